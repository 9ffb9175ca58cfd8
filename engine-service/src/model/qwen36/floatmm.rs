//! Float weight matrices (BF16 or F32, row-major `[out][in]`) times f32 activations.
//!
//! Contract: [`matmul_float`] computes `out[m * rows + o] = sum_i x[m * cols + i] * W[o][i]`
//! with BF16 weights widened in registers (never stored as f32: a real-size model keeps half
//! the bytes). Output rows are split across the pool threads; each weight row is widened once
//! per block of [`M_BLOCK`] activation rows. Every output value is summed in one fixed order
//! (16 lanes by column index mod 16, then a fixed tree), so it is bit-identical whatever the
//! number of activation rows, the block a row falls in or the thread count: a pass split
//! differently gives the same bits (the model's cached-vs-uncached exactness relies on it).
//! Kernel sets (chosen once per process): AVX-512 intrinsics with fused multiply-adds; AVX2
//! intrinsics with fused multiply-adds; else auto-vectorized separate multiply and add
//! (portable). Bits differ between the sets, as for the attention kernel.

use crate::backend::cpu::kernels::ThreadPool;
use crate::backend::cpu::kernels::threadpool::split_range;

const LANES: usize = 16;
/// Activation rows sharing one pass over a weight row.
const M_BLOCK: usize = 4;
/// Weight rows sharing one load of an activation chunk.
const W_BLOCK: usize = 2;

/// Element type of a float matrix.
pub trait Elem: Copy + Send + Sync + 'static {
    /// Whether the element is BF16 bits (else f32); picks the SIMD load.
    const BF16: bool;
    fn widen(self) -> f32;
}

/// BF16 bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bf16(pub u16);

impl Elem for Bf16 {
    const BF16: bool = true;
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
}

impl Elem for f32 {
    const BF16: bool = false;
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

/// A row-major float matrix owned in memory.
pub struct FloatMatrix<E: Elem> {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<E>,
}

impl<E: Elem> FloatMatrix<E> {
    pub fn row(&self, r: usize) -> &[E] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: threads write disjoint output columns.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// See the module contract. Panics if `x` or `out` is shorter than the shapes need.
pub fn matmul_float<E: Elem>(pool: &ThreadPool, w: &FloatMatrix<E>, x: &[f32], m_rows: usize, out: &mut [f32]) {
    assert!(x.len() >= m_rows * w.cols && out.len() >= m_rows * w.rows, "matmul_float: short buffers");
    let outp = OutPtr(out.as_mut_ptr());
    let kernel = pick::<E>();
    pool.run(|i, n| {
        let rows = split_range(w.rows, n, i, 1);
        // SAFETY: output columns `rows` of every activation row belong to this thread.
        unsafe { kernel(w, x, m_rows, rows, outp) };
    });
}

type Kernel<E> = unsafe fn(&FloatMatrix<E>, &[f32], usize, std::ops::Range<usize>, OutPtr);

fn pick<E: Elem>() -> Kernel<E> {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::backend::cpu::kernels::{SimdCeiling, simd_ceiling};
        let ceiling = simd_ceiling();
        if ceiling >= SimdCeiling::Detected && std::arch::is_x86_feature_detected!("avx512f") {
            return rows_avx512::<E>;
        }
        if ceiling >= SimdCeiling::Avx2
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            return rows_avx2::<E>;
        }
    }
    rows_portable::<E>
}

/// AVX-512 kernel: 2 weight rows x 4 activation rows of 16-lane FMA accumulators in registers.
/// Same lane assignment and reduction as [`rows_body`], but fused multiply-adds, so its bits
/// differ from the other kernel sets (like the attention kernel, exactness holds per kernel set).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn rows_avx512<E: Elem>(w: &FloatMatrix<E>, x: &[f32], m: usize, rows: std::ops::Range<usize>, out: OutPtr) {
    let full_m = m / M_BLOCK * M_BLOCK;
    let mut o = rows.start;
    while o < rows.end {
        let two = o + W_BLOCK <= rows.end;
        let mut r0 = 0;
        // SAFETY (all calls): forwarded; each covers columns o.. of rows r0.. only.
        unsafe {
            while r0 < full_m {
                if two {
                    avx512::tile::<E, 2, 4>(w, x, r0, o, out)
                } else {
                    avx512::tile::<E, 1, 4>(w, x, r0, o, out)
                }
                r0 += M_BLOCK;
            }
            while r0 < m {
                if two {
                    avx512::tile::<E, 2, 1>(w, x, r0, o, out)
                } else {
                    avx512::tile::<E, 1, 1>(w, x, r0, o, out)
                }
                r0 += 1;
            }
        }
        o += if two { W_BLOCK } else { 1 };
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Elem, FloatMatrix, LANES, OutPtr, reduce};

    /// 16 weights from `p` as f32 lanes.
    #[inline(always)]
    unsafe fn load_w<E: Elem>(p: *const E) -> __m512 {
        // SAFETY: the caller guarantees 16 readable elements.
        unsafe {
            if E::BF16 {
                let h = _mm256_loadu_si256(p as *const __m256i);
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
            } else {
                _mm512_loadu_ps(p as *const f32)
            }
        }
    }

    /// Weight rows `o0..o0+R` x activation rows `r0..r0+B`.
    ///
    /// # Safety
    /// AVX-512F present; the caller owns output columns `o0..o0+R` of rows `r0..r0+B`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<E: Elem, const R: usize, const B: usize>(
        w: &FloatMatrix<E>,
        x: &[f32],
        r0: usize,
        o0: usize,
        out: OutPtr,
    ) {
        let cols = w.cols;
        let full = cols / LANES * LANES;
        let wp: [*const E; R] = std::array::from_fn(|j| w.row(o0 + j).as_ptr());
        let xp: [*const f32; B] = std::array::from_fn(|b| x[(r0 + b) * cols..(r0 + b + 1) * cols].as_ptr());
        let mut acc = [[_mm512_setzero_ps(); B]; R];
        let mut c = 0;
        while c < full {
            // SAFETY: c + 16 <= cols for every row read.
            unsafe {
                let wv: [__m512; R] = std::array::from_fn(|j| load_w::<E>(wp[j].add(c)));
                for b in 0..B {
                    let xv = _mm512_loadu_ps(xp[b].add(c));
                    for j in 0..R {
                        acc[j][b] = _mm512_fmadd_ps(wv[j], xv, acc[j][b]);
                    }
                }
            }
            c += LANES;
        }
        for j in 0..R {
            for b in 0..B {
                let mut lanes = [0f32; LANES];
                // SAFETY: 16 f32 of stack space.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), acc[j][b]) };
                for cc in full..cols {
                    // SAFETY: cc < cols.
                    let (wv, xv) = unsafe { ((*wp[j].add(cc)).widen(), *xp[b].add(cc)) };
                    lanes[cc - full] = wv.mul_add(xv, lanes[cc - full]);
                }
                // SAFETY: column o0+j of row r0+b is ours.
                unsafe { *out.0.add((r0 + b) * w.rows + o0 + j) = reduce(&lanes) };
            }
        }
    }
}

/// AVX2 kernel: 2 weight rows x 2 activation rows, each a pair of 8-lane FMA accumulators (the
/// same 16 lanes as [`rows_body`]): 8 accumulators, the 4 widened weight vectors and one
/// activation vector fit the 16 registers. BF16 is widened in registers (zero-extend, shift).
/// Fused multiply-adds, so its bits differ from the portable set's (exactness holds per set).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_avx2<E: Elem>(w: &FloatMatrix<E>, x: &[f32], m: usize, rows: std::ops::Range<usize>, out: OutPtr) {
    const B: usize = 2;
    let full_m = m / B * B;
    let mut o = rows.start;
    while o < rows.end {
        let two = o + W_BLOCK <= rows.end;
        let mut r0 = 0;
        // SAFETY (all calls): forwarded; each covers columns o.. of rows r0.. only.
        unsafe {
            while r0 < full_m {
                if two {
                    avx2::tile::<E, 2, B>(w, x, r0, o, out)
                } else {
                    avx2::tile::<E, 1, B>(w, x, r0, o, out)
                }
                r0 += B;
            }
            if r0 < m {
                if two { avx2::tile::<E, 2, 1>(w, x, r0, o, out) } else { avx2::tile::<E, 1, 1>(w, x, r0, o, out) }
            }
        }
        o += if two { W_BLOCK } else { 1 };
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{Elem, FloatMatrix, LANES, OutPtr, reduce};

    /// 8 weights from `p` as f32 lanes.
    #[inline(always)]
    unsafe fn load_w<E: Elem>(p: *const E) -> __m256 {
        // SAFETY: the caller guarantees 8 readable elements.
        unsafe {
            if E::BF16 {
                let h = _mm_loadu_si128(p as *const __m128i);
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
            } else {
                _mm256_loadu_ps(p as *const f32)
            }
        }
    }

    /// Weight rows `o0..o0+R` x activation rows `r0..r0+B`; lanes 0..8 in `acc[..][..][0]`,
    /// 8..16 in `[1]`.
    ///
    /// # Safety
    /// AVX2 and FMA present; the caller owns output columns `o0..o0+R` of rows `r0..r0+B`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<E: Elem, const R: usize, const B: usize>(
        w: &FloatMatrix<E>,
        x: &[f32],
        r0: usize,
        o0: usize,
        out: OutPtr,
    ) {
        let cols = w.cols;
        let full = cols / LANES * LANES;
        let wp: [*const E; R] = std::array::from_fn(|j| w.row(o0 + j).as_ptr());
        let xp: [*const f32; B] = std::array::from_fn(|b| x[(r0 + b) * cols..(r0 + b + 1) * cols].as_ptr());
        let mut acc = [[[_mm256_setzero_ps(); 2]; B]; R];
        let mut c = 0;
        while c < full {
            // SAFETY: c + 16 <= cols for every row read.
            unsafe {
                let wv: [[__m256; 2]; R] =
                    std::array::from_fn(|j| [load_w::<E>(wp[j].add(c)), load_w::<E>(wp[j].add(c + 8))]);
                for b in 0..B {
                    for h in 0..2 {
                        let xv = _mm256_loadu_ps(xp[b].add(c + 8 * h));
                        for j in 0..R {
                            acc[j][b][h] = _mm256_fmadd_ps(wv[j][h], xv, acc[j][b][h]);
                        }
                    }
                }
            }
            c += LANES;
        }
        for j in 0..R {
            for b in 0..B {
                let mut lanes = [0f32; LANES];
                // SAFETY: 16 f32 of stack space.
                unsafe {
                    _mm256_storeu_ps(lanes.as_mut_ptr(), acc[j][b][0]);
                    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[j][b][1]);
                }
                for cc in full..cols {
                    // SAFETY: cc < cols.
                    let (wv, xv) = unsafe { ((*wp[j].add(cc)).widen(), *xp[b].add(cc)) };
                    lanes[cc - full] = wv.mul_add(xv, lanes[cc - full]);
                }
                // SAFETY: column o0+j of row r0+b is ours.
                unsafe { *out.0.add((r0 + b) * w.rows + o0 + j) = reduce(&lanes) };
            }
        }
    }
}

unsafe fn rows_portable<E: Elem>(w: &FloatMatrix<E>, x: &[f32], m: usize, rows: std::ops::Range<usize>, out: OutPtr) {
    // SAFETY: forwarded.
    unsafe { rows_body(w, x, m, rows, out) }
}

/// # Safety
/// The caller owns output columns `rows` of all `m` activation rows.
#[inline(always)]
unsafe fn rows_body<E: Elem>(w: &FloatMatrix<E>, x: &[f32], m: usize, rows: std::ops::Range<usize>, out: OutPtr) {
    let mut o = rows.start;
    while o + W_BLOCK <= rows.end {
        // SAFETY: forwarded.
        unsafe { tile::<E, W_BLOCK>(w, x, m, o, out) };
        o += W_BLOCK;
    }
    while o < rows.end {
        // SAFETY: forwarded.
        unsafe { tile::<E, 1>(w, x, m, o, out) };
        o += 1;
    }
}

/// Weight rows `o0..o0+R` against all activation rows, [`M_BLOCK`] at a time: each loaded
/// activation chunk serves R weight rows, each widened weight chunk `M_BLOCK` activation rows.
///
/// # Safety
/// The caller owns output columns `o0..o0+R` of all `m` activation rows.
#[inline(always)]
unsafe fn tile<E: Elem, const R: usize>(w: &FloatMatrix<E>, x: &[f32], m: usize, o0: usize, out: OutPtr) {
    let cols = w.cols;
    let full = cols / LANES * LANES;
    let wr: [&[E]; R] = std::array::from_fn(|j| w.row(o0 + j));
    let mut r0 = 0;
    while r0 < m {
        let nb = M_BLOCK.min(m - r0);
        let mut acc = [[[0f32; LANES]; M_BLOCK]; R];
        let mut c = 0;
        while c < full {
            let mut wv = [[0f32; LANES]; R];
            for j in 0..R {
                for l in 0..LANES {
                    wv[j][l] = wr[j][c + l].widen();
                }
            }
            for b in 0..nb {
                let xr = &x[(r0 + b) * cols + c..(r0 + b) * cols + c + LANES];
                for j in 0..R {
                    for l in 0..LANES {
                        acc[j][b][l] += wv[j][l] * xr[l];
                    }
                }
            }
            c += LANES;
        }
        for cc in full..cols {
            for j in 0..R {
                let wv = wr[j][cc].widen();
                for b in 0..nb {
                    acc[j][b][cc - full] += wv * x[(r0 + b) * cols + cc];
                }
            }
        }
        for (j, accj) in acc.iter().enumerate() {
            for (b, a) in accj.iter().enumerate().take(nb) {
                // SAFETY: column o0+j of row r0+b is ours.
                unsafe { *out.0.add((r0 + b) * w.rows + o0 + j) = reduce(a) };
            }
        }
        r0 += nb;
    }
}

/// Fixed-order tree sum of the 16 lanes.
#[inline(always)]
fn reduce(a: &[f32; LANES]) -> f32 {
    let mut h = [0f32; 8];
    for i in 0..8 {
        h[i] = a[i] + a[i + 8];
    }
    let q = [h[0] + h[4], h[1] + h[5], h[2] + h[6], h[3] + h[7]];
    (q[0] + q[2]) + (q[1] + q[3])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_plain_product_and_is_bit_identical_for_any_row_count_and_threads() {
        let (rows, cols) = (37, 83);
        let w: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0).collect();
        let bf = FloatMatrix { rows, cols, data: w.iter().map(|&v| Bf16((v.to_bits() >> 16) as u16)).collect() };
        let fm = FloatMatrix { rows, cols, data: w.clone() };
        let m = 9;
        let x: Vec<f32> = (0..m * cols).map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0).collect();
        let one = ThreadPool::new(1);
        let two = ThreadPool::new(2);
        let mut all = vec![0f32; m * rows];
        matmul_float(&two, &fm, &x, m, &mut all);
        for mi in 0..m {
            for o in 0..rows {
                let want: f64 = (0..cols).map(|i| x[mi * cols + i] as f64 * w[o * cols + i] as f64).sum();
                assert!((all[mi * rows + o] as f64 - want).abs() < 1e-4, "{mi} {o}");
            }
        }
        let mut allb = vec![0f32; m * rows];
        matmul_float(&two, &bf, &x, m, &mut allb);
        for mi in 0..m {
            let mut single = vec![0f32; rows];
            matmul_float(&one, &bf, &x[mi * cols..], 1, &mut single);
            assert_eq!(&single[..], &allb[mi * rows..(mi + 1) * rows], "row {mi}");
        }
    }
}
