//! GGML K-quant weight matrices (Q4_K, Q5_K, Q6_K: 256-value super-blocks, as llama.cpp's
//! `ggml-common.h` lays them out) and their matmul `out[m, o] = sum_i x[m, i] * W[o, i]`.
//!
//! Layouts (bytes, in order), `d`/`dmin` f16:
//! - Q4_K (144): `d`, `dmin`, `scales[12]` (eight 6-bit scale/min pairs), `qs[128]` (4-bit).
//! - Q5_K (176): `d`, `dmin`, `scales[12]`, `qh[32]` (fifth bits), `qs[128]`.
//! - Q6_K (210): `ql[128]` (low 4 bits), `qh[64]` (high 2 bits), `scales[16]` (i8), `d`.
//!
//! [`dequantize_row`] is the reference (ggml's `dequantize_row_q*_K`, value for value).
//!
//! Matmul, weight-only (activations stay f32): each thread dequantizes a panel of
//! [`PANEL_ROWS`] weight rows into an f32 scratch once per call (the loops are plain
//! byte-to-float arithmetic that the compiler vectorizes for the target features of the
//! caller: AVX-512, AVX2 or NEON) and runs the float kernels of [`super::floatmm`] on it. So
//! a row's result has the float kernels' bits whatever the number of activation rows, the
//! split into threads or the pass split, like every other weight format here.
//! At decode (one activation row) Q4_K and Q6_K have fused x86 kernels that dequantize in
//! registers with the same operations and accumulate in the same lane order (`kquant_x86.rs`):
//! the same bits without the scratch round trip.
//! Not done yet: llama.cpp's integer dot products against Q8_K-quantized activations
//! (faster at decode, where this path is bound by dequantization, not memory).

use half::f16;

use super::floatmm::{FloatMatrix, matmul_float};
use super::matmul::OutPtr;
use super::threadpool::{ThreadPool, split_range};

/// Values per super-block.
pub const QK_K: usize = 256;
/// Weight rows dequantized together by one thread.
const PANEL_ROWS: usize = 8;

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

/// Why a [`KQuantMatrix`] could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KQuantError {
    #[error("{dtype} rows of {cols} values are not whole super-blocks of {QK_K}")]
    Cols { dtype: &'static str, cols: usize },
    #[error("{dtype} [{rows}, {cols}] needs {want} bytes, got {got}")]
    Len { dtype: &'static str, rows: usize, cols: usize, want: usize, got: usize },
}

/// A K-quant matrix `[rows][cols]` in its file layout (row-major super-blocks).
pub struct KQuantMatrix {
    pub dtype: KQuantType,
    pub rows: usize,
    pub cols: usize,
    data: Vec<u8>,
}

impl KQuantMatrix {
    pub fn new(dtype: KQuantType, rows: usize, cols: usize, data: &[u8]) -> Result<KQuantMatrix, KQuantError> {
        if cols == 0 || !cols.is_multiple_of(QK_K) {
            return Err(KQuantError::Cols { dtype: dtype.name(), cols });
        }
        let want = rows * cols / QK_K * dtype.block_bytes();
        if data.len() != want {
            return Err(KQuantError::Len { dtype: dtype.name(), rows, cols, want, got: data.len() });
        }
        Ok(KQuantMatrix { dtype, rows, cols, data: data.to_vec() })
    }

    #[inline(always)]
    fn row_bytes(&self) -> usize {
        self.cols / QK_K * self.dtype.block_bytes()
    }

    /// Row `r` as f32 (`out.len() == cols`). Inlined so that the SIMD callers vectorize it.
    #[inline(always)]
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let rb = self.row_bytes();
        dequantize_row(self.dtype, &self.data[r * rb..(r + 1) * rb], out);
    }

    pub fn weight_bytes(&self) -> usize {
        self.data.len()
    }

    /// The super-blocks, row-major.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }
}

/// Dequantizes whole super-blocks `src` into `out`. Values of `out` that no whole block of
/// `src` covers are left at zero (as [`super::dequantize_row`] does) rather than panicking.
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

#[inline(always)]
fn half(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes (ggml's `get_scale_min_k4`).
#[inline(always)]
pub(super) fn scale_min(j: usize, q: &[u8]) -> (u8, u8) {
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

/// Dequantizes rows `o..o + r` into `panel` (`r * cols` values), with the widest SIMD this
/// CPU allows compiled in.
fn dequantize_panel(w: &KQuantMatrix, o: usize, r: usize, panel: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use super::{SimdCeiling, simd_ceiling};
        let ceiling = simd_ceiling();
        if ceiling >= SimdCeiling::Detected && std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: AVX-512F checked.
            return unsafe { dequantize_panel_avx512(w, o, r, panel) };
        }
        if ceiling >= SimdCeiling::Avx2 && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 checked.
            return unsafe { dequantize_panel_avx2(w, o, r, panel) };
        }
    }
    dequantize_panel_body(w, o, r, panel)
}

#[inline(always)]
fn dequantize_panel_body(w: &KQuantMatrix, o: usize, r: usize, panel: &mut [f32]) {
    for j in 0..r {
        w.dequantize_row(o + j, &mut panel[j * w.cols..(j + 1) * w.cols]);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn dequantize_panel_avx512(w: &KQuantMatrix, o: usize, r: usize, panel: &mut [f32]) {
    dequantize_panel_body(w, o, r, panel)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dequantize_panel_avx2(w: &KQuantMatrix, o: usize, r: usize, panel: &mut [f32]) {
    dequantize_panel_body(w, o, r, panel)
}

type FusedKernel = unsafe fn(&KQuantMatrix, &[f32], std::ops::Range<usize>, OutPtr);

/// The fused one-row kernel for `dtype` on this CPU (same bits as the panel path), if any.
fn fused_decode_kernel(dtype: KQuantType) -> Option<FusedKernel> {
    #[cfg(target_arch = "x86_64")]
    if dtype != KQuantType::Q5K {
        use super::{SimdCeiling, simd_ceiling};
        let ceiling = simd_ceiling();
        if ceiling >= SimdCeiling::Detected
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
        {
            return Some(x86::rows_avx512);
        }
        if ceiling >= SimdCeiling::Avx2
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            return Some(x86::rows_avx2);
        }
    }
    let _ = dtype;
    None
}

#[cfg(target_arch = "x86_64")]
#[path = "kquant_x86.rs"]
mod x86;

/// `out[m * w.rows + o] = sum_i x[m * w.cols + i] * W[o][i]` for `m < m_rows`; all pool threads.
/// See the module docs for how; panics if `x` or `out` is shorter than the shapes need.
pub fn matmul_kquant(pool: &ThreadPool, w: &KQuantMatrix, x: &[f32], m_rows: usize, out: &mut [f32]) {
    assert!(x.len() >= m_rows * w.cols && out.len() >= m_rows * w.rows, "matmul_kquant: short buffers");
    let outp = OutPtr(out.as_mut_ptr());
    if m_rows == 1
        && let Some(fused) = fused_decode_kernel(w.dtype)
    {
        pool.run(|i, n| {
            let out_base = outp;
            let rows = split_range(w.rows, n, i, 4);
            // SAFETY: the kernel's features were checked; outputs `rows` belong to this thread.
            unsafe { fused(w, &x[..w.cols], rows, out_base) };
        });
        return;
    }
    pool.run(|i, n| {
        let out_base = outp; // the whole Sync wrapper, not its raw pointer field
        let rows = split_range(w.rows, n, i, PANEL_ROWS);
        // One pool per thread: a one-thread pool spawns nothing and runs on its caller.
        let serial = ThreadPool::new(1);
        let mut panel = FloatMatrix { rows: PANEL_ROWS, cols: w.cols, data: vec![0f32; PANEL_ROWS * w.cols] };
        let mut part = vec![0f32; m_rows * PANEL_ROWS];
        let mut o = rows.start;
        while o < rows.end {
            let r = PANEL_ROWS.min(rows.end - o);
            dequantize_panel(w, o, r, &mut panel.data[..r * w.cols]);
            panel.rows = r;
            matmul_float(&serial, &panel, x, m_rows, &mut part[..m_rows * r]);
            for m in 0..m_rows {
                // SAFETY: output columns `rows` of every activation row belong to this thread.
                unsafe {
                    std::ptr::copy_nonoverlapping(part.as_ptr().add(m * r), out_base.0.add(m * w.rows + o), r);
                }
            }
            o += r;
        }
    });
}

#[cfg(test)]
#[path = "kquant_tests.rs"]
mod tests;
