//! Fused decode kernels for Q4_K and Q6_K (one activation row): each group of 16 weights is
//! dequantized in registers with exactly the reference's operations (`d1 * q - m1` as a
//! multiply then a subtract for Q4_K, `(d * scale) * q` for Q6_K; no fused rounding) and
//! multiplied into the row's 16-lane accumulator in column order, then reduced as
//! [`crate::backend::cpu::kernels::floatmm::reduce`] does: the bits of the panel path (dequantize, then the float
//! kernels), without the round trip through an f32 scratch.
//!
//! AVX-512: one 16-lane vector per group. AVX2: two 8-lane halves (lanes 0..8 and 8..16 of
//! the float kernels' accumulator).

#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::{KQuantMatrix, KQuantType, QK_K, scale_min};
use crate::backend::cpu::kernels::floatmm::reduce;
use crate::backend::cpu::kernels::matmul::OutPtr;

/// Weight rows per tile (independent accumulators in flight).
const R: usize = 4;

fn half_at(b: *const u8) -> f32 {
    // SAFETY: the caller points at two readable bytes.
    half::f16::from_bits(u16::from_le_bytes(unsafe { [*b, *b.add(1)] })).to_f32()
}

/// One 16-value group as f32 lanes, from 16 codes (`u8` in the low bits of each i32 lane).
trait Lanes: Copy {
    unsafe fn zero() -> Self;
    /// `(scale * codes) - offset` per lane, codes from 16 bytes.
    unsafe fn affine(codes: __m128i, scale: f32, offset: f32) -> Self;
    /// `scale * codes` per lane, codes signed bytes.
    unsafe fn scaled_i8(codes: __m128i, scale: f32) -> Self;
    /// `acc + w * x[0..16]`, fused.
    unsafe fn fma(self, w: Self, x: *const f32) -> Self;
    unsafe fn store(self, out: &mut [f32; 16]);
}

#[derive(Clone, Copy)]
struct V512(__m512);

impl Lanes for V512 {
    #[inline(always)]
    unsafe fn zero() -> Self {
        V512(_mm512_setzero_ps())
    }
    #[inline(always)]
    unsafe fn affine(codes: __m128i, scale: f32, offset: f32) -> Self {
        let q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(codes));
        V512(_mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(scale), q), _mm512_set1_ps(offset)))
    }
    #[inline(always)]
    unsafe fn scaled_i8(codes: __m128i, scale: f32) -> Self {
        let q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes));
        V512(_mm512_mul_ps(_mm512_set1_ps(scale), q))
    }
    #[inline(always)]
    unsafe fn fma(self, w: Self, x: *const f32) -> Self {
        V512(_mm512_fmadd_ps(w.0, _mm512_loadu_ps(x), self.0))
    }
    #[inline(always)]
    unsafe fn store(self, out: &mut [f32; 16]) {
        _mm512_storeu_ps(out.as_mut_ptr(), self.0)
    }
}

#[derive(Clone, Copy)]
struct V256([__m256; 2]);

impl Lanes for V256 {
    #[inline(always)]
    unsafe fn zero() -> Self {
        V256([_mm256_setzero_ps(); 2])
    }
    #[inline(always)]
    unsafe fn affine(codes: __m128i, scale: f32, offset: f32) -> Self {
        let (s, o) = (_mm256_set1_ps(scale), _mm256_set1_ps(offset));
        let lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes));
        let hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128::<8>(codes)));
        V256([_mm256_sub_ps(_mm256_mul_ps(s, lo), o), _mm256_sub_ps(_mm256_mul_ps(s, hi), o)])
    }
    #[inline(always)]
    unsafe fn scaled_i8(codes: __m128i, scale: f32) -> Self {
        let s = _mm256_set1_ps(scale);
        let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes));
        let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(codes)));
        V256([_mm256_mul_ps(s, lo), _mm256_mul_ps(s, hi)])
    }
    #[inline(always)]
    unsafe fn fma(self, w: Self, x: *const f32) -> Self {
        V256([
            _mm256_fmadd_ps(w.0[0], _mm256_loadu_ps(x), self.0[0]),
            _mm256_fmadd_ps(w.0[1], _mm256_loadu_ps(x.add(8)), self.0[1]),
        ])
    }
    #[inline(always)]
    unsafe fn store(self, out: &mut [f32; 16]) {
        _mm256_storeu_ps(out.as_mut_ptr(), self.0[0]);
        _mm256_storeu_ps(out.as_mut_ptr().add(8), self.0[1]);
    }
}

/// One Q4_K super-block of row `blk` into `acc` against `x` (the block's 256 activations).
#[inline(always)]
unsafe fn q4k_block<L: Lanes>(blk: *const u8, x: *const f32, mut acc: L) -> L {
    let (d, dmin) = (half_at(blk), half_at(blk.add(2)));
    let scales = std::slice::from_raw_parts(blk.add(4), 12);
    let qs = blk.add(16);
    let mask = _mm_set1_epi8(0x0f);
    for g in 0..4 {
        let (sc1, mn1) = scale_min(2 * g, scales);
        let (sc2, mn2) = scale_min(2 * g + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * mn1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * mn2 as f32);
        let xg = x.add(64 * g);
        let q0 = _mm_loadu_si128(qs.add(32 * g) as *const __m128i);
        let q1 = _mm_loadu_si128(qs.add(32 * g + 16) as *const __m128i);
        acc = acc.fma(L::affine(_mm_and_si128(q0, mask), d1, m1), xg);
        acc = acc.fma(L::affine(_mm_and_si128(q1, mask), d1, m1), xg.add(16));
        acc = acc.fma(L::affine(_mm_and_si128(_mm_srli_epi16::<4>(q0), mask), d2, m2), xg.add(32));
        acc = acc.fma(L::affine(_mm_and_si128(_mm_srli_epi16::<4>(q1), mask), d2, m2), xg.add(48));
    }
    acc
}

/// One Q6_K super-block (see [`q4k_block`]).
#[allow(clippy::needless_range_loop)] // the four code vectors indexed by part and half read clearer
#[inline(always)]
unsafe fn q6k_block<L: Lanes>(blk: *const u8, x: *const f32, mut acc: L) -> L {
    let d = half_at(blk.add(208));
    let mask4 = _mm_set1_epi8(0x0f);
    let mask2 = _mm_set1_epi8(3);
    let bias = _mm_set1_epi8(32);
    for n in 0..2 {
        let ql = blk.add(64 * n);
        let qh = blk.add(128 + 32 * n);
        let sc = blk.add(192 + 8 * n) as *const i8;
        let xn = x.add(128 * n);
        let mut codes = [[_mm_setzero_si128(); 2]; 4];
        for c in 0..2 {
            let a = _mm_loadu_si128(ql.add(16 * c) as *const __m128i);
            let b = _mm_loadu_si128(ql.add(32 + 16 * c) as *const __m128i);
            let h = _mm_loadu_si128(qh.add(16 * c) as *const __m128i);
            // 2-bit fields of h moved to bits 4..6 (16-bit shifts, then masks per byte)
            let h0 = _mm_slli_epi16::<4>(_mm_and_si128(h, mask2));
            let h1 = _mm_slli_epi16::<2>(_mm_and_si128(h, _mm_set1_epi8(0x0c)));
            let h2 = _mm_and_si128(h, _mm_set1_epi8(0x30));
            let h3 = _mm_and_si128(_mm_srli_epi16::<2>(h), _mm_set1_epi8(0x30));
            codes[0][c] = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(a, mask4), h0), bias);
            codes[1][c] = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(b, mask4), h1), bias);
            codes[2][c] = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(_mm_srli_epi16::<4>(a), mask4), h2), bias);
            codes[3][c] = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(_mm_srli_epi16::<4>(b), mask4), h3), bias);
        }
        for (part, pc) in codes.iter().enumerate() {
            for (c, &q) in pc.iter().enumerate() {
                let scale = d * *sc.add(2 * part + c) as f32;
                acc = acc.fma(L::scaled_i8(q, scale), xn.add(32 * part + 16 * c));
            }
        }
    }
    acc
}

#[inline(always)]
unsafe fn rows_fused<L: Lanes>(w: &KQuantMatrix, x: &[f32], rows: Range<usize>, out: OutPtr) {
    let nb = w.cols / QK_K;
    let bb = w.dtype.block_bytes();
    let data = w.bytes().as_ptr();
    let mut o = rows.start;
    while o < rows.end {
        let r = R.min(rows.end - o);
        let mut acc = [L::zero(); R];
        for b in 0..nb {
            let xb = x.as_ptr().add(b * QK_K);
            for (j, a) in acc.iter_mut().enumerate().take(r) {
                let blk = data.add(((o + j) * nb + b) * bb);
                // the next rows' blocks: this tile reads R streams
                _mm_prefetch::<_MM_HINT_T0>((blk as *const i8).wrapping_add(2048));
                *a = match w.dtype {
                    KQuantType::Q4K => q4k_block(blk, xb, *a),
                    KQuantType::Q6K => q6k_block(blk, xb, *a),
                    KQuantType::Q5K => unreachable!("Q5_K takes the panel path"),
                };
            }
        }
        for (j, a) in acc.iter().enumerate().take(r) {
            let mut lanes = [0f32; 16];
            a.store(&mut lanes);
            *out.0.add(o + j) = reduce(&lanes);
        }
        o += r;
    }
}

/// # Safety
/// AVX-512F present; `w.dtype` is Q4_K or Q6_K; the caller owns outputs `rows` of its one
/// activation row `x`.
#[target_feature(enable = "avx512f,avx512bw,fma")]
pub(super) unsafe fn rows_avx512(w: &KQuantMatrix, x: &[f32], rows: Range<usize>, out: OutPtr) {
    rows_fused::<V512>(w, x, rows, out)
}

/// # Safety
/// AVX2 and FMA present; otherwise as [`rows_avx512`].
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn rows_avx2(w: &KQuantMatrix, x: &[f32], rows: Range<usize>, out: OutPtr) {
    rows_fused::<V256>(w, x, rows, out)
}
