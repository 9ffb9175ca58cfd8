//! GGML K-quant weight matrices (Q4_K, Q5_K, Q6_K: 256-value super-blocks, as llama.cpp's
//! `ggml-common.h` lays them out) and their matmul `out[m, o] = sum_i x[m, i] * W[o, i]`.
//!
//! Layouts (bytes, in order), `d`/`dmin` f16:
//! - Q4_K (144): `d`, `dmin`, `scales[12]` (eight 6-bit scale/min pairs), `qs[128]` (4-bit).
//! - Q5_K (176): `d`, `dmin`, `scales[12]`, `qh[32]` (fifth bits), `qs[128]`.
//! - Q6_K (210): `ql[128]` (low 4 bits), `qh[64]` (high 2 bits), `scales[16]` (i8), `d`.
//!
//! [`dequantize_row`] is the reference for the values (ggml's `dequantize_row_q*_K`, value for
//! value); embeddings and tests use it.
//!
//! Matmul multiplies integer codes by activations quantized to 8 bits per 256-value block
//! ([`Q8KActs`], as llama.cpp's `Q8_K`): per super-block, the code-times-activation sums of
//! the sub-blocks, scaled by the sub-block scales as integers, give one exact integer per
//! (weight row, activation row, block), which one shared float formula adds to the row's
//! result in block order ([`accumulate_block`]). Every kernel set computes the same integers
//! and the same float operations in the same order, so a row's result has the same bits on
//! every kernel set, for any number of activation rows, any split into threads and any pass
//! split (the speculative == plain contract needs the last).
//!
//! Two layouts: the file's ([`Layout::File`]: the [`Scalar`] reference here, NEON with and
//! without `sdot` in `kquant_neon.rs`), and [`Layout::Grouped`], sixteen weight rows
//! interleaved per block so that one vector holds four codes of each of sixteen rows
//! (`kquant_grouped.rs`): the x86 kernels (AVX2, AVX-512, AVX-512 VNNI) multiply it against
//! one activation row's four codes broadcast, eight or sixteen dot products at once with no
//! reduction across lanes. A matrix is stored in one layout, the one the kernel set chosen
//! at load wants.
//!
//! Results differ from an exact f32 product by the activation rounding (relative ~1e-3), as
//! llama.cpp's do.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::matmul::OutPtr;
use super::threadpool::{ThreadPool, split_range};

use engine_ops::kquant::half;
pub use engine_ops::kquant::{KQuantType, QK_K, dequantize_row, quantize_rows, scale_min};
/// Activation values per entry of [`Q8KActs::bsums`].
pub const BSUM_VALUES: usize = 16;

/// Why a [`KQuantMatrix`] could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KQuantError {
    #[error("{dtype} rows of {cols} values are not whole super-blocks of {QK_K}")]
    Cols { dtype: &'static str, cols: usize },
    #[error("{dtype} [{rows}, {cols}] needs {want} bytes, got {got}")]
    Len { dtype: &'static str, rows: usize, cols: usize, want: usize, got: usize },
}

/// How a [`KQuantMatrix`] holds its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// As the file stores them: row-major super-blocks.
    File,
    /// Sixteen rows interleaved per block (`kquant_grouped.rs`); the last group padded with
    /// zero rows.
    Grouped,
}

/// A K-quant matrix `[rows][cols]`.
pub struct KQuantMatrix {
    pub dtype: KQuantType,
    pub rows: usize,
    pub cols: usize,
    layout: Layout,
    data: Vec<u8>,
}

impl KQuantMatrix {
    /// The matrix from its file bytes (row-major super-blocks), in the layout this CPU's
    /// kernel set (and `EDGE_KERNELS_ISA`) multiplies.
    pub fn new(dtype: KQuantType, rows: usize, cols: usize, data: &[u8]) -> Result<KQuantMatrix, KQuantError> {
        let layout = if grouped_kernel().is_some() { Layout::Grouped } else { Layout::File };
        KQuantMatrix::with_layout(dtype, rows, cols, data, layout)
    }

    /// As [`KQuantMatrix::new`], in the layout given.
    pub fn with_layout(
        dtype: KQuantType,
        rows: usize,
        cols: usize,
        data: &[u8],
        layout: Layout,
    ) -> Result<KQuantMatrix, KQuantError> {
        if cols == 0 || !cols.is_multiple_of(QK_K) {
            return Err(KQuantError::Cols { dtype: dtype.name(), cols });
        }
        let want = rows * cols / QK_K * dtype.block_bytes();
        if data.len() != want {
            return Err(KQuantError::Len { dtype: dtype.name(), rows, cols, want, got: data.len() });
        }
        let data = match layout {
            Layout::File => data.to_vec(),
            Layout::Grouped => grouped::pack(dtype, rows, cols, data),
        };
        Ok(KQuantMatrix { dtype, rows, cols, layout, data })
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// Bytes of one row in the file layout.
    #[inline(always)]
    fn row_bytes(&self) -> usize {
        self.cols / QK_K * self.dtype.block_bytes()
    }

    /// Row `r` as f32 (`out.len() == cols`), the reference's values in either layout.
    #[inline(always)]
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        match self.layout {
            Layout::File => {
                let rb = self.row_bytes();
                dequantize_row(self.dtype, &self.data[r * rb..(r + 1) * rb], out);
            }
            Layout::Grouped => {
                let row = grouped::unpack_row(self.dtype, self.cols, &self.data, r);
                dequantize_row(self.dtype, &row, out);
            }
        }
    }

    /// Bytes the matrix holds (the grouped layout stores scales unpacked: about 3% more).
    pub fn weight_bytes(&self) -> usize {
        self.data.len()
    }
}

/// Activation rows quantized for the K-quant dot products (llama.cpp's `Q8_K`): per row and
/// 256-value block, codes `q = round(x / d)` in `-127..=127` with `d = max|x| / 127`, and the
/// sums of each 16 and each 32 codes (the `dmin` and Q6_K offset terms need them).
#[derive(Clone, Debug, Default)]
pub struct Q8KActs {
    pub m_rows: usize,
    pub cols: usize,
    /// `[m][cols]` codes.
    pub qs: Vec<i8>,
    /// `[m][cols / 256]` block scales.
    pub d: Vec<f32>,
    /// `[m][cols / 16]` sums of 16 codes.
    pub bsums: Vec<i16>,
    /// `[m][cols / 32]` sums of 32 codes (|sum| <= 32 * 127: an i16).
    pub sums32: Vec<i16>,
}

impl Q8KActs {
    /// Quantizes `m_rows` rows of `cols` values (`cols` whole blocks), rows split over `pool`.
    pub fn quantize(pool: &ThreadPool, x: &[f32], m_rows: usize, cols: usize) -> Q8KActs {
        let mut a = Q8KActs::default();
        a.quantize_into(pool, x, m_rows, cols);
        a
    }

    /// [`Q8KActs::quantize`] into these buffers (no allocation once they are large enough).
    pub fn quantize_into(&mut self, pool: &ThreadPool, x: &[f32], m_rows: usize, cols: usize) {
        assert!(cols.is_multiple_of(QK_K) && x.len() >= m_rows * cols, "Q8KActs: bad shape");
        let nb = cols / QK_K;
        self.m_rows = m_rows;
        self.cols = cols;
        self.qs.resize(m_rows * cols, 0);
        self.d.resize(m_rows * nb, 0.0);
        self.bsums.resize(m_rows * cols / BSUM_VALUES, 0);
        self.sums32.resize(m_rows * cols / 32, 0);
        let (qs, d) = (SendPtr(self.qs.as_mut_ptr()), SendPtr(self.d.as_mut_ptr()));
        let (bsums, sums32) = (SendPtr(self.bsums.as_mut_ptr()), SendPtr(self.sums32.as_mut_ptr()));
        pool.run(|i, n| {
            let (qs, d, bsums, sums32) = (qs, d, bsums, sums32);
            for blk in split_range(m_rows * nb, n, i, 1) {
                // SAFETY: block `blk`'s codes, scale and sums belong to this thread alone.
                let (q, s, s32) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(qs.0.add(blk * QK_K), QK_K),
                        std::slice::from_raw_parts_mut(bsums.0.add(blk * QK_K / BSUM_VALUES), QK_K / BSUM_VALUES),
                        std::slice::from_raw_parts_mut(sums32.0.add(blk * QK_K / 32), QK_K / 32),
                    )
                };
                let scale = quantize_block_q8k(&x[blk * QK_K..(blk + 1) * QK_K], q, s);
                for (t, pair) in s32.iter_mut().zip(s.chunks_exact(2)) {
                    *t = pair[0] + pair[1];
                }
                // SAFETY: as above.
                unsafe { *d.0.add(blk) = scale };
            }
        });
    }
}

#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: threads write disjoint blocks.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}

/// One block of 256 values: codes into `q`, sums of 16 into `bsums`; returns the scale. Plain
/// IEEE operations (max, divide, multiply, round half away from zero), so any vectorization
/// the compiler picks gives the same codes. Compiled for AVX2 where allowed: without SSE4.1
/// `round` is a libm call per value, which made quantizing cost as much as a prefill matmul.
fn quantize_block_q8k(x: &[f32], q: &mut [i8], bsums: &mut [i16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::simd_ceiling() >= super::SimdCeiling::Avx2 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 checked.
        return unsafe { quantize_block_q8k_avx2(x, q, bsums) };
    }
    quantize_block_q8k_body(x, q, bsums)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_block_q8k_avx2(x: &[f32], q: &mut [i8], bsums: &mut [i16]) -> f32 {
    quantize_block_q8k_body(x, q, bsums)
}

#[inline(always)]
fn quantize_block_q8k_body(x: &[f32], q: &mut [i8], bsums: &mut [i16]) -> f32 {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (o, &v) in q.iter_mut().zip(x) {
        // the clamp only matters for NaN/inf input
        *o = (v * id).round().clamp(-127.0, 127.0) as i8;
    }
    for (s, c) in bsums.iter_mut().zip(q.chunks_exact(BSUM_VALUES)) {
        *s = c.iter().map(|&v| v as i16).sum();
    }
    d
}

/// The eight 6-bit scales and eight 6-bit mins of a Q4_K/Q5_K block from its 12 packed bytes,
/// as [`scale_min`] gives them one by one (whole-word shifts: the kernels call it per block).
#[inline(always)]
pub(super) fn scales_mins(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    let w = |i: usize| u32::from_le_bytes([packed[4 * i], packed[4 * i + 1], packed[4 * i + 2], packed[4 * i + 3]]);
    let (w0, w1, w2) = (w(0), w(1), w(2));
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const TOP2: u32 = 0x0303_0303;
    // scales 0..4: low 6 bits of bytes 0..4; 4..8: low nibbles of bytes 8..12 with the top
    // two bits of bytes 0..4. Mins likewise from bytes 4..8 and the high nibbles of 8..12.
    let sc_hi = (w2 & LOW4) | (((w0 >> 6) & TOP2) << 4);
    let mn_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & TOP2) << 4);
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    sc[..4].copy_from_slice(&(w0 & LOW6).to_le_bytes());
    sc[4..].copy_from_slice(&sc_hi.to_le_bytes());
    mn[..4].copy_from_slice(&(w1 & LOW6).to_le_bytes());
    mn[4..].copy_from_slice(&mn_hi.to_le_bytes());
    (sc, mn)
}

/// Lanes of a block's integer sums in the file-layout kernels (see [`BlockSums`]).
pub(super) const LANES: usize = 8;

/// Block `(d, dmin)` of a K-quant block; for Q6_K `dmin = d`, since its -32 code offset
/// enters through the min sum (`sum sc * (q - 32) * a = sum sc * q * a - 32 * sum sc * a`).
#[inline(always)]
pub(super) fn block_scales(dtype: KQuantType, blk: &[u8]) -> (f32, f32) {
    match dtype {
        KQuantType::Q4K | KQuantType::Q5K => (half(blk, 0), half(blk, 2)),
        KQuantType::Q6K => (half(blk, 208), half(blk, 208)),
    }
}

/// The float part every kernel set shares, per weight row, activation row and block in
/// block order: `acc = fma(d * da, S, acc)`, then `acc = fma(-(dmin * da), N, acc)`, from
/// `acc = 0`, where the block's two exact integers are
/// - `S = sum sc(p) * q(p) * a(p)` over its 256 positions (`sc(p)` the sub-block scale, `q`
///   the unsigned code: 0..32 for Q4_K/Q5_K, 0..64 for Q6_K, `a` the activation code), and
/// - `N`: Q4_K/Q5_K `sum_j min[j] * (bs[2j] + bs[2j + 1])`, Q6_K
///   `32 * sum_t sc[t] * bs[t]` (`bs` the activation sums of 16).
///
/// (i32 to f32 rounds to nearest-even everywhere; `d * da` is one f32 product.) The
/// integers may be summed in any order, so each kernel set lays out its work as suits it:
/// weight rows in vector lanes for the grouped layout, positions in lanes for the file layout.
#[inline(always)]
pub(super) fn accumulate_block(acc: f32, d: f32, dmin: f32, da: f32, s: i32, n: i32) -> f32 {
    let acc = (d * da).mul_add(s as f32, acc);
    (-(dmin * da)).mul_add(n as f32, acc)
}

/// One file-layout kernel set's block arithmetic: per weight row, activation row and
/// super-block, two sets of [`LANES`] exact i32 sums whose totals are the `S` and `N` of
/// [`accumulate_block`] (code lane `k` holds the positions `p` with `p % 32 / 4 == k`: four
/// adjacent bytes per lane is what `madd` and `sdot` produce).
pub(super) trait BlockSums {
    /// [`LANES`] i32 lanes.
    type Lanes: Copy;
    /// Code and min lanes per activation row. `a[r]` points at the block's 256 codes of row
    /// r, `bs[r]` at its 16 sums.
    ///
    /// # Safety
    /// `blk` is one whole block of the type; `a`/`bs` point at whole blocks; the CPU has the
    /// implementation's features.
    unsafe fn q4k<const M: usize>(
        blk: *const u8,
        a: [*const i8; M],
        bs: [*const i16; M],
    ) -> ([Self::Lanes; M], [Self::Lanes; M]);
    /// # Safety
    /// As [`BlockSums::q4k`].
    unsafe fn q5k<const M: usize>(
        blk: *const u8,
        a: [*const i8; M],
        bs: [*const i16; M],
    ) -> ([Self::Lanes; M], [Self::Lanes; M]);
    /// # Safety
    /// As [`BlockSums::q4k`].
    unsafe fn q6k<const M: usize>(
        blk: *const u8,
        a: [*const i8; M],
        bs: [*const i16; M],
    ) -> ([Self::Lanes; M], [Self::Lanes; M]);
    /// The sum of the lanes (exact).
    ///
    /// # Safety
    /// The CPU has the implementation's features.
    unsafe fn total(lanes: Self::Lanes) -> i32;
    /// [`block_scales`] (f16 to f32 is exact: any conversion gives the same bits).
    ///
    /// # Safety
    /// As [`BlockSums::q4k`].
    #[inline(always)]
    unsafe fn scales(dtype: KQuantType, blk: &[u8]) -> (f32, f32) {
        block_scales(dtype, blk)
    }
}

/// The reference: plain integer loops in the layout's own terms.
pub(super) struct Scalar;

type Lanes8 = [i32; LANES];

impl Scalar {
    fn q4k_one(blk: &[u8], a: &[i8], bs: &[i16], fifth: Option<&[u8]>) -> (Lanes8, Lanes8) {
        let (sc, mn) = scales_mins(&blk[4..16]);
        let qs = if fifth.is_some() { &blk[48..176] } else { &blk[16..144] };
        let mut codes = [0i32; LANES];
        for g in 0..4 {
            for l in 0..32 {
                let (mut lo, mut hi) = ((qs[32 * g + l] & 0xf) as i32, (qs[32 * g + l] >> 4) as i32);
                if let Some(qh) = fifth {
                    lo += ((qh[l] >> (2 * g)) & 1) as i32 * 16;
                    hi += ((qh[l] >> (2 * g + 1)) & 1) as i32 * 16;
                }
                codes[l / 4] += sc[2 * g] as i32 * lo * a[64 * g + l] as i32;
                codes[l / 4] += sc[2 * g + 1] as i32 * hi * a[64 * g + 32 + l] as i32;
            }
        }
        let mins = std::array::from_fn(|k| mn[k] as i32 * (bs[2 * k] as i32 + bs[2 * k + 1] as i32));
        (codes, mins)
    }

    fn q6k_one(blk: &[u8], a: &[i8], bs: &[i16]) -> (Lanes8, Lanes8) {
        let sc = |t: usize| (blk[192 + t] as i8) as i32;
        let mut codes = [0i32; LANES];
        for n in 0..2 {
            let (ql, qh) = (&blk[64 * n..64 * n + 64], &blk[128 + 32 * n..128 + 32 * n + 32]);
            for l in 0..32 {
                // codes 0..64 at positions 128n + 32k + l (the -32 offset is in the min lanes)
                let q = [
                    (ql[l] & 0xf) | ((qh[l] & 3) << 4),
                    (ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
                ];
                for (k, &q) in q.iter().enumerate() {
                    codes[l / 4] += sc(8 * n + 2 * k + l / 16) * q as i32 * a[128 * n + 32 * k + l] as i32;
                }
            }
        }
        let mins = std::array::from_fn(|k| 32 * (sc(2 * k) * bs[2 * k] as i32 + sc(2 * k + 1) * bs[2 * k + 1] as i32));
        (codes, mins)
    }

    /// # Safety
    /// As [`BlockSums::q4k`].
    unsafe fn each<const M: usize>(
        bytes: usize,
        blk: *const u8,
        a: [*const i8; M],
        bs: [*const i16; M],
        one: impl Fn(&[u8], &[i8], &[i16]) -> (Lanes8, Lanes8),
    ) -> ([Lanes8; M], [Lanes8; M]) {
        // SAFETY: the caller's contract.
        let blk = unsafe { std::slice::from_raw_parts(blk, bytes) };
        let (mut codes, mut mins) = ([[0; LANES]; M], [[0; LANES]; M]);
        for r in 0..M {
            // SAFETY: the caller's contract.
            let (a, bs) = unsafe {
                (std::slice::from_raw_parts(a[r], QK_K), std::slice::from_raw_parts(bs[r], QK_K / BSUM_VALUES))
            };
            (codes[r], mins[r]) = one(blk, a, bs);
        }
        (codes, mins)
    }
}

impl BlockSums for Scalar {
    type Lanes = Lanes8;

    unsafe fn q4k<const M: usize>(
        blk: *const u8,
        a: [*const i8; M],
        bs: [*const i16; M],
    ) -> ([Lanes8; M], [Lanes8; M]) {
        // SAFETY: the caller's contract.
        unsafe { Scalar::each(144, blk, a, bs, |b, a, s| Scalar::q4k_one(b, a, s, None)) }
    }
    unsafe fn q5k<const M: usize>(
        blk: *const u8,
        a: [*const i8; M],
        bs: [*const i16; M],
    ) -> ([Lanes8; M], [Lanes8; M]) {
        // SAFETY: the caller's contract.
        unsafe { Scalar::each(176, blk, a, bs, |b, a, s| Scalar::q4k_one(b, a, s, Some(&b[16..48]))) }
    }
    unsafe fn q6k<const M: usize>(
        blk: *const u8,
        a: [*const i8; M],
        bs: [*const i16; M],
    ) -> ([Lanes8; M], [Lanes8; M]) {
        // SAFETY: the caller's contract.
        unsafe { Scalar::each(210, blk, a, bs, Scalar::q6k_one) }
    }
    #[inline(always)]
    unsafe fn total(lanes: Lanes8) -> i32 {
        lanes.iter().sum()
    }
}

/// Dot products of weight row `o` with activation rows `ms`, block by block. (Loops over
/// the `M` rows rather than `array::map`, which does not always inline.)
#[inline(always)]
unsafe fn row_dots<K: BlockSums, const M: usize>(
    w: &KQuantMatrix,
    acts: &Q8KActs,
    o: usize,
    ms: [usize; M],
) -> [f32; M] {
    let nb = w.cols / QK_K;
    let bb = w.dtype.block_bytes();
    let row = &w.data[o * nb * bb..(o + 1) * nb * bb];
    let (mut qs, mut bsums, mut scales) = ([std::ptr::null(); M], [std::ptr::null(); M], [&[][..]; M]);
    for r in 0..M {
        qs[r] = acts.qs[ms[r] * w.cols..(ms[r] + 1) * w.cols].as_ptr();
        let n_sums = w.cols / BSUM_VALUES;
        bsums[r] = acts.bsums[ms[r] * n_sums..(ms[r] + 1) * n_sums].as_ptr();
        scales[r] = &acts.d[ms[r] * nb..(ms[r] + 1) * nb];
    }
    let mut acc = [0f32; M];
    for (b, blk) in row.chunks_exact(bb).enumerate() {
        let (mut a, mut bs) = ([std::ptr::null(); M], [std::ptr::null(); M]);
        for r in 0..M {
            // SAFETY: block `b` lies inside row `ms[r]` (sliced above).
            unsafe {
                a[r] = qs[r].add(b * QK_K);
                bs[r] = bsums[r].add(b * (QK_K / BSUM_VALUES));
            }
        }
        // SAFETY: whole blocks; the caller's CPU features.
        let (codes, mins) = unsafe {
            match w.dtype {
                KQuantType::Q4K => K::q4k::<M>(blk.as_ptr(), a, bs),
                KQuantType::Q5K => K::q5k::<M>(blk.as_ptr(), a, bs),
                KQuantType::Q6K => K::q6k::<M>(blk.as_ptr(), a, bs),
            }
        };
        // SAFETY: as above.
        let (d, dmin) = unsafe { K::scales(w.dtype, blk) };
        for r in 0..M {
            // SAFETY: as above.
            let (s, n) = unsafe { (K::total(codes[r]), K::total(mins[r])) };
            acc[r] = accumulate_block(acc[r], d, dmin, scales[r][b], s, n);
        }
    }
    acc
}

/// Activation rows sharing one pass over a weight row.
const M_TILE: usize = 4;
/// Bytes of weight rows that stay in cache while every activation row passes over them.
pub(super) const WEIGHT_TILE_BYTES: usize = 96 << 10;

/// Outputs `rows` of activation rows `first_act_row..`: weight rows in cache-sized tiles,
/// activation rows in fours (then one by one).
///
/// # Safety
/// `K`'s CPU features are present; the caller owns outputs `rows` of every activation row.
#[inline(always)]
pub(super) unsafe fn rows_tiled<K: BlockSums>(
    w: &KQuantMatrix,
    acts: &Q8KActs,
    rows: Range<usize>,
    out: OutPtr,
    first_act_row: usize,
) {
    let tile = (WEIGHT_TILE_BYTES / w.row_bytes()).max(1);
    let m_rows = acts.m_rows;
    let mut start = rows.start;
    while start < rows.end {
        let end = (start + tile).min(rows.end);
        let mut m = first_act_row;
        while m + M_TILE <= m_rows {
            for o in start..end {
                // SAFETY: the caller's contract.
                let dots = unsafe { row_dots::<K, M_TILE>(w, acts, o, [m, m + 1, m + 2, m + 3]) };
                for (r, v) in dots.into_iter().enumerate() {
                    // SAFETY: output `o` of every activation row belongs to this thread.
                    unsafe { *out.0.add((m + r) * w.rows + o) = v };
                }
            }
            m += M_TILE;
        }
        for m in m..m_rows {
            for o in start..end {
                // SAFETY: as above.
                unsafe { *out.0.add(m * w.rows + o) = row_dots::<K, 1>(w, acts, o, [m])[0] };
            }
        }
        start = end;
    }
}

/// How many of `units` (rows or row groups of `unit_bytes` each) one chunk holds. With
/// several activation rows, about four chunks per thread of at most a cache tile each (the
/// rows of a tile reuse it from cache). With one (decode) nothing is reused: two long chunks
/// per thread, since each chunk start is a new stream the prefetchers must pick up again
/// (capped at a tile, decode on the hybrid Q4_K_M file ran 4-8% slower); two, not one, so
/// that a thread can take over part of a descheduled one's share.
pub(super) fn chunk_units(units: usize, unit_bytes: usize, m_rows: usize, threads: usize) -> usize {
    let threads = threads.max(1);
    if m_rows == 1 {
        return units.div_ceil(2 * threads).max(1);
    }
    let tile = (WEIGHT_TILE_BYTES / unit_bytes.max(1)).max(1);
    units.div_ceil(4 * threads).clamp(1, tile)
}

/// Weight rows handed to the pool's threads a chunk at a time, as each asks: a thread that
/// is descheduled or slower takes fewer (a static split left the caller waiting on the other
/// thread for ~10% of a prefill on a shared 2-vCPU machine). Each row's result does not
/// depend on which thread computes it.
pub(super) struct RowChunks {
    next: AtomicUsize,
    rows: usize,
    chunk: usize,
}

impl RowChunks {
    /// Chunks of [`chunk_units`] rows, in multiples of four.
    fn new(w: &KQuantMatrix, m_rows: usize, threads: usize) -> RowChunks {
        let chunk = chunk_units(w.rows, w.row_bytes(), m_rows, threads).next_multiple_of(4);
        RowChunks::over(w.rows, chunk)
    }

    /// `rows` units (rows, or groups of rows) in chunks of `chunk`.
    pub(super) fn over(rows: usize, chunk: usize) -> RowChunks {
        RowChunks { next: AtomicUsize::new(0), rows, chunk: chunk.max(1) }
    }

    /// The next chunk of rows, if any are left.
    pub(super) fn next(&self) -> Option<Range<usize>> {
        let start = self.next.fetch_add(self.chunk, Ordering::Relaxed);
        (start < self.rows).then(|| start..(start + self.chunk).min(self.rows))
    }
}

/// The row kernel: `rows_tiled` compiled for one kernel set, over the chunks it takes.
type RowsKernel = unsafe fn(&KQuantMatrix, &Q8KActs, &RowChunks, OutPtr);

/// # Safety
/// The outputs of the rows in `chunks` are written by no one else.
unsafe fn rows_scalar(w: &KQuantMatrix, acts: &Q8KActs, chunks: &RowChunks, out: OutPtr) {
    while let Some(rows) = chunks.next() {
        // SAFETY: the caller's contract; the scalar kernels need no CPU features.
        unsafe { rows_tiled::<Scalar>(w, acts, rows, out, 0) }
    }
}

/// The widest kernel set this CPU (and `EDGE_KERNELS_ISA`) allows.
fn kernel() -> RowsKernel {
    #[cfg(target_arch = "aarch64")]
    if super::simd_ceiling() == super::SimdCeiling::Detected && std::arch::is_aarch64_feature_detected!("neon") {
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            return neon::rows_neon_dotprod;
        }
        return neon::rows_neon;
    }
    rows_scalar
}

#[cfg(target_arch = "aarch64")]
#[path = "kquant_neon.rs"]
mod neon;

#[path = "kquant_grouped.rs"]
pub(super) mod grouped;

/// The grouped-layout kernel this CPU (and `EDGE_KERNELS_ISA`) runs, if any.
fn grouped_kernel() -> Option<grouped::GroupedKernel> {
    #[cfg(target_arch = "x86_64")]
    {
        use super::{SimdCeiling, simd_ceiling};
        let ceiling = simd_ceiling();
        let has = |f: &str| match f {
            "avx512" => {
                std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw")
            }
            "avx512vnni" => std::arch::is_x86_feature_detected!("avx512vnni"),
            "avxvnni" => std::arch::is_x86_feature_detected!("avxvnni"),
            _ => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("f16c")
            }
        };
        if ceiling >= SimdCeiling::Detected && has("avx2") && has("avx512") {
            return Some(if has("avx512vnni") { grouped::x86::rows_avx512_vnni } else { grouped::x86::rows_avx512 });
        }
        if ceiling >= SimdCeiling::Avx2 && has("avx2") {
            // AVX-VNNI gives the same exact integers in fewer instructions (same bits).
            return Some(if has("avxvnni") { grouped::x86::rows_avx2_vnni } else { grouped::x86::rows_avx2 });
        }
    }
    None
}

/// `out[m * w.rows + o] = sum_i x[m * w.cols + i] * W[o][i]` for `m < m_rows`; all pool threads.
/// See the module docs for how; panics if `x` or `out` is shorter than the shapes need.
pub fn matmul_kquant(pool: &ThreadPool, w: &KQuantMatrix, x: &[f32], m_rows: usize, out: &mut [f32]) {
    assert!(x.len() >= m_rows * w.cols && out.len() >= m_rows * w.rows, "matmul_kquant: short buffers");
    let acts = Q8KActs::quantize(pool, x, m_rows, w.cols);
    matmul_kquant_q8k(pool, w, &acts, out)
}

/// [`matmul_kquant`] on activations already quantized (several matrices that read the same
/// input share one quantization).
pub fn matmul_kquant_q8k(pool: &ThreadPool, w: &KQuantMatrix, acts: &Q8KActs, out: &mut [f32]) {
    matmul_kquant_q8k_many(pool, acts, &mut [(w, out)])
}

/// [`matmul_kquant_q8k`] for several matrices that read the same activations, in one pool
/// call: a thread moves on to the next matrix as soon as the current one's chunks are all
/// taken, so there is one wait at the end instead of one per matrix (and small matrices,
/// such as the gate projections of a few rows, do not leave a thread idle on their own).
/// Each output is what [`matmul_kquant_q8k`] gives.
pub fn matmul_kquant_q8k_many(pool: &ThreadPool, acts: &Q8KActs, mats: &mut [(&KQuantMatrix, &mut [f32])]) {
    struct Job<'a> {
        w: &'a KQuantMatrix,
        kernel: RowsKernel,
        chunks: RowChunks,
        out: OutPtr,
    }
    let threads = pool.n_threads();
    let jobs: Vec<Job<'_>> = mats
        .iter_mut()
        .map(|(w, out)| {
            assert!(acts.cols == w.cols && out.len() >= acts.m_rows * w.rows, "matmul_kquant: shapes");
            let (kernel, chunks) = match w.layout {
                Layout::File => (kernel(), RowChunks::new(w, acts.m_rows, threads)),
                Layout::Grouped => {
                    // A grouped matrix is built only where a grouped kernel runs.
                    let kernel: RowsKernel = grouped_kernel().expect("grouped layout without its kernel");
                    (kernel, grouped::chunks(w, acts.m_rows, threads))
                }
            };
            Job { w, kernel, chunks, out: OutPtr(out.as_mut_ptr()) }
        })
        .collect();
    pool.run(|_, _| {
        for job in &jobs {
            let out_base = job.out; // the whole Sync wrapper, not its raw pointer field
            // SAFETY: the kernels' features were checked when they were chosen; each chunk's
            // outputs go to the one thread that took it, and the outputs do not overlap
            // (distinct `&mut` slices).
            unsafe { (job.kernel)(job.w, acts, &job.chunks, out_base) };
        }
    });
}

/// One matrix on a kernel the caller picks (the tests run every kernel set this way).
#[cfg(test)]
fn matmul_kquant_q8k_with(pool: &ThreadPool, kernel: RowsKernel, w: &KQuantMatrix, acts: &Q8KActs, out: &mut [f32]) {
    assert!(w.layout == Layout::File, "file-layout kernel on a grouped matrix");
    assert!(acts.cols == w.cols && out.len() >= acts.m_rows * w.rows, "matmul_kquant: shapes");
    let outp = OutPtr(out.as_mut_ptr());
    let chunks = RowChunks::new(w, acts.m_rows, pool.n_threads());
    pool.run(|_, _| {
        let out_base = outp; // the whole Sync wrapper, not its raw pointer field
        // SAFETY: the kernel's features were checked; each chunk's outputs go to the one
        // thread that took it.
        unsafe { kernel(w, acts, &chunks, out_base) };
    });
}

#[cfg(test)]
#[path = "kquant_tests.rs"]
mod tests;
