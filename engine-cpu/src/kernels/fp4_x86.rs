//! x86_64 NVFP4 matmul kernels (see `fp4.rs` for the contract). Each `#[target_feature]`
//! function holds a whole loop; the tile helpers carry the same features and inline into it.
//!
//! Block decode, both ISAs: the 8 code bytes of a 16-value block are one u64 whose nibble k is
//! element k (ModelOpt packing). It is broadcast to every 64-bit lane straight from memory (a
//! load, no shuffle) and lane q is shifted right by 4q bits (`vpsrlvq`), so 32-bit lane 2q holds
//! nibble q and lane 2q+1 nibble q+8 in its low bits. A `vpermps` table lookup reads only those
//! low bits; the table is the block scale's row of [`E2M1_SCALED`] (values times scale), so no
//! multiply follows. AVX-512 indexes all 16 entries at once; AVX2 looks up the scaled magnitude
//! (low 3 bits) and xors bit 3, moved to bit 31, in as the sign, for shifts 0..16 and 16..32
//! (the two halves). Both therefore produce the block in the order e0, e8, e1, e9, ..., e7, e15, and the
//! activations are permuted to that order once per matmul ([`super::permute_acts_into`]), so each
//! block costs one shift, one permute (p5) and one FMA per activation row.

#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::{BLOCK, E2M1_SCALED, Job, ROW_TILE};

pub(super) fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma")
}

pub(super) fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// Bytes ahead in each row's code stream to prefetch (DRAM latency at ~10-20 GB/s per core
/// across 4 row streams plus their scales).
const PREFETCH_BYTES: usize = 2048;

/// # Safety
/// AVX-512F and FMA must be present (checked by the dispatcher); `job.out` as for `rows_scalar`.
pub(super) unsafe fn rows_avx512(job: &Job, rows: Range<usize>) {
    rows_avx512_impl(job, rows)
}

/// # Safety
/// AVX2 and FMA must be present (checked by the dispatcher); `job.out` as for `rows_scalar`.
pub(super) unsafe fn rows_avx2(job: &Job, rows: Range<usize>) {
    rows_avx2_impl(job, rows)
}

#[target_feature(enable = "avx512f,fma")]
unsafe fn rows_avx512_impl(job: &Job, rows: Range<usize>) {
    let mut o = rows.start;
    while o < rows.end {
        let r = (rows.end - o).min(ROW_TILE);
        match r {
            4 => m_loop512::<4>(job, o),
            3 => m_loop512::<3>(job, o),
            2 => m_loop512::<2>(job, o),
            _ => m_loop512::<1>(job, o),
        }
        o += r;
    }
}

/// Activation rows in groups of 4: 16 accumulators, 4 activation vectors and the decode
/// constants fit the 32 zmm registers. (A 2 x 8 tile, fewer decodes per FMA, measured ~25 %
/// slower at m = 16: register pressure.)
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn m_loop512<const R: usize>(job: &Job, o0: usize) {
    let mut m0 = 0;
    while m0 < job.m_rows {
        let mb = (job.m_rows - m0).min(4);
        match mb {
            4 => tile512::<R, 4>(job, o0, m0),
            3 => tile512::<R, 3>(job, o0, m0),
            2 => tile512::<R, 2>(job, o0, m0),
            _ => tile512::<R, 1>(job, o0, m0),
        }
        m0 += mb;
    }
}

/// One block's 16 code values in the permuted lane order (see the module docs).
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn decode512(codes: *const u8, shifts: __m512i, lut: *const f32) -> __m512 {
    let q = _mm512_set1_epi64((codes as *const i64).read_unaligned());
    _mm512_permutexvar_ps(_mm512_srlv_epi64(q, shifts), _mm512_load_ps(lut))
}

/// Output rows o0..o0+R x activation rows m0..m0+M (activations permuted per block).
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn tile512<const R: usize, const M: usize>(job: &Job, o0: usize, m0: usize) {
    let w = job.w;
    let (cols, nb, half) = (w.cols, w.cols / BLOCK, w.cols / 2);
    let luts = E2M1_SCALED.0.as_ptr();
    let shifts = _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28);
    let codes = w.packed.as_ptr().add(o0 * half);
    let scales = w.scales.as_ptr().add(o0 * nb);
    let xs = job.x.as_ptr().add(m0 * cols);
    // later activation blocks re-read the same rows from cache
    let prefetch = m0 == 0;
    let mut acc = [[_mm512_setzero_ps(); M]; R];
    for b in 0..nb {
        if prefetch && b % 8 == 0 {
            for r in 0..R {
                // wrapping: past the buffer the address is simply not fetched
                _mm_prefetch::<_MM_HINT_T0>(codes.wrapping_add(r * half + b * 8 + PREFETCH_BYTES) as *const i8);
                if b % 64 == 0 {
                    _mm_prefetch::<_MM_HINT_T0>(scales.wrapping_add(r * nb + b + 64) as *const i8);
                }
            }
        }
        let mut xv = [_mm512_setzero_ps(); M];
        for (mi, v) in xv.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(xs.add(mi * cols + b * BLOCK));
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let lut = luts.add(*scales.add(r * nb + b) as usize) as *const f32;
            let wv = decode512(codes.add(r * half + b * 8), shifts, lut);
            for (a, &xm) in acc_r.iter_mut().zip(&xv) {
                *a = _mm512_fmadd_ps(wv, xm, *a);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (mi, &a) in acc_r.iter().enumerate() {
            *job.out.0.add((m0 + mi) * w.rows + o0 + r) = _mm512_reduce_add_ps(a) * w.global_scale;
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn rows_avx2_impl(job: &Job, rows: Range<usize>) {
    let mut o = rows.start;
    while o < rows.end {
        let r = (rows.end - o).min(ROW_TILE);
        match r {
            4 => m_loop256::<4>(job, o),
            3 => m_loop256::<3>(job, o),
            2 => m_loop256::<2>(job, o),
            _ => m_loop256::<1>(job, o),
        }
        o += r;
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn m_loop256<const R: usize>(job: &Job, o0: usize) {
    let mut m0 = 0;
    while m0 < job.m_rows {
        // 16 ymm registers: R x 2 accumulators plus 2 x 2 activation vectors
        let mb = (job.m_rows - m0).min(2);
        if mb == 2 {
            tile256::<R, 2>(job, o0, m0);
        } else {
            tile256::<R, 1>(job, o0, m0);
        }
        m0 += mb;
    }
}

/// One block as two halves in the permuted lane order (see the module docs).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn decode256(codes: *const u8, lut: *const f32, sign: __m256i) -> (__m256, __m256) {
    let mag = _mm256_load_ps(lut);
    let q = _mm256_set1_epi64x((codes as *const i64).read_unaligned());
    let i0 = _mm256_srlv_epi64(q, _mm256_setr_epi64x(0, 4, 8, 12));
    let i1 = _mm256_srlv_epi64(q, _mm256_setr_epi64x(16, 20, 24, 28));
    let v0 = _mm256_xor_ps(
        _mm256_permutevar8x32_ps(mag, i0),
        _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32::<28>(i0), sign)),
    );
    let v1 = _mm256_xor_ps(
        _mm256_permutevar8x32_ps(mag, i1),
        _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32::<28>(i1), sign)),
    );
    (v0, v1)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
    _mm_cvtss_f32(s)
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile256<const R: usize, const M: usize>(job: &Job, o0: usize, m0: usize) {
    let w = job.w;
    let (cols, nb, half) = (w.cols, w.cols / BLOCK, w.cols / 2);
    let luts = E2M1_SCALED.0.as_ptr();
    let sign = _mm256_set1_epi32(i32::MIN);
    let codes = w.packed.as_ptr().add(o0 * half);
    let scales = w.scales.as_ptr().add(o0 * nb);
    let xs = job.x.as_ptr().add(m0 * cols);
    let prefetch = m0 == 0;
    let mut acc = [[_mm256_setzero_ps(); M]; R];
    for b in 0..nb {
        if prefetch && b % 8 == 0 {
            for r in 0..R {
                _mm_prefetch::<_MM_HINT_T0>(codes.wrapping_add(r * half + b * 8 + PREFETCH_BYTES) as *const i8);
                if b % 64 == 0 {
                    _mm_prefetch::<_MM_HINT_T0>(scales.wrapping_add(r * nb + b + 64) as *const i8);
                }
            }
        }
        let mut xv = [[_mm256_setzero_ps(); 2]; M];
        for (mi, v) in xv.iter_mut().enumerate() {
            let p = xs.add(mi * cols + b * BLOCK);
            *v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))];
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let lut = luts.add(*scales.add(r * nb + b) as usize) as *const f32;
            let (w0, w1) = decode256(codes.add(r * half + b * 8), lut, sign);
            for (a, xm) in acc_r.iter_mut().zip(&xv) {
                *a = _mm256_fmadd_ps(w1, xm[1], _mm256_fmadd_ps(w0, xm[0], *a));
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (mi, &a) in acc_r.iter().enumerate() {
            *job.out.0.add((m0 + mi) * w.rows + o0 + r) = hsum256(a) * w.global_scale;
        }
    }
}

/// Activation rows from which the blocked kernels run (below, the direct ones: decoding a
/// block feeds too few rows to pay for parking it).
pub(super) const BLOCKED_MIN_ROWS: usize = 4;
/// Columns of a decoded panel (8 rows x 512 x 4 bytes = 16 KiB: L1-resident).
const KC: usize = 512;

/// Cache-blocked AVX-512 form for prefill-sized products: each panel of 8 weight rows is
/// decoded once per [`KC`] columns into f32 (the same values `decode512` gives the direct
/// kernel, in the same permuted order), shared by every activation row; 8 x 3 register
/// tiles FMA over it ([`crate::kernels::floatmm`]'s panel tile) with the
/// 16-lane accumulators parked between column blocks. Each lane sees the same fused
/// multiply-adds in the same order and the same final reduction as [`tile512`]: same bits.
///
/// # Safety
/// As [`rows_avx512`].
pub(super) unsafe fn rows_avx512_blocked(job: &Job, rows: Range<usize>) {
    rows_avx512_blocked_impl(job, rows)
}

#[target_feature(enable = "avx512f,fma")]
unsafe fn rows_avx512_blocked_impl(job: &Job, rows: Range<usize>) {
    use super::super::floatmm::avx512::{PANEL, panel_tile};
    const LANES: usize = 16;
    let w = job.w;
    let (cols, nb, half, m) = (w.cols, w.cols / BLOCK, w.cols / 2, job.m_rows);
    let luts = E2M1_SCALED.0.as_ptr();
    let shifts = _mm512_setr_epi64(0, 4, 8, 12, 16, 20, 24, 28);
    let mut panel = vec![0f32; PANEL * KC];
    let mut acc = vec![0f32; m * PANEL * LANES];
    let mut o = rows.start;
    while o < rows.end {
        let r = PANEL.min(rows.end - o);
        acc.fill(0.0);
        let mut k0 = 0;
        while k0 < cols {
            let kc = KC.min(cols - k0);
            for j in 0..PANEL {
                let dst = panel.as_mut_ptr().add(j * KC);
                for c in (0..kc).step_by(BLOCK) {
                    let v = if j < r {
                        let b = (k0 + c) / BLOCK;
                        let lut = luts.add(*w.scales.get_unchecked((o + j) * nb + b) as usize) as *const f32;
                        decode512(w.packed.as_ptr().add((o + j) * half + b * 8), shifts, lut)
                    } else {
                        _mm512_setzero_ps()
                    };
                    _mm512_storeu_ps(dst.add(c), v);
                }
            }
            let mut r0 = 0;
            while r0 < m {
                let b = (m - r0).min(3);
                let xp = job.x.as_ptr().add(r0 * cols + k0);
                let ap = acc.as_mut_ptr().add(r0 * PANEL * LANES);
                match b {
                    3 => panel_tile::<3>(panel.as_ptr(), xp, cols, kc, ap),
                    2 => panel_tile::<2>(panel.as_ptr(), xp, cols, kc, ap),
                    _ => panel_tile::<1>(panel.as_ptr(), xp, cols, kc, ap),
                }
                r0 += b;
            }
            k0 += kc;
        }
        for row in 0..m {
            for j in 0..r {
                let a = _mm512_loadu_ps(acc.as_ptr().add((row * PANEL + j) * LANES));
                *job.out.0.add(row * w.rows + o + j) = _mm512_reduce_add_ps(a) * w.global_scale;
            }
        }
        o += r;
    }
}

/// Weight rows per panel of the AVX2 blocked form.
const PANEL256: usize = 4;

/// Cache-blocked AVX2 form (as [`rows_avx512_blocked`]): 4-row panels decoded by
/// `decode256`, 4 x 2 tiles of 8-lane accumulators that take each block's low then high half,
/// as [`tile256`] does; same bits.
///
/// # Safety
/// As [`rows_avx2`].
pub(super) unsafe fn rows_avx2_blocked(job: &Job, rows: Range<usize>) {
    rows_avx2_blocked_impl(job, rows)
}

#[target_feature(enable = "avx2,fma")]
unsafe fn rows_avx2_blocked_impl(job: &Job, rows: Range<usize>) {
    const LANES: usize = 8;
    let w = job.w;
    let (cols, nb, half, m) = (w.cols, w.cols / BLOCK, w.cols / 2, job.m_rows);
    let luts = E2M1_SCALED.0.as_ptr();
    let sign = _mm256_set1_epi32(i32::MIN);
    let mut panel = vec![0f32; PANEL256 * KC];
    let mut acc = vec![0f32; m * PANEL256 * LANES];
    let mut o = rows.start;
    while o < rows.end {
        let r = PANEL256.min(rows.end - o);
        acc.fill(0.0);
        let mut k0 = 0;
        while k0 < cols {
            let kc = KC.min(cols - k0);
            for j in 0..PANEL256 {
                let dst = panel.as_mut_ptr().add(j * KC);
                for c in (0..kc).step_by(BLOCK) {
                    let (v0, v1) = if j < r {
                        let b = (k0 + c) / BLOCK;
                        let lut = luts.add(*w.scales.get_unchecked((o + j) * nb + b) as usize) as *const f32;
                        decode256(w.packed.as_ptr().add((o + j) * half + b * 8), lut, sign)
                    } else {
                        (_mm256_setzero_ps(), _mm256_setzero_ps())
                    };
                    _mm256_storeu_ps(dst.add(c), v0);
                    _mm256_storeu_ps(dst.add(c + 8), v1);
                }
            }
            let mut r0 = 0;
            while r0 < m {
                let b = (m - r0).min(2);
                let xp = job.x.as_ptr().add(r0 * cols + k0);
                let ap = acc.as_mut_ptr().add(r0 * PANEL256 * LANES);
                if b == 2 {
                    panel_tile256::<2>(panel.as_ptr(), xp, cols, kc, ap)
                } else {
                    panel_tile256::<1>(panel.as_ptr(), xp, cols, kc, ap)
                }
                r0 += b;
            }
            k0 += kc;
        }
        for row in 0..m {
            for j in 0..r {
                let a = _mm256_loadu_ps(acc.as_ptr().add((row * PANEL256 + j) * LANES));
                *job.out.0.add(row * w.rows + o + j) = hsum256(a) * w.global_scale;
            }
        }
        o += r;
    }
}

/// The 4 panel rows (stride [`KC`]) x `B` activation rows over `kc` columns into the parked
/// 8-lane accumulators at `acc` (`[B][PANEL256][8]`): per block, low half then high half.
#[allow(clippy::needless_range_loop)] // register arrays indexed by row/activation read clearer
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn panel_tile256<const B: usize>(panel: *const f32, xp: *const f32, cols: usize, kc: usize, acc: *mut f32) {
    let mut a = [[_mm256_setzero_ps(); PANEL256]; B];
    for (b, ab) in a.iter_mut().enumerate() {
        for (j, v) in ab.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(acc.add((b * PANEL256 + j) * 8));
        }
    }
    let mut c = 0;
    while c < kc {
        let xv: [[__m256; 2]; B] =
            std::array::from_fn(|b| [_mm256_loadu_ps(xp.add(b * cols + c)), _mm256_loadu_ps(xp.add(b * cols + c + 8))]);
        for j in 0..PANEL256 {
            let w0 = _mm256_loadu_ps(panel.add(j * KC + c));
            let w1 = _mm256_loadu_ps(panel.add(j * KC + c + 8));
            for b in 0..B {
                a[b][j] = _mm256_fmadd_ps(w1, xv[b][1], _mm256_fmadd_ps(w0, xv[b][0], a[b][j]));
            }
        }
        c += BLOCK;
    }
    for (b, ab) in a.iter().enumerate() {
        for (j, v) in ab.iter().enumerate() {
            _mm256_storeu_ps(acc.add((b * PANEL256 + j) * 8), *v);
        }
    }
}
