//! The CPU's implementation of the op seam ([`engine_ops::Ops`]): each op calls today's
//! kernels in [`super::kernels`], so a model run through [`CpuOps`] gives the bits it gave
//! when it called them itself. The thread pool, the kernel-set dispatch and the scratch the
//! kernels need (the quantized activations shared by a group of matmuls) live here.

use std::cell::RefCell;
use std::ops::Range;

use super::kernels::attention::attention_tree;
use super::kernels::floatmm::{Bf16, Elem, FloatMatrix, matmul_float};
use super::kernels::fp4::{Nvfp4Matrix, matmul_nvfp4};
use super::kernels::gdn;
use super::kernels::kquant::{
    KQuantMatrix, KQuantType, Q8KActs, matmul_kquant, matmul_kquant_q8k, matmul_kquant_q8k_many,
};
use super::kernels::norm::{add_in_place, rms_norm};
use super::kernels::rope::{rope_adjacent_pairs, rope_half_split, rope_table, rope_table_f32};
use super::kernels::threadpool::SPLIT_MIN_ROWS;
use super::kernels::{
    AttnParams, GgmlType, PackedMatrix, Q8Acts, QMatrix, ThreadPool, activation, attention, dequantize_row,
    matmul_packed, matmul_packed_q8, write_kv_scaled,
};
use engine_ops::EngineError;
use engine_ops::kv::{KvLayout, PageId};

use crate::pages::{HostPages, PageAddr, PageTable};
use engine_ops::tensor::{MatrixData, MatrixDesc, SharedBytes, TensorDesc};
use engine_ops::{AttnShape, GdnDims, GdnMode, GdnSeq, KvWrite, Ops, RopeStyle, SeqKv};

/// A weight matrix `[out][in]` as the CPU kernels take it; [`CpuMatrix::matmul`] computes
/// `out[m][o] = sum_i x[m][i] * W[o][i]` in f32.
pub enum CpuMatrix {
    /// GGUF block-quantized (Q8_0, Q4_0, Q4_1: against 8-bit activations) or F16 rows,
    /// re-laid into the packed GEMM's tiles.
    Packed(PackedMatrix),
    /// K-quants (Q4_K, Q5_K, Q6_K) as stored, against 8-bit activations ([`matmul_kquant`]).
    KQuant(KQuantMatrix),
    /// BF16 rows, row-major, widened in registers ([`matmul_float`]; not widened in memory, so
    /// real-size models fit).
    Bf16(FloatMatrix<Bf16>),
    /// F32 rows, row-major.
    F32(FloatMatrix<f32>),
    /// NVFP4 (ModelOpt), multiplied without expansion by the FP4 kernel (weight-only:
    /// activations stay f32).
    Nvfp4(Nvfp4Matrix),
    /// The matrix's column `i` is `inner`'s column `at[i]`: the input rows are scattered into
    /// the stored order before the matmul (a copy of the activations instead of a reordered
    /// copy of the weights, which for K-quants would split their 256-value blocks).
    Scattered { inner: Box<CpuMatrix>, at: Vec<u32> },
}

impl CpuMatrix {
    /// The matrix a description gives: K-quants stay as stored, F32/BF16 rows stay float,
    /// F16 and the 32-value block quants are packed into tiles, NVFP4 stays packed.
    pub fn from_desc(d: &MatrixDesc) -> Result<CpuMatrix, EngineError> {
        CpuMatrix::from_data(d, &d.data)
    }

    fn from_data(d: &MatrixDesc, data: &MatrixData) -> Result<CpuMatrix, EngineError> {
        let (rows, cols) = (d.rows, d.cols);
        match data {
            MatrixData::Ggml { dtype, bytes } => {
                let dtype = *dtype;
                if dtype.row_bytes(cols).and_then(|r| r.checked_mul(rows)) != Some(bytes.len()) {
                    return Err(d.error(format!("{} bytes do not hold {dtype:?} [{rows}, {cols}]", bytes.len())));
                }
                if let Some(kind) = KQuantType::of(dtype) {
                    return KQuantMatrix::new(kind, rows, cols, bytes).map(CpuMatrix::KQuant).map_err(|e| d.error(e));
                }
                match dtype {
                    GgmlType::F32 => {
                        let data =
                            bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                        Ok(CpuMatrix::F32(FloatMatrix { rows, cols, data }))
                    }
                    GgmlType::BF16 => {
                        let data = bytes.chunks_exact(2).map(|b| Bf16(u16::from_le_bytes([b[0], b[1]]))).collect();
                        Ok(CpuMatrix::Bf16(FloatMatrix { rows, cols, data }))
                    }
                    _ => {
                        let q = QMatrix { dtype, rows, cols, data: bytes };
                        PackedMatrix::pack(&q).map(CpuMatrix::Packed).ok_or_else(|| d.error("bytes do not match shape"))
                    }
                }
            }
            MatrixData::Nvfp4 { packed, scales, global_scale, input_scale } => {
                Nvfp4Matrix::new(rows, cols, packed, scales, *global_scale, *input_scale)
                    .map(CpuMatrix::Nvfp4)
                    .map_err(|e| d.error(e))
            }
            MatrixData::Scattered { inner, at } => {
                if at.len() != cols || at.iter().any(|&c| c as usize >= cols) {
                    return Err(d.error("column map does not match the matrix's columns"));
                }
                let inner = Box::new(CpuMatrix::from_data(d, inner)?);
                Ok(CpuMatrix::Scattered { inner, at: at.clone() })
            }
        }
    }

    pub fn rows(&self) -> usize {
        match self {
            CpuMatrix::Packed(p) => p.rows,
            CpuMatrix::KQuant(k) => k.rows,
            CpuMatrix::Bf16(w) => w.rows,
            CpuMatrix::F32(w) => w.rows,
            CpuMatrix::Nvfp4(w) => w.rows(),
            CpuMatrix::Scattered { inner, .. } => inner.rows(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            CpuMatrix::Packed(p) => p.cols,
            CpuMatrix::KQuant(k) => k.cols,
            CpuMatrix::Bf16(w) => w.cols,
            CpuMatrix::F32(w) => w.cols,
            CpuMatrix::Nvfp4(w) => w.cols(),
            CpuMatrix::Scattered { inner, .. } => inner.cols(),
        }
    }

    /// `out[m * rows + o] = sum_i x[m * cols + i] * W[o][i]` for `m < m_rows`; all pool threads.
    pub fn matmul(&self, pool: &ThreadPool, x: &[f32], m_rows: usize, out: &mut [f32]) {
        match self {
            CpuMatrix::Packed(p) => matmul_packed(pool, p, x, m_rows, out),
            CpuMatrix::KQuant(k) => matmul_kquant(pool, k, x, m_rows, out),
            CpuMatrix::Bf16(w) => matmul_float(pool, w, x, m_rows, out),
            CpuMatrix::F32(w) => matmul_float(pool, w, x, m_rows, out),
            CpuMatrix::Nvfp4(w) => matmul_nvfp4(pool, w, x, m_rows, out),
            CpuMatrix::Scattered { inner, at } => {
                let cols = inner.cols();
                let mut scattered = vec![0f32; m_rows * cols];
                for (dst, src) in scattered.chunks_exact_mut(cols).zip(x.chunks_exact(cols)) {
                    for (&v, &to) in src.iter().zip(at) {
                        dst[to as usize] = v;
                    }
                }
                inner.matmul(pool, &scattered, m_rows, out)
            }
        }
    }

    /// Row `r` as f32 (embedding lookup). `out.len()` must be `cols`.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) -> Result<(), EngineError> {
        if r >= self.rows() || out.len() != self.cols() {
            return Err(EngineError::Internal(format!("row {r} of a {}x{} matrix", self.rows(), self.cols())));
        }
        match self {
            CpuMatrix::Bf16(w) => {
                for (o, v) in out.iter_mut().zip(w.row(r)) {
                    *o = v.widen();
                }
            }
            CpuMatrix::F32(w) => out.copy_from_slice(w.row(r)),
            CpuMatrix::Packed(p) => {
                // Bounds were checked above, so this cannot fail.
                p.row_f32(r, out);
            }
            CpuMatrix::Nvfp4(w) => w.dequantize_row(r, out),
            CpuMatrix::KQuant(w) => w.dequantize_row(r, out),
            CpuMatrix::Scattered { inner, at } => {
                let mut stored = vec![0f32; out.len()];
                inner.row_f32(r, &mut stored)?;
                for (o, &from) in out.iter_mut().zip(at) {
                    *o = stored[from as usize];
                }
            }
        }
        Ok(())
    }

    /// Bytes the matrix occupies in memory.
    pub fn bytes(&self) -> usize {
        match self {
            CpuMatrix::Packed(p) => p.bytes().len(),
            CpuMatrix::KQuant(w) => w.weight_bytes(),
            CpuMatrix::Bf16(w) => w.data.len() * 2,
            CpuMatrix::F32(w) => w.data.len() * 4,
            CpuMatrix::Nvfp4(w) => w.weight_bytes(),
            CpuMatrix::Scattered { inner, at } => inner.bytes() + at.len() * 4,
        }
    }
}

/// An embedding table left in the mapped file: one row is dequantized per token.
pub struct CpuEmbedding {
    dtype: GgmlType,
    rows: usize,
    cols: usize,
    row_bytes: usize,
    bytes: SharedBytes,
}

/// Values from which element-wise work is split across the pool (a few rows of a prefill;
/// a decode step's gates stay on the calling thread).
const SPLIT_MIN_VALUES: usize = 4096;

/// The CPU backend's ops: a thread pool and the kernels' scratch.
pub struct CpuOps {
    pool: ThreadPool,
    /// Activations quantized once for a group of matmuls ([`Ops::matmul`]); kept so that
    /// steady-state decode allocates nothing.
    q8: RefCell<Q8Acts>,
    /// The same for K-quant matrices (their 256-value blocks, llama.cpp's `Q8_K`).
    q8k: RefCell<Q8KActs>,
    /// Page ids -> host addresses (the spaces the backend was given, and private pages).
    pages: RefCell<PageTable>,
    /// One call's resolved pages; kept so that steady-state decode allocates nothing.
    addrs: RefCell<Vec<PageAddr>>,
}

impl CpuOps {
    /// `n_threads` compute threads (0 = 1).
    pub fn new(n_threads: usize) -> CpuOps {
        CpuOps {
            pool: ThreadPool::new(n_threads),
            q8: RefCell::default(),
            q8k: RefCell::default(),
            pages: RefCell::default(),
            addrs: RefCell::new(Vec::with_capacity(4096)),
        }
    }

    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }

    /// Makes the pages of `space` resolvable (see [`engine_ops::kv::PageId`]).
    pub fn map_pages(&self, space: u32, memory: std::sync::Arc<dyn HostPages>) -> Result<(), EngineError> {
        self.pages.borrow_mut().map(space, memory)
    }

    pub fn unmap_pages(&self, space: u32) {
        self.pages.borrow_mut().unmap(space);
    }

    /// Whether every page resolves: checked once per pass, so the ops that cannot return an
    /// error (KV writes, attention) only meet mapped pages.
    pub fn check_pages(&self, ids: &[PageId]) -> Result<(), EngineError> {
        self.pages.borrow().resolve_into(ids, &mut self.addrs.borrow_mut())
    }

    /// A copy of `len` bytes at `offset` of a page (tests compare KV bit for bit).
    pub fn read_page_bytes(
        &self,
        layout: &KvLayout,
        id: PageId,
        offset: usize,
        len: usize,
    ) -> Result<Vec<u8>, EngineError> {
        if offset.checked_add(len).is_none_or(|end| end > layout.page_bytes()) {
            return Err(EngineError::Internal(format!("bytes {offset}+{len} outside a page")));
        }
        self.with_addrs(&[id], |addrs| {
            // SAFETY: the page is mapped and the range lies inside it (checked above); reads
            // happen between passes, when nothing writes it.
            unsafe { std::slice::from_raw_parts(addrs[0].as_ptr().add(offset), len) }.to_vec()
        })
    }

    /// Writes `bytes` at `offset` of a page (tests poison or craft KV).
    pub fn write_page_bytes(
        &self,
        layout: &KvLayout,
        id: PageId,
        offset: usize,
        bytes: &[u8],
    ) -> Result<(), EngineError> {
        if offset.checked_add(bytes.len()).is_none_or(|end| end > layout.page_bytes()) {
            return Err(EngineError::Internal(format!("bytes {offset}+{} outside a page", bytes.len())));
        }
        self.with_addrs(&[id], |addrs| {
            // SAFETY: the page is mapped and the range lies inside it (checked above); writes
            // happen between passes, to pages the caller owns.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addrs[0].as_ptr().add(offset), bytes.len()) }
        })
    }

    /// Runs `f` over the addresses of `ids`.
    fn with_addrs<R>(&self, ids: &[PageId], f: impl FnOnce(&[PageAddr]) -> R) -> Result<R, EngineError> {
        let mut addrs = self.addrs.borrow_mut();
        self.pages.borrow().resolve_into(ids, &mut addrs)?;
        Ok(f(&addrs))
    }
}

/// Pins glibc's mmap threshold at its default (128 KiB). Left dynamic, glibc raises it (up to
/// 32 MiB) each time a large mapped block is freed, so the staging buffers a loader frees
/// (generated or re-ordered weight bytes) move later weight, state and scratch buffers onto
/// the heap; measured on the Qwen3.5-0.8B BF16 bench, that alone made 1-thread decode 15%
/// slower (`cargo bench -p engine-service --bench qwen36`, 7.5 vs 8.8 tokens/s). Pinned,
/// buffers are placed the same whatever was loaded before them. The backend's loaders call it
/// before any weight is staged.
pub fn pin_malloc_mmap_threshold() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static PINNED: std::sync::Once = std::sync::Once::new();
        // SAFETY: mallopt only changes the allocator's policy for later allocations.
        PINNED.call_once(|| unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        });
    }
}

impl Ops for CpuOps {
    type Buf = Vec<f32>;
    type Matrix = CpuMatrix;
    type Embedding = CpuEmbedding;
    type Vector = Vec<f32>;
    type RopeTable = Vec<(f32, f32)>;

    fn matrix(&self, t: &MatrixDesc) -> Result<CpuMatrix, EngineError> {
        CpuMatrix::from_desc(t)
    }

    fn embedding(&self, t: &TensorDesc) -> Result<CpuEmbedding, EngineError> {
        let row_bytes = t.dtype.row_bytes(t.cols).ok_or_else(|| t.error("bad row size"))?;
        if t.rows.checked_mul(row_bytes) != Some(t.bytes.len()) {
            return Err(t.error("bytes do not match shape"));
        }
        Ok(CpuEmbedding { dtype: t.dtype, rows: t.rows, cols: t.cols, row_bytes, bytes: t.bytes.clone() })
    }

    fn vector(&self, t: &TensorDesc) -> Result<Vec<f32>, EngineError> {
        if t.rows != 1 || t.dtype.row_bytes(t.cols) != Some(t.bytes.len()) {
            return Err(t.error("not a vector of its stated length"));
        }
        let mut out = vec![0.0; t.cols];
        dequantize_row(t.dtype, t.bytes.as_slice(), &mut out);
        Ok(out)
    }

    fn vector_from(&self, values: &[f32]) -> Vec<f32> {
        values.to_vec()
    }

    fn matrix_shape(w: &CpuMatrix) -> (usize, usize) {
        (w.rows(), w.cols())
    }

    fn matrix_bytes(w: &CpuMatrix) -> usize {
        w.bytes()
    }

    fn grow(&self, buf: &mut Vec<f32>, len: usize) {
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
    }

    fn to_host(&self, buf: &Vec<f32>, range: Range<usize>) -> Vec<f32> {
        buf[range].to_vec()
    }

    fn upload(&self, values: &[f32], buf: &mut Vec<f32>, at: usize) {
        self.grow(buf, at + values.len());
        buf[at..at + values.len()].copy_from_slice(values);
    }

    fn save_le(&self, buf: &Vec<f32>, dst: &mut [u8]) {
        for (d, &v) in dst.chunks_exact_mut(4).zip(buf) {
            d.copy_from_slice(&v.to_le_bytes());
        }
    }

    fn load_le(&self, src: &[u8], buf: &mut Vec<f32>) {
        buf.clear();
        buf.extend(src.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])));
    }

    fn zeros(&self, buf: &mut Vec<f32>, len: usize) {
        buf.clear();
        buf.resize(len, 0.0);
    }

    fn concat_cols(&self, a: &Vec<f32>, wa: usize, b: &Vec<f32>, wb: usize, rows: usize, out: &mut Vec<f32>) {
        let w = wa + wb;
        for r in 0..rows {
            out[r * w..r * w + wa].copy_from_slice(&a[r * wa..(r + 1) * wa]);
            out[r * w + wa..(r + 1) * w].copy_from_slice(&b[r * wb..(r + 1) * wb]);
        }
    }

    fn deinterleave_heads(
        &self,
        x: &Vec<f32>,
        rows: usize,
        n_heads: usize,
        head_dim: usize,
        first: &mut Vec<f32>,
        second: &mut Vec<f32>,
    ) {
        let (hd, width) = (head_dim, n_heads * head_dim);
        for r in 0..rows {
            for h in 0..n_heads {
                let src = &x[r * 2 * width + 2 * h * hd..][..2 * hd];
                first[r * width + h * hd..][..hd].copy_from_slice(&src[..hd]);
                second[r * width + h * hd..][..hd].copy_from_slice(&src[hd..]);
            }
        }
    }

    fn gather_rows(&self, src: &Vec<f32>, width: usize, rows: &[usize], out: &mut Vec<f32>) {
        for (i, &r) in rows.iter().enumerate() {
            out[i * width..(i + 1) * width].copy_from_slice(&src[r * width..(r + 1) * width]);
        }
    }

    fn embed(&self, table: &CpuEmbedding, tokens: &[u32], out: &mut Vec<f32>) -> Result<(), EngineError> {
        let (h, bytes) = (table.cols, table.bytes.as_slice());
        for (i, &tok) in tokens.iter().enumerate() {
            let t = tok as usize;
            if t >= table.rows {
                return Err(EngineError::Internal(format!("embedding row {tok} of {}", table.rows)));
            }
            let src = &bytes[t * table.row_bytes..(t + 1) * table.row_bytes];
            dequantize_row(table.dtype, src, &mut out[i * h..(i + 1) * h]);
        }
        Ok(())
    }

    fn embed_rows(&self, table: &CpuMatrix, tokens: &[u32], out: &mut Vec<f32>) -> Result<(), EngineError> {
        let h = table.cols();
        for (i, &tok) in tokens.iter().enumerate() {
            table.row_f32(tok as usize, &mut out[i * h..(i + 1) * h])?;
        }
        Ok(())
    }

    fn rms_norm(&self, x: &Vec<f32>, w: &Vec<f32>, eps: f32, rows: usize, out: &mut Vec<f32>) {
        let d = w.len();
        let n = rows * d;
        // Rows split across the pool: each row's arithmetic is the same.
        self.pool
            .split_rows(&mut out[..n], d, 1, SPLIT_MIN_ROWS, |o, r| rms_norm(&x[r.start * d..r.end * d], w, eps, o));
    }

    fn matmul(&self, x: &Vec<f32>, rows: usize, outs: &mut [(&CpuMatrix, &mut Vec<f32>)]) {
        let cols = outs.first().map_or(0, |(w, _)| w.cols());
        let x = &x[..rows * cols];
        let quantized = outs.iter().any(|(w, _)| matches!(w, CpuMatrix::Packed(p) if p.dtype.is_quantized()));
        let mut acts = self.q8.borrow_mut();
        if quantized {
            acts.quantize_into(x, rows, cols);
        }
        let kquant = outs.iter().any(|(w, _)| matches!(w, CpuMatrix::KQuant(_)));
        let mut kacts = self.q8k.borrow_mut();
        if kquant {
            kacts.quantize_into(&self.pool, x, rows, cols);
        }
        if outs.len() > 1 && outs.iter().all(|(w, _)| matches!(w, CpuMatrix::KQuant(_))) {
            // One pool call for all of them (no wait between matrices).
            let mut mats: Vec<(&KQuantMatrix, &mut [f32])> = outs
                .iter_mut()
                .filter_map(|(w, out)| match w {
                    CpuMatrix::KQuant(k) => Some((k, &mut out[..rows * k.rows])),
                    _ => None,
                })
                .collect();
            return matmul_kquant_q8k_many(&self.pool, &kacts, &mut mats);
        }
        for (w, out) in outs.iter_mut() {
            let out = &mut out[..rows * w.rows()];
            match w {
                CpuMatrix::Packed(p) if p.dtype.is_quantized() => matmul_packed_q8(&self.pool, p, &acts, out),
                CpuMatrix::KQuant(k) => matmul_kquant_q8k(&self.pool, k, &kacts, out),
                w => w.matmul(&self.pool, x, rows, out),
            }
        }
    }

    fn silu_mul(&self, gate: &mut Vec<f32>, up: &Vec<f32>, len: usize) {
        activation::silu_mul(&self.pool, &mut gate[..len], &up[..len]);
    }

    fn add_assign(&self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) {
        add_in_place(&mut x[..len], &y[..len]);
    }

    fn sigmoid_mul(&self, x: &mut Vec<f32>, gate: &Vec<f32>, len: usize) {
        // Split across the pool from prefill-sized lengths on (the same formula per value).
        self.pool.split_rows(&mut x[..len], 1, 16, SPLIT_MIN_VALUES, |x, r| {
            for (a, &g) in x.iter_mut().zip(&gate[r]) {
                *a *= 1.0 / (1.0 + (-g).exp());
            }
        });
    }

    fn scale(&self, x: &mut Vec<f32>, s: f32, len: usize) {
        x[..len].iter_mut().for_each(|a| *a *= s);
    }

    fn rope_table(&self, positions: &[usize], inv_freq: &[f64], table: &mut Vec<(f32, f32)>) {
        rope_table(positions, inv_freq, table);
    }

    fn rope_table_f32(&self, positions: &[usize], inv_freq: &[f32], table: &mut Vec<(f32, f32)>) {
        rope_table_f32(positions, inv_freq, table);
    }

    fn rope(&self, style: RopeStyle, x: &mut Vec<f32>, width: usize, head_dim: usize, table: &Vec<(f32, f32)>) {
        let pairs = style.pairs(head_dim);
        let rows = table.len() / pairs;
        match style {
            RopeStyle::AdjacentPairs => rope_adjacent_pairs(&mut x[..rows * width], head_dim, table),
            RopeStyle::HalfSplit { .. } => rope_half_split(&mut x[..rows * width], head_dim, pairs, table),
        }
    }

    fn move_kv(&self, layout: &KvLayout, pages: &[PageId], from: usize, to: usize) -> Result<(), EngineError> {
        self.with_addrs(pages, |addrs| crate::pages::move_kv_position(layout, addrs, from, to))?
    }

    fn copy_page(&self, layout: &KvLayout, from: PageId, to: PageId) -> Result<(), EngineError> {
        self.with_addrs(&[from, to], |addrs| crate::pages::copy_page(layout, addrs[0], addrs[1]))
    }

    fn private_pages(&self, layout: &KvLayout, n: usize) -> Result<Vec<PageId>, EngineError> {
        Ok(self.pages.borrow_mut().private_pages(layout, n))
    }

    fn zero_private_pages(&self, layout: &KvLayout, pages: &[PageId]) -> Result<(), EngineError> {
        self.pages.borrow().zero_private_pages(layout, pages)
    }

    fn free_private_pages(&self, pages: &[PageId]) {
        self.pages.borrow_mut().free_private_pages(pages);
    }

    fn write_kv(&self, w: &KvWrite, k: &Vec<f32>, v: &Vec<f32>) {
        let s = w.seq;
        let kvd = s.layout.n_kv_heads * s.layout.head_dim;
        self.with_addrs(s.pages, |pages| {
            for (j, r) in s.rows.clone().enumerate() {
                write_kv_scaled(
                    s.layout,
                    pages,
                    w.layer,
                    s.start_pos + j,
                    &k[r * kvd..(r + 1) * kvd],
                    &v[r * kvd..(r + 1) * kvd],
                    w.k_scale,
                    w.v_scale,
                );
            }
        })
        .expect("KV pages are checked before every pass (CpuOps::check_pages)");
    }

    fn attention(&self, shape: &AttnShape, seq: &SeqKv, q: &Vec<f32>, out: &mut Vec<f32>) {
        let m = seq.rows.len();
        if m == 0 {
            return;
        }
        let qd = shape.n_heads * shape.head_dim;
        let params = AttnParams {
            layer: shape.layer,
            n_heads: shape.n_heads,
            n_kv_heads: shape.n_kv_heads,
            head_dim: shape.head_dim,
            scale: shape.scale,
        };
        let (q, out) = (&q[seq.rows.start * qd..seq.rows.end * qd], &mut out[seq.rows.start * qd..seq.rows.end * qd]);
        self.with_addrs(seq.pages, |pages| match seq.tree {
            Some(t) => attention_tree(&self.pool, seq.layout, pages, &params, seq.start_pos, t, q, out),
            None => attention(&self.pool, seq.layout, pages, &params, seq.start_pos, q, m, out),
        })
        .expect("KV pages are checked before every pass (CpuOps::check_pages)");
    }

    fn gdn_gates(&self, beta: &mut Vec<f32>, g: &mut Vec<f32>, neg_a: &Vec<f32>, dt_bias: &Vec<f32>, rows: usize) {
        let n = rows * neg_a.len();
        gdn::gates(&mut beta[..n], &mut g[..n], neg_a, dt_bias);
    }

    fn causal_conv1d_silu(
        &self,
        d: &GdnDims,
        taps: &Vec<f32>,
        qkv: &Vec<f32>,
        seqs: &mut [GdnSeq<'_, Vec<f32>>],
        out: &mut Vec<f32>,
    ) {
        gdn::causal_conv1d_silu(&self.pool, d, taps, qkv, seqs, out);
    }

    fn gdn_qk_norm(&self, d: &GdnDims, x: &mut Vec<f32>, rows: usize) {
        gdn::qk_norm(&self.pool, d, &mut x[..rows * d.conv_dim()]);
    }

    fn delta_rule(
        &self,
        d: &GdnDims,
        mode: GdnMode,
        x: &Vec<f32>,
        beta: &Vec<f32>,
        g: &Vec<f32>,
        seqs: &mut [GdnSeq<'_, Vec<f32>>],
        out: &mut Vec<f32>,
    ) {
        gdn::delta_rule_heads(&self.pool, d, mode, x, beta, g, seqs, out);
    }

    fn gated_rms_norm(&self, x: &mut Vec<f32>, z: &Vec<f32>, w: &Vec<f32>, eps: f32, rows: usize) {
        let n = rows * w.len();
        gdn::gated_rms_norm(&self.pool, &mut x[..n], &z[..n], w, eps);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::kquant::quantize_rows;

    /// A GGUF Qwen file's `out_proj` when K-quant blocks span two value heads
    /// (`model/qwen36/gguf.rs`): the matrix stays in the file's order and the input is scattered.
    #[test]
    fn k_quant_value_columns_stay_in_file_order_and_the_input_is_scattered() {
        // Qwen3.6-27B's case in small: 128-value heads, Hv > Hk, 256-value K-quant blocks.
        let (hk, hv, dv, rows) = (2, 4, 128, 5);
        let cols = hv * dv;
        let stored: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 211) as f32 - 105.0) / 300.0).collect();
        let bytes = quantize_rows(KQuantType::Q4K, &stored);
        // GGUF's tiled value-head order -> HF's (what `untile_map` in `engine-models`' Qwen
        // GGUF loader builds): head `h` of HF order is tile `(h % (hv / hk)) * hk + h / (hv / hk)`.
        let map: Vec<usize> =
            (0..hv).flat_map(|h| (0..dv).map(move |d| ((h % (hv / hk)) * hk + h / (hv / hk)) * dv + d)).collect();
        let inner = KQuantMatrix::new(KQuantType::Q4K, rows, cols, &bytes).unwrap();
        let mut deq = vec![0f32; rows * cols];
        for r in 0..rows {
            inner.dequantize_row(r, &mut deq[r * cols..(r + 1) * cols]);
        }
        let w = CpuMatrix::Scattered {
            inner: Box::new(CpuMatrix::KQuant(inner)),
            at: map.iter().map(|&s| s as u32).collect(),
        };
        // Rows in the model's (HF) order.
        let mut row = vec![0f32; cols];
        for r in 0..rows {
            w.row_f32(r, &mut row).unwrap();
            let want: Vec<f32> = map.iter().map(|&s| deq[r * cols + s]).collect();
            assert_eq!(row, want, "row {r}");
        }
        // The product with the HF-order matrix, within the 8-bit activation rounding.
        let m = 3;
        let x: Vec<f32> = (0..m * cols).map(|i| ((i * 31 % 61) as f32 - 30.0) / 17.0).collect();
        let mut got = vec![0f32; m * rows];
        w.matmul(&ThreadPool::new(2), &x, m, &mut got);
        for mi in 0..m {
            for r in 0..rows {
                let terms = (0..cols).map(|i| deq[r * cols + map[i]] as f64 * x[mi * cols + i] as f64);
                let (want, mag) = terms.fold((0f64, 0f64), |(s, a), t| (s + t, a + t.abs()));
                let g = got[mi * rows + r] as f64;
                assert!((g - want).abs() <= 1e-2 * mag, "m {mi} row {r}: {g} vs {want}");
            }
        }
    }
}
