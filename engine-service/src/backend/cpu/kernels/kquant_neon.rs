//! The K-quant block sums ([`super::BlockSums`]) on aarch64: codes unpacked to bytes in
//! registers and multiplied by the activation codes 16 at a time into i32 lanes, either with
//! `sdot` (the dotprod extension, which Thor's cores have; inline assembly because its
//! intrinsic is unstable in Rust 1.95) or with widening multiplies and pairwise adds (plain
//! NEON). Each sub-block's lane sums are scaled as integers; integer sums are exact, so both
//! give [`super::Scalar`]'s results.

#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::aarch64::*;
use std::marker::PhantomData;
use std::ops::Range;

use super::{BlockSums, KQuantMatrix, Q8KActs, rows_tiled, scales_mins};
use crate::backend::cpu::kernels::matmul::OutPtr;

/// `acc + ` the products of 16 signed bytes, summed into four i32 lanes (which lane holds
/// which products is up to the implementation).
pub(super) trait Dot16 {
    unsafe fn dot(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t;
}

/// Plain NEON: `smull` to i16, pairwise add-accumulate into i32.
pub(super) struct Widen;

impl Dot16 for Widen {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
        let lo = vmull_s8(vget_low_s8(w), vget_low_s8(a));
        let hi = vmull_high_s8(w, a);
        vpadalq_s16(vpadalq_s16(acc, lo), hi)
    }
}

/// `sdot`: four products per i32 lane in one instruction.
pub(super) struct Sdot;

impl Dot16 for Sdot {
    #[inline(always)]
    unsafe fn dot(mut acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
        std::arch::asm!(
            ".arch_extension dotprod",
            "sdot {acc:v}.4s, {w:v}.16b, {a:v}.16b",
            acc = inout(vreg) acc,
            w = in(vreg) w,
            a = in(vreg) a,
            options(pure, nomem, nostack),
        );
        acc
    }
}

pub(super) struct Neon<D>(PhantomData<D>);

#[inline(always)]
unsafe fn load_i8(p: *const i8) -> int8x16_t {
    vld1q_s8(p)
}

/// `sum_j mins[j] * (bs[2j] + bs[2j + 1])` per row.
#[inline(always)]
fn min_sums<const M: usize>(mn: [u8; 8], bs: [*const i16; M]) -> [i32; M] {
    let mut sums = [0i32; M];
    for r in 0..M {
        for j in 0..8 {
            // SAFETY: the caller's block holds 16 sums.
            let (a, b) = unsafe { (*bs[r].add(2 * j), *bs[r].add(2 * j + 1)) };
            sums[r] += mn[j] as i32 * (a as i32 + b as i32);
        }
    }
    sums
}

impl<D: Dot16> Neon<D> {
    #[inline(always)]
    unsafe fn q45k<const M: usize>(
        blk: *const u8,
        fifth: bool,
        a: [*const i8; M],
        bs: [*const i16; M],
    ) -> ([i32; M], [i32; M]) {
        let (sc, mn) = scales_mins(std::slice::from_raw_parts(blk.add(4), 12));
        let qs = if fifth { blk.add(48) } else { blk.add(16) };
        let m4 = vdupq_n_u8(0x0f);
        let sixteen = vdupq_n_u8(16);
        let mut acc = [vdupq_n_s32(0); M];
        for g in 0..4 {
            let mut s_lo = [vdupq_n_s32(0); M];
            let mut s_hi = [vdupq_n_s32(0); M];
            for c in 0..2 {
                let q = vld1q_u8(qs.add(32 * g + 16 * c));
                let (mut lo, mut hi) = (vandq_u8(q, m4), vshrq_n_u8::<4>(q));
                if fifth {
                    // bits 2g and 2g + 1 of qh moved to bit 4 (negative counts shift right)
                    let qh = vld1q_u8(blk.add(16 + 16 * c));
                    let to_lo = vdupq_n_s8(4 - 2 * g as i8);
                    let to_hi = vdupq_n_s8(3 - 2 * g as i8);
                    lo = vorrq_u8(lo, vandq_u8(vshlq_u8(qh, to_lo), sixteen));
                    hi = vorrq_u8(hi, vandq_u8(vshlq_u8(qh, to_hi), sixteen));
                }
                let (lo, hi) = (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi));
                for r in 0..M {
                    s_lo[r] = D::dot(s_lo[r], lo, load_i8(a[r].add(64 * g + 16 * c)));
                    s_hi[r] = D::dot(s_hi[r], hi, load_i8(a[r].add(64 * g + 32 + 16 * c)));
                }
            }
            for r in 0..M {
                acc[r] = vmlaq_n_s32(acc[r], s_lo[r], sc[2 * g] as i32);
                acc[r] = vmlaq_n_s32(acc[r], s_hi[r], sc[2 * g + 1] as i32);
            }
        }
        let mut si = [0i32; M];
        for r in 0..M {
            si[r] = vaddvq_s32(acc[r]);
        }
        (si, min_sums(mn, bs))
    }
}

impl<D: Dot16> BlockSums for Neon<D> {
    #[inline(always)]
    unsafe fn q4k<const M: usize>(blk: *const u8, a: [*const i8; M], bs: [*const i16; M]) -> ([i32; M], [i32; M]) {
        Self::q45k(blk, false, a, bs)
    }

    #[inline(always)]
    unsafe fn q5k<const M: usize>(blk: *const u8, a: [*const i8; M], bs: [*const i16; M]) -> ([i32; M], [i32; M]) {
        Self::q45k(blk, true, a, bs)
    }

    #[inline(always)]
    unsafe fn q6k<const M: usize>(blk: *const u8, a: [*const i8; M], bs: [*const i16; M]) -> ([i32; M], [i32; M]) {
        let sc = blk.add(192) as *const i8;
        let m4 = vdupq_n_u8(0x0f);
        let m3 = vdupq_n_u8(0x03);
        let mut acc = [vdupq_n_s32(0); M];
        for n in 0..2 {
            for c in 0..2 {
                let ql0 = vld1q_u8(blk.add(64 * n + 16 * c));
                let ql1 = vld1q_u8(blk.add(64 * n + 32 + 16 * c));
                let qh = vld1q_u8(blk.add(128 + 32 * n + 16 * c));
                // codes 0..64 at positions 128n + 32k + 16c..: sub-block 8n + 2k + c
                let codes = [
                    vorrq_u8(vandq_u8(ql0, m4), vshlq_n_u8::<4>(vandq_u8(qh, m3))),
                    vorrq_u8(vandq_u8(ql1, m4), vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(qh), m3))),
                    vorrq_u8(vshrq_n_u8::<4>(ql0), vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<4>(qh), m3))),
                    vorrq_u8(vshrq_n_u8::<4>(ql1), vshlq_n_u8::<4>(vshrq_n_u8::<6>(qh))),
                ];
                for (k, &q) in codes.iter().enumerate() {
                    let q = vreinterpretq_s8_u8(q);
                    let scale = *sc.add(8 * n + 2 * k + c) as i32;
                    for r in 0..M {
                        let s = D::dot(vdupq_n_s32(0), q, load_i8(a[r].add(128 * n + 32 * k + 16 * c)));
                        acc[r] = vmlaq_n_s32(acc[r], s, scale);
                    }
                }
            }
        }
        let mut si = [0i32; M];
        for r in 0..M {
            let mut offset = 0i32;
            for t in 0..16 {
                offset += *sc.add(t) as i32 * *bs[r].add(t) as i32;
            }
            si[r] = vaddvq_s32(acc[r]) - 32 * offset;
        }
        (si, [0; M])
    }
}

/// # Safety
/// NEON present; the caller owns outputs `rows` of every activation row.
#[target_feature(enable = "neon")]
pub(super) unsafe fn rows_neon(w: &KQuantMatrix, acts: &Q8KActs, rows: Range<usize>, out: OutPtr) {
    rows_tiled::<Neon<Widen>>(w, acts, rows, out)
}

/// # Safety
/// NEON and dotprod present; otherwise as [`rows_neon`].
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn rows_neon_dotprod(w: &KQuantMatrix, acts: &Q8KActs, rows: Range<usize>, out: OutPtr) {
    rows_tiled::<Neon<Sdot>>(w, acts, rows, out)
}
