//! The K-quant block sums ([`super::BlockSums`]) in AVX2 and AVX-512BW: codes unpacked to
//! bytes in registers, multiplied by the activation codes with `maddubs` (u8 x i8 pairs to
//! i16; at most 2 * 63 * 127, no saturation), scaled per sub-block with `madd` (i16 pairs to
//! i32): i32 lane k of a 32-code run holds its bytes 4k..4k+4, the layout [`super::BlockSums`]
//! asks for (AVX-512 folds its upper eight lanes onto the lower ones). Block scales are applied
//! lane-wise with FMA; lanes meet once per row.

#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use super::{BSUM_VALUES, BlockSums, KQuantMatrix, KQuantType, Q8KActs, QK_K, RowChunks, rows_tiled, scales_mins};
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

/// `fma(dd, codes, acc)` then `fma(-dm, mins, acc)` in eight f32 lanes.
#[inline(always)]
unsafe fn accumulate8(acc: __m256, dd: f32, dm: f32, codes: __m256i, mins: __m256i) -> __m256 {
    let acc = _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(codes), acc);
    _mm256_fmadd_ps(_mm256_set1_ps(-dm), _mm256_cvtepi32_ps(mins), acc)
}

/// `(t0 + t2) + (t1 + t3)` with `t[k] = acc[k] + acc[k + 4]`.
#[inline(always)]
unsafe fn reduce8(acc: __m256) -> f32 {
    let t = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
    let u = _mm_add_ps(t, _mm_shuffle_ps::<0b01_00_11_10>(t, t));
    _mm_cvtss_f32(_mm_add_ss(u, _mm_shuffle_ps::<0b01>(u, u)))
}

/// A 512-bit accumulator folded to 256 bits (exact).
#[inline(always)]
unsafe fn fold512(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
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
    type Acc = __m256;

    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }

    #[inline(always)]
    unsafe fn accumulate(acc: __m256, dd: f32, dm: f32, codes: __m256i, mins: __m256i) -> __m256 {
        accumulate8(acc, dd, dm, codes, mins)
    }

    #[inline(always)]
    unsafe fn reduce(acc: __m256) -> f32 {
        reduce8(acc)
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

/// AVX-512BW; with `VNNI`, `vpdpwssd` does the scale multiply-add in one instruction (the same
/// exact integers as `madd` then `add`).
pub(super) struct Avx512<const VNNI: bool>;

/// `acc + madd(products, scales)`.
#[inline(always)]
unsafe fn madd_add<const VNNI: bool>(acc: __m512i, products: __m512i, scales: __m512i) -> __m512i {
    if VNNI {
        _mm512_dpwssd_epi32(acc, products, scales)
    } else {
        _mm512_add_epi32(acc, _mm512_madd_epi16(products, scales))
    }
}

/// Two 256-bit halves as one 512-bit vector (`lo` in the low half).
#[inline(always)]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
}

/// `permutexvar` indices putting scale `2g` (of eight i16 scales) in the low 16 i16 lanes
/// and `2g + 1` in the high 16, per group `g`.
static PAIR_SCALE_INDEX: [[i16; 32]; 4] = {
    let mut t = [[0i16; 32]; 4];
    let mut g = 0;
    while g < 4 {
        let mut i = 0;
        while i < 32 {
            t[g][i] = (2 * g + i / 16) as i16;
            i += 1;
        }
        g += 1;
    }
    t
};

impl<const VNNI: bool> Avx512<VNNI> {
    /// Q4_K/Q5_K code lanes per row before folding (lane k + lane k + 8 is code lane k) and
    /// min lanes. Each group's 32 bytes are broadcast to both halves and shifted by 0 (low
    /// nibbles: sub-block 2g) or 4 (high: 2g + 1), matching 64 activation codes in order.
    #[inline(always)]
    unsafe fn q45k_raw<const M: usize>(
        blk: *const u8,
        fifth: bool,
        a: [*const i8; M],
        bs: [*const i16; M],
    ) -> ([__m512i; M], [__m256i; M]) {
        prefetch_block(blk, if fifth { 176 } else { 144 });
        let (sc, mn) = scales_mins(std::slice::from_raw_parts(blk.add(4), 12));
        let qs = if fifth { blk.add(48) } else { blk.add(16) };
        let qh = if fifth {
            _mm512_broadcast_i64x4(_mm256_loadu_si256(blk.add(16) as *const __m256i))
        } else {
            _mm512_setzero_si512()
        };
        let scv = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_loadl_epi64(sc.as_ptr() as *const __m128i)));
        let m4 = _mm512_set1_epi8(0x0f);
        let shifts = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi16(4));
        let mut acc = [_mm512_setzero_si512(); M];
        for (g, index) in PAIR_SCALE_INDEX.iter().enumerate() {
            let q = _mm512_broadcast_i64x4(_mm256_loadu_si256(qs.add(32 * g) as *const __m256i));
            let mut w = _mm512_and_si512(_mm512_srlv_epi16(q, shifts), m4);
            if fifth {
                // fifth bit 2g of each qh byte for the low half, 2g + 1 for the high half
                let bits = _mm512_inserti64x4::<1>(
                    _mm512_set1_epi8((1u8 << (2 * g)) as i8),
                    _mm256_set1_epi8((2u8 << (2 * g)) as i8),
                );
                let has = _mm512_test_epi8_mask(qh, bits);
                w = _mm512_mask_add_epi8(w, has, w, _mm512_set1_epi8(16));
            }
            let idx = _mm512_loadu_si512(index.as_ptr() as *const __m512i);
            let s = _mm512_permutexvar_epi16(idx, scv);
            for r in 0..M {
                let av = _mm512_loadu_si512(a[r].add(64 * g) as *const __m512i);
                acc[r] = madd_add::<VNNI>(acc[r], _mm512_maddubs_epi16(w, av), s);
            }
        }
        (acc, min_lanes(mn, bs))
    }

    /// Q6_K code lanes per row before folding, and min lanes.
    #[inline(always)]
    unsafe fn q6k_raw<const M: usize>(
        blk: *const u8,
        a: [*const i8; M],
        bs: [*const i16; M],
    ) -> ([__m512i; M], [__m256i; M]) {
        prefetch_block(blk, 210);
        let scales = q6k_scales(blk);
        let sc512 = _mm512_castsi256_si512(scales);
        let mut acc = [_mm512_setzero_si512(); M];
        for n in 0..2 {
            let [q1, q2, q3, q4] = q6k_codes(blk, n);
            for (h, w) in [join(q1, q2), join(q3, q4)].into_iter().enumerate() {
                // 64 codes = four sub-blocks of 16 = four runs of 8 i16 lanes
                let t = (8 * n + 4 * h) as i16;
                let lanes: [i16; 32] = std::array::from_fn(|i| t + (i / 8) as i16);
                let idx = _mm512_loadu_si512(lanes.as_ptr() as *const __m512i);
                let s = _mm512_permutexvar_epi16(idx, sc512);
                for r in 0..M {
                    let av = _mm512_loadu_si512(a[r].add(128 * n + 64 * h) as *const __m512i);
                    acc[r] = madd_add::<VNNI>(acc[r], _mm512_maddubs_epi16(w, av), s);
                }
            }
        }
        (acc, offset_lanes(scales, bs))
    }

    #[inline(always)]
    unsafe fn folded<const M: usize>(raw: ([__m512i; M], [__m256i; M])) -> ([__m256i; M], [__m256i; M]) {
        let mut folded = [_mm256_setzero_si256(); M];
        for (f, &v) in folded.iter_mut().zip(&raw.0) {
            *f = fold512(v);
        }
        (folded, raw.1)
    }

    /// Dot products of weight row `o` with the `M` (even) activation rows of one tile: the
    /// float stage two rows per vector (`[row r | row r + 1]`). The tile's codes and sums come
    /// packed block-major (`qs[b][r][256]`, `bsums[b][r][16]`, see [`PackedTiles`]), so every
    /// row is a constant offset from one pointer; `da2[b * M / 2 + p]` holds the scales of
    /// rows `2p`, `2p + 1` at block `b` (eight lanes each).
    #[inline(always)]
    unsafe fn tile<const M: usize>(
        w: &KQuantMatrix,
        o: usize,
        qs: *const i8,
        bsums: *const i16,
        da2: &[__m512],
    ) -> [f32; M] {
        let (nb, bb) = (w.cols / QK_K, w.dtype.block_bytes());
        let row = w.bytes().as_ptr().add(o * nb * bb);
        let sums = QK_K / BSUM_VALUES;
        let mut acc2 = [_mm512_setzero_ps(); M];
        for b in 0..nb {
            let blk = row.add(b * bb);
            let (qb, sb) = (qs.add(b * M * QK_K), bsums.add(b * M * sums));
            let a: [*const i8; M] = std::array::from_fn(|r| qb.add(r * QK_K));
            let bs: [*const i16; M] = std::array::from_fn(|r| sb.add(r * sums));
            let (codes, mins) = match w.dtype {
                KQuantType::Q4K => Self::q45k_raw::<M>(blk, false, a, bs),
                KQuantType::Q5K => Self::q45k_raw::<M>(blk, true, a, bs),
                KQuantType::Q6K => Self::q6k_raw::<M>(blk, a, bs),
            };
            let (d, dmin) = f16c_scales(w.dtype, std::slice::from_raw_parts(blk, bb));
            let (vd, vm) = (_mm512_set1_ps(d), _mm512_set1_ps(-dmin));
            for p in 0..M / 2 {
                let (c0, c1) = (codes[2 * p], codes[2 * p + 1]);
                let lanes = _mm512_add_epi32(
                    _mm512_shuffle_i64x2::<0b01_00_01_00>(c0, c1),
                    _mm512_shuffle_i64x2::<0b11_10_11_10>(c0, c1),
                );
                let min_lanes = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(mins[2 * p]), mins[2 * p + 1]);
                let da = da2[b * (M / 2) + p];
                acc2[p] = _mm512_fmadd_ps(_mm512_mul_ps(vd, da), _mm512_cvtepi32_ps(lanes), acc2[p]);
                acc2[p] = _mm512_fmadd_ps(_mm512_mul_ps(vm, da), _mm512_cvtepi32_ps(min_lanes), acc2[p]);
            }
        }
        let mut out = [0f32; M];
        for p in 0..M / 2 {
            out[2 * p] = reduce8(_mm512_castps512_ps256(acc2[p]));
            out[2 * p + 1] = reduce8(_mm256_castsi256_ps(_mm512_extracti64x4_epi64::<1>(_mm512_castps_si512(acc2[p]))));
        }
        out
    }
}

impl<const VNNI: bool> BlockSums for Avx512<VNNI> {
    type Lanes = __m256i;
    type Acc = __m256;

    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }

    #[inline(always)]
    unsafe fn accumulate(acc: __m256, dd: f32, dm: f32, codes: __m256i, mins: __m256i) -> __m256 {
        accumulate8(acc, dd, dm, codes, mins)
    }

    #[inline(always)]
    unsafe fn reduce(acc: __m256) -> f32 {
        reduce8(acc)
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
        Self::folded(Self::q45k_raw(blk, false, a, bs))
    }

    #[inline(always)]
    unsafe fn q5k<const M: usize>(
        blk: *const u8,
        a: [*const i8; M],
        bs: [*const i16; M],
    ) -> ([__m256i; M], [__m256i; M]) {
        Self::folded(Self::q45k_raw(blk, true, a, bs))
    }

    #[inline(always)]
    unsafe fn q6k<const M: usize>(
        blk: *const u8,
        a: [*const i8; M],
        bs: [*const i16; M],
    ) -> ([__m256i; M], [__m256i; M]) {
        Self::folded(Self::q6k_raw(blk, a, bs))
    }
}

/// Activation tiles of `M` rows, each block-major: `qs[t][b][r][256]`, `bsums[t][b][r][16]`.
/// Each thread packs its own copy (a few hundred KiB at most, against a GEMM over them).
struct PackedTiles {
    qs: Vec<i8>,
    bsums: Vec<i16>,
    tile_codes: usize,
    tile_sums: usize,
}

impl PackedTiles {
    fn new<const M: usize>(acts: &Q8KActs, tiles: usize) -> PackedTiles {
        let (cols, nb) = (acts.cols, acts.cols / QK_K);
        let sums = QK_K / BSUM_VALUES;
        let (tile_codes, tile_sums) = (M * cols, M * nb * sums);
        let mut qs = vec![0i8; tiles * tile_codes];
        let mut bsums = vec![0i16; tiles * tile_sums];
        for t in 0..tiles {
            for b in 0..nb {
                for r in 0..M {
                    let m = t * M + r;
                    let dst = t * tile_codes + (b * M + r) * QK_K;
                    qs[dst..dst + QK_K].copy_from_slice(&acts.qs[m * cols + b * QK_K..][..QK_K]);
                    let dst = t * tile_sums + (b * M + r) * sums;
                    bsums[dst..dst + sums].copy_from_slice(&acts.bsums[m * nb * sums + b * sums..][..sums]);
                }
            }
        }
        PackedTiles { qs, bsums, tile_codes, tile_sums }
    }

    fn tile(&self, t: usize) -> (*const i8, *const i16) {
        (self.qs[t * self.tile_codes..].as_ptr(), self.bsums[t * self.tile_sums..].as_ptr())
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

/// # Safety
/// AVX-512F and BW present; otherwise as [`rows_avx2`].
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(super) unsafe fn rows_avx512(w: &KQuantMatrix, acts: &Q8KActs, chunks: &RowChunks, out: OutPtr) {
    rows_avx512_with::<false>(w, acts, chunks, out)
}

/// # Safety
/// AVX-512 VNNI present; otherwise as [`rows_avx512`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows_avx512_vnni(w: &KQuantMatrix, acts: &Q8KActs, chunks: &RowChunks, out: OutPtr) {
    rows_avx512_with::<true>(w, acts, chunks, out)
}

#[inline(always)]
unsafe fn rows_avx512_with<const VNNI: bool>(w: &KQuantMatrix, acts: &Q8KActs, chunks: &RowChunks, out: OutPtr) {
    // Tiles of eight activation rows (the weight unpacking shared by eight), then the rest
    // through the generic path. The activation scales, as the float stage wants them, once.
    const M: usize = 8;
    let (nb, m_rows) = (w.cols / QK_K, acts.m_rows);
    let tiles = m_rows / M;
    let packed = PackedTiles::new::<M>(acts, tiles);
    let da2: Vec<__m512> = (0..tiles * nb * M / 2)
        .map(|i| {
            let (t, rest) = (i / (nb * M / 2), i % (nb * M / 2));
            let (b, p) = (rest / (M / 2), rest % (M / 2));
            let m = t * M + 2 * p;
            let lo = _mm256_set1_ps(acts.d[m * nb + b]);
            let hi = _mm256_set1_ps(acts.d[(m + 1) * nb + b]);
            _mm512_castsi512_ps(_mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_castps_si256(lo)),
                _mm256_castps_si256(hi),
            ))
        })
        .collect();
    // Chunks are at most a cache tile of weight rows: every activation tile passes over it.
    while let Some(rows) = chunks.next() {
        for t in 0..tiles {
            let m0 = t * M;
            let da = &da2[t * nb * M / 2..(t + 1) * nb * M / 2];
            let (qs, bsums) = packed.tile(t);
            for o in rows.clone() {
                let dots = Avx512::<VNNI>::tile::<M>(w, o, qs, bsums, da);
                for (r, v) in dots.into_iter().enumerate() {
                    *out.0.add((m0 + r) * w.rows + o) = v;
                }
            }
        }
        if tiles * M < m_rows {
            rows_tiled::<Avx512<VNNI>>(w, acts, rows, out, tiles * M)
        }
    }
}
