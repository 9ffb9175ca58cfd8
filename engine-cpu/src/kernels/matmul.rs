//! Matrix multiplication of activation rows by GGUF weight matrices:
//! `out[m * rows + n] = sum_k x[m * cols + k] * W[n][k]`.
//!
//! Two entry points:
//! - [`matmul`] takes a [`QMatrix`] straight from the GGUF bytes (row-wise integer dots; fine
//!   for tests and cold paths).
//! - [`matmul_packed`] takes a [`PackedMatrix`] built once at load time by [`PackedMatrix::pack`]:
//!   quantized weights are re-laid in tiles of 16 rows x 32 columns so one 512-bit VNNI
//!   instruction produces 16 output rows, and each weight tile is loaded once for up to
//!   [`M_BLOCK`] activation rows. This is the fast path.
//!
//! Quantized weights multiply Q8-quantized activations ([`Q8Acts`], built once per call or
//! shared via [`matmul_packed_q8`]); results differ from an exact f32 product by that
//! activation rounding (relative ~1e-3), identically on every ISA up to float summation order.
//! Work is split across all pool threads by output rows.

use super::quant::{GgmlType, Q8Acts, QK, dequantize_row, f16_to_f32, read_u16};
use super::threadpool::{ThreadPool, split_range};

/// Rows per packed tile (one 512-bit vector of i32/f32 lanes).
pub const TILE_ROWS: usize = 16;
/// Activation rows that share one pass over a weight tile.
pub const M_BLOCK: usize = 4;

/// A weight matrix as stored in GGUF: `rows` output features, each a contiguous row of `cols` inputs.
#[derive(Clone, Copy)]
pub struct QMatrix<'a> {
    pub dtype: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
}

impl QMatrix<'_> {
    /// Bytes of row `r`. Panics if the matrix bytes are shorter than its shape says; shapes are
    /// validated when the model is loaded ([`QMatrix::check`]).
    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }

    fn row_bytes(&self) -> usize {
        self.dtype.row_bytes(self.cols).unwrap_or(0)
    }

    /// Whether the shape is consistent with the bytes (cols a whole number of blocks, enough data).
    pub fn check(&self) -> bool {
        match self.dtype.row_bytes(self.cols) {
            Some(rb) => rb.checked_mul(self.rows).is_some_and(|n| n <= self.data.len()),
            None => false,
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub *mut f32);
// SAFETY: threads write disjoint output rows.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

fn check_shapes(rows: usize, cols: usize, x: &[f32], m_rows: usize, out: &[f32]) {
    assert!(x.len() >= m_rows * cols, "matmul: x has {} values, need {m_rows}x{cols}", x.len());
    assert!(out.len() >= m_rows * rows, "matmul: out has {} values, need {m_rows}x{rows}", out.len());
}

/// out[m * w.rows + n] = sum_k x[m * w.cols + k] * W[n][k], for m in 0..m_rows. Uses all pool threads.
pub fn matmul(pool: &ThreadPool, w: &QMatrix, x: &[f32], m_rows: usize, out: &mut [f32]) {
    assert!(w.check(), "matmul: {:?} matrix {}x{} has {} bytes", w.dtype, w.rows, w.cols, w.data.len());
    check_shapes(w.rows, w.cols, x, m_rows, out);
    let outp = OutPtr(out.as_mut_ptr());
    if w.dtype.is_quantized() {
        let acts = Q8Acts::quantize(x, m_rows, w.cols);
        pool.run(|i, n| {
            let r = split_range(w.rows, n, i, 1);
            // SAFETY: rows `r` of every output row belong to this thread alone.
            unsafe { rowwise_quant(w, &acts, r, outp) };
        });
    } else {
        pool.run(|i, n| {
            let r = split_range(w.rows, n, i, 1);
            // SAFETY: as above.
            unsafe { rowwise_float(w.dtype, w.data, w.rows, w.cols, x, m_rows, r, outp) };
        });
    }
}

unsafe fn rowwise_quant(w: &QMatrix, a: &Q8Acts, rows: std::ops::Range<usize>, out: OutPtr) {
    let nb = w.cols / QK;
    let bb = w.dtype.block_bytes();
    for n in rows {
        let row = w.row(n);
        for m in 0..a.m_rows {
            let mut acc = 0f32;
            for b in 0..nb {
                let blk = &row[b * bb..(b + 1) * bb];
                let aq = &a.qs[(m * nb + b) * QK..][..QK];
                let (da, sa) = (a.d[m * nb + b], a.s[m * nb + b]);
                let d = f16_to_f32(read_u16(blk, 0));
                let (isum, c) = match w.dtype {
                    GgmlType::Q8_0 => {
                        let s: i32 = blk[2..34].iter().zip(aq).map(|(&q, &x)| q as i8 as i32 * x as i32).sum();
                        (s, 0.0)
                    }
                    GgmlType::Q4_0 | GgmlType::Q4_1 => {
                        let off = if w.dtype == GgmlType::Q4_1 { 4 } else { 2 };
                        let mut s = 0i32;
                        for j in 0..16 {
                            let byte = blk[off + j];
                            s += (byte & 0x0f) as i32 * aq[j] as i32 + (byte >> 4) as i32 * aq[j + 16] as i32;
                        }
                        let c = if w.dtype == GgmlType::Q4_1 { f16_to_f32(read_u16(blk, 2)) } else { -8.0 * d };
                        (s, c)
                    }
                    _ => (0, 0.0),
                };
                acc += d * (da * isum as f32) + c * sa;
            }
            // SAFETY: the caller owns output column n of every row.
            unsafe { *out.0.add(m * w.rows + n) = acc };
        }
    }
}

/// Float weights: each row is converted to f32 once and dotted with every activation row.
#[allow(clippy::too_many_arguments)]
unsafe fn rowwise_float(
    dtype: GgmlType,
    data: &[u8],
    n_rows: usize,
    cols: usize,
    x: &[f32],
    m_rows: usize,
    rows: std::ops::Range<usize>,
    out: OutPtr,
) {
    let rb = dtype.block_bytes() * cols;
    let mut wrow = vec![0f32; cols];
    let dot = super::dispatch().dot_f32;
    for n in rows {
        super::quant::dequantize_row(dtype, &data[n * rb..(n + 1) * rb], &mut wrow);
        for m in 0..m_rows {
            let v = dot(&wrow, &x[m * cols..(m + 1) * cols]);
            // SAFETY: the caller owns output column n of every row.
            unsafe { *out.0.add(m * n_rows + n) = v };
        }
    }
}

pub(crate) fn dot_f32_scalar(a: &[f32], b: &[f32]) -> f32 {
    // 8 partial sums: keeps the reference close to what SIMD paths compute
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for k in chunks * 8..a.len().min(b.len()) {
        s += a[k] * b[k];
    }
    s
}

/// 64-byte aligned bytes (a vector of cache lines).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

/// Weight bytes, 64-byte aligned, with 2 MiB pages requested for the aligned interior of
/// large buffers before they are first touched ([`advise_huge_pages`]).
#[derive(Clone)]
pub struct AlignedBytes {
    lines: Vec<Line>,
    len: usize,
}

impl AlignedBytes {
    pub(crate) fn zeroed(len: usize) -> AlignedBytes {
        // zeroed allocation: large ones are fresh, untouched mappings, so the advice applies
        let lines = vec![Line([0; 64]); len.div_ceil(64)];
        advise_huge_pages(lines.as_ptr() as usize, len);
        AlignedBytes { lines, len }
    }
    pub(crate) fn copy_of(src: &[u8]) -> AlignedBytes {
        let mut a = AlignedBytes::zeroed(src.len());
        a.as_mut_slice().copy_from_slice(src);
        a
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `lines` holds at least `len` initialized bytes.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const u8, self.len) }
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut u8, self.len) }
    }
}

impl std::ops::Deref for AlignedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::DerefMut for AlignedBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

/// Asks for 2 MiB pages on the 2 MiB-aligned interior of a large, not yet touched buffer:
/// weight streaming then takes far fewer TLB misses (spec: steadier and ~1.2x faster GEMV).
/// Best effort: with THP disabled the call fails and nothing changes.
fn advise_huge_pages(addr: usize, len: usize) {
    const HUGE: usize = 2 << 20;
    #[cfg(target_os = "linux")]
    {
        let start = addr.next_multiple_of(HUGE);
        let end = (addr + len) / HUGE * HUGE;
        if end > start {
            // SAFETY: the range lies inside a live allocation we own; MADV_HUGEPAGE does not
            // change its contents.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (addr, len, HUGE);
}

/// A weight matrix re-laid for the SIMD kernels (see the module docs). Quantized types are
/// stored as tiles of 16 rows x 32 columns, `[group][block]`, each tile:
/// - Q4_1: 256 B nibbles, 16 f16 `d`, 16 f16 `m` (320 B); Q4_0: nibbles + `d` (288 B);
/// - Q8_0: 512 B of `q + 128` as u8, 16 f16 `d` (544 B).
///
/// Nibble byte `64j + 4r + i` of a tile holds row r's values `8j+i` (low) and `8j+4+i` (high);
/// Q8_0 byte `64j + 4r + i` holds value `4j+i`. Rows past `rows` are zero (they add nothing).
/// Float types keep their GGUF rows unchanged.
pub struct PackedMatrix {
    pub dtype: GgmlType,
    pub rows: usize,
    pub cols: usize,
    data: AlignedBytes,
}

/// Bytes of one 16x32 tile of a quantized type.
pub(crate) fn tile_bytes(dtype: GgmlType) -> usize {
    match dtype {
        GgmlType::Q4_1 => 320,
        GgmlType::Q4_0 => 288,
        GgmlType::Q8_0 => 544,
        _ => 0,
    }
}

impl PackedMatrix {
    /// Re-lays `w`; `None` if its shape does not match its bytes.
    pub fn pack(w: &QMatrix) -> Option<PackedMatrix> {
        // K-quants have their own matrix type (`kquant::KQuantMatrix`), not tiles.
        if !w.check() || w.dtype.is_kquant() {
            return None;
        }
        if !w.dtype.is_quantized() {
            let len = w.rows * w.row_bytes();
            let mut data = AlignedBytes::zeroed(len);
            data.as_mut_slice().copy_from_slice(&w.data[..len]);
            return Some(PackedMatrix { dtype: w.dtype, rows: w.rows, cols: w.cols, data });
        }
        let nb = w.cols / QK;
        let groups = w.rows.div_ceil(TILE_ROWS);
        let tb = tile_bytes(w.dtype);
        let bb = w.dtype.block_bytes();
        let mut data = AlignedBytes::zeroed(groups * nb * tb);
        let buf = data.as_mut_slice();
        for n in 0..w.rows {
            let (g, r) = (n / TILE_ROWS, n % TILE_ROWS);
            let row = w.row(n);
            for b in 0..nb {
                let blk = &row[b * bb..(b + 1) * bb];
                let tile = &mut buf[(g * nb + b) * tb..][..tb];
                match w.dtype {
                    GgmlType::Q8_0 => {
                        for k in 0..QK {
                            tile[64 * (k / 4) + 4 * r + k % 4] = blk[2 + k] ^ 0x80;
                        }
                        tile[512 + 2 * r..514 + 2 * r].copy_from_slice(&blk[0..2]);
                    }
                    GgmlType::Q4_0 | GgmlType::Q4_1 => {
                        let off = if w.dtype == GgmlType::Q4_1 { 4 } else { 2 };
                        let q = |k: usize| {
                            let byte = blk[off + k % 16];
                            if k < 16 { byte & 0x0f } else { byte >> 4 }
                        };
                        for j in 0..4 {
                            for i in 0..4 {
                                tile[64 * j + 4 * r + i] = q(8 * j + i) | (q(8 * j + 4 + i) << 4);
                            }
                        }
                        tile[256 + 2 * r..258 + 2 * r].copy_from_slice(&blk[0..2]);
                        if w.dtype == GgmlType::Q4_1 {
                            tile[288 + 2 * r..290 + 2 * r].copy_from_slice(&blk[2..4]);
                        }
                    }
                    _ => unreachable!("float types return above"),
                }
            }
        }
        Some(PackedMatrix { dtype: w.dtype, rows: w.rows, cols: w.cols, data })
    }

    pub fn bytes(&self) -> &[u8] {
        self.data.as_slice()
    }

    /// Row `r` as f32 (`out.len()` must be `cols`), exactly the values the kernels multiply:
    /// quantized rows are read back from their tiles into GGUF blocks and dequantized.
    /// `false` (and `out` untouched) when `r` or `out.len()` is out of range.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) -> bool {
        if r >= self.rows || out.len() != self.cols {
            return false;
        }
        let buf = self.data.as_slice();
        if !self.dtype.is_quantized() {
            let rb = self.cols * self.dtype.block_bytes();
            dequantize_row(self.dtype, &buf[r * rb..(r + 1) * rb], out);
            return true;
        }
        let nb = self.cols / QK;
        let tb = tile_bytes(self.dtype);
        let (g, tr) = (r / TILE_ROWS, r % TILE_ROWS);
        let mut blk = [0u8; 34];
        for (b, dst) in out.chunks_exact_mut(QK).enumerate() {
            let tile = &buf[(g * nb + b) * tb..][..tb];
            // The inverse of `pack`'s per-type tile layout, into the GGUF block layout.
            let len = match self.dtype {
                GgmlType::Q8_0 => {
                    blk[0..2].copy_from_slice(&tile[512 + 2 * tr..514 + 2 * tr]);
                    for k in 0..QK {
                        blk[2 + k] = tile[64 * (k / 4) + 4 * tr + k % 4] ^ 0x80;
                    }
                    34
                }
                GgmlType::Q4_0 | GgmlType::Q4_1 => {
                    let off = if self.dtype == GgmlType::Q4_1 { 4 } else { 2 };
                    blk[0..2].copy_from_slice(&tile[256 + 2 * tr..258 + 2 * tr]);
                    if self.dtype == GgmlType::Q4_1 {
                        blk[2..4].copy_from_slice(&tile[288 + 2 * tr..290 + 2 * tr]);
                    }
                    let q = |v: usize| {
                        let byte = tile[64 * (v / 8) + 4 * tr + v % 4];
                        if v % 8 < 4 { byte & 0x0f } else { byte >> 4 }
                    };
                    for k in 0..16 {
                        blk[off + k] = q(k) | (q(k + 16) << 4);
                    }
                    off + 16
                }
                _ => unreachable!("float types return above"),
            };
            dequantize_row(self.dtype, &blk[..len], dst);
        }
        true
    }

    pub(crate) fn groups(&self) -> usize {
        self.rows.div_ceil(TILE_ROWS)
    }
}

/// [`matmul`] on a packed matrix (the fast path).
pub fn matmul_packed(pool: &ThreadPool, w: &PackedMatrix, x: &[f32], m_rows: usize, out: &mut [f32]) {
    check_shapes(w.rows, w.cols, x, m_rows, out);
    if w.dtype.is_quantized() {
        let acts = Q8Acts::quantize(x, m_rows, w.cols);
        matmul_packed_q8(pool, w, &acts, out);
    } else {
        let outp = OutPtr(out.as_mut_ptr());
        pool.run(|i, n| {
            let r = split_range(w.rows, n, i, 1);
            // SAFETY: rows `r` belong to this thread alone.
            unsafe { rowwise_float(w.dtype, w.bytes(), w.rows, w.cols, x, m_rows, r, outp) };
        });
    }
}

/// [`matmul_packed`] with activations already quantized (share one [`Q8Acts`] between the
/// matrices that read the same input, e.g. Q, K and V). `w` must be a quantized type.
pub fn matmul_packed_q8(pool: &ThreadPool, w: &PackedMatrix, acts: &Q8Acts, out: &mut [f32]) {
    packed_q8_with(super::dispatch(), pool, w, acts, out)
}

pub(crate) fn packed_q8_with(
    kern: &super::Dispatch,
    pool: &ThreadPool,
    w: &PackedMatrix,
    acts: &Q8Acts,
    out: &mut [f32],
) {
    assert!(w.dtype.is_quantized(), "matmul_packed_q8 needs a quantized matrix");
    assert_eq!(acts.cols, w.cols, "matmul_packed_q8: activation width");
    assert!(out.len() >= acts.m_rows * w.rows, "matmul_packed_q8: output too short");
    let outp = OutPtr(out.as_mut_ptr());
    let kernel = kern.packed_gemm;
    let groups = w.groups();
    pool.run(|i, n| {
        let g = split_range(groups, n, i, 1);
        // SAFETY: groups `g` (rows 16g..16g+16) belong to this thread alone.
        unsafe { kernel(w, acts, g, outp) };
    });
}

/// Several quantized matrices reading the same activations (Q|K|V, gate|up) in one pool
/// dispatch: `outs[i][m * ws[i].rows + n]`. The output rows of all matrices are split across
/// threads together, so there is one barrier instead of one per matrix.
pub fn matmul_packed_many(pool: &ThreadPool, ws: &[&PackedMatrix], acts: &Q8Acts, outs: &mut [&mut [f32]]) {
    assert_eq!(ws.len(), outs.len(), "matmul_packed_many: one output per matrix");
    for (w, o) in ws.iter().zip(outs.iter()) {
        assert!(w.dtype.is_quantized(), "matmul_packed_many needs quantized matrices");
        assert_eq!(acts.cols, w.cols, "matmul_packed_many: activation width");
        assert!(o.len() >= acts.m_rows * w.rows, "matmul_packed_many: output too short");
    }
    let ptrs: Vec<OutPtr> = outs.iter_mut().map(|o| OutPtr(o.as_mut_ptr())).collect();
    let kernel = super::dispatch().packed_gemm;
    let total: usize = ws.iter().map(|w| w.groups()).sum();
    pool.run(|i, n| {
        let mine = split_range(total, n, i, 1);
        let mut first = 0;
        for (w, &out) in ws.iter().zip(&ptrs) {
            let g = w.groups();
            let lo = mine.start.max(first);
            let hi = mine.end.min(first + g);
            if lo < hi {
                // SAFETY: global groups `mine` belong to this thread alone.
                unsafe { kernel(w, acts, lo - first..hi - first, out) };
            }
            first += g;
        }
    });
}

/// Portable packed GEMM, the reference the SIMD sets are tested against. Each tile is unpacked
/// once into natural element order and shared by all activation rows; every output still
/// accumulates block by block as `acc += d * (d_a * isum) + c * s_a` (integer sums are exact,
/// so the unpacking changes no bit; `matmul_tests` holds the tile-order loop it replaced).
pub(crate) unsafe fn packed_gemm_scalar(w: &PackedMatrix, a: &Q8Acts, g: std::ops::Range<usize>, out: OutPtr) {
    let nb = w.cols / QK;
    let tb = tile_bytes(w.dtype);
    let data = w.bytes();
    let mut acc = vec![0f32; a.m_rows * TILE_ROWS];
    // The integer dot products run in f32, element-major so each step is 16 independent lanes
    // (what portable code auto-vectorizes: SSE2/NEON mul+add, no reassociation needed). They
    // stay exact: |w| <= 255, |a| <= 128, so every partial sum of 32 products is an integer
    // below 2^24, and the result is bit for bit the i32 sum.
    let mut wf = [[0f32; TILE_ROWS]; QK];
    let mut af = [0f32; QK];
    let (mut d, mut c) = ([0f32; TILE_ROWS], [0f32; TILE_ROWS]);
    for gi in g {
        acc.fill(0.0);
        for b in 0..nb {
            let tile = &data[(gi * nb + b) * tb..][..tb];
            unpack_tile(w.dtype, tile, &mut wf, &mut d, &mut c);
            for m in 0..a.m_rows {
                for (x, &q) in af.iter_mut().zip(&a.qs[(m * nb + b) * QK..][..QK]) {
                    *x = q as f32;
                }
                // Two accumulator sets (even and odd k) halve the add latency chain.
                let (mut even, mut odd) = ([0f32; TILE_ROWS], [0f32; TILE_ROWS]);
                for (wk, ak) in wf.chunks_exact(2).zip(af.chunks_exact(2)) {
                    for r in 0..TILE_ROWS {
                        even[r] += wk[0][r] * ak[0];
                        odd[r] += wk[1][r] * ak[1];
                    }
                }
                let isum: [f32; TILE_ROWS] = std::array::from_fn(|r| even[r] + odd[r]);
                let (da, sa) = (a.d[m * nb + b], a.s[m * nb + b]);
                let acc_m = &mut acc[m * TILE_ROWS..][..TILE_ROWS];
                for r in 0..TILE_ROWS {
                    acc_m[r] += d[r] * (da * isum[r]) + c[r] * sa;
                }
            }
        }
        let rows = (w.rows - gi * TILE_ROWS).min(TILE_ROWS);
        for m in 0..a.m_rows {
            for (r, &v) in acc[m * TILE_ROWS..][..rows].iter().enumerate() {
                // SAFETY: the caller owns the rows of groups `g`.
                unsafe { *out.0.add(m * w.rows + gi * TILE_ROWS + r) = v };
            }
        }
    }
}

/// One tile's 16 rows as `wf[k][r]` (element k of row r) in natural element order (Q4:
/// nibbles 0..15; Q8_0: stored q + 128), with each row's scale `d` and the coefficient `c` of
/// the activation sum (`-8d`, Q4_1's min, `-128d`).
fn unpack_tile(
    dtype: GgmlType,
    tile: &[u8],
    wf: &mut [[f32; TILE_ROWS]; QK],
    d: &mut [f32; TILE_ROWS],
    c: &mut [f32; TILE_ROWS],
) {
    // Loops in the tile's byte order (row r's 4 bytes of a 64-byte vector, then the next row)
    // so the 16x4 transpose vectorizes.
    if dtype == GgmlType::Q8_0 {
        // element k of row r sits at 64 * (k / 4) + 4 * r + k % 4
        for (vector, wk4) in tile[..512].as_chunks::<64>().0.iter().zip(wf.as_chunks_mut::<4>().0) {
            for r in 0..TILE_ROWS {
                for i in 0..4 {
                    wk4[i][r] = vector[4 * r + i] as f32;
                }
            }
        }
    } else {
        // vector j holds elements 8j..8j+4 in the low nibbles and 8j+4..8j+8 in the high ones
        for (vector, wk8) in tile[..256].as_chunks::<64>().0.iter().zip(wf.as_chunks_mut::<8>().0) {
            let (lo, hi) = wk8.split_at_mut(4);
            for r in 0..TILE_ROWS {
                for i in 0..4 {
                    let byte = vector[4 * r + i];
                    lo[i][r] = (byte & 0x0f) as f32;
                    hi[i][r] = (byte >> 4) as f32;
                }
            }
        }
    }
    for r in 0..TILE_ROWS {
        if dtype == GgmlType::Q8_0 {
            d[r] = f16_to_f32(read_u16(tile, 512 + 2 * r));
            c[r] = -128.0 * d[r];
        } else {
            d[r] = f16_to_f32(read_u16(tile, 256 + 2 * r));
            c[r] = if dtype == GgmlType::Q4_1 { f16_to_f32(read_u16(tile, 288 + 2 * r)) } else { -8.0 * d[r] };
        }
    }
}

#[cfg(test)]
#[path = "matmul_tests.rs"]
pub(crate) mod tests;
