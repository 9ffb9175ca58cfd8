//! The grouped-layout K-quant kernels in AVX-512 (`super` has the layout): per group-block,
//! each 64-byte code vector is unpacked to bytes once and multiplied against every activation
//! row of a tile with its four codes broadcast: `vpdpbusd` with VNNI, `maddubs` + `madd` (no
//! saturation: at most 2 * 63 * 127 per pair) without. Per sub-block the sixteen row sums are
//! scaled with `vpmulld`; the min sums come from `madd` of the rows' min pairs and the
//! activation sums; the float stage runs sixteen rows per vector.

#![allow(unsafe_op_in_unsafe_fn)]
// Register arrays are indexed by activation row across several arrays at once.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::super::{KQuantMatrix, KQuantType, Q8KActs, QK_K, RowChunks};
use super::{
    GROUP_ROWS, Q5_FIFTH, Q6_CODES, Q6_SCALES, Q6_SUB_BYTES, Q45_CODES, Q45_MINS, Q45_SCALES, group_block_bytes,
};
use crate::kernels::matmul::OutPtr;

/// The two integer products the kernels need.
trait Dot4 {
    /// `acc + ` per i32 lane the sum of four u8 x i8 products.
    unsafe fn dpbusd(acc: __m512i, w: __m512i, a: __m512i) -> __m512i;
    /// `acc + ` per i32 lane the sum of two i16 x i16 products.
    unsafe fn dpwssd(acc: __m512i, x: __m512i, y: __m512i) -> __m512i;
}

/// AVX-512 VNNI: one instruction each.
struct Vnni;

impl Dot4 for Vnni {
    #[inline(always)]
    unsafe fn dpbusd(acc: __m512i, w: __m512i, a: __m512i) -> __m512i {
        _mm512_dpbusd_epi32(acc, w, a)
    }
    #[inline(always)]
    unsafe fn dpwssd(acc: __m512i, x: __m512i, y: __m512i) -> __m512i {
        _mm512_dpwssd_epi32(acc, x, y)
    }
}

/// AVX-512BW alone: the same exact integers in two and three instructions.
struct Bw;

impl Dot4 for Bw {
    #[inline(always)]
    unsafe fn dpbusd(acc: __m512i, w: __m512i, a: __m512i) -> __m512i {
        _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(w, a), _mm512_set1_epi16(1)))
    }
    #[inline(always)]
    unsafe fn dpwssd(acc: __m512i, x: __m512i, y: __m512i) -> __m512i {
        _mm512_add_epi32(acc, _mm512_madd_epi16(x, y))
    }
}

/// Four bytes at `p` in every i32 lane.
#[inline(always)]
unsafe fn bcst<T>(p: *const T) -> __m512i {
    _mm512_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

#[inline(always)]
unsafe fn load(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p as *const __m512i)
}

/// Q4_K/Q5_K: per activation row, the sixteen rows' `S` and `N` for one group-block. `a[m]`
/// points at the block's 256 activation codes, `s32[m]` at its eight sums of 32.
#[inline(always)]
unsafe fn q45<D: Dot4, const M: usize, const FIFTH: bool>(
    blk: *const u8,
    a: [*const i8; M],
    s32: [*const i16; M],
) -> ([__m512i; M], [__m512i; M]) {
    let m4 = _mm512_set1_epi8(0x0f);
    let bit4 = _mm512_set1_epi8(0x10);
    let mut s = [_mm512_setzero_si512(); M];
    for sb in 0..8 {
        let sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.add(Q45_SCALES + 16 * sb) as *const __m128i));
        let fifth = if FIFTH { load(blk.add(Q5_FIFTH + 64 * sb)) } else { _mm512_setzero_si512() };
        let mut acc = [_mm512_setzero_si512(); M];
        for u in 0..4 {
            let v = load(blk.add(Q45_CODES + 64 * (4 * sb + u)));
            let mut lo = _mm512_and_si512(v, m4);
            let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
            if FIFTH {
                // bit u of each byte to bit 4 for the low codes, bit 4 + u for the high ones
                // (16-bit shifts: what crosses from the neighbouring byte misses bit 4)
                let up = _mm512_sll_epi16(fifth, _mm_cvtsi32_si128(4 - u as i32));
                let down = _mm512_srl_epi16(fifth, _mm_cvtsi32_si128(u as i32));
                lo = _mm512_or_si512(lo, _mm512_and_si512(up, bit4));
                hi = _mm512_or_si512(hi, _mm512_and_si512(down, bit4));
            }
            for m in 0..M {
                let p = a[m].add(32 * sb + 4 * u);
                acc[m] = D::dpbusd(acc[m], lo, bcst(p));
                acc[m] = D::dpbusd(acc[m], hi, bcst(p.add(16)));
            }
        }
        for m in 0..M {
            s[m] = _mm512_add_epi32(s[m], _mm512_mullo_epi32(acc[m], sc));
        }
    }
    let mut n = [_mm512_setzero_si512(); M];
    for j in 0..4 {
        let mins = _mm512_cvtepu8_epi16(_mm256_loadu_si256(blk.add(Q45_MINS + 32 * j) as *const __m256i));
        for m in 0..M {
            n[m] = D::dpwssd(n[m], mins, bcst(s32[m].add(2 * j)));
        }
    }
    (s, n)
}

/// Q6_K: as [`q45`], `bs[m]` pointing at the block's sixteen sums of 16.
#[inline(always)]
unsafe fn q6<D: Dot4, const M: usize>(
    blk: *const u8,
    a: [*const i8; M],
    bs: [*const i16; M],
) -> ([__m512i; M], [__m512i; M]) {
    let m4 = _mm512_set1_epi8(0x0f);
    let m30 = _mm512_set1_epi8(0x30);
    let (mut s, mut n) = ([_mm512_setzero_si512(); M], [_mm512_setzero_si512(); M]);
    for j in 0..8 {
        // row r's scales 2j, 2j + 1 as the i16 halves of lane r
        let pair = _mm512_cvtepi8_epi16(_mm256_loadu_si256(blk.add(Q6_SCALES + 32 * j) as *const __m256i));
        for m in 0..M {
            n[m] = D::dpwssd(n[m], pair, bcst(bs[m].add(2 * j)));
        }
        let scales = [_mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(pair)), _mm512_srai_epi32::<16>(pair)];
        for (e, &sc) in scales.iter().enumerate() {
            let t = 2 * j + e;
            let sub = blk.add(Q6_CODES + Q6_SUB_BYTES * t);
            let (v0, v1, h) = (load(sub), load(sub.add(64)), load(sub.add(128)));
            // high bits 2k..2k + 2 of each byte to bits 4..6 (16-bit shifts, masked per byte)
            let codes = [
                _mm512_or_si512(_mm512_and_si512(v0, m4), _mm512_and_si512(_mm512_slli_epi16::<4>(h), m30)),
                _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(v0), m4),
                    _mm512_and_si512(_mm512_slli_epi16::<2>(h), m30),
                ),
                _mm512_or_si512(_mm512_and_si512(v1, m4), _mm512_and_si512(h, m30)),
                _mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16::<4>(v1), m4),
                    _mm512_and_si512(_mm512_srli_epi16::<2>(h), m30),
                ),
            ];
            let mut acc = [_mm512_setzero_si512(); M];
            for (k, &c) in codes.iter().enumerate() {
                for m in 0..M {
                    acc[m] = D::dpbusd(acc[m], c, bcst(a[m].add(16 * t + 4 * k)));
                }
            }
            for m in 0..M {
                s[m] = _mm512_add_epi32(s[m], _mm512_mullo_epi32(acc[m], sc));
            }
        }
    }
    for m in 0..M {
        n[m] = _mm512_slli_epi32::<5>(n[m]);
    }
    (s, n)
}

/// Per activation row `m0..m0 + M`, block `b`'s 256 codes and the sums its type pairs with
/// the mins (Q4_K/Q5_K: the eight sums of 32; Q6_K: the sixteen sums of 16).
#[inline(always)]
unsafe fn block_rows<const M: usize>(
    dtype: KQuantType,
    acts: &Q8KActs,
    m0: usize,
    b: usize,
) -> ([*const i8; M], [*const i16; M]) {
    let cols = acts.cols;
    let a = std::array::from_fn(|m| acts.qs.as_ptr().add((m0 + m) * cols + b * QK_K));
    let sums = match dtype {
        KQuantType::Q6K => std::array::from_fn(|m| acts.bsums.as_ptr().add((m0 + m) * cols / 16 + b * 16)),
        _ => std::array::from_fn(|m| acts.sums32.as_ptr().add((m0 + m) * cols / 32 + b * 8)),
    };
    (a, sums)
}

/// The sixteen outputs of one group for activation rows `m0..m0 + M`.
#[inline(always)]
unsafe fn tile<D: Dot4, const M: usize>(
    dtype: KQuantType,
    group: *const u8,
    nb: usize,
    acts: &Q8KActs,
    m0: usize,
) -> [__m512; M] {
    let q8 = acts;
    let gb = group_block_bytes(dtype);
    let mut facc = [_mm512_setzero_ps(); M];
    for b in 0..nb {
        let blk = group.add(b * gb);
        let (a, sums) = block_rows::<M>(dtype, acts, m0, b);
        let (s, n) = match dtype {
            KQuantType::Q4K => q45::<D, M, false>(blk, a, sums),
            KQuantType::Q5K => q45::<D, M, true>(blk, a, sums),
            KQuantType::Q6K => q6::<D, M>(blk, a, sums),
        };
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i));
        let dmin = if dtype == KQuantType::Q6K {
            d
        } else {
            _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32) as *const __m256i))
        };
        for m in 0..M {
            // `accumulate_block` in sixteen lanes: fnmadd(x, y, z) = fma(-x, y, z)
            let da = _mm512_set1_ps(*q8.d.as_ptr().add((m0 + m) * nb + b));
            facc[m] = _mm512_fmadd_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(s[m]), facc[m]);
            facc[m] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, da), _mm512_cvtepi32_ps(n[m]), facc[m]);
        }
    }
    facc
}

/// Activation rows per pass over a group's weights.
const M_TILE: usize = 4;

#[inline(always)]
unsafe fn rows_with<D: Dot4>(w: &KQuantMatrix, acts: &Q8KActs, chunks: &RowChunks, out: OutPtr) {
    let nb = w.cols / QK_K;
    let gb = group_block_bytes(w.dtype);
    let data = super::data(w).as_ptr();
    let m_rows = acts.m_rows;
    while let Some(groups) = chunks.next() {
        for g in groups {
            let group = data.add(g * nb * gb);
            let valid = (w.rows - g * GROUP_ROWS).min(GROUP_ROWS);
            let mask = ((1u32 << valid) - 1) as __mmask16;
            let at = |m: usize| out.0.add(m * w.rows + g * GROUP_ROWS);
            let mut m = 0;
            while m + M_TILE <= m_rows {
                let r = tile::<D, M_TILE>(w.dtype, group, nb, acts, m);
                for (i, v) in r.into_iter().enumerate() {
                    _mm512_mask_storeu_ps(at(m + i), mask, v);
                }
                m += M_TILE;
            }
            for m in m..m_rows {
                let [v] = tile::<D, 1>(w.dtype, group, nb, acts, m);
                _mm512_mask_storeu_ps(at(m), mask, v);
            }
        }
    }
}

/// # Safety
/// AVX-512F, BW, FMA and F16C present; `w` is grouped; the outputs of the groups in `chunks`
/// are written by no one else.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub(in crate::kernels::kquant) unsafe fn rows_avx512(
    w: &KQuantMatrix,
    acts: &Q8KActs,
    chunks: &RowChunks,
    out: OutPtr,
) {
    rows_with::<Bw>(w, acts, chunks, out)
}

/// # Safety
/// AVX-512 VNNI present; otherwise as [`rows_avx512`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(in crate::kernels::kquant) unsafe fn rows_avx512_vnni(
    w: &KQuantMatrix,
    acts: &Q8KActs,
    chunks: &RowChunks,
    out: OutPtr,
) {
    rows_with::<Vnni>(w, acts, chunks, out)
}

// AVX2: each 64-byte vector of the layout is two halves of eight rows, and a group-block is
// multiplied one half at a time (sixteen registers hold one half's sums for a tile). With no
// `vpdpbusd`, products go through `maddubs` (u8 x i8 pairs to i16) and are summed in i16
// across steps while they cannot overflow (Q4_K: eight steps of pairs <= 2 * 15 * 127;
// Q5_K: four of <= 2 * 31 * 127; Q6_K: two of <= 2 * 63 * 127), then `madd` with the rows'
// scales as i16 pairs widens and scales them in one instruction. With AVX-VNNI (`VNNI`:
// Intel from Alder Lake, AMD from Zen 5) `vpdpbusd` on 256-bit vectors sums the products
// straight into i32 lanes and the sub-block sums are scaled with `vpmulld`, as in AVX-512.
// Both forms compute the same exact integers, so they give the same bits.

#[inline(always)]
unsafe fn load_half(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// Four bytes at `p` in every i32 lane of a 256-bit vector.
#[inline(always)]
unsafe fn bcst8<T>(p: *const T) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

/// Eight u8 at `p` as i16 pairs `(x, x)`, one per i32 lane.
#[inline(always)]
unsafe fn dup_u8_pairs(p: *const u8) -> __m256i {
    let b = _mm_loadl_epi64(p as *const __m128i);
    _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(b, b))
}

/// `acc + ` per i32 lane the sum of four u8 x i8 products (AVX-VNNI).
#[inline(always)]
unsafe fn dpbusd8(acc: __m256i, w: __m256i, a: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(acc, w, a)
}

/// Q4_K/Q5_K for rows `8 * half..` of a group-block: as [`q45`] in eight lanes.
#[inline(always)]
unsafe fn q45_avx2<const M: usize, const FIFTH: bool, const VNNI: bool>(
    blk: *const u8,
    half: usize,
    a: [*const i8; M],
    s32: [*const i16; M],
) -> ([__m256i; M], [__m256i; M]) {
    let m4 = _mm256_set1_epi8(0x0f);
    let bit4 = _mm256_set1_epi8(0x10);
    let mut s = [_mm256_setzero_si256(); M];
    for sb in 0..8 {
        let sc = if VNNI {
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(blk.add(Q45_SCALES + 16 * sb + 8 * half) as *const __m128i))
        } else {
            dup_u8_pairs(blk.add(Q45_SCALES + 16 * sb + 8 * half))
        };
        let fifth = if FIFTH { load_half(blk.add(Q5_FIFTH + 64 * sb + 32 * half)) } else { _mm256_setzero_si256() };
        let mut acc = [_mm256_setzero_si256(); M];
        // VNNI: the high codes' products in a second chain (`vpdpbusd`'s latency, not its
        // throughput, would bound one chain per row)
        let mut acc_hi = [_mm256_setzero_si256(); M];
        for u in 0..4 {
            let v = load_half(blk.add(Q45_CODES + 64 * (4 * sb + u) + 32 * half));
            let mut lo = _mm256_and_si256(v, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
            if FIFTH {
                let up = _mm256_sll_epi16(fifth, _mm_cvtsi32_si128(4 - u as i32));
                let down = _mm256_srl_epi16(fifth, _mm_cvtsi32_si128(u as i32));
                lo = _mm256_or_si256(lo, _mm256_and_si256(up, bit4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(down, bit4));
            }
            for m in 0..M {
                let p = a[m].add(32 * sb + 4 * u);
                if VNNI {
                    acc[m] = dpbusd8(acc[m], lo, bcst8(p));
                    acc_hi[m] = dpbusd8(acc_hi[m], hi, bcst8(p.add(16)));
                } else {
                    acc[m] = _mm256_add_epi16(acc[m], _mm256_maddubs_epi16(lo, bcst8(p)));
                    acc[m] = _mm256_add_epi16(acc[m], _mm256_maddubs_epi16(hi, bcst8(p.add(16))));
                }
            }
            if FIFTH && u == 1 && !VNNI {
                for m in 0..M {
                    s[m] = _mm256_add_epi32(s[m], _mm256_madd_epi16(acc[m], sc));
                    acc[m] = _mm256_setzero_si256();
                }
            }
        }
        for m in 0..M {
            let scaled = if VNNI {
                _mm256_mullo_epi32(_mm256_add_epi32(acc[m], acc_hi[m]), sc)
            } else {
                _mm256_madd_epi16(acc[m], sc)
            };
            s[m] = _mm256_add_epi32(s[m], scaled);
        }
    }
    let mut n = [_mm256_setzero_si256(); M];
    for j in 0..4 {
        let mins = _mm256_cvtepu8_epi16(_mm_loadu_si128(blk.add(Q45_MINS + 32 * j + 16 * half) as *const __m128i));
        for m in 0..M {
            n[m] = _mm256_add_epi32(n[m], _mm256_madd_epi16(mins, bcst8(s32[m].add(2 * j))));
        }
    }
    (s, n)
}

/// `pshufb` indices copying the low (`EVEN`) or high i16 of each i32 lane into both halves.
static DUP_I16: [[u8; 32]; 2] = {
    let mut t = [[0u8; 32]; 2];
    let mut i = 0;
    while i < 32 {
        t[0][i] = (i / 4 * 4 + i % 2) as u8;
        t[1][i] = (i / 4 * 4 + 2 + i % 2) as u8;
        i += 1;
    }
    t
};

/// Q6_K for rows `8 * half..` of a group-block: as [`q6`] in eight lanes.
#[inline(always)]
unsafe fn q6_avx2<const M: usize, const VNNI: bool>(
    blk: *const u8,
    half: usize,
    a: [*const i8; M],
    bs: [*const i16; M],
) -> ([__m256i; M], [__m256i; M]) {
    let m4 = _mm256_set1_epi8(0x0f);
    let m30 = _mm256_set1_epi8(0x30);
    let dup = [load_half(DUP_I16[0].as_ptr()), load_half(DUP_I16[1].as_ptr())];
    let (mut s, mut n) = ([_mm256_setzero_si256(); M], [_mm256_setzero_si256(); M]);
    for j in 0..8 {
        let pair = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(Q6_SCALES + 32 * j + 16 * half) as *const __m128i));
        for m in 0..M {
            n[m] = _mm256_add_epi32(n[m], _mm256_madd_epi16(pair, bcst8(bs[m].add(2 * j))));
        }
        for (e, &d) in dup.iter().enumerate() {
            let sc = if VNNI {
                // row r's scale 2j + e, sign-extended in lane r
                if e == 0 {
                    _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(pair))
                } else {
                    _mm256_srai_epi32::<16>(pair)
                }
            } else {
                _mm256_shuffle_epi8(pair, d)
            };
            let t = 2 * j + e;
            let sub = blk.add(Q6_CODES + Q6_SUB_BYTES * t + 32 * half);
            let (v0, v1, h) = (load_half(sub), load_half(sub.add(64)), load_half(sub.add(128)));
            let codes = [
                _mm256_or_si256(_mm256_and_si256(v0, m4), _mm256_and_si256(_mm256_slli_epi16::<4>(h), m30)),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(v0), m4),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(h), m30),
                ),
                _mm256_or_si256(_mm256_and_si256(v1, m4), _mm256_and_si256(h, m30)),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(v1), m4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(h), m30),
                ),
            ];
            if VNNI {
                for m in 0..M {
                    let p = a[m].add(16 * t);
                    // two chains, as in `q45_avx2`
                    let even = dpbusd8(dpbusd8(_mm256_setzero_si256(), codes[0], bcst8(p)), codes[2], bcst8(p.add(8)));
                    let odd =
                        dpbusd8(dpbusd8(_mm256_setzero_si256(), codes[1], bcst8(p.add(4))), codes[3], bcst8(p.add(12)));
                    s[m] = _mm256_add_epi32(s[m], _mm256_mullo_epi32(_mm256_add_epi32(even, odd), sc));
                }
                continue;
            }
            for k in [0, 2] {
                for m in 0..M {
                    let p = a[m].add(16 * t + 4 * k);
                    let pair_sum = _mm256_add_epi16(
                        _mm256_maddubs_epi16(codes[k], bcst8(p)),
                        _mm256_maddubs_epi16(codes[k + 1], bcst8(p.add(4))),
                    );
                    s[m] = _mm256_add_epi32(s[m], _mm256_madd_epi16(pair_sum, sc));
                }
            }
        }
    }
    for m in 0..M {
        n[m] = _mm256_slli_epi32::<5>(n[m]);
    }
    (s, n)
}

/// The outputs of rows `8 * h0..8 * (h0 + H)` of one group (eight per half) for activation
/// rows `m0..m0 + M`. With `H = 2` each block's two halves are multiplied back to back, so a
/// pass reads whole cache lines and its memory traffic is spread evenly (one half at a time
/// touches every line of the group twice, the first time at twice the rate).
#[inline(always)]
unsafe fn tile_avx2<const M: usize, const H: usize, const VNNI: bool>(
    dtype: KQuantType,
    group: *const u8,
    h0: usize,
    nb: usize,
    acts: &Q8KActs,
    m0: usize,
) -> [[__m256; M]; H] {
    let q8 = acts;
    let gb = group_block_bytes(dtype);
    let mut facc = [[_mm256_setzero_ps(); M]; H];
    for b in 0..nb {
        let blk = group.add(b * gb);
        let (a, sums) = block_rows::<M>(dtype, acts, m0, b);
        for (i, facc) in facc.iter_mut().enumerate() {
            let half = h0 + i;
            let (s, n) = match dtype {
                KQuantType::Q4K => q45_avx2::<M, false, VNNI>(blk, half, a, sums),
                KQuantType::Q5K => q45_avx2::<M, true, VNNI>(blk, half, a, sums),
                KQuantType::Q6K => q6_avx2::<M, VNNI>(blk, half, a, sums),
            };
            let d = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16 * half) as *const __m128i));
            let dmin = if dtype == KQuantType::Q6K {
                d
            } else {
                _mm256_cvtph_ps(_mm_loadu_si128(blk.add(32 + 16 * half) as *const __m128i))
            };
            for m in 0..M {
                let da = _mm256_set1_ps(*q8.d.as_ptr().add((m0 + m) * nb + b));
                facc[m] = _mm256_fmadd_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(s[m]), facc[m]);
                facc[m] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(n[m]), facc[m]);
            }
        }
    }
    facc
}

/// # Safety
/// AVX2, FMA and F16C present; `w` is grouped; the outputs of the groups in `chunks` are
/// written by no one else.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::kernels::kquant) unsafe fn rows_avx2(w: &KQuantMatrix, acts: &Q8KActs, chunks: &RowChunks, out: OutPtr) {
    rows_avx2_with::<false>(w, acts, chunks, out)
}

/// # Safety
/// AVX-VNNI present; otherwise as [`rows_avx2`].
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(in crate::kernels::kquant) unsafe fn rows_avx2_vnni(
    w: &KQuantMatrix,
    acts: &Q8KActs,
    chunks: &RowChunks,
    out: OutPtr,
) {
    rows_avx2_with::<true>(w, acts, chunks, out)
}

#[inline(always)]
unsafe fn rows_avx2_with<const VNNI: bool>(w: &KQuantMatrix, acts: &Q8KActs, chunks: &RowChunks, out: OutPtr) {
    const M: usize = 4;
    let nb = w.cols / QK_K;
    let gb = group_block_bytes(w.dtype);
    let data = super::data(w).as_ptr();
    let m_rows = acts.m_rows;
    let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    while let Some(groups) = chunks.next() {
        for g in groups {
            let group = data.add(g * nb * gb);
            let valid = (w.rows - g * GROUP_ROWS).min(GROUP_ROWS);
            let mask = |half: usize| {
                let live = valid.saturating_sub(8 * half).min(8) as i32;
                _mm256_cmpgt_epi32(_mm256_set1_epi32(live), lanes)
            };
            let at = |m: usize, half: usize| out.0.add(m * w.rows + g * GROUP_ROWS + 8 * half);
            // Tiles of M rows: one half at a time (sixteen registers hold one half's sums).
            let tiled = m_rows - m_rows % M;
            for half in 0..valid.div_ceil(8) {
                for m in (0..tiled).step_by(M) {
                    let [r] = tile_avx2::<M, 1, VNNI>(w.dtype, group, half, nb, acts, m);
                    for (i, v) in r.into_iter().enumerate() {
                        _mm256_maskstore_ps(at(m + i, half), mask(half), v);
                    }
                }
            }
            // Single rows (decode): both halves per block.
            for m in tiled..m_rows {
                if valid > 8 {
                    let [[v0], [v1]] = tile_avx2::<1, 2, VNNI>(w.dtype, group, 0, nb, acts, m);
                    _mm256_maskstore_ps(at(m, 0), mask(0), v0);
                    _mm256_maskstore_ps(at(m, 1), mask(1), v1);
                } else {
                    let [[v]] = tile_avx2::<1, 1, VNNI>(w.dtype, group, 0, nb, acts, m);
                    _mm256_maskstore_ps(at(m, 0), mask(0), v);
                }
            }
        }
    }
}
