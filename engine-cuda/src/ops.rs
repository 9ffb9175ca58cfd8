//! `CudaOps`: the op seam on a GPU, for the Llama family (the Gated DeltaNet ops come with
//! the Qwen3.6 part). Activations are f32 device buffers; weights stay in their GGUF block
//! format in device memory and the kernels decode them; KV pages are addressed by device
//! pointer, resolved from page ids once per call (see [`PageSpaces`]).
//!
//! Errors: the trait's arithmetic ops return nothing (a CPU op cannot fail), but a launch can.
//! The first failure is kept and every later op is skipped until the backend takes it after
//! the pass ([`CudaOps::take_error`]), the way CUDA itself reports asynchronous errors.

use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DeviceRepr, PushKernelArg, ValidAsZeroBits};
use engine_ops::kv::{HostPages, KvDtype, KvLayout, PageId};
use engine_ops::tensor::{GgmlType, MatrixData, MatrixDesc, TensorDesc, dequantize_row};
use engine_ops::{AttnShape, EngineError, GdnDims, GdnMode, GdnSeq, KvWrite, Ops, RopeStyle, SeqKv};

use crate::CudaError;
use crate::device::GpuDevice;
use crate::launch::{self, AttnParams, KvGeometry};
use crate::pages::PageSpaces;

/// An f32 activation buffer in device memory; grow-only.
#[derive(Default)]
pub struct GpuBuf {
    mem: Option<CudaSlice<f32>>,
}

impl GpuBuf {
    pub fn capacity(&self) -> usize {
        self.mem.as_ref().map_or(0, CudaSlice::len)
    }
}

/// A weight matrix (or embedding table) in its GGUF block format, rows contiguous.
pub struct GpuMatrix {
    data: CudaSlice<u8>,
    /// The kernels' name for the format (`gemv_<format>`, `embed_<format>`).
    format: &'static str,
    rows: usize,
    cols: usize,
    row_bytes: usize,
}

/// A small f32 vector (norm weights).
pub struct GpuVector {
    /// `None` only when the upload failed (the pass fails with that error).
    data: Option<CudaSlice<f32>>,
    len: usize,
}

/// Rotary angles of one pass: `(cos, sin)` per row and pair, made on the host by the same
/// function as the CPU's and uploaded.
#[derive(Default)]
pub struct GpuRope {
    host: Vec<(f32, f32)>,
    dev: GpuBuf,
    pairs: usize,
}

pub struct CudaOps {
    dev: Arc<GpuDevice>,
    error: RefCell<Option<CudaError>>,
    pages: RefCell<PageSpaces>,
    /// Small per-call uploads (token ids, row indices, page addresses, tree tables). Reused
    /// without waiting: everything runs on one stream, so the next upload into a staging
    /// buffer is ordered after the kernels that read the previous one.
    staging: RefCell<Staging>,
    /// The attention split pass's partial results, reused by every call.
    attn_partials: RefCell<GpuBuf>,
}

#[derive(Default)]
struct Staging {
    u32s: Option<CudaSlice<u32>>,
    u64s: Option<CudaSlice<u64>>,
    /// Tokens chosen on the device, copied back.
    tokens: Option<CudaSlice<u32>>,
}

fn driver(e: cudarc::driver::DriverError) -> CudaError {
    CudaError::Driver(format!("{e:?}"))
}

/// Staging buffer `slot` with room for `len` values: a new one when short, once the queued
/// kernels that may read the old one finished.
fn reserve<'s, T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    slot: &'s mut Option<CudaSlice<T>>,
    len: usize,
) -> Result<&'s mut CudaSlice<T>, CudaError> {
    let buf = match slot.take() {
        Some(b) if b.len() >= len => b,
        old => {
            if old.is_some() {
                stream.synchronize().map_err(driver)?;
            }
            drop(old);
            stream.alloc_zeros::<T>(len.max(1024)).map_err(driver)?
        }
    };
    Ok(slot.insert(buf))
}

/// The kernel suffix of a weight format the GEMV and gather kernels decode.
fn format_suffix(dtype: GgmlType) -> Option<&'static str> {
    match dtype {
        GgmlType::Q8_0 => Some("q8_0"),
        GgmlType::Q4_0 => Some("q4_0"),
        GgmlType::Q4_1 => Some("q4_1"),
        GgmlType::F16 => Some("f16"),
        GgmlType::BF16 => Some("bf16"),
        GgmlType::F32 => Some("f32"),
        GgmlType::Q4_K => Some("q4_k"),
        GgmlType::Q5_K => Some("q5_k"),
        GgmlType::Q6_K => Some("q6_k"),
    }
}

impl CudaOps {
    pub fn new(dev: Arc<GpuDevice>) -> Result<CudaOps, CudaError> {
        Ok(CudaOps {
            pages: RefCell::new(PageSpaces::new(dev.clone())?),
            dev,
            error: RefCell::new(None),
            staging: RefCell::new(Staging::default()),
            attn_partials: RefCell::new(GpuBuf::default()),
        })
    }

    pub fn device(&self) -> &Arc<GpuDevice> {
        &self.dev
    }

    /// The first failure since the last call, after waiting for the queued work (a kernel's
    /// fault surfaces at the next synchronisation).
    pub fn take_error(&self) -> Result<(), EngineError> {
        if self.error.borrow().is_none() {
            let synced = self.dev.stream().synchronize().map_err(driver);
            self.record(synced);
        }
        match self.error.borrow_mut().take() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    fn failed(&self) -> bool {
        self.error.borrow().is_some()
    }

    fn record<T>(&self, r: Result<T, CudaError>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                let mut slot = self.error.borrow_mut();
                if slot.is_none() {
                    tracing::error!(error = %e, "CUDA op failed; the pass fails");
                    *slot = Some(e);
                }
                None
            }
        }
    }

    fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        s.device_ptr(self.dev.stream()).0
    }

    fn buf_ptr(&self, b: &GpuBuf) -> u64 {
        b.mem.as_ref().map_or(0, |m| self.ptr(m))
    }

    /// [`Ops::grow`] that says whether `buf` now holds `len` values (a failed allocation is
    /// kept as the pass's error, and the op that needed it is skipped).
    fn grown(&self, buf: &mut GpuBuf, len: usize) -> bool {
        let r = self.grow_keep(buf, len).map(|_| ());
        self.record(r).is_some()
    }

    /// Grows `buf` to at least `len` values, keeping its contents; returns its memory.
    fn grow_keep<'b>(&self, buf: &'b mut GpuBuf, len: usize) -> Result<&'b mut CudaSlice<f32>, CudaError> {
        let stream = self.dev.stream();
        let mem = match buf.mem.take() {
            Some(m) if m.len() >= len => m,
            old => {
                let capacity = old.as_ref().map_or(0, CudaSlice::len);
                let new_len = len.max(capacity + capacity / 2).max(256);
                let mut fresh = match stream.alloc_zeros::<f32>(new_len) {
                    Ok(f) => f,
                    Err(e) => {
                        buf.mem = old;
                        return Err(driver(e));
                    }
                };
                if let Some(old) = &old {
                    stream.memcpy_dtod(old, &mut fresh.slice_mut(..old.len())).map_err(driver)?;
                    // Queued kernels may still use the old buffer: let them finish before it
                    // is freed.
                    stream.synchronize().map_err(driver)?;
                }
                fresh
            }
        };
        Ok(buf.mem.insert(mem))
    }

    /// Uploads `values` into a reusable staging buffer (grown when short); returns its device
    /// address.
    fn stage<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        slot: &mut Option<CudaSlice<T>>,
        values: &[T],
    ) -> Result<u64, CudaError> {
        let buf = reserve(self.dev.stream(), slot, values.len())?;
        self.dev.stream().memcpy_htod(values, &mut buf.slice_mut(..values.len())).map_err(driver)?;
        Ok(self.ptr(buf))
    }

    /// Token ids, row indices, tree tables.
    fn stage_u32(&self, values: &[u32]) -> Result<u64, CudaError> {
        self.stage(&mut self.staging.borrow_mut().u32s, values)
    }

    /// Page addresses: their own buffer, so a launch can take both.
    fn stage_u64(&self, values: &[u64]) -> Result<u64, CudaError> {
        self.stage(&mut self.staging.borrow_mut().u64s, values)
    }

    /// Device addresses of `ids`, uploaded.
    fn stage_pages(&self, ids: &[PageId]) -> Result<u64, CudaError> {
        let addrs = self.pages.borrow().addresses(ids)?;
        self.stage_u64(&addrs)
    }

    /// Makes page memory of `space` reachable by the kernels (see [`PageSpaces::map`]).
    pub fn map_pages(&self, space: u32, memory: Arc<dyn HostPages>) -> Result<(), EngineError> {
        Ok(self.pages.borrow_mut().map(space, memory)?)
    }

    pub fn unmap_pages(&self, space: u32) {
        self.pages.borrow_mut().unmap(space);
    }

    /// Before a pass: fails when any of `ids` is not mapped (as the CPU does), and brings the
    /// pages to the device where they are mirrored there.
    pub fn check_pages(&self, ids: &[PageId]) -> Result<(), EngineError> {
        Ok(self.pages.borrow_mut().prepare(ids)?)
    }

    /// Makes the host copies of `ids` hold what the GPU wrote (before the engine commits the
    /// pages to the cache, or a test reads them on the host).
    pub fn flush_pages(&self, ids: &[PageId]) -> Result<(), EngineError> {
        self.take_error()?;
        Ok(self.pages.borrow_mut().flush(ids)?)
    }

    /// Where KV pages live on this GPU.
    pub fn kv_residency(&self) -> crate::pages::Residency {
        self.pages.borrow().residency()
    }

    fn upload_weights(&self, bytes: &[u8]) -> Result<CudaSlice<u8>, CudaError> {
        self.dev.stream().clone_htod(bytes).map_err(driver)
    }

    fn elementwise(&self, kernel: &str, x: u64, y: u64, s: f32, len: usize) {
        if len == 0 || self.failed() {
            return;
        }
        let cfg = launch::linear(len);
        let n = len as u32;
        let stream = self.dev.stream();
        let mut b = stream.launch_builder(self.dev.function(kernel));
        b.arg(&x);
        if kernel == "scale" {
            b.arg(&s);
        } else {
            b.arg(&y);
        }
        b.arg(&n);
        // SAFETY: the arguments match the kernel's parameters (elementwise.cu); the buffers
        // hold at least `len` values (the trait's contract, grown by the model).
        let r = unsafe { b.launch(cfg.into()) };
        self.record(r.map(|_| ()).map_err(driver));
    }
}

impl Ops for CudaOps {
    type Buf = GpuBuf;
    type Matrix = GpuMatrix;
    type Embedding = GpuMatrix;
    type Vector = GpuVector;
    type RopeTable = GpuRope;

    fn matrix(&self, t: &MatrixDesc) -> Result<GpuMatrix, EngineError> {
        let MatrixData::Ggml { dtype, bytes } = &t.data else {
            return Err(t.error("the CUDA backend runs GGUF block formats only (NVFP4 and reordered columns come with Qwen3.6 on the GPU)"));
        };
        let format = format_suffix(*dtype)
            .ok_or_else(|| t.error(format!("{dtype:?} weights are not supported by the CUDA backend yet")))?;
        if !t.cols.is_multiple_of(32) {
            return Err(t.error(format!("{} columns: the CUDA kernels need a multiple of 32", t.cols)));
        }
        let row_bytes = dtype.row_bytes(t.cols).ok_or_else(|| t.error("bad row size"))?;
        if t.rows.checked_mul(row_bytes) != Some(bytes.len()) {
            return Err(t.error("bytes do not match shape"));
        }
        let data = self.upload_weights(bytes).map_err(|e| t.error(e))?;
        Ok(GpuMatrix { data, format, rows: t.rows, cols: t.cols, row_bytes })
    }

    fn embedding(&self, t: &TensorDesc) -> Result<GpuMatrix, EngineError> {
        let format = format_suffix(t.dtype).filter(|_| t.cols.is_multiple_of(32)).ok_or_else(|| {
            t.error(format!("{:?} embedding of {} columns: not supported by the CUDA backend", t.dtype, t.cols))
        })?;
        let row_bytes = t.dtype.row_bytes(t.cols).ok_or_else(|| t.error("bad row size"))?;
        if t.rows.checked_mul(row_bytes) != Some(t.bytes.len()) {
            return Err(t.error("bytes do not match shape"));
        }
        let data = self.upload_weights(t.bytes.as_slice()).map_err(|e| t.error(e))?;
        Ok(GpuMatrix { data, format, rows: t.rows, cols: t.cols, row_bytes })
    }

    fn vector(&self, t: &TensorDesc) -> Result<GpuVector, EngineError> {
        if t.rows != 1 || t.dtype.row_bytes(t.cols) != Some(t.bytes.len()) {
            return Err(t.error("not a vector of its stated length"));
        }
        let mut host = vec![0.0; t.cols];
        dequantize_row(t.dtype, t.bytes.as_slice(), &mut host);
        let data = self.dev.stream().clone_htod(&host).map_err(|e| t.error(driver(e)))?;
        Ok(GpuVector { data: Some(data), len: t.cols })
    }

    fn vector_from(&self, values: &[f32]) -> GpuVector {
        // The trait gives this no error path; an allocation failure here is at load time and
        // the next op's check reports it.
        match self.dev.stream().clone_htod(values) {
            Ok(data) => GpuVector { data: Some(data), len: values.len() },
            Err(e) => {
                self.record::<()>(Err(driver(e)));
                GpuVector { data: None, len: 0 }
            }
        }
    }

    fn matrix_shape(w: &GpuMatrix) -> (usize, usize) {
        (w.rows, w.cols)
    }

    fn matrix_bytes(w: &GpuMatrix) -> usize {
        w.data.len()
    }

    fn grow(&self, buf: &mut GpuBuf, len: usize) {
        let r = self.grow_keep(buf, len).map(|_| ());
        self.record(r);
    }

    fn to_host(&self, buf: &GpuBuf, range: Range<usize>) -> Vec<f32> {
        let mut out = vec![0.0; range.len()];
        if range.is_empty() || self.failed() {
            return out;
        }
        let Some(mem) = &buf.mem else { return out };
        let stream = self.dev.stream();
        let r = stream.memcpy_dtoh(&mem.slice(range), &mut out).and_then(|()| stream.synchronize());
        self.record(r.map_err(driver));
        out
    }

    fn upload(&self, values: &[f32], buf: &mut GpuBuf, at: usize) {
        if values.is_empty() || self.failed() {
            return;
        }
        let r = self.grow_keep(buf, at + values.len()).and_then(|mem| {
            self.dev.stream().memcpy_htod(values, &mut mem.slice_mut(at..at + values.len())).map_err(driver)
        });
        self.record(r);
    }

    fn save_le(&self, buf: &GpuBuf, dst: &mut [u8]) {
        let values = self.to_host(buf, 0..(dst.len() / 4).min(buf.capacity()));
        for (d, v) in dst.chunks_exact_mut(4).zip(values) {
            d.copy_from_slice(&v.to_le_bytes());
        }
    }

    fn load_le(&self, src: &[u8], buf: &mut GpuBuf) {
        let values: Vec<f32> = src.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        self.upload(&values, buf, 0);
    }

    fn zeros(&self, buf: &mut GpuBuf, len: usize) {
        if len == 0 || self.failed() {
            return;
        }
        let r = self
            .grow_keep(buf, len)
            .and_then(|mem| self.dev.stream().memset_zeros(&mut mem.slice_mut(..len)).map_err(driver));
        self.record(r);
    }

    fn gather_rows(&self, src: &GpuBuf, width: usize, rows: &[usize], out: &mut GpuBuf) {
        if rows.is_empty() || width == 0 || self.failed() {
            return;
        }
        if !self.grown(out, rows.len() * width) {
            return;
        }
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let Some(idx) = self.record(self.stage_u32(&idx)) else { return };
        let (s, o, w) = (self.buf_ptr(src), self.buf_ptr(out), width as u32);
        let cfg = launch::rows_2d(width, rows.len());
        let stream = self.dev.stream();
        let mut b = stream.launch_builder(self.dev.function("gather_rows"));
        b.arg(&s).arg(&w).arg(&idx).arg(&o);
        // SAFETY: matches elementwise.cu's gather_rows; `src` holds the indexed rows.
        self.record(unsafe { b.launch(cfg.into()) }.map(|_| ()).map_err(driver));
    }

    fn concat_cols(&self, a: &GpuBuf, wa: usize, b_: &GpuBuf, wb: usize, rows: usize, out: &mut GpuBuf) {
        if rows == 0 || self.failed() {
            return;
        }
        if !self.grown(out, rows * (wa + wb)) {
            return;
        }
        let (pa, pb, po, wa32, wb32) = (self.buf_ptr(a), self.buf_ptr(b_), self.buf_ptr(out), wa as u32, wb as u32);
        let cfg = launch::rows_2d(wa + wb, rows);
        let stream = self.dev.stream();
        let mut b = stream.launch_builder(self.dev.function("concat_cols"));
        b.arg(&pa).arg(&wa32).arg(&pb).arg(&wb32).arg(&po);
        // SAFETY: matches elementwise.cu's concat_cols.
        self.record(unsafe { b.launch(cfg.into()) }.map(|_| ()).map_err(driver));
    }

    fn deinterleave_heads(
        &self,
        x: &GpuBuf,
        rows: usize,
        n_heads: usize,
        head_dim: usize,
        first: &mut GpuBuf,
        second: &mut GpuBuf,
    ) {
        if rows == 0 || self.failed() {
            return;
        }
        let width = n_heads * head_dim;
        if !self.grown(first, rows * width) || !self.grown(second, rows * width) {
            return;
        }
        let (px, pf, ps, nh, hd) =
            (self.buf_ptr(x), self.buf_ptr(first), self.buf_ptr(second), n_heads as u32, head_dim as u32);
        let cfg = launch::rows_2d(width, rows);
        let stream = self.dev.stream();
        let mut b = stream.launch_builder(self.dev.function("deinterleave_heads"));
        b.arg(&px).arg(&nh).arg(&hd).arg(&pf).arg(&ps);
        // SAFETY: matches elementwise.cu's deinterleave_heads.
        self.record(unsafe { b.launch(cfg.into()) }.map(|_| ()).map_err(driver));
    }

    fn embed(&self, table: &GpuMatrix, tokens: &[u32], out: &mut GpuBuf) -> Result<(), EngineError> {
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= table.rows) {
            return Err(EngineError::Internal(format!("embedding row {bad} of {}", table.rows)));
        }
        if tokens.is_empty() || self.failed() {
            return Ok(());
        }
        if !self.grown(out, tokens.len() * table.cols) {
            return Ok(());
        }
        let Some(tok) = self.record(self.stage_u32(tokens)) else { return Ok(()) };
        let (pt, rb, cols, po) = (self.ptr(&table.data), table.row_bytes as u32, table.cols as u32, self.buf_ptr(out));
        let cfg = launch::per_row(tokens.len(), table.cols / 32);
        let stream = self.dev.stream();
        let mut b = stream.launch_builder(self.dev.function(&format!("embed_{}", table.format)));
        b.arg(&pt).arg(&rb).arg(&cols).arg(&tok).arg(&po);
        // SAFETY: matches gemv.cu's embed_*; every token is a row of the table (checked).
        self.record(unsafe { b.launch(cfg.into()) }.map(|_| ()).map_err(driver));
        Ok(())
    }

    fn embed_rows(&self, table: &GpuMatrix, tokens: &[u32], out: &mut GpuBuf) -> Result<(), EngineError> {
        // A matrix is stored like an embedding table (rows of GGUF blocks).
        self.embed(table, tokens, out)
    }

    fn rms_norm(&self, x: &GpuBuf, w: &GpuVector, eps: f32, rows: usize, out: &mut GpuBuf) {
        if rows == 0 || self.failed() {
            return;
        }
        if !self.grown(out, rows * w.len) {
            return;
        }
        let (px, pw, po, width) =
            (self.buf_ptr(x), w.data.as_ref().map_or(0, |d| self.ptr(d)), self.buf_ptr(out), w.len as u32);
        let cfg = launch::per_row(rows, w.len);
        let stream = self.dev.stream();
        let mut b = stream.launch_builder(self.dev.function("rms_norm"));
        b.arg(&px).arg(&pw).arg(&eps).arg(&width).arg(&po);
        // SAFETY: matches norm.cu's rms_norm.
        self.record(unsafe { b.launch(cfg.into()) }.map(|_| ()).map_err(driver));
    }

    fn matmul(&self, x: &GpuBuf, rows: usize, outs: &mut [(&GpuMatrix, &mut GpuBuf)]) {
        if rows == 0 {
            return;
        }
        let px = self.buf_ptr(x);
        for (w, out) in outs.iter_mut() {
            if self.failed() {
                return;
            }
            if !self.grown(out, rows * w.rows) {
                return;
            }
            let (pw, rb, out_rows, cols, xr, po) =
                (self.ptr(&w.data), w.row_bytes as u32, w.rows as u32, w.cols as u32, rows as u32, self.buf_ptr(out));
            let cfg = launch::gemv(w.rows);
            let stream = self.dev.stream();
            let mut b = stream.launch_builder(self.dev.function(&format!("gemv_{}", w.format)));
            b.arg(&pw).arg(&rb).arg(&out_rows).arg(&cols).arg(&px).arg(&xr).arg(&po);
            // SAFETY: matches gemv.cu's gemv_*; `x` holds `rows` rows of `cols`.
            self.record(unsafe { b.launch(cfg.into()) }.map(|_| ()).map_err(driver));
        }
    }

    fn silu_mul(&self, gate: &mut GpuBuf, up: &GpuBuf, len: usize) {
        self.elementwise("silu_mul", self.buf_ptr(gate), self.buf_ptr(up), 0.0, len);
    }

    fn add_assign(&self, x: &mut GpuBuf, y: &GpuBuf, len: usize) {
        self.elementwise("add_assign", self.buf_ptr(x), self.buf_ptr(y), 0.0, len);
    }

    fn sigmoid_mul(&self, x: &mut GpuBuf, gate: &GpuBuf, len: usize) {
        self.elementwise("sigmoid_mul", self.buf_ptr(x), self.buf_ptr(gate), 0.0, len);
    }

    fn scale(&self, x: &mut GpuBuf, s: f32, len: usize) {
        self.elementwise("scale", self.buf_ptr(x), 0, s, len);
    }

    fn rope_table(&self, positions: &[usize], inv_freq: &[f64], table: &mut GpuRope) {
        engine_ops::rope::rope_table(positions, inv_freq, &mut table.host);
        table.pairs = inv_freq.len();
        self.upload_rope(table);
    }

    fn rope_table_f32(&self, positions: &[usize], inv_freq: &[f32], table: &mut GpuRope) {
        engine_ops::rope::rope_table_f32(positions, inv_freq, &mut table.host);
        table.pairs = inv_freq.len();
        self.upload_rope(table);
    }

    fn rope(&self, style: RopeStyle, x: &mut GpuBuf, width: usize, head_dim: usize, table: &GpuRope) {
        let pairs = style.pairs(head_dim);
        if pairs == 0 || table.host.is_empty() || self.failed() {
            return;
        }
        let rows = table.host.len() / pairs;
        let (px, pt, w, hd) = (self.buf_ptr(x), self.buf_ptr(&table.dev), width as u32, head_dim as u32);
        let cfg = launch::per_row(rows, (width / head_dim) * pairs);
        let stream = self.dev.stream();
        let r = match style {
            RopeStyle::AdjacentPairs => {
                let mut b = stream.launch_builder(self.dev.function("rope_adjacent"));
                b.arg(&px).arg(&w).arg(&hd).arg(&pt);
                // SAFETY: matches rope.cu's rope_adjacent; the table has `rows` rows.
                unsafe { b.launch(cfg.into()) }
            }
            RopeStyle::HalfSplit { rotated } => {
                let rot = rotated as u32;
                let mut b = stream.launch_builder(self.dev.function("rope_half_split"));
                b.arg(&px).arg(&w).arg(&hd).arg(&rot).arg(&pt);
                // SAFETY: matches rope.cu's rope_half_split.
                unsafe { b.launch(cfg.into()) }
            }
        };
        self.record(r.map(|_| ()).map_err(driver));
    }

    fn write_kv(&self, w: &KvWrite, k: &GpuBuf, v: &GpuBuf) {
        let s = w.seq;
        let n = s.rows.len();
        if n == 0 || self.failed() {
            return;
        }
        let Some(pages) = self.record(self.stage_pages(s.pages)) else { return };
        let kvd = s.layout.n_kv_heads * s.layout.head_dim;
        let offset = (s.rows.start * kvd * 4) as u64;
        let (pk, pv) = (self.buf_ptr(k) + offset, self.buf_ptr(v) + offset);
        let geometry = KvGeometry::new(s.layout, w.layer);
        let start = s.start_pos as u32;
        let cfg = launch::per_row(n, kvd);
        let stream = self.dev.stream();
        let r = match s.layout.dtype {
            KvDtype::F16 => {
                let mut b = stream.launch_builder(self.dev.function("write_kv_f16"));
                b.arg(&pk).arg(&pv).arg(&pages).arg(&start).arg(&geometry);
                // SAFETY: matches kv.cu's write_kv_f16; the pages cover every written slot.
                unsafe { b.launch(cfg.into()) }
            }
            KvDtype::Fp8 => {
                let mut b = stream.launch_builder(self.dev.function("write_kv_fp8"));
                b.arg(&pk).arg(&pv).arg(&pages).arg(&start).arg(&geometry).arg(&w.k_scale).arg(&w.v_scale);
                // SAFETY: matches kv.cu's write_kv_fp8.
                unsafe { b.launch(cfg.into()) }
            }
        };
        self.record(r.map(|_| ()).map_err(driver));
        let pt = s.layout.page_tokens;
        let end = (s.start_pos + n).div_ceil(pt).min(s.pages.len());
        let written = s.pages.get(s.start_pos / pt..end).unwrap_or(&[]);
        self.pages.borrow_mut().written(written);
    }

    fn move_kv(&self, layout: &KvLayout, pages: &[PageId], from: usize, to: usize) -> Result<(), EngineError> {
        let covered = pages.len() * layout.page_tokens;
        if from >= covered || to >= covered {
            return Err(EngineError::Internal(format!("KV move {from} -> {to} outside {covered} positions")));
        }
        let addrs = self.stage_pages(pages)?;
        let geometry = KvGeometry::new(layout, 0);
        let (f, t, row_bytes) = (from as u32, to as u32, layout.row_bytes() as u32);
        let cfg = launch::per_row(layout.n_layers * 2 * layout.n_kv_heads, layout.row_bytes());
        let stream = self.dev.stream();
        let mut b = stream.launch_builder(self.dev.function("move_kv"));
        b.arg(&addrs).arg(&f).arg(&t).arg(&geometry).arg(&row_bytes);
        // SAFETY: matches kv.cu's move_kv; both positions lie in `pages` (checked).
        unsafe { b.launch(cfg.into()) }.map_err(driver)?;
        self.pages.borrow_mut().written(&[pages[to / layout.page_tokens]]);
        Ok(())
    }

    fn copy_page(&self, layout: &KvLayout, from: PageId, to: PageId) -> Result<(), EngineError> {
        self.pages.borrow_mut().prepare(&[from])?;
        let addrs = self.pages.borrow().addresses(&[from, to])?;
        let stream = self.dev.stream();
        // A raw driver call: make the context current on this thread first (cudarc's own
        // calls do it themselves).
        self.dev.context().bind_to_thread().map_err(driver)?;
        // SAFETY: both addresses are mapped pages of at least `page_bytes` (PageSpaces).
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(addrs[1], addrs[0], layout.page_bytes(), stream.cu_stream())
        }
        .map_err(driver)?;
        self.pages.borrow_mut().written(&[to]);
        Ok(())
    }

    fn private_pages(&self, layout: &KvLayout, n: usize) -> Result<Vec<PageId>, EngineError> {
        Ok(self.pages.borrow_mut().private_pages(layout.page_bytes(), n)?)
    }

    fn zero_private_pages(&self, layout: &KvLayout, pages: &[PageId]) -> Result<(), EngineError> {
        Ok(self.pages.borrow().zero_private_pages(layout.page_bytes(), pages)?)
    }

    fn free_private_pages(&self, pages: &[PageId]) {
        self.pages.borrow_mut().free_private_pages(pages);
    }

    fn attention(&self, shape: &AttnShape, seq: &SeqKv, q: &GpuBuf, out: &mut GpuBuf) {
        let m = seq.rows.len();
        if m == 0 || self.failed() {
            return;
        }
        let Some(pages) = self.record(self.stage_pages(seq.pages)) else { return };
        let (anc, depth, stride) = match seq.tree {
            Some(t) => {
                let (table, stride) = launch::tree_tables(t, seq.start_pos);
                let Some(table) = self.record(self.stage_u32(&table)) else { return };
                // Depths follow the ancestor slots in the same staging buffer.
                (table, table + (m * stride * 4) as u64, stride as u32)
            }
            None => (0, 0, 0),
        };
        let qd = shape.n_heads * shape.head_dim;
        let offset = (seq.rows.start * qd * 4) as u64;
        let (pq, po) = (self.buf_ptr(q) + offset, self.buf_ptr(out) + offset);
        // The longest row sees the whole chain, or the tree's deepest node.
        let max_visible = seq.start_pos + seq.tree.map_or(m, |t| t.max_depth() + 1);
        let splits = launch::attention_splits(max_visible);
        let mut partials = self.attn_partials.borrow_mut();
        let grown = self
            .grow_keep(&mut partials, launch::attention_partials(m, shape.n_heads, splits, shape.head_dim))
            .map(|_| ());
        if self.record(grown).is_none() {
            return;
        }
        let pp = self.buf_ptr(&partials);
        let params = AttnParams::new(shape, seq.layout, seq.start_pos, stride, splits);
        let name = match seq.layout.dtype {
            KvDtype::F16 => "attention_split_f16",
            KvDtype::Fp8 => "attention_split_fp8",
        };
        let stream = self.dev.stream();
        let mut b = stream.launch_builder(self.dev.function(name));
        b.arg(&pq).arg(&pages).arg(&anc).arg(&depth).arg(&params).arg(&pp);
        // SAFETY: matches attention.cu's attention_split_*; the pages cover every visible
        // slot, the tree tables have a row per node, `partials` holds every split's result.
        let r = unsafe { b.launch(launch::attention(m, shape.n_heads, splits).into()) };
        if self.record(r.map(|_| ()).map_err(driver)).is_none() {
            return;
        }
        let mut b = stream.launch_builder(self.dev.function("attention_merge"));
        b.arg(&pp).arg(&depth).arg(&params).arg(&po);
        // SAFETY: matches attention.cu's attention_merge over the partials written above.
        self.record(unsafe { b.launch(launch::attention_merge(m, shape.n_heads).into()) }.map(|_| ()).map_err(driver));
    }

    // The Gated DeltaNet ops run on the GPU with Qwen3.6 (the next part); a Qwen3.6 model is
    // refused at load on this backend, so reaching one is an internal error, reported as such.

    fn gdn_gates(&self, _: &mut GpuBuf, _: &mut GpuBuf, _: &GpuVector, _: &GpuVector, _: usize) {
        self.record::<()>(Err(CudaError::Unsupported("Gated DeltaNet gates")));
    }

    fn causal_conv1d_silu(&self, _: &GdnDims, _: &GpuVector, _: &GpuBuf, _: &mut [GdnSeq<'_, GpuBuf>], _: &mut GpuBuf) {
        self.record::<()>(Err(CudaError::Unsupported("Gated DeltaNet causal conv")));
    }

    fn gdn_qk_norm(&self, _: &GdnDims, _: &mut GpuBuf, _: usize) {
        self.record::<()>(Err(CudaError::Unsupported("Gated DeltaNet q/k norm")));
    }

    fn delta_rule(
        &self,
        _: &GdnDims,
        _: GdnMode,
        _: &GpuBuf,
        _: &GpuBuf,
        _: &GpuBuf,
        _: &mut [GdnSeq<'_, GpuBuf>],
        _: &mut GpuBuf,
    ) {
        self.record::<()>(Err(CudaError::Unsupported("the gated delta rule")));
    }

    fn gated_rms_norm(&self, x: &mut GpuBuf, z: &GpuBuf, w: &GpuVector, eps: f32, rows: usize) {
        if rows == 0 || self.failed() {
            return;
        }
        let (px, pz, pw, width) =
            (self.buf_ptr(x), self.buf_ptr(z), w.data.as_ref().map_or(0, |d| self.ptr(d)), w.len as u32);
        let cfg = launch::per_row(rows, w.len);
        let stream = self.dev.stream();
        let mut b = stream.launch_builder(self.dev.function("gated_rms_norm"));
        b.arg(&px).arg(&pz).arg(&pw).arg(&eps).arg(&width);
        // SAFETY: matches norm.cu's gated_rms_norm.
        self.record(unsafe { b.launch(cfg.into()) }.map(|_| ()).map_err(driver));
    }
}

impl CudaOps {
    /// The index of the largest value of each of `rows` rows of `vocab` values of `logits`
    /// from row `first` (the lowest index among equals; NaN never wins, as the host's
    /// `argmax`): a greedy step copies back 4 bytes a row, not the row.
    pub fn argmax_rows(
        &self,
        logits: &GpuBuf,
        first: usize,
        rows: usize,
        vocab: usize,
    ) -> Result<Vec<u32>, EngineError> {
        self.take_error()?;
        if rows == 0 {
            return Ok(Vec::new());
        }
        if logits.capacity() < (first + rows) * vocab {
            return Err(EngineError::Internal(format!("argmax of rows {first}..{} beyond the logits", first + rows)));
        }
        let stream = self.dev.stream();
        let mut st = self.staging.borrow_mut();
        let out = reserve(stream, &mut st.tokens, rows)?;
        let (pl, v, po) = (self.buf_ptr(logits) + (first * vocab * 4) as u64, vocab as u32, self.ptr(out));
        let mut b = stream.launch_builder(self.dev.function("argmax_rows"));
        b.arg(&pl).arg(&v).arg(&po);
        // SAFETY: matches sample.cu's argmax_rows; `logits` holds the rows (checked above).
        unsafe { b.launch(launch::per_row(rows, vocab).into()) }.map_err(|e| EngineError::from(driver(e)))?;
        let mut host = vec![0u32; rows];
        stream
            .memcpy_dtoh(&out.slice(..rows), &mut host)
            .and_then(|()| stream.synchronize())
            .map_err(|e| EngineError::from(driver(e)))?;
        Ok(host)
    }

    fn upload_rope(&self, table: &mut GpuRope) {
        let flat: Vec<f32> = table.host.iter().flat_map(|&(c, s)| [c, s]).collect();
        let mut dev = std::mem::take(&mut table.dev);
        self.upload(&flat, &mut dev, 0);
        table.dev = dev;
    }
}

// SAFETY: #[repr(C)] structs of u32/f32 fields, laid out as the kernels' structs.
unsafe impl DeviceRepr for KvGeometry {}
// SAFETY: as above.
unsafe impl DeviceRepr for AttnParams {}

impl From<launch::Grid> for cudarc::driver::LaunchConfig {
    fn from(g: launch::Grid) -> Self {
        cudarc::driver::LaunchConfig { grid_dim: g.grid, block_dim: (g.block, 1, 1), shared_mem_bytes: 0 }
    }
}
