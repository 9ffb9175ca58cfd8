//! x86_64 kernels: AVX-512 (F/BW/VL + VNNI, F16C, FMA). Each `#[target_feature]` function
//! holds a whole hot loop; helpers carry the same features and inline into it.
//!
//! Packed GEMM: per 16x32 tile, the 4-bit weights are split into 8 vectors of 64 u8 (4 values
//! of each of 16 rows) and fed to `vpdpbusd` against a broadcast of 4 activation bytes, so one
//! instruction yields 4 MACs for each of 16 output rows with no horizontal sums. A tile is
//! unpacked once per group of up to [`M_BLOCK`] activation rows.

#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::Dispatch;
use super::attention::{CHUNK, Chunk, ChunkRef, State, WideState};
use super::matmul::{M_BLOCK, OutPtr, PackedMatrix, TILE_ROWS, tile_bytes};
use super::quant::{GgmlType, Q8Acts, QK};

static AVX512: Dispatch = Dispatch {
    name: "avx512-vnni",
    quantize_q8: quantize_q8_avx512_safe,
    dot_f32: dot_f32_avx512_safe,
    packed_gemm: packed_gemm_avx512,
    attn_chunk: attn_chunk_avx512,
    attn_wide: Some(attn_wide_avx512),
};

fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
        && is_x86_feature_detected!("f16c")
        && is_x86_feature_detected!("fma")
}

/// Fallback for x86 CPUs without AVX-512 VNNI: the packed GEMM on AVX2 `maddubs` (or
/// AVX-VNNI's `vpdpbusd` on 256-bit vectors where the CPU has it: the same exact integers)
/// and the attention chunk and wide kernels of [`super::x86_avx2`]; quantization and `dot_f32` are scalar.
static AVX2: Dispatch = Dispatch {
    name: "avx2",
    quantize_q8: super::quant::quantize_block_q8_scalar,
    dot_f32: super::matmul::dot_f32_scalar,
    packed_gemm: packed_gemm_avx2_entry,
    attn_chunk: super::x86_avx2::attn_chunk_avx2,
    attn_wide: Some(super::x86_avx2::attn_wide_avx2),
};

pub(crate) fn available() -> Vec<&'static Dispatch> {
    let mut v: Vec<&'static Dispatch> = Vec::new();
    if has_avx512() {
        v.push(&AVX512);
    }
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
        v.push(&AVX2);
    }
    v
}

unsafe fn packed_gemm_avx2_entry(w: &PackedMatrix, a: &Q8Acts, g: Range<usize>, out: OutPtr) {
    match w.dtype {
        GgmlType::Q4_1 | GgmlType::Q4_0 | GgmlType::Q8_0 if has_avx_vnni() => packed_gemm_avx_vnni(w, a, g, out),
        GgmlType::Q4_1 | GgmlType::Q4_0 | GgmlType::Q8_0 => packed_gemm_avx2(w, a, g, out),
        _ => super::matmul::packed_gemm_scalar(w, a, g, out),
    }
}

/// Whether the CPU has AVX-VNNI (std caches the detection).
fn has_avx_vnni() -> bool {
    is_x86_feature_detected!("avxvnni")
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn packed_gemm_avx2(w: &PackedMatrix, a: &Q8Acts, g: Range<usize>, out: OutPtr) {
    packed_gemm_avx2_with::<false>(w, a, g, out)
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn packed_gemm_avx_vnni(w: &PackedMatrix, a: &Q8Acts, g: Range<usize>, out: OutPtr) {
    packed_gemm_avx2_with::<true>(w, a, g, out)
}

/// AVX2 packed GEMM: a tile's 64-byte vector j is two 256-bit halves (rows 0-7, 8-15);
/// `maddubs` + `madd` (or, with `VNNI`, `vpdpbusd`) give per-row i32 sums. Q8_0 is flipped
/// back to signed and multiplied with the sign trick (`|w|` x `sign(a, w)`) so the i16 pair
/// sums cannot saturate.
#[inline(always)]
unsafe fn packed_gemm_avx2_with<const VNNI: bool>(w: &PackedMatrix, a: &Q8Acts, g: Range<usize>, out: OutPtr) {
    let nb = w.cols / QK;
    let tb = tile_bytes(w.dtype);
    let data = w.bytes().as_ptr();
    let ones = _mm256_set1_epi16(1);
    let mask = _mm256_set1_epi8(0x0f);
    let flip = _mm256_set1_epi8(-128);
    // acc + per i32 lane the sum of four u8 x i8 products
    let dot = |acc: __m256i, wv: __m256i, av: __m256i| {
        if VNNI {
            _mm256_dpbusd_avx_epi32(acc, wv, av)
        } else {
            _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(wv, av), ones))
        }
    };
    for gi in g {
        for m in 0..a.m_rows {
            let mut acc = [_mm256_setzero_ps(); 2];
            for b in 0..nb {
                let tile = data.add((gi * nb + b) * tb);
                if m == 0 {
                    // The first activation row streams the tiles from memory: fetch ahead
                    // (a prefetch past the buffer's end is simply not done).
                    let pf = tile.wrapping_add(PREFETCH_BYTES);
                    let mut off = 0;
                    while off < tb {
                        _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(off) as *const i8);
                        off += 64;
                    }
                }
                let aq = a.qs.as_ptr().add(m * a.cols + b * QK);
                let mut s = [_mm256_setzero_si256(); 2];
                let doff;
                if w.dtype == GgmlType::Q8_0 {
                    for j in 0..8 {
                        let av = _mm256_set1_epi32((aq.add(4 * j) as *const i32).read_unaligned());
                        for (half, sh) in s.iter_mut().enumerate() {
                            let wv = _mm256_xor_si256(
                                _mm256_loadu_si256(tile.add(64 * j + 32 * half) as *const __m256i),
                                flip,
                            );
                            *sh = dot(*sh, _mm256_abs_epi8(wv), _mm256_sign_epi8(av, wv));
                        }
                    }
                    doff = 512;
                } else {
                    for j in 0..4 {
                        let alo = _mm256_set1_epi32((aq.add(8 * j) as *const i32).read_unaligned());
                        let ahi = _mm256_set1_epi32((aq.add(8 * j + 4) as *const i32).read_unaligned());
                        for (half, sh) in s.iter_mut().enumerate() {
                            let raw = _mm256_loadu_si256(tile.add(64 * j + 32 * half) as *const __m256i);
                            let lo = _mm256_and_si256(raw, mask);
                            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), mask);
                            *sh = dot(dot(*sh, lo, alo), hi, ahi);
                        }
                    }
                    doff = 256;
                }
                let da = _mm256_set1_ps(a.d[m * (a.cols / QK) + b]);
                let sa = _mm256_set1_ps(a.s[m * (a.cols / QK) + b]);
                for (half, acc_h) in acc.iter_mut().enumerate() {
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(tile.add(doff + 16 * half) as *const __m128i));
                    let c = match w.dtype {
                        GgmlType::Q4_1 => _mm256_cvtph_ps(_mm_loadu_si128(tile.add(288 + 16 * half) as *const __m128i)),
                        GgmlType::Q4_0 => _mm256_mul_ps(d, _mm256_set1_ps(-8.0)),
                        _ => _mm256_setzero_ps(),
                    };
                    let t = _mm256_mul_ps(_mm256_cvtepi32_ps(s[half]), da);
                    *acc_h = _mm256_fmadd_ps(c, sa, _mm256_fmadd_ps(d, t, *acc_h));
                }
            }
            let mut res = [0f32; TILE_ROWS];
            _mm256_storeu_ps(res.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(res.as_mut_ptr().add(8), acc[1]);
            let rows = (w.rows - gi * TILE_ROWS).min(TILE_ROWS);
            for (r, &v) in res.iter().enumerate().take(rows) {
                *out.0.add(m * w.rows + gi * TILE_ROWS + r) = v;
            }
        }
    }
}

fn quantize_q8_avx512_safe(x: &[f32], q: &mut [i8]) -> (f32, f32) {
    assert!(x.len() >= QK && q.len() >= QK);
    // SAFETY: only reachable through AVX512, which is selected after feature detection;
    // lengths checked above.
    unsafe { quantize_q8_avx512(x.as_ptr(), q.as_mut_ptr()) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn quantize_q8_avx512(x: *const f32, q: *mut i8) -> (f32, f32) {
    let a = _mm512_loadu_ps(x);
    let b = _mm512_loadu_ps(x.add(16));
    let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let idv = _mm512_set1_ps(id);
    let qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, idv));
    let qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, idv));
    _mm_storeu_si128(q as *mut __m128i, _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128(q.add(16) as *mut __m128i, _mm512_cvtsepi32_epi8(qb));
    let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
    (d, d * sum as f32)
}

fn dot_f32_avx512_safe(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    // SAFETY: feature-detected (see above); reads stay below n.
    unsafe { dot_f32_avx512(a.as_ptr(), b.as_ptr(), n) }
}

#[target_feature(enable = "avx512f,fma")]
unsafe fn dot_f32_avx512(a: *const f32, b: *const f32, n: usize) -> f32 {
    let mut acc0 = _mm512_setzero_ps();
    let mut acc1 = _mm512_setzero_ps();
    let mut k = 0;
    while k + 32 <= n {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(k)), _mm512_loadu_ps(b.add(k)), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(k + 16)), _mm512_loadu_ps(b.add(k + 16)), acc1);
        k += 32;
    }
    if k + 16 <= n {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a.add(k)), _mm512_loadu_ps(b.add(k)), acc0);
        k += 16;
    }
    if k < n {
        let m: __mmask16 = ((1u32 << (n - k)) - 1) as u16;
        acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a.add(k)), _mm512_maskz_loadu_ps(m, b.add(k)), acc1);
    }
    _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
}

/// Which weight format a tile loop handles.
const KIND_Q4_1: u8 = 0;
const KIND_Q4_0: u8 = 1;
const KIND_Q8_0: u8 = 2;

/// Bytes ahead of the current tile to prefetch (a few tiles: DRAM latency at ~20 GB/s/core).
const PREFETCH_BYTES: usize = 2048;

unsafe fn packed_gemm_avx512(w: &PackedMatrix, a: &Q8Acts, g: Range<usize>, out: OutPtr) {
    match w.dtype {
        GgmlType::Q4_1 => packed_gemm_kind::<KIND_Q4_1>(w, a, g, out),
        GgmlType::Q4_0 => packed_gemm_kind::<KIND_Q4_0>(w, a, g, out),
        GgmlType::Q8_0 => packed_gemm_kind::<KIND_Q8_0>(w, a, g, out),
        _ => super::matmul::packed_gemm_scalar(w, a, g, out),
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn packed_gemm_kind<const KIND: u8>(w: &PackedMatrix, a: &Q8Acts, g: Range<usize>, out: OutPtr) {
    let m_rows = a.m_rows;
    for gi in g {
        let mut m0 = 0;
        while m0 < m_rows {
            let mb = (m_rows - m0).min(M_BLOCK);
            let prefetch = m0 == 0;
            match mb {
                4 => group_rows::<KIND, 4>(w, a, gi, m0, prefetch, out),
                3 => group_rows::<KIND, 3>(w, a, gi, m0, prefetch, out),
                2 => group_rows::<KIND, 2>(w, a, gi, m0, prefetch, out),
                _ => group_rows::<KIND, 1>(w, a, gi, m0, prefetch, out),
            }
            m0 += mb;
        }
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn bcast4(p: *const i8) -> __m512i {
    _mm512_set1_epi32((p as *const i32).read_unaligned())
}

/// Activation rows m0..m0+MB against tile group `gi`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn group_rows<const KIND: u8, const MB: usize>(
    w: &PackedMatrix,
    a: &Q8Acts,
    gi: usize,
    m0: usize,
    prefetch: bool,
    out: OutPtr,
) {
    let nb = w.cols / QK;
    let tb = tile_bytes(w.dtype);
    let base = w.bytes().as_ptr().add(gi * nb * tb);
    let end = w.bytes().as_ptr() as usize + w.bytes().len();
    let mask_lo = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); MB];
    let aq0 = a.qs.as_ptr().add(m0 * a.cols);
    let ad = a.d.as_ptr().add(m0 * nb);
    let as_ = a.s.as_ptr().add(m0 * nb);
    for b in 0..nb {
        let tile = base.add(b * tb);
        if prefetch {
            // wrapping: the address may lie past the buffer, where it is not prefetched
            let pf = tile.wrapping_add(PREFETCH_BYTES);
            let mut off = 0;
            while off < tb && (pf as usize) + off < end {
                _mm_prefetch::<_MM_HINT_T0>(pf.wrapping_add(off) as *const i8);
                off += 64;
            }
        }
        let (d, c);
        let mut wv = [_mm512_setzero_si512(); 8];
        if KIND == KIND_Q8_0 {
            for (j, v) in wv.iter_mut().enumerate() {
                *v = _mm512_loadu_si512(tile.add(64 * j) as *const _);
            }
            d = _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(512) as *const __m256i));
            c = _mm512_mul_ps(d, _mm512_set1_ps(-128.0));
        } else {
            for j in 0..4 {
                let raw = _mm512_loadu_si512(tile.add(64 * j) as *const _);
                wv[2 * j] = _mm512_and_si512(raw, mask_lo);
                wv[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16::<4>(raw), mask_lo);
            }
            d = _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(256) as *const __m256i));
            c = if KIND == KIND_Q4_1 {
                _mm512_cvtph_ps(_mm256_loadu_si256(tile.add(288) as *const __m256i))
            } else {
                _mm512_mul_ps(d, _mm512_set1_ps(-8.0))
            };
        }
        for (mi, acc_m) in acc.iter_mut().enumerate() {
            let aq = aq0.add(mi * a.cols + b * QK);
            // Both layouts pair vector j with activation bytes 4j..4j+4 (see PackedMatrix docs).
            let mut s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[0], bcast4(aq));
            let mut s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[1], bcast4(aq.add(4)));
            s0 = _mm512_dpbusd_epi32(s0, wv[2], bcast4(aq.add(8)));
            s1 = _mm512_dpbusd_epi32(s1, wv[3], bcast4(aq.add(12)));
            s0 = _mm512_dpbusd_epi32(s0, wv[4], bcast4(aq.add(16)));
            s1 = _mm512_dpbusd_epi32(s1, wv[5], bcast4(aq.add(20)));
            s0 = _mm512_dpbusd_epi32(s0, wv[6], bcast4(aq.add(24)));
            s1 = _mm512_dpbusd_epi32(s1, wv[7], bcast4(aq.add(28)));
            let f = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            let t = _mm512_mul_ps(f, _mm512_set1_ps(*ad.add(mi * nb + b)));
            *acc_m = _mm512_fmadd_ps(d, t, *acc_m);
            *acc_m = _mm512_fmadd_ps(c, _mm512_set1_ps(*as_.add(mi * nb + b)), *acc_m);
        }
    }
    let rows = (w.rows - gi * TILE_ROWS).min(TILE_ROWS);
    let mask: __mmask16 = if rows == TILE_ROWS { 0xffff } else { ((1u32 << rows) - 1) as u16 };
    for (mi, acc_m) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(out.0.add((m0 + mi) * w.rows + gi * TILE_ROWS), mask, *acc_m);
    }
}

/// exp(x) for a vector, x <= 0 (softmax arguments); relative error ~2e-7.
#[inline]
#[target_feature(enable = "avx512f,fma")]
pub(super) unsafe fn exp_ps(x: __m512) -> __m512 {
    let x = _mm512_max_ps(x, _mm512_set1_ps(-87.0));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
        x,
        _mm512_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm512_set1_ps(1.0 / 720.0);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0 / 120.0));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0 / 24.0));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0 / 6.0));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0));
    _mm512_scalef_ps(p, n)
}

/// Sums each of 16 vectors horizontally: lane L of the result is the sum of `v[L]`, provided
/// `v` was filled in the order given by [`REDUCE_SLOT`]. Per vector x the tree is
/// `(y0 + y2) + (y1 + y3)` with `y_e = (x[e] + x[e+8]) + (x[e+4] + x[e+12])`
/// ([`attn_wide_nv`] reproduces it).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn reduce16(v: &[__m512; 16]) -> __m512 {
    let mut r1 = [_mm512_setzero_ps(); 8];
    for k in 0..8 {
        let (a, b) = (v[2 * k], v[2 * k + 1]);
        r1[k] = _mm512_add_ps(_mm512_shuffle_f32x4::<0x44>(a, b), _mm512_shuffle_f32x4::<0xee>(a, b));
    }
    let mut r2 = [_mm512_setzero_ps(); 4];
    for k in 0..4 {
        let (a, b) = (r1[2 * k], r1[2 * k + 1]);
        r2[k] = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(a, b), _mm512_shuffle_f32x4::<0xdd>(a, b));
    }
    let mut r3 = [_mm512_setzero_ps(); 2];
    for k in 0..2 {
        let (a, b) = (r2[2 * k], r2[2 * k + 1]);
        r3[k] = _mm512_add_ps(_mm512_shuffle_ps::<0x44>(a, b), _mm512_shuffle_ps::<0xee>(a, b));
    }
    let (a, b) = (r3[0], r3[1]);
    _mm512_add_ps(_mm512_shuffle_ps::<0x88>(a, b), _mm512_shuffle_ps::<0xdd>(a, b))
}

/// Sum of the 16 lanes of `v` in the canonical tree both attention kernels use: lanes
/// (i, i+8), then (i, i+4), (i, i+2), (i, i+1).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn sum16_tree(v: __m512) -> f32 {
    let a = _mm512_add_ps(v, _mm512_shuffle_f32x4::<0b01_00_11_10>(v, v));
    let b = _mm512_add_ps(a, _mm512_shuffle_f32x4::<0b00_00_00_01>(a, a));
    let c = _mm512_add_ps(b, _mm512_shuffle_ps::<0b00_00_11_10>(b, b));
    let d = _mm512_add_ps(c, _mm512_shuffle_ps::<0b00_00_00_01>(c, c));
    _mm512_cvtss_f32(d)
}

/// Input slot of token t for [`reduce16`]: slot s ends up in lane 4*(s%4) + s/4.
const REDUCE_SLOT: [usize; 16] = {
    let mut slot = [0; 16];
    let mut s = 0;
    while s < 16 {
        slot[4 * (s % 4) + s / 4] = s;
        s += 1;
    }
    slot
};

unsafe fn attn_chunk_avx512(c: &Chunk, st: &mut State) {
    // More than 8 heads run as groups of 8 (each head's arithmetic is the same either way).
    let mut h0 = 0;
    while h0 < c.g {
        let g = (c.g - h0).min(8);
        macro_rules! by_group {
            ($nv:literal) => {
                match g {
                    1 => attn_chunk_nv::<$nv, 1>(c, st, h0),
                    2 => attn_chunk_nv::<$nv, 2>(c, st, h0),
                    3 => attn_chunk_nv::<$nv, 3>(c, st, h0),
                    4 => attn_chunk_nv::<$nv, 4>(c, st, h0),
                    5 => attn_chunk_nv::<$nv, 5>(c, st, h0),
                    6 => attn_chunk_nv::<$nv, 6>(c, st, h0),
                    7 => attn_chunk_nv::<$nv, 7>(c, st, h0),
                    _ => attn_chunk_nv::<$nv, 8>(c, st, h0),
                }
            };
        }
        match c.head_dim {
            16 => by_group!(1),
            32 => by_group!(2),
            64 => by_group!(4),
            128 => by_group!(8),
            // Wider heads (Qwen3.6's 256) would not keep q in the 32 registers: the AVX2
            // kernel (q from L1) serves them for this set too, chunk and wide alike.
            _ => return super::x86_avx2::attn_chunk_zmm(c, st),
        }
        h0 += g;
    }
}

/// One chunk for heads h0..h0+G of NV*16 dims: each K and V row is loaded and converted once
/// and used by all G heads; the G accumulators stay in registers for PV.
#[allow(clippy::needless_range_loop)] // register arrays indexed by head/vector read clearer
#[target_feature(enable = "avx512f,avx512vl,f16c,fma")]
unsafe fn attn_chunk_nv<const NV: usize, const G: usize>(c: &Chunk, st: &mut State, h0: usize) {
    let hd = NV * 16;
    let n = c.n;
    let mut qv = [[_mm512_setzero_ps(); NV]; G];
    for (h, qh) in qv.iter_mut().enumerate() {
        for (j, v) in qh.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(c.q.as_ptr().add((h0 + h) * hd + 16 * j));
        }
    }
    let mut part = [[_mm512_setzero_ps(); 16]; G];
    for t in 0..n {
        let mut kv = [_mm512_setzero_ps(); NV];
        for (j, v) in kv.iter_mut().enumerate() {
            *v = _mm512_cvtph_ps(_mm256_loadu_si256(c.k.add(t * hd + 16 * j) as *const __m256i));
        }
        for h in 0..G {
            let mut p = _mm512_mul_ps(qv[h][0], kv[0]);
            for j in 1..NV {
                p = _mm512_fmadd_ps(qv[h][j], kv[j], p);
            }
            part[h][REDUCE_SLOT[t]] = p;
        }
    }
    let valid: __mmask16 = if n >= 16 { 0xffff } else { ((1u32 << n) - 1) as u16 };
    let mut pa = [[0f32; 16]; G];
    let mut acc = [[_mm512_setzero_ps(); NV]; G];
    for h in 0..G {
        let s = reduce16(&part[h]);
        let mx = _mm512_mask_reduce_max_ps(valid, s);
        let m_old = st.m[h0 + h];
        let m_new = m_old.max(mx);
        let p = _mm512_maskz_mov_ps(valid, exp_ps(_mm512_sub_ps(s, _mm512_set1_ps(m_new))));
        _mm512_storeu_ps(pa[h].as_mut_ptr(), p);
        let psum = sum16_tree(p);
        let accp = st.acc.as_ptr().add((h0 + h) * hd);
        if m_new == m_old {
            // the common case once the running max has settled: no rescale (alpha would be
            // exactly 1, so this is the same arithmetic)
            st.l[h0 + h] += psum;
            for (j, v) in acc[h].iter_mut().enumerate() {
                *v = _mm512_loadu_ps(accp.add(16 * j));
            }
        } else {
            let alpha =
                if m_old == f32::NEG_INFINITY { 0.0 } else { _mm512_cvtss_f32(exp_ps(_mm512_set1_ps(m_old - m_new))) };
            st.l[h0 + h] = st.l[h0 + h] * alpha + psum;
            st.m[h0 + h] = m_new;
            let av = _mm512_set1_ps(alpha);
            for (j, v) in acc[h].iter_mut().enumerate() {
                *v = _mm512_mul_ps(_mm512_loadu_ps(accp.add(16 * j)), av);
            }
        }
    }
    for t in 0..n {
        let mut vv = [_mm512_setzero_ps(); NV];
        for (j, v) in vv.iter_mut().enumerate() {
            *v = _mm512_cvtph_ps(_mm256_loadu_si256(c.v.add(t * hd + 16 * j) as *const __m256i));
        }
        for h in 0..G {
            let pb = _mm512_set1_ps(pa[h][t]);
            for j in 0..NV {
                acc[h][j] = _mm512_fmadd_ps(pb, vv[j], acc[h][j]);
            }
        }
    }
    let accp = st.acc.as_mut_ptr();
    for h in 0..G {
        for j in 0..NV {
            _mm512_storeu_ps(accp.add((h0 + h) * hd + 16 * j), acc[h][j]);
        }
    }
}

unsafe fn attn_wide_avx512(chunks: &[ChunkRef], qt: &[f32], nlb: usize, hd: usize, ws: &mut WideState) {
    assert!(
        qt.len() >= nlb * hd * 16 && ws.acc.len() >= nlb * hd * 16 && ws.m.len() >= nlb * 16,
        "attn_wide: short buffers"
    );
    match hd {
        16 => attn_wide_nv::<1>(chunks, qt, nlb, ws),
        32 => attn_wide_nv::<2>(chunks, qt, nlb, ws),
        64 => attn_wide_nv::<4>(chunks, qt, nlb, ws),
        128 => attn_wide_nv::<8>(chunks, qt, nlb, ws),
        // These heads' chunk kernel here is the AVX2 one: the AVX2 wide kernel's arithmetic,
        // 16 lanes at a time, gives its bits.
        256 => super::x86_wide512::attn_wide_256(chunks, qt, nlb, ws),
        _ => unreachable!("attention only selects the wide kernel for these head sizes"),
    }
}

/// Rows-in-lanes attention: 16 stacked query rows per vector, so scores for one key are
/// vectors of FMAs against broadcast K values, the softmax runs across rows, and PV
/// broadcasts V values. Per row it does exactly the arithmetic of [`attn_chunk_nv`] (the
/// `reduce16` dot-product tree over head_dim, `exp_ps`, the `sum16_tree` over the chunk's
/// probabilities, PV in key order), so a query gets the same bits from either kernel.
/// Query and state stay transposed (`[lane block][d][16]`, see [`WideState`]) across calls.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512vl,f16c,fma")]
unsafe fn attn_wide_nv<const NV: usize>(chunks: &[ChunkRef], qt: &[f32], nlb: usize, ws: &mut WideState) {
    let hd = NV * 16;
    let (mv, lv, acct) = (&mut ws.m, &mut ws.l, &mut ws.acc);
    let mut kf = [0f32; CHUNK * 128];
    let mut vf = [0f32; CHUNK * 128];
    for (ci, c) in chunks.iter().enumerate() {
        let n = c.n;
        if let Some(next) = chunks.get(ci + 1) {
            next.prefetch(hd);
        }
        for t in 0..n {
            for j in 0..NV {
                let k = _mm512_cvtph_ps(_mm256_loadu_si256(c.k.add(t * hd + 16 * j) as *const __m256i));
                _mm512_storeu_ps(kf.as_mut_ptr().add(t * hd + 16 * j), k);
                let v = _mm512_cvtph_ps(_mm256_loadu_si256(c.v.add(t * hd + 16 * j) as *const __m256i));
                _mm512_storeu_ps(vf.as_mut_ptr().add(t * hd + 16 * j), v);
            }
        }
        for lb in 0..nlb {
            let qp = qt.as_ptr().add(lb * hd * 16);
            let ap = acct.as_mut_ptr().add(lb * hd * 16);
            let mut s = [_mm512_setzero_ps(); CHUNK];
            let mut t0 = 0;
            while t0 < n {
                // keys t0..t0+4 (rows past n hold finite stale values and are ignored)
                let sc = scores4::<NV>(qp, kf.as_ptr().add(t0 * hd));
                for u in 0..4 {
                    if t0 + u < n {
                        s[t0 + u] = sc[u];
                    }
                }
                t0 += 4;
            }
            let m_old = _mm512_loadu_ps(mv.as_ptr().add(lb * 16));
            let mut mx = s[0];
            for t in 1..n {
                mx = _mm512_max_ps(mx, s[t]);
            }
            let m_new = _mm512_max_ps(m_old, mx);
            let mut l = _mm512_loadu_ps(lv.as_ptr().add(lb * 16));
            if _mm512_cmp_ps_mask::<_CMP_NEQ_OQ>(m_new, m_old) != 0
                || _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(m_old, m_old) != 0
            {
                // lanes whose max did not move get alpha = exp_ps(0) = 1 exactly
                let alpha = exp_ps(_mm512_sub_ps(m_old, m_new));
                // a lane still at -inf has nothing accumulated yet
                let alpha = _mm512_mask_mov_ps(
                    alpha,
                    _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(m_old, _mm512_set1_ps(f32::NEG_INFINITY)),
                    _mm512_setzero_ps(),
                );
                l = _mm512_mul_ps(l, alpha);
                for d in 0..hd {
                    _mm512_storeu_ps(ap.add(d * 16), _mm512_mul_ps(_mm512_loadu_ps(ap.add(d * 16)), alpha));
                }
                _mm512_storeu_ps(mv.as_mut_ptr().add(lb * 16), m_new);
            }
            let mut p = [_mm512_setzero_ps(); CHUNK];
            for t in 0..n {
                p[t] = exp_ps(_mm512_sub_ps(s[t], m_new));
            }
            // sum16_tree's order over keys: (t, t+8), (t, t+4), (t, t+2), (t, t+1)
            let mut h8 = [_mm512_setzero_ps(); 8];
            for t in 0..8 {
                h8[t] = _mm512_add_ps(p[t], p[t + 8]);
            }
            let mut h4 = [_mm512_setzero_ps(); 4];
            for t in 0..4 {
                h4[t] = _mm512_add_ps(h8[t], h8[t + 4]);
            }
            let h2 = [_mm512_add_ps(h4[0], h4[2]), _mm512_add_ps(h4[1], h4[3])];
            l = _mm512_add_ps(l, _mm512_add_ps(h2[0], h2[1]));
            _mm512_storeu_ps(lv.as_mut_ptr().add(lb * 16), l);
            pv_lane_block::<NV>(ap, &p, &vf, n);
        }
    }
}

/// PV of one lane block of 16 rows-in-lanes (`acc` at `ap`: `[d][16]`): 16 dims at a time in
/// registers, keys in order, `p[t]` the rows' probabilities of key `t` and `vf` the keys' V
/// rows (`NV * 16` values each).
#[allow(clippy::needless_range_loop)] // register arrays indexed by dim read clearer
#[inline]
#[target_feature(enable = "avx512f,fma")]
pub(super) unsafe fn pv_lane_block<const NV: usize>(ap: *mut f32, p: &[__m512; CHUNK], vf: &[f32], n: usize) {
    let hd = NV * 16;
    for db in 0..NV {
        let mut acc = [_mm512_setzero_ps(); 16];
        for k in 0..16 {
            acc[k] = _mm512_loadu_ps(ap.add((db * 16 + k) * 16));
        }
        for t in 0..n {
            for k in 0..16 {
                acc[k] = _mm512_fmadd_ps(p[t], _mm512_set1_ps(vf[t * hd + db * 16 + k]), acc[k]);
            }
        }
        for k in 0..16 {
            _mm512_storeu_ps(ap.add((db * 16 + k) * 16), acc[k]);
        }
    }
}

type Vec4 = [__m512; 4];

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn add4(a: Vec4, b: Vec4) -> Vec4 {
    [_mm512_add_ps(a[0], b[0]), _mm512_add_ps(a[1], b[1]), _mm512_add_ps(a[2], b[2]), _mm512_add_ps(a[3], b[3])]
}

/// For 4 keys (f32 rows at `kp`, stride NV*16) and 16 transposed query rows (`qp`: `[d][16]`):
/// partial dot products over dims `l, l+16, ...` (a product, then FMAs in order), as lane `l`
/// of [`attn_chunk_nv`]'s per-key vector.
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn dot_part<const NV: usize>(qp: *const f32, kp: *const f32, l: usize) -> Vec4 {
    let hd = NV * 16;
    let q0 = _mm512_loadu_ps(qp.add(l * 16));
    let mut x = [_mm512_setzero_ps(); 4];
    for (u, xu) in x.iter_mut().enumerate() {
        *xu = _mm512_mul_ps(q0, _mm512_set1_ps(*kp.add(u * hd + l)));
    }
    for j in 1..NV {
        let qj = _mm512_loadu_ps(qp.add((16 * j + l) * 16));
        for (u, xu) in x.iter_mut().enumerate() {
            *xu = _mm512_fmadd_ps(qj, _mm512_set1_ps(*kp.add(u * hd + 16 * j + l)), *xu);
        }
    }
    x
}

/// Scores of 4 keys for 16 query rows, summing the 16 partials in [`reduce16`]'s tree.
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn scores4<const NV: usize>(qp: *const f32, kp: *const f32) -> Vec4 {
    macro_rules! x {
        ($l:literal) => {
            dot_part::<NV>(qp, kp, $l)
        };
    }
    // combined as soon as both halves exist, to keep few vectors live
    let y0 = add4(add4(x!(0), x!(8)), add4(x!(4), x!(12)));
    let y02 = add4(y0, add4(add4(x!(2), x!(10)), add4(x!(6), x!(14))));
    let y1 = add4(add4(x!(1), x!(9)), add4(x!(5), x!(13)));
    let y13 = add4(y1, add4(add4(x!(3), x!(11)), add4(x!(7), x!(15))));
    add4(y02, y13)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul::{QMatrix, tests::random_matrix};
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The AVX-VNNI form sums the same products exactly, as the `maddubs` form does (no i16
    /// pair can saturate for these types): the same bits, extreme codes included.
    #[test]
    fn avx_vnni_and_maddubs_packed_gemm_give_the_same_bits() {
        if !(has_avx_vnni() && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")) {
            eprintln!("skipped: this CPU has no AVX-VNNI");
            return;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for dtype in [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0] {
            let (rows, cols, m_rows) = (40, 128, 3);
            let mut data = random_matrix(&mut rng, dtype, rows, cols);
            if dtype == GgmlType::Q8_0 {
                // the extremes: -128 codes in the first block of every row
                let rb = dtype.row_bytes(cols).unwrap();
                data.chunks_exact_mut(rb).for_each(|row| row[2..34].fill(0x80));
            }
            let w = PackedMatrix::pack(&QMatrix { dtype, rows, cols, data: &data }).unwrap();
            let mut x: Vec<f32> = (0..m_rows * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
            x[..32].iter_mut().enumerate().for_each(|(i, v)| *v = if i % 2 == 0 { 1.0 } else { -1.0 });
            let a = Q8Acts::quantize(&x, m_rows, cols);
            let groups = 0..rows.div_ceil(TILE_ROWS);
            let (mut plain, mut vnni) = (vec![0f32; m_rows * rows], vec![0f32; m_rows * rows]);
            // SAFETY: AVX2, FMA, F16C and AVX-VNNI checked; each call owns its output.
            unsafe {
                packed_gemm_avx2(&w, &a, groups.clone(), OutPtr(plain.as_mut_ptr()));
                packed_gemm_avx_vnni(&w, &a, groups, OutPtr(vnni.as_mut_ptr()));
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&plain), bits(&vnni), "{dtype:?}");
        }
    }
}
