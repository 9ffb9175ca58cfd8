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
//!
//! Prefill-sized products (at least [`BLOCKED_MIN_ROWS`] activation rows) run a cache-blocked
//! form on the SIMD sets: a panel of weight rows is widened to f32 once per [`KC`] columns
//! (into L1, shared by every activation row, instead of once per 4 rows), register tiles of
//! 8 weight x 3 activation rows (AVX-512) or 6 x 2 (AVX2) FMA over it, and the 16-lane
//! accumulators are parked in a buffer between column blocks. Parking a register and
//! reloading it is exact, so each lane still sees the same fused multiply-adds in the same
//! column order: the blocked form gives the direct form's bits (tests check it).

use super::ThreadPool;
use super::threadpool::split_range;

const LANES: usize = 16;
/// Activation rows sharing one pass over a weight row.
const M_BLOCK: usize = 4;
/// Weight rows sharing one load of an activation chunk.
const W_BLOCK: usize = 2;
/// Bytes ahead of the current column that the direct (decode) kernels prefetch in each weight
/// row; `EDGE_GEMV_PREFETCH` overrides (0 still prefetches the current line) for tuning.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // used by the x86 kernels only
fn prefetch_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| std::env::var("EDGE_GEMV_PREFETCH").ok().and_then(|v| v.parse().ok()).unwrap_or(2048))
}

/// Prefetches each row of `rows` [`prefetch_bytes`] ahead of column `c`, once per cache line.
///
/// # Safety
/// SSE (every x86_64 CPU); the addresses need not be valid.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn prefetch_rows_ahead<E: Elem>(rows: &[*const E], c: usize) {
    use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    let at = c * std::mem::size_of::<E>();
    if at.is_multiple_of(64) {
        for &p in rows {
            // SAFETY: a prefetch never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>((p as *const i8).wrapping_add(at + prefetch_bytes())) };
        }
    }
}

/// Activation rows from which the SIMD sets use the cache-blocked form.
pub const BLOCKED_MIN_ROWS: usize = 4;
/// Columns of a widened weight panel (8 rows x 512 x 4 bytes = 16 KiB: L1-resident).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // used by the x86 kernels only
const KC: usize = 512;

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
    matmul_float_capped(super::simd_ceiling(), pool, w, x, m_rows, out)
}

/// [`matmul_float`] with the kernel sets capped at `ceiling` (tests compare the sets).
pub(crate) fn matmul_float_capped<E: Elem>(
    ceiling: super::SimdCeiling,
    pool: &ThreadPool,
    w: &FloatMatrix<E>,
    x: &[f32],
    m_rows: usize,
    out: &mut [f32],
) {
    assert!(x.len() >= m_rows * w.cols && out.len() >= m_rows * w.rows, "matmul_float: short buffers");
    let outp = OutPtr(out.as_mut_ptr());
    let (kernel, align) = pick::<E>(ceiling, m_rows);
    pool.run(|i, n| {
        let rows = split_range(w.rows, n, i, align);
        // SAFETY: output columns `rows` of every activation row belong to this thread.
        unsafe { kernel(w, x, m_rows, rows, outp) };
    });
}

type Kernel<E> = unsafe fn(&FloatMatrix<E>, &[f32], usize, std::ops::Range<usize>, OutPtr);

/// The kernel for `m_rows` activation rows and the row alignment of its thread shares.
fn pick<E: Elem>(ceiling: super::SimdCeiling, m_rows: usize) -> (Kernel<E>, usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use super::SimdCeiling;
        let blocked = m_rows >= BLOCKED_MIN_ROWS;
        if ceiling >= SimdCeiling::Detected && std::arch::is_x86_feature_detected!("avx512f") {
            return if blocked { (blocked_avx512::<E>, avx512::PANEL) } else { (rows_avx512::<E>, 1) };
        }
        if ceiling >= SimdCeiling::Avx2
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            return if blocked { (blocked_avx2::<E>, avx2::PANEL) } else { (rows_avx2::<E>, 1) };
        }
    }
    let _ = (ceiling, m_rows);
    (rows_portable::<E>, 1)
}

/// Widens weight rows `o0..o0+r` (`r <= panel`), columns `k0..k0+kc`, into `panel` rows of
/// stride [`KC`]; rows `r..panel_rows` are zero (their outputs are never stored).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // used by the x86 kernels only
#[inline(always)]
fn widen_panel<E: Elem>(
    w: &FloatMatrix<E>,
    o0: usize,
    r: usize,
    k0: usize,
    kc: usize,
    panel: &mut [f32],
    panel_rows: usize,
) {
    for j in 0..panel_rows {
        let dst = &mut panel[j * KC..j * KC + kc];
        if j < r {
            widen_row(&w.row(o0 + j)[k0..k0 + kc], dst);
        } else {
            dst.fill(0.0);
        }
    }
}

/// `dst[i] = src[i]` as f32, 16 at a time without bounds checks (`len` is a multiple of 16):
/// inlined into the SIMD kernels, where it compiles to wide loads, shifts and stores.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // used by the x86 kernels only
#[inline(always)]
fn widen_row<E: Elem>(src: &[E], dst: &mut [f32]) {
    assert!(src.len() == dst.len() && src.len().is_multiple_of(LANES));
    for (d, s) in dst.chunks_exact_mut(LANES).zip(src.chunks_exact(LANES)) {
        let s: &[E; LANES] = s.try_into().expect("16 lanes");
        let d: &mut [f32; LANES] = d.try_into().expect("16 lanes");
        for l in 0..LANES {
            d[l] = s[l].widen();
        }
    }
}

/// The shared part of the blocked kernels: for each panel of `P` weight rows and each column
/// block, widen the panel, run `tile(panel, x_row0, activation rows, k0, kc, acc)` over the
/// activation rows in groups of at most `B`, then finish each output from its parked lanes
/// (the tail columns with the same fused multiply-adds the direct kernels use, then [`reduce`]).
///
/// # Safety
/// The caller owns output columns `rows` of all `m` activation rows; `tile` must only touch
/// the accumulators of the rows it is given.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // used by the x86 kernels only
#[inline(always)]
unsafe fn blocked_rows<E: Elem, const P: usize, const B: usize>(
    w: &FloatMatrix<E>,
    x: &[f32],
    m: usize,
    rows: std::ops::Range<usize>,
    out: OutPtr,
    tile: impl Fn(&[f32], usize, usize, usize, usize, &mut [f32]),
    reduce_lanes: impl Fn(&[f32; LANES]) -> f32,
) {
    let cols = w.cols;
    let full = cols / LANES * LANES;
    let mut panel = vec![0f32; P * KC];
    // acc[(row * P + j) * LANES + lane]
    let mut acc = vec![0f32; m * P * LANES];
    let mut o = rows.start;
    while o < rows.end {
        let r = P.min(rows.end - o);
        acc.fill(0.0);
        let mut k0 = 0;
        while k0 < full {
            let kc = KC.min(full - k0);
            widen_panel(w, o, r, k0, kc, &mut panel, P);
            let mut r0 = 0;
            while r0 < m {
                let b = B.min(m - r0);
                tile(&panel, r0, b, k0, kc, &mut acc);
                r0 += b;
            }
            k0 += kc;
        }
        for row in 0..m {
            for j in 0..r {
                let parked: &[f32; LANES] = acc[(row * P + j) * LANES..][..LANES].try_into().expect("16 lanes");
                let v = if full == cols {
                    reduce_lanes(parked)
                } else {
                    let mut lanes = *parked;
                    for cc in full..cols {
                        let (wv, xv) = (w.row(o + j)[cc].widen(), x[row * cols + cc]);
                        lanes[cc - full] = wv.mul_add(xv, lanes[cc - full]);
                    }
                    reduce(&lanes)
                };
                // SAFETY: column o+j of every activation row is ours.
                unsafe { *out.0.add(row * w.rows + o + j) = v };
            }
        }
        o += r;
    }
}

/// Cache-blocked AVX-512 form (see the module docs): 8 x 3 register tiles.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn blocked_avx512<E: Elem>(w: &FloatMatrix<E>, x: &[f32], m: usize, rows: std::ops::Range<usize>, out: OutPtr) {
    let cols = w.cols;
    // SAFETY: forwarded; the tiles read the panel and activation rows in bounds.
    unsafe {
        blocked_rows::<E, { avx512::PANEL }, 3>(
            w,
            x,
            m,
            rows,
            out,
            |panel, r0, b, k0, kc, acc| {
                let xp = x.as_ptr().add(r0 * cols + k0);
                let ap = acc.as_mut_ptr().add(r0 * avx512::PANEL * LANES);
                match b {
                    3 => avx512::panel_tile::<3>(panel.as_ptr(), xp, cols, kc, ap),
                    2 => avx512::panel_tile::<2>(panel.as_ptr(), xp, cols, kc, ap),
                    _ => avx512::panel_tile::<1>(panel.as_ptr(), xp, cols, kc, ap),
                }
            },
            |lanes| avx2::reduce_lanes(lanes),
        )
    }
}

/// Cache-blocked AVX2 form (see the module docs): two 3 x 2 register tiles per 6-row panel.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn blocked_avx2<E: Elem>(w: &FloatMatrix<E>, x: &[f32], m: usize, rows: std::ops::Range<usize>, out: OutPtr) {
    let cols = w.cols;
    // SAFETY: forwarded; the tiles read the panel and activation rows in bounds.
    unsafe {
        blocked_rows::<E, { avx2::PANEL }, 2>(
            w,
            x,
            m,
            rows,
            out,
            |panel, r0, b, k0, kc, acc| {
                let xp = x.as_ptr().add(r0 * cols + k0);
                for half in 0..2 {
                    let pp = panel.as_ptr().add(half * 3 * KC);
                    let ap = acc.as_mut_ptr().add((r0 * avx2::PANEL + half * 3) * LANES);
                    if b == 2 {
                        avx2::panel_tile::<2>(pp, xp, cols, kc, ap)
                    } else {
                        avx2::panel_tile::<1>(pp, xp, cols, kc, ap)
                    }
                }
            },
            |lanes| avx2::reduce_lanes(lanes),
        )
    }
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
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    use super::{Elem, FloatMatrix, KC, LANES, OutPtr, reduce};

    /// Weight rows per panel of the blocked form.
    pub(crate) const PANEL: usize = 8;

    /// The panel's 8 rows x activation rows `xp`, `xp + cols`, ... (`B` of them) over `kc`
    /// columns, accumulating into the parked lanes at `acc` (`[B][PANEL][16]`).
    ///
    /// # Safety
    /// AVX-512F present; `panel` holds `PANEL` rows of stride `KC` with `kc` valid columns,
    /// `xp` `B` rows of stride `cols` with `kc` readable values, `acc` `B * PANEL * 16` floats.
    #[allow(clippy::needless_range_loop)] // register arrays indexed by row/activation read clearer
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn panel_tile<const B: usize>(
        panel: *const f32,
        xp: *const f32,
        cols: usize,
        kc: usize,
        acc: *mut f32,
    ) {
        // SAFETY: all offsets are within the bounds the caller guarantees.
        unsafe {
            let mut a = [[_mm512_setzero_ps(); PANEL]; B];
            for (b, ab) in a.iter_mut().enumerate() {
                for (j, v) in ab.iter_mut().enumerate() {
                    *v = _mm512_loadu_ps(acc.add((b * PANEL + j) * LANES));
                }
            }
            let mut c = 0;
            while c < kc {
                // The next tile's activation rows, one line each per step, into L1 ahead of use.
                for b in 0..B {
                    _mm_prefetch::<_MM_HINT_T0>(xp.wrapping_add((B + b) * cols + c) as *const i8);
                }
                let xv: [__m512; B] = std::array::from_fn(|b| _mm512_loadu_ps(xp.add(b * cols + c)));
                for j in 0..PANEL {
                    let wv = _mm512_loadu_ps(panel.add(j * KC + c));
                    for b in 0..B {
                        a[b][j] = _mm512_fmadd_ps(wv, xv[b], a[b][j]);
                    }
                }
                c += LANES;
            }
            for (b, ab) in a.iter().enumerate() {
                for (j, v) in ab.iter().enumerate() {
                    _mm512_storeu_ps(acc.add((b * PANEL + j) * LANES), *v);
                }
            }
        }
    }

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
        // The first activation block streams the weight rows from memory: fetch ahead.
        let prefetch = r0 == 0;
        while c < full {
            if prefetch {
                // SAFETY: prefetches only hint; an address past the buffer is not fetched.
                unsafe { super::prefetch_rows_ahead(&wp, c) };
            }
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

    use super::{Elem, FloatMatrix, KC, LANES, OutPtr, reduce};

    /// Weight rows per panel of the blocked form (two 3-row tiles).
    pub(super) const PANEL: usize = 6;

    /// [`super::reduce`] in registers: the same pairs added in the same order (lane i with
    /// i + 8, then i with i + 4, then 0 + 2 with 1 + 3), so the same bits.
    ///
    /// # Safety
    /// AVX2 present (the caller's target features).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn reduce_lanes(lanes: &[f32; LANES]) -> f32 {
        // SAFETY: 16 readable floats.
        unsafe {
            let p = lanes.as_ptr();
            let h = _mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)));
            let q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
            // [q0 + q2, q1 + q3, ..]
            let r = _mm_add_ps(q, _mm_movehl_ps(q, q));
            _mm_cvtss_f32(_mm_add_ss(r, _mm_shuffle_ps::<0b01>(r, r)))
        }
    }

    /// Three panel rows (stride `KC`) x `B` activation rows over `kc` columns, into the parked
    /// lanes at `acc` (row stride `PANEL * 16`; lanes 0..8 and 8..16 as the direct kernel).
    /// 12 accumulators, two activation vectors and one weight vector: 15 of the 16 registers.
    ///
    /// # Safety
    /// AVX2 and FMA present; bounds as [`super::avx512::panel_tile`].
    #[allow(clippy::needless_range_loop)] // register arrays indexed by row/activation read clearer
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn panel_tile<const B: usize>(
        panel: *const f32,
        xp: *const f32,
        cols: usize,
        kc: usize,
        acc: *mut f32,
    ) {
        const R: usize = 3;
        // SAFETY: all offsets are within the bounds the caller guarantees.
        unsafe {
            let mut a = [[[_mm256_setzero_ps(); 2]; R]; B];
            for (b, ab) in a.iter_mut().enumerate() {
                for (j, v) in ab.iter_mut().enumerate() {
                    let p = acc.add((b * PANEL + j) * LANES);
                    *v = [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))];
                }
            }
            let mut c = 0;
            while c < kc {
                for h in 0..2 {
                    let xv: [__m256; B] = std::array::from_fn(|b| _mm256_loadu_ps(xp.add(b * cols + c + 8 * h)));
                    for j in 0..R {
                        let wv = _mm256_loadu_ps(panel.add(j * KC + c + 8 * h));
                        for b in 0..B {
                            a[b][j][h] = _mm256_fmadd_ps(wv, xv[b], a[b][j][h]);
                        }
                    }
                }
                c += LANES;
            }
            for (b, ab) in a.iter().enumerate() {
                for (j, v) in ab.iter().enumerate() {
                    let p = acc.add((b * PANEL + j) * LANES);
                    _mm256_storeu_ps(p, v[0]);
                    _mm256_storeu_ps(p.add(8), v[1]);
                }
            }
        }
    }

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
        // The first activation block streams the weight rows from memory: fetch ahead.
        let prefetch = r0 == 0;
        while c < full {
            if prefetch {
                // SAFETY: prefetches only hint; an address past the buffer is not fetched.
                unsafe { super::prefetch_rows_ahead(&wp, c) };
            }
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
pub(crate) fn reduce(a: &[f32; LANES]) -> f32 {
    let mut h = [0f32; 8];
    for i in 0..8 {
        h[i] = a[i] + a[i + 8];
    }
    let q = [h[0] + h[4], h[1] + h[5], h[2] + h[6], h[3] + h[7]];
    (q[0] + q[2]) + (q[1] + q[3])
}

#[cfg(test)]
#[path = "floatmm_tests.rs"]
mod tests;
