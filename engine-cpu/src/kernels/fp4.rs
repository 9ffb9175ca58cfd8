//! NVFP4 (NVIDIA ModelOpt) weight matrices and their matmul `y[m, o] = sum_i x[m, i] * W[o, i]`.
//!
//! An [`Nvfp4Matrix`] holds one Linear exactly as ModelOpt stores it (spec 8.2), copied once
//! into 64-byte aligned memory (2 MiB pages advised):
//! - `packed` `[out, in/2]` bytes: element `2i` of a row in the **low** nibble of byte `i`,
//!   element `2i+1` in the high nibble; a nibble is an E2M1 code, bit 3 the sign, bits 0-2
//!   indexing {0, 0.5, 1, 1.5, 2, 3, 4, 6} ([`E2M1_VALUES`]);
//! - `scales` `[out, in/16]` FP8 E4M3 block scales (decoded exactly, see [`super::fp8`]);
//! - `global_scale`, the FP32 `weight_scale_2`.
//!
//! `W[o, i] = e2m1(code[o, i]) * e4m3(scales[o, i/16]) * global_scale`.
//!
//! `input_scale` (the W4A4 activation scale) is carried but not used: on the CPU activations
//! stay f32 (weight-only, "W4A16"), so [`matmul_nvfp4`] equals dequantize-then-f32-matmul up
//! to float summation order (tests bound the difference; see `fp4_tests.rs`).
//!
//! Kernel: the matrix is never expanded. Per block of 16 inputs and output row, the 8 code
//! bytes become 16 f32 through a 16-entry LUT already multiplied by the block scale (a 64-bit
//! broadcast, a variable shift and one `vpermps` on AVX-512; a 8-entry permute plus a sign xor
//! on AVX2; the 256 scaled tables are exact, e2m1 * e4m3 fits f32; details in `fp4_x86.rs`)
//! and FMA'd into f32 accumulators; `global_scale` is applied once per output. The SIMD decode
//! yields a block in the lane order e0, e8, e1, e9, ..., so the activations are permuted to match once per call
//! (m x in floats, shared by all matrices of [`matmul_nvfp4_many`]). Register tiles are 4
//! output rows x 4 (AVX-512) or 2 (AVX2) activation rows: each decoded block feeds several
//! FMAs and each activation load several rows. With m >= 4 the kernel is bound by f32 FMA
//! throughput (16 MACs per instruction), not by memory.
//! Output rows are split across the pool threads in groups of 4.
//! Weight bytes streamed per matmul: `out * in * 9/16` (4.5 bits per weight).
//!
//! ISA: AVX-512F, else AVX2+FMA, else scalar (also the reference), detected once;
//! `EDGE_KERNELS_ISA=scalar|avx2|avx512-vnni` forces one like the other kernels do.

use std::ops::Range;
use std::sync::OnceLock;

use super::fp8::E4M3_TO_F32;
use super::matmul::{AlignedBytes, OutPtr};
use super::threadpool::{ThreadPool, split_range};

use engine_ops::nvfp4::Nvfp4Linear;
pub use engine_ops::nvfp4::{BLOCK, E2M1_VALUES, e2m1_code};
/// Output rows per register tile (and per unit of thread work).
pub(crate) const ROW_TILE: usize = 4;

/// `E2M1_SCALED.0[s][c] = E2M1_VALUES[c] * e4m3(s)`, exact (at most 2 x 4 significant bits):
/// the SIMD kernels look up a block's values already scaled, one `vpermps` with the row of its
/// scale byte as the table (16 KiB, L1-resident) instead of a lookup plus a multiply.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // used by the x86 kernels only
pub(crate) static E2M1_SCALED: Aligned64<[[f32; 16]; 256]> = Aligned64(build_scaled());

#[repr(C, align(64))]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // used by the x86 kernels only
pub(crate) struct Aligned64<T>(pub T);

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // used by the x86 kernels only
const fn build_scaled() -> [[f32; 16]; 256] {
    let mut t = [[0f32; 16]; 256];
    let mut s = 0;
    while s < 256 {
        let mut c = 0;
        while c < 16 {
            t[s][c] = E2M1_VALUES[c] * super::fp8::e4m3_to_f32(s as u8);
            c += 1;
        }
        s += 1;
    }
    t
}

/// Why an [`Nvfp4Matrix`] could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Nvfp4Error {
    #[error("input width {cols} is not a positive multiple of {BLOCK}")]
    Cols { cols: usize },
    #[error("packed weights have {got} bytes, [{rows}, {cols}/2] needs {want}")]
    PackedLen { rows: usize, cols: usize, got: usize, want: usize },
    #[error("block scales have {got} bytes, [{rows}, {cols}/16] needs {want}")]
    ScalesLen { rows: usize, cols: usize, got: usize, want: usize },
    #[error("global scale {0} is not finite")]
    GlobalScale(f32),
}

/// An NVFP4 Linear weight, `rows` = out features, `cols` = in features (see module docs).
#[derive(Clone)]
pub struct Nvfp4Matrix {
    rows: usize,
    cols: usize,
    packed: AlignedBytes,
    scales: AlignedBytes,
    global_scale: f32,
    input_scale: Option<f32>,
}

impl std::fmt::Debug for Nvfp4Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvfp4Matrix")
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("global_scale", &self.global_scale)
            .field("input_scale", &self.input_scale)
            .finish_non_exhaustive()
    }
}

impl Nvfp4Matrix {
    /// Copies ModelOpt's tensors as they are (no re-layout) into aligned memory; checks the
    /// lengths against the shape. NaN block scales are accepted (they propagate, as in the
    /// reference dequantization).
    pub fn new(
        rows: usize,
        cols: usize,
        packed: impl AsRef<[u8]>,
        scales: impl AsRef<[u8]>,
        global_scale: f32,
        input_scale: Option<f32>,
    ) -> Result<Nvfp4Matrix, Nvfp4Error> {
        let (packed, scales) = (packed.as_ref(), scales.as_ref());
        if cols == 0 || !cols.is_multiple_of(BLOCK) {
            return Err(Nvfp4Error::Cols { cols });
        }
        let want = rows.checked_mul(cols / 2).ok_or(Nvfp4Error::Cols { cols })?;
        if packed.len() != want {
            return Err(Nvfp4Error::PackedLen { rows, cols, got: packed.len(), want });
        }
        let want = rows * (cols / BLOCK);
        if scales.len() != want {
            return Err(Nvfp4Error::ScalesLen { rows, cols, got: scales.len(), want });
        }
        if !global_scale.is_finite() {
            return Err(Nvfp4Error::GlobalScale(global_scale));
        }
        Ok(Nvfp4Matrix {
            rows,
            cols,
            packed: AlignedBytes::copy_of(packed),
            scales: AlignedBytes::copy_of(scales),
            global_scale,
            input_scale,
        })
    }

    /// The matrix of a checked checkpoint Linear (copies its bytes once).
    pub fn from_linear(l: &Nvfp4Linear) -> Result<Nvfp4Matrix, Nvfp4Error> {
        Nvfp4Matrix::new(l.rows, l.cols, l.packed, l.scales, l.global_scale, l.input_scale)
    }

    /// Quantizes row-major f32 weights `[rows, cols]` the way ModelOpt does (spec 8.2):
    /// global = amax / (6 * 448) (1.0 for an all-zero matrix), block scale = E4M3(max(block amax /
    /// (6 * global), 2^-9)) (1.0 for an all-zero block), codes = nearest E2M1 of w / (scale * global),
    /// ties to the even code, saturating at 6. For tests, benchmarks and random-weight models.
    pub fn quantize(rows: usize, cols: usize, w: &[f32]) -> Result<Nvfp4Matrix, Nvfp4Error> {
        if cols == 0 || !cols.is_multiple_of(BLOCK) {
            return Err(Nvfp4Error::Cols { cols });
        }
        let q = engine_ops::nvfp4::quantize(rows, cols, w);
        Nvfp4Matrix::new(rows, cols, &q.packed, &q.scales, q.global_scale, None)
    }

    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// `[rows, cols/2]` E2M1 code bytes, ModelOpt layout.
    pub fn packed(&self) -> &[u8] {
        &self.packed
    }
    /// `[rows, cols/16]` E4M3 block scales.
    pub fn scales(&self) -> &[u8] {
        &self.scales
    }
    /// `weight_scale_2`.
    pub fn global_scale(&self) -> f32 {
        self.global_scale
    }
    /// The checkpoint's `input_scale` (unused on the CPU; see module docs).
    pub fn input_scale(&self) -> Option<f32> {
        self.input_scale
    }
    /// Bytes a matmul streams: codes plus block scales.
    pub fn weight_bytes(&self) -> usize {
        self.packed.len() + self.scales.len()
    }

    /// Row `r` as f32 (the reference dequantization: code value * block scale * global).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows && out.len() >= self.cols, "dequantize_row: row {r} or output length");
        let nb = self.cols / BLOCK;
        let codes = &self.packed[r * self.cols / 2..][..self.cols / 2];
        let scales = &self.scales[r * nb..][..nb];
        for (i, &byte) in codes.iter().enumerate() {
            let s = E4M3_TO_F32[scales[2 * i / BLOCK] as usize] * self.global_scale;
            out[2 * i] = E2M1_VALUES[(byte & 0x0f) as usize] * s;
            out[2 * i + 1] = E2M1_VALUES[(byte >> 4) as usize] * s;
        }
    }

    /// The whole matrix as row-major f32 (tests and debugging only: `rows * cols * 4` bytes).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_row(r, row);
        }
        out
    }
}

/// A kernel set for the NVFP4 matmul.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp4Isa {
    Avx512,
    Avx2,
    Scalar,
}

impl Fp4Isa {
    /// The `EDGE_KERNELS_ISA` name of the matching kernel set.
    pub fn name(self) -> &'static str {
        match self {
            Fp4Isa::Avx512 => "avx512-vnni",
            Fp4Isa::Avx2 => "avx2",
            Fp4Isa::Scalar => "scalar",
        }
    }

    /// Every kernel set this CPU can run, best first (scalar last).
    pub fn available() -> Vec<Fp4Isa> {
        let mut v = Vec::with_capacity(3);
        #[cfg(target_arch = "x86_64")]
        {
            if x86::has_avx512() {
                v.push(Fp4Isa::Avx512);
            }
            if x86::has_avx2() {
                v.push(Fp4Isa::Avx2);
            }
        }
        v.push(Fp4Isa::Scalar);
        v
    }

    /// The kernel set used by [`matmul_nvfp4`], chosen on first use.
    pub fn selected() -> Fp4Isa {
        static CHOSEN: OnceLock<Fp4Isa> = OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let all = Fp4Isa::available();
            let forced = super::forced_isa();
            let pick = forced.and_then(|want| all.iter().copied().find(|i| i.name() == want)).unwrap_or(all[0]);
            tracing::info!(isa = pick.name(), "nvfp4 kernels selected");
            pick
        })
    }
}

/// Borrowed matmul operands shared by every kernel: activations `x` `[m_rows, w.cols]`.
#[derive(Clone, Copy)]
pub(crate) struct Job<'a> {
    pub w: &'a Nvfp4Matrix,
    pub x: &'a [f32],
    pub m_rows: usize,
    pub out: OutPtr,
}

/// `out[m * w.rows() + o] = sum_i x[m * w.cols() + i] * W[o, i]` for `m < m_rows`; all pool threads.
pub fn matmul_nvfp4(pool: &ThreadPool, w: &Nvfp4Matrix, x: &[f32], m_rows: usize, out: &mut [f32]) {
    matmul_nvfp4_with(Fp4Isa::selected(), pool, w, x, m_rows, out)
}

/// [`matmul_nvfp4`] on a given kernel set (tests and benchmarks compare them). An ISA this CPU
/// lacks runs the scalar kernels instead.
pub fn matmul_nvfp4_with(isa: Fp4Isa, pool: &ThreadPool, w: &Nvfp4Matrix, x: &[f32], m_rows: usize, out: &mut [f32]) {
    matmul_nvfp4_many_with(isa, pool, &[w], x, m_rows, &mut [out])
}

/// Several matrices reading the same activations (q|k|v, gate|up, in_proj_qkv|z) in one pool
/// dispatch: `outs[j][m * ws[j].rows() + o]`. Row groups of all matrices are split across the
/// threads together (one barrier, and each keeps its own global scale, unlike a fused matrix).
pub fn matmul_nvfp4_many(pool: &ThreadPool, ws: &[&Nvfp4Matrix], x: &[f32], m_rows: usize, outs: &mut [&mut [f32]]) {
    matmul_nvfp4_many_with(Fp4Isa::selected(), pool, ws, x, m_rows, outs)
}

/// [`matmul_nvfp4_many`] on a given kernel set.
pub fn matmul_nvfp4_many_with(
    isa: Fp4Isa,
    pool: &ThreadPool,
    ws: &[&Nvfp4Matrix],
    x: &[f32],
    m_rows: usize,
    outs: &mut [&mut [f32]],
) {
    assert_eq!(ws.len(), outs.len(), "matmul_nvfp4: one output per matrix");
    for (w, o) in ws.iter().zip(outs.iter()) {
        assert!(x.len() >= m_rows * w.cols, "matmul_nvfp4: x has {} values, need {m_rows}x{}", x.len(), w.cols);
        assert!(o.len() >= m_rows * w.rows, "matmul_nvfp4: out has {} values, need {m_rows}x{}", o.len(), w.rows);
    }
    if m_rows == 0 || ws.is_empty() {
        return;
    }
    let cols = ws[0].cols;
    assert!(ws.iter().all(|w| w.cols == cols), "matmul_nvfp4_many: matrices read the same activations");
    let (kernel, permuted) = kernel_for(isa, m_rows);
    if permuted {
        PERMUTED_ACTS.with_borrow_mut(|buf| {
            permute_acts_into(&x[..m_rows * cols], buf);
            run_jobs(kernel, pool, ws, &buf[..m_rows * cols], m_rows, outs);
        });
    } else {
        run_jobs(kernel, pool, ws, x, m_rows, outs);
    }
}

thread_local! {
    /// The calling thread's permuted activations, grow-only: a prefill's buffer is megabytes,
    /// and allocated per matmul it would be mapped, page-faulted in zeroed, and unmapped every
    /// call (the backend pins glibc's mmap threshold; measured 7% of 1-thread prefill).
    static PERMUTED_ACTS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Splits the matrices' row tiles over the pool and runs `kernel` on each share.
fn run_jobs(kernel: Kernel, pool: &ThreadPool, ws: &[&Nvfp4Matrix], x: &[f32], m_rows: usize, outs: &mut [&mut [f32]]) {
    let jobs: Vec<Job> =
        ws.iter().zip(outs.iter_mut()).map(|(w, o)| Job { w, x, m_rows, out: OutPtr(o.as_mut_ptr()) }).collect();
    let units: Vec<usize> = ws.iter().map(|w| w.rows.div_ceil(ROW_TILE)).collect();
    let total: usize = units.iter().sum();
    pool.run(|i, n| {
        let mine = split_range(total, n, i, 1);
        let mut first = 0;
        for (job, &u) in jobs.iter().zip(&units) {
            let (lo, hi) = (mine.start.max(first), mine.end.min(first + u));
            if lo < hi {
                let rows = (lo - first) * ROW_TILE..((hi - first) * ROW_TILE).min(job.w.rows);
                // SAFETY: output rows `rows` of this matrix (every activation row) belong to
                // this thread alone; shapes were checked above.
                unsafe { kernel(job, rows) };
            }
            first += u;
        }
    });
}

type Kernel = unsafe fn(&Job, Range<usize>);

/// The kernel for `isa` and `m_rows` activation rows, and whether it reads permuted
/// activations ([`permute_acts_into`]). The blocked kernels give the direct ones' bits.
fn kernel_for(isa: Fp4Isa, m_rows: usize) -> (Kernel, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        let blocked = m_rows >= x86::BLOCKED_MIN_ROWS;
        if isa == Fp4Isa::Avx512 && x86::has_avx512() {
            return (if blocked { x86::rows_avx512_blocked } else { x86::rows_avx512 }, true);
        }
        if isa == Fp4Isa::Avx2 && x86::has_avx2() {
            return (if blocked { x86::rows_avx2_blocked } else { x86::rows_avx2 }, true);
        }
    }
    let _ = (isa, m_rows);
    (rows_scalar, false)
}

/// Reorders every block of 16 activations to the SIMD decode order e0, e8, e1, e9, ..., e7, e15,
/// into `out[..x.len()]` (grown if shorter).
fn permute_acts_into(x: &[f32], out: &mut Vec<f32>) {
    if out.len() < x.len() {
        out.resize(x.len(), 0.0);
    }
    for (o, i) in out[..x.len()].chunks_exact_mut(BLOCK).zip(x.chunks_exact(BLOCK)) {
        for q in 0..BLOCK / 2 {
            o[2 * q] = i[q];
            o[2 * q + 1] = i[q + BLOCK / 2];
        }
    }
}

/// Reference kernel: each output row is decoded once into a scratch row (one row, never the
/// matrix), then dotted with every activation row in 16 lanes (the SIMD summation shape).
/// # Safety
/// `job.out` must be valid for `m_rows * w.rows` writes, rows `rows` owned by the caller.
pub(crate) unsafe fn rows_scalar(job: &Job, rows: Range<usize>) {
    let w = job.w;
    let nb = w.cols / BLOCK;
    let mut wrow = vec![0f32; w.cols];
    for o in rows {
        let codes = &w.packed[o * w.cols / 2..][..w.cols / 2];
        let scales = &w.scales[o * nb..][..nb];
        for (b, chunk) in wrow.chunks_exact_mut(BLOCK).enumerate() {
            let s = E4M3_TO_F32[scales[b] as usize];
            for (j, pair) in chunk.chunks_exact_mut(2).enumerate() {
                let byte = codes[b * 8 + j];
                pair[0] = E2M1_VALUES[(byte & 0x0f) as usize] * s;
                pair[1] = E2M1_VALUES[(byte >> 4) as usize] * s;
            }
        }
        for m in 0..job.m_rows {
            let xr = &job.x[m * w.cols..][..w.cols];
            let mut acc = [0f32; BLOCK];
            for (wb, xb) in wrow.chunks_exact(BLOCK).zip(xr.chunks_exact(BLOCK)) {
                for l in 0..BLOCK {
                    acc[l] += wb[l] * xb[l];
                }
            }
            let v = acc.iter().sum::<f32>() * w.global_scale;
            // SAFETY: the caller owns output column `o` of every activation row.
            unsafe { *job.out.0.add(m * w.rows + o) = v };
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[path = "fp4_x86.rs"]
mod x86;

#[cfg(test)]
#[path = "fp4_tests.rs"]
mod tests;
