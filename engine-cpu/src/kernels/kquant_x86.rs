//! The K-quant block sums ([`super::BlockSums`]) of the file layout in AVX2: codes unpacked
//! to bytes in registers, multiplied by the activation codes with `maddubs` (u8 x i8 pairs to
//! i16; at most 2 * 63 * 127, no saturation), scaled per sub-block with `madd` (i16 pairs to
//! i32), then summed across lanes once per block. (AVX-512 CPUs use the grouped layout.)

#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use super::{BlockSums, KQuantMatrix, KQuantType, Q8KActs, RowChunks, rows_tiled, scales_mins};
use crate::kernels::matmul::OutPtr;

/// Eight u8 mins as sixteen i16 lanes, each twice (lane pairs meet the activation sums of 16).
#[inline(always)]
unsafe fn mins_pairs(mn: [u8; 8]) -> __m256i {
    let dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_loadl_epi64(mn.as_ptr() as *const __m128i), dup))
}

/// Per row, the min lanes `mins[j] * (bs[2j] + bs[2j + 1])`.
#[inline(always)]
unsafe fn min_lanes<const M: usize>(mn: [u8; 8], bs: [*const i16; M]) -> [__m256i; M] {
    let mv = mins_pairs(mn);
    let mut v = [_mm256_setzero_si256(); M];
    for r in 0..M {
        v[r] = _mm256_madd_epi16(_mm256_loadu_si256(bs[r] as *const __m256i), mv);
    }
    v
}

/// Sixteen i8 Q6_K scales as i16 lanes.
#[inline(always)]
unsafe fn q6k_scales(blk: *const u8) -> __m256i {
    _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(192) as *const __m128i))
}

/// Per row, the Q6_K min lanes `32 * (sc[2j] * bs[2j] + sc[2j + 1] * bs[2j + 1])`.
#[inline(always)]
unsafe fn offset_lanes<const M: usize>(sc: __m256i, bs: [*const i16; M]) -> [__m256i; M] {
    let mut v = [_mm256_setzero_si256(); M];
    for r in 0..M {
        v[r] = _mm256_slli_epi32::<5>(_mm256_madd_epi16(_mm256_loadu_si256(bs[r] as *const __m256i), sc));
    }
    v
}

/// The four 32-code groups of a Q6_K half `n` (positions `128n + 32k..`), codes 0..64.
#[inline(always)]
unsafe fn q6k_codes(blk: *const u8, n: usize) -> [__m256i; 4] {
    let m4 = _mm256_set1_epi8(0x0f);
    let ql0 = _mm256_loadu_si256(blk.add(64 * n) as *const __m256i);
    let ql1 = _mm256_loadu_si256(blk.add(64 * n + 32) as *const __m256i);
    let qh = _mm256_loadu_si256(blk.add(128 + 32 * n) as *const __m256i);
    // two-bit fields of qh moved to bits 4..6 (16-bit shifts; the masks keep bytes apart)
    let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)));
    let h1 = _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(0x0c)));
    let h2 = _mm256_and_si256(qh, _mm256_set1_epi8(0x30));
    let h3 = _mm256_and_si256(_mm256_srli_epi16::<2>(qh), _mm256_set1_epi8(0x30));
    [
        _mm256_or_si256(_mm256_and_si256(ql0, m4), h0),
        _mm256_or_si256(_mm256_and_si256(ql1, m4), h1),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4), h2),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4), h3),
    ]
}

/// Q4_K/Q5_K low and high 32-code groups of group `g` (sub-blocks 2g and 2g + 1).
#[inline(always)]
unsafe fn q45k_codes(qs: *const u8, qh: Option<__m256i>, g: usize) -> (__m256i, __m256i) {
    let m4 = _mm256_set1_epi8(0x0f);
    let q = _mm256_loadu_si256(qs.add(32 * g) as *const __m256i);
    let (mut lo, mut hi) = (_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4));
    if let Some(qh) = qh {
        // fifth bits 2g and 2g + 1 of each byte of qh, as 16
        let (u1, u2) = (_mm256_set1_epi8(1 << (2 * g)), _mm256_set1_epi8((2 << (2 * g)) as u8 as i8));
        let sixteen = _mm256_set1_epi8(16);
        let b1 = _mm256_cmpeq_epi8(_mm256_and_si256(qh, u1), u1);
        let b2 = _mm256_cmpeq_epi8(_mm256_and_si256(qh, u2), u2);
        lo = _mm256_or_si256(lo, _mm256_and_si256(b1, sixteen));
        hi = _mm256_or_si256(hi, _mm256_and_si256(b2, sixteen));
    }
    (lo, hi)
}

/// A block's f16 `(d, dmin)` with F16C (`dmin = d` for Q6_K, as [`super::block_scales`]).
#[inline(always)]
unsafe fn f16c_scales(dtype: KQuantType, blk: &[u8]) -> (f32, f32) {
    let at = if dtype == KQuantType::Q6K { 208 } else { 0 };
    let bits = if dtype == KQuantType::Q6K {
        u16::from_le_bytes([blk[at], blk[at + 1]]) as i32
    } else {
        i32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]])
    };
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits));
    let d = _mm_cvtss_f32(v);
    if dtype == KQuantType::Q6K { (d, d) } else { (d, _mm_cvtss_f32(_mm_shuffle_ps::<1>(v, v))) }
}

/// Eight u8 sub-block scales as i16 lanes 0..8 of both 128-bit halves.
#[inline(always)]
unsafe fn scales_i16(sc: [u8; 8]) -> __m256i {
    _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64(sc.as_ptr() as *const __m128i)))
}

/// `pshufb` indices that copy i16 lane `j` (0..8) of a 128-bit half into all eight lanes.
static SCALE_LANE: [[u8; 32]; 8] = {
    let mut t = [[0u8; 32]; 8];
    let mut j = 0;
    while j < 8 {
        let mut i = 0;
        while i < 32 {
            t[j][i] = (2 * j + i % 2) as u8;
            i += 1;
        }
        j += 1;
    }
    t
};

/// Scale `j` (0..8) of [`scales_i16`] in every i16 lane.
#[inline(always)]
unsafe fn scale_lanes(scv: __m256i, j: usize) -> __m256i {
    _mm256_shuffle_epi8(scv, _mm256_loadu_si256(SCALE_LANE[j].as_ptr() as *const __m256i))
}

/// Bytes ahead of the current block that the kernels prefetch: decode streams each weight
/// row once, and the hardware prefetcher alone leaves the integer kernels waiting on memory.
const PREFETCH_AHEAD: usize = 1024;

/// Prefetches the cache lines of the block `PREFETCH_AHEAD` bytes after `blk` (`bytes` long).
#[inline(always)]
unsafe fn prefetch_block(blk: *const u8, bytes: usize) {
    let ahead = blk.wrapping_add(PREFETCH_AHEAD) as *const i8;
    let mut at = 0;
    while at < bytes {
        // SAFETY: a prefetch never faults.
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(at));
        at += 64;
    }
}

pub(super) struct Avx2;

impl Avx2 {
    #[inline(always)]
    unsafe fn q45k<const M: usize>(
        blk: *const u8,
        fifth: bool,
        a: [*const i8; M],
        bs: [*const i16; M],
    ) -> ([__m256i; M], [__m256i; M]) {
        prefetch_block(blk, if fifth { 176 } else { 144 });
        let (sc, mn) = scales_mins(std::slice::from_raw_parts(blk.add(4), 12));
        let (qh, qs) = if fifth {
            (Some(_mm256_loadu_si256(blk.add(16) as *const __m256i)), blk.add(48))
        } else {
            (None, blk.add(16))
        };
        let scv = scales_i16(sc);
        let mut acc = [_mm256_setzero_si256(); M];
        for g in 0..4 {
            let (lo, hi) = q45k_codes(qs, qh, g);
            let (s1, s2) = (scale_lanes(scv, 2 * g), scale_lanes(scv, 2 * g + 1));
            for r in 0..M {
                let a1 = _mm256_loadu_si256(a[r].add(64 * g) as *const __m256i);
                let a2 = _mm256_loadu_si256(a[r].add(64 * g + 32) as *const __m256i);
                let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a1), s1);
                let p2 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a2), s2);
                acc[r] = _mm256_add_epi32(acc[r], _mm256_add_epi32(p1, p2));
            }
        }
        (acc, min_lanes(mn, bs))
    }
}

impl BlockSums for Avx2 {
    type Lanes = __m256i;

    #[inline(always)]
    unsafe fn total(lanes: __m256i) -> i32 {
        let t = _mm_add_epi32(_mm256_castsi256_si128(lanes), _mm256_extracti128_si256::<1>(lanes));
        let t = _mm_add_epi32(t, _mm_shuffle_epi32::<0b01_00_11_10>(t));
        _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32::<0b10_11_00_01>(t)))
    }

    #[inline(always)]
    unsafe fn scales(dtype: KQuantType, blk: &[u8]) -> (f32, f32) {
        f16c_scales(dtype, blk)
    }

    #[inline(always)]
    unsafe fn q4k<const M: usize>(
        blk: *const u8,
        a: [*const i8; M],
        bs: [*const i16; M],
    ) -> ([__m256i; M], [__m256i; M]) {
        Avx2::q45k(blk, false, a, bs)
    }

    #[inline(always)]
    unsafe fn q5k<const M: usize>(
        blk: *const u8,
        a: [*const i8; M],
        bs: [*const i16; M],
    ) -> ([__m256i; M], [__m256i; M]) {
        Avx2::q45k(blk, true, a, bs)
    }

    #[inline(always)]
    unsafe fn q6k<const M: usize>(
        blk: *const u8,
        a: [*const i8; M],
        bs: [*const i16; M],
    ) -> ([__m256i; M], [__m256i; M]) {
        prefetch_block(blk, 210);
        let sc = blk.add(192) as *const i8;
        let mut acc = [_mm256_setzero_si256(); M];
        for n in 0..2 {
            let codes = q6k_codes(blk, n);
            for (k, &q) in codes.iter().enumerate() {
                // sub-blocks of 16: lanes 0..8 of the i16 products take scale 2k, 8..16 2k + 1
                let t = 8 * n + 2 * k;
                let s = _mm256_set_m128i(_mm_set1_epi16(*sc.add(t + 1) as i16), _mm_set1_epi16(*sc.add(t) as i16));
                for r in 0..M {
                    let av = _mm256_loadu_si256(a[r].add(128 * n + 32 * k) as *const __m256i);
                    acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(_mm256_maddubs_epi16(q, av), s));
                }
            }
        }
        (acc, offset_lanes(q6k_scales(blk), bs))
    }
}

/// # Safety
/// AVX2, FMA and F16C present; the outputs of the rows in `chunks` are written by no one else.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_avx2(w: &KQuantMatrix, acts: &Q8KActs, chunks: &RowChunks, out: OutPtr) {
    while let Some(rows) = chunks.next() {
        rows_tiled::<Avx2>(w, acts, rows, out, 0)
    }
}
