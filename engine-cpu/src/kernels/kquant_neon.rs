//! The K-quant block sums ([`super::BlockSums`]) on aarch64: codes unpacked to bytes in
//! registers and multiplied by the activation codes 16 at a time into i32 lanes, either with
//! `sdot` (the dotprod extension, which Thor's cores have; inline assembly because its
//! intrinsic is unstable in Rust 1.95) or with widening multiplies and pairwise adds (plain
//! NEON). Each sub-block's lane sums are scaled as integers and summed across lanes once per
//! block, so both forms give [`super::Scalar`]'s bits.

#![allow(unsafe_op_in_unsafe_fn)]
// Register arrays are indexed by row and lane half together; ranges read clearer than zips.
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;
use std::marker::PhantomData;

use super::{BlockSums, KQuantMatrix, Q8KActs, RowChunks, rows_tiled, scales_mins};
use crate::kernels::matmul::OutPtr;

/// `acc + ` the products of 16 signed bytes, four adjacent ones per i32 lane (lane k: bytes
/// 4k..4k+4, as `sdot` sums them).
pub(super) trait Dot16 {
    unsafe fn dot(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t;
}

/// Plain NEON: `smull` to i16, then two pairwise adds into i32.
pub(super) struct Widen;

impl Dot16 for Widen {
    #[inline(always)]
    unsafe fn dot(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
        let lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(a)));
        let hi = vpaddlq_s16(vmull_high_s8(w, a));
        vaddq_s32(acc, vpaddq_s32(lo, hi))
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

/// Eight i32 lanes as two vectors (lanes 0..4, 4..8).
type Lanes = [int32x4_t; 2];

/// Per row, the min lanes `mins[k] * (bs[2k] + bs[2k + 1])`.
#[inline(always)]
unsafe fn min_lanes<const M: usize>(mn: [u8; 8], bs: [*const i16; M]) -> [Lanes; M] {
    let m16 = vmovl_u8(vld1_u8(mn.as_ptr()));
    let mins =
        [vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(m16))), vreinterpretq_s32_u32(vmovl_u16(vget_high_u16(m16)))];
    let mut v = [[vdupq_n_s32(0); 2]; M];
    for r in 0..M {
        for h in 0..2 {
            v[r][h] = vmulq_s32(mins[h], vpaddlq_s16(vld1q_s16(bs[r].add(8 * h))));
        }
    }
    v
}

/// Per row, the Q6_K min lanes `32 * (sc[2k] * bs[2k] + sc[2k + 1] * bs[2k + 1])`.
#[inline(always)]
unsafe fn offset_lanes<const M: usize>(sc: *const i8, bs: [*const i16; M]) -> [Lanes; M] {
    let sc8 = vld1q_s8(sc);
    let scales = [vmovl_s8(vget_low_s8(sc8)), vmovl_high_s8(sc8)];
    let mut v = [[vdupq_n_s32(0); 2]; M];
    for r in 0..M {
        for h in 0..2 {
            let b = vld1q_s16(bs[r].add(8 * h));
            let lo = vmull_s16(vget_low_s16(scales[h]), vget_low_s16(b));
            let hi = vmull_high_s16(scales[h], b);
            v[r][h] = vshlq_n_s32::<5>(vpaddq_s32(lo, hi));
        }
    }
    v
}

impl<D: Dot16> Neon<D> {
    #[inline(always)]
    unsafe fn q45k<const M: usize>(
        blk: *const u8,
        fifth: bool,
        a: [*const i8; M],
        bs: [*const i16; M],
    ) -> ([Lanes; M], [Lanes; M]) {
        let (sc, mn) = scales_mins(std::slice::from_raw_parts(blk.add(4), 12));
        let qs = if fifth { blk.add(48) } else { blk.add(16) };
        let m4 = vdupq_n_u8(0x0f);
        let sixteen = vdupq_n_u8(16);
        let mut acc = [[vdupq_n_s32(0); 2]; M];
        for g in 0..4 {
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
                // bytes 16c.. of sub-blocks 2g and 2g + 1: lanes 4c..4c+4
                for r in 0..M {
                    let s_lo = D::dot(vdupq_n_s32(0), lo, load_i8(a[r].add(64 * g + 16 * c)));
                    let s_hi = D::dot(vdupq_n_s32(0), hi, load_i8(a[r].add(64 * g + 32 + 16 * c)));
                    acc[r][c] = vmlaq_n_s32(acc[r][c], s_lo, sc[2 * g] as i32);
                    acc[r][c] = vmlaq_n_s32(acc[r][c], s_hi, sc[2 * g + 1] as i32);
                }
            }
        }
        (acc, min_lanes(mn, bs))
    }
}

impl<D: Dot16> BlockSums for Neon<D> {
    type Lanes = Lanes;

    #[inline(always)]
    unsafe fn total(lanes: Lanes) -> i32 {
        vaddvq_s32(vaddq_s32(lanes[0], lanes[1]))
    }

    #[inline(always)]
    unsafe fn q4k<const M: usize>(blk: *const u8, a: [*const i8; M], bs: [*const i16; M]) -> ([Lanes; M], [Lanes; M]) {
        Self::q45k(blk, false, a, bs)
    }

    #[inline(always)]
    unsafe fn q5k<const M: usize>(blk: *const u8, a: [*const i8; M], bs: [*const i16; M]) -> ([Lanes; M], [Lanes; M]) {
        Self::q45k(blk, true, a, bs)
    }

    #[inline(always)]
    unsafe fn q6k<const M: usize>(blk: *const u8, a: [*const i8; M], bs: [*const i16; M]) -> ([Lanes; M], [Lanes; M]) {
        let sc = blk.add(192) as *const i8;
        let m4 = vdupq_n_u8(0x0f);
        let m3 = vdupq_n_u8(0x03);
        let mut acc = [[vdupq_n_s32(0); 2]; M];
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
                        acc[r][c] = vmlaq_n_s32(acc[r][c], s, scale);
                    }
                }
            }
        }
        (acc, offset_lanes(sc, bs))
    }
}

/// # Safety
/// NEON present; the outputs of the rows in `chunks` are written by no one else.
#[target_feature(enable = "neon")]
pub(super) unsafe fn rows_neon(w: &KQuantMatrix, acts: &Q8KActs, chunks: &RowChunks, out: OutPtr) {
    while let Some(rows) = chunks.next() {
        rows_tiled::<Neon<Widen>>(w, acts, rows, out, 0)
    }
}

/// # Safety
/// NEON and dotprod present; otherwise as [`rows_neon`].
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn rows_neon_dotprod(w: &KQuantMatrix, acts: &Q8KActs, chunks: &RowChunks, out: OutPtr) {
    while let Some(rows) = chunks.next() {
        rows_tiled::<Neon<Sdot>>(w, acts, rows, out, 0)
    }
}
