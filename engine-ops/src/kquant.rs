//! GGML K-quant blocks (Q4_K, Q5_K, Q6_K: 256-value super-blocks, as llama.cpp's
//! `ggml-common.h` lays them out): the reference decoder ([`dequantize_row`], ggml's
//! `dequantize_row_q*_K` value for value) and a plain encoder ([`quantize_rows`]) for
//! random-weight models and tests. The CPU kernels multiply these blocks in place
//! (`KQuantMatrix`).
//!
//! Layouts (bytes, in order), `d`/`dmin` f16:
//! - Q4_K (144): `d`, `dmin`, `scales[12]` (eight 6-bit scale/min pairs), `qs[128]` (4-bit).
//! - Q5_K (176): `d`, `dmin`, `scales[12]`, `qh[32]` (fifth bits), `qs[128]`.
//! - Q6_K (210): `ql[128]` (low 4 bits), `qh[64]` (high 2 bits), `scales[16]` (i8), `d`.

use half::f16;

use crate::tensor::GgmlType;

/// Values per super-block.
pub const QK_K: usize = 256;

/// One of the K-quant block types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KQuantType {
    Q4K,
    Q5K,
    Q6K,
}

impl KQuantType {
    /// Maps a GGUF `ggml_type` id (12, 13, 14).
    pub fn from_ggml_id(id: u32) -> Option<KQuantType> {
        match id {
            12 => Some(KQuantType::Q4K),
            13 => Some(KQuantType::Q5K),
            14 => Some(KQuantType::Q6K),
            _ => None,
        }
    }

    /// Bytes per super-block of [`QK_K`] values.
    /// The K-quant type of a stored element type, for the K-quants.
    pub fn of(t: GgmlType) -> Option<KQuantType> {
        match t {
            GgmlType::Q4_K => Some(KQuantType::Q4K),
            GgmlType::Q5_K => Some(KQuantType::Q5K),
            GgmlType::Q6_K => Some(KQuantType::Q6K),
            _ => None,
        }
    }

    pub fn block_bytes(self) -> usize {
        match self {
            KQuantType::Q4K => 144,
            KQuantType::Q5K => 176,
            KQuantType::Q6K => 210,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KQuantType::Q4K => "Q4_K",
            KQuantType::Q5K => "Q5_K",
            KQuantType::Q6K => "Q6_K",
        }
    }
}

/// Dequantizes whole super-blocks `src` into `out`. Values of `out` that no whole block of
/// `src` covers are left at zero (as [`crate::tensor::dequantize_row`] does) rather than panicking.
#[inline(always)]
pub fn dequantize_row(dtype: KQuantType, src: &[u8], out: &mut [f32]) {
    let bb = dtype.block_bytes();
    let blocks = (out.len() / QK_K).min(src.len() / bb);
    out[blocks * QK_K..].fill(0.0);
    for (blk, y) in src.chunks_exact(bb).zip(out.chunks_exact_mut(QK_K)) {
        let y: &mut [f32; QK_K] = y.try_into().expect("one super-block");
        match dtype {
            KQuantType::Q4K => q4k_block(blk, y),
            KQuantType::Q5K => q5k_block(blk, y),
            KQuantType::Q6K => q6k_block(blk, y),
        }
    }
}

/// The little-endian f16 at `b[at..at + 2]`, as f32 (a super-block's `d` or `dmin`).
#[inline(always)]
pub fn half(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Quantizes rows of `cols` values (whole super-blocks) to `dtype` with plain min/max scales
/// (not llama.cpp's error-minimizing search): for random-weight models and tests, where the
/// layout and the kernels matter, not the last bit of quantization error.
pub fn quantize_rows(dtype: KQuantType, x: &[f32]) -> Vec<u8> {
    assert!(x.len().is_multiple_of(QK_K), "quantize_rows: whole super-blocks");
    let mut out = Vec::with_capacity(x.len() / QK_K * dtype.block_bytes());
    for blk in x.chunks_exact(QK_K) {
        match dtype {
            KQuantType::Q4K => quantize_q45k(blk, 15, &mut out),
            KQuantType::Q5K => quantize_q45k(blk, 31, &mut out),
            KQuantType::Q6K => quantize_q6k(blk, &mut out),
        }
    }
    out
}

fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_bits().to_le_bytes()
}

/// Q4_K (`levels` 15) or Q5_K (31): per 32 values `x ~ d*sc*q - dmin*m`.
fn quantize_q45k(x: &[f32], levels: u8, out: &mut Vec<u8>) {
    let mut scale = [0f32; 8];
    let mut min = [0f32; 8];
    for j in 0..8 {
        let sub = &x[32 * j..32 * j + 32];
        let lo = sub.iter().fold(0f32, |a, &v| a.min(v));
        let hi = sub.iter().fold(0f32, |a, &v| a.max(v));
        scale[j] = (hi - lo) / levels as f32;
        min[j] = -lo;
    }
    let d = f16::from_f32(scale.iter().fold(0f32, |a, &v| a.max(v)) / 63.0).to_f32();
    let dmin = f16::from_f32(min.iter().fold(0f32, |a, &v| a.max(v)) / 63.0).to_f32();
    let code6 = |v: f32, unit: f32| if unit > 0.0 { (v / unit).round().clamp(0.0, 63.0) as u8 } else { 0 };
    let sc: [u8; 8] = std::array::from_fn(|j| code6(scale[j], d));
    let mn: [u8; 8] = std::array::from_fn(|j| code6(min[j], dmin));
    let mut packed = [0u8; 12];
    for j in 0..4 {
        packed[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        packed[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        packed[j + 8] = (sc[j + 4] & 0xf) | ((mn[j + 4] & 0xf) << 4);
    }
    let mut q = [0u8; QK_K];
    for j in 0..8 {
        let (step, off) = (d * sc[j] as f32, dmin * mn[j] as f32);
        for i in 32 * j..32 * j + 32 {
            q[i] = if step > 0.0 { ((x[i] + off) / step).round().clamp(0.0, levels as f32) as u8 } else { 0 };
        }
    }
    out.extend_from_slice(&f16_bytes(d));
    out.extend_from_slice(&f16_bytes(dmin));
    out.extend_from_slice(&packed);
    if levels > 15 {
        let mut qh = [0u8; 32];
        for (i, &v) in q.iter().enumerate() {
            // value i = 64g + 32h + l: its fifth bit is bit 2g + h of qh[l]
            qh[i % 32] |= (v >> 4) << (i / 32);
        }
        out.extend_from_slice(&qh);
    }
    for g in 0..4 {
        for l in 0..32 {
            out.push((q[64 * g + l] & 0xf) | ((q[64 * g + 32 + l] & 0xf) << 4));
        }
    }
}

/// Q6_K: per 16 values `x ~ d*sc*(q - 32)`, `sc` signed 8-bit.
fn quantize_q6k(x: &[f32], out: &mut Vec<u8>) {
    let scale: [f32; 16] =
        std::array::from_fn(|t| x[16 * t..16 * t + 16].iter().fold(0f32, |a, &v| a.max(v.abs())) / 31.0);
    let d = f16::from_f32(scale.iter().fold(0f32, |a, &v| a.max(v)) / 127.0).to_f32();
    let sc: [i8; 16] =
        std::array::from_fn(|t| if d > 0.0 { (scale[t] / d).round().clamp(-128.0, 127.0) as i8 } else { 0 });
    let q: [u8; QK_K] = std::array::from_fn(|i| {
        let step = d * sc[i / 16] as f32;
        let c = if step > 0.0 { (x[i] / step).round().clamp(-32.0, 31.0) as i32 } else { 0 };
        (c + 32) as u8
    });
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for n in 0..2 {
        for l in 0..32 {
            let at = |k: usize| q[128 * n + 32 * k + l];
            ql[64 * n + l] = (at(0) & 0xf) | ((at(2) & 0xf) << 4);
            ql[64 * n + 32 + l] = (at(1) & 0xf) | ((at(3) & 0xf) << 4);
            qh[32 * n + l] = (at(0) >> 4) | ((at(1) >> 4) << 2) | ((at(2) >> 4) << 4) | ((at(3) >> 4) << 6);
        }
    }
    out.extend_from_slice(&ql);
    out.extend_from_slice(&qh);
    out.extend(sc.iter().map(|&v| v as u8));
    out.extend_from_slice(&f16_bytes(d));
}

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes (ggml's `get_scale_min_k4`).
#[inline(always)]
pub fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

#[inline(always)]
fn q4k_block(b: &[u8], y: &mut [f32; QK_K]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..144];
    for g in 0..4 {
        let (sc1, m1) = scale_min(2 * g, scales);
        let (sc2, m2) = scale_min(2 * g + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        let q = &qs[32 * g..32 * g + 32];
        let (lo, hi) = y[64 * g..64 * g + 64].split_at_mut(32);
        for l in 0..32 {
            lo[l] = d1 * (q[l] & 0xf) as f32 - m1;
            hi[l] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

#[inline(always)]
fn q5k_block(b: &[u8], y: &mut [f32; QK_K]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for g in 0..4 {
        let (sc1, m1) = scale_min(2 * g, scales);
        let (sc2, m2) = scale_min(2 * g + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        let (u1, u2) = (1u8 << (2 * g), 2u8 << (2 * g));
        let q = &qs[32 * g..32 * g + 32];
        let (lo, hi) = y[64 * g..64 * g + 64].split_at_mut(32);
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            lo[l] = d1 * ((q[l] & 0xf) + h1) as f32 - m1;
            hi[l] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
        }
    }
}

#[inline(always)]
fn q6k_block(b: &[u8], y: &mut [f32; QK_K]) {
    let d = half(b, 208);
    for n in 0..2 {
        let ql = &b[64 * n..64 * n + 64];
        let qh = &b[128 + 32 * n..128 + 32 * n + 32];
        let sc = &b[192 + 8 * n..192 + 8 * n + 8];
        let y = &mut y[128 * n..128 * n + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}
