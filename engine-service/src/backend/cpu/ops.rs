//! The CPU's implementation of the op seam ([`crate::ops::Ops`]): each op calls today's
//! kernels in [`super::kernels`], so a model run through [`CpuOps`] gives the bits it gave
//! when it called them itself. The thread pool, the kernel-set dispatch and the scratch the
//! kernels need (the quantized activations shared by a group of matmuls) live here.

use std::cell::RefCell;
use std::ops::Range;

use super::kernels::attention::attention_tree;
use super::kernels::kquant::{KQuantMatrix, KQuantType, matmul_kquant};
use super::kernels::norm::{add_in_place, rms_norm};
use super::kernels::rope::{rope_adjacent_pairs, rope_table};
use super::kernels::{
    AttnParams, GgmlType, PackedMatrix, Q8Acts, QMatrix, ThreadPool, activation, attention, dequantize_row,
    matmul_packed, matmul_packed_q8, write_kv_scaled,
};
use crate::EngineError;
use crate::format::{SharedBytes, TensorDesc};
use crate::ops::{AttnShape, KvWrite, Ops, RopeStyle, SeqKv};

/// A weight matrix as the CPU kernels take it.
pub enum CpuMatrix {
    /// GGUF block-quantized (Q8_0, Q4_0, Q4_1: against 8-bit activations) or float rows,
    /// re-laid into the packed GEMM's tiles.
    Packed(PackedMatrix),
    /// K-quants (Q4_K, Q5_K, Q6_K) as stored.
    KQuant(KQuantMatrix),
}

impl CpuMatrix {
    pub fn rows(&self) -> usize {
        match self {
            CpuMatrix::Packed(p) => p.rows,
            CpuMatrix::KQuant(k) => k.rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            CpuMatrix::Packed(p) => p.cols,
            CpuMatrix::KQuant(k) => k.cols,
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

/// The CPU backend's ops: a thread pool and the kernels' scratch.
pub struct CpuOps {
    pool: ThreadPool,
    /// Activations quantized once for a group of matmuls ([`Ops::matmul`]); kept so that
    /// steady-state decode allocates nothing.
    q8: RefCell<Q8Acts>,
}

impl CpuOps {
    /// `n_threads` compute threads (0 = 1).
    pub fn new(n_threads: usize) -> CpuOps {
        CpuOps { pool: ThreadPool::new(n_threads), q8: RefCell::default() }
    }

    pub fn pool(&self) -> &ThreadPool {
        &self.pool
    }
}

impl Ops for CpuOps {
    type Buf = Vec<f32>;
    type Matrix = CpuMatrix;
    type Embedding = CpuEmbedding;
    type Vector = Vec<f32>;
    type RopeTable = Vec<(f32, f32)>;

    fn matrix(&self, t: &TensorDesc) -> Result<CpuMatrix, EngineError> {
        if let Some(kind) = KQuantType::of(t.dtype) {
            return KQuantMatrix::new(kind, t.rows, t.cols, t.bytes.as_slice())
                .map(CpuMatrix::KQuant)
                .map_err(|e| t.error(e));
        }
        let q = QMatrix { dtype: t.dtype, rows: t.rows, cols: t.cols, data: t.bytes.as_slice() };
        PackedMatrix::pack(&q).map(CpuMatrix::Packed).ok_or_else(|| t.error("bytes do not match shape"))
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

    fn matrix_shape(w: &CpuMatrix) -> (usize, usize) {
        (w.rows(), w.cols())
    }

    fn grow(&self, buf: &mut Vec<f32>, len: usize) {
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
    }

    fn to_host(&self, buf: &Vec<f32>, range: Range<usize>) -> Vec<f32> {
        buf[range].to_vec()
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

    fn rms_norm(&self, x: &Vec<f32>, w: &Vec<f32>, eps: f32, rows: usize, out: &mut Vec<f32>) {
        let n = rows * w.len();
        rms_norm(&x[..n], w, eps, &mut out[..n]);
    }

    fn matmul(&self, x: &Vec<f32>, rows: usize, outs: &mut [(&CpuMatrix, &mut Vec<f32>)]) {
        let cols = outs.first().map_or(0, |(w, _)| w.cols());
        let x = &x[..rows * cols];
        let quantized = outs.iter().any(|(w, _)| matches!(w, CpuMatrix::Packed(p) if p.dtype.is_quantized()));
        let mut acts = self.q8.borrow_mut();
        if quantized {
            acts.quantize_into(x, rows, cols);
        }
        for (w, out) in outs.iter_mut() {
            let out = &mut out[..rows * w.rows()];
            match w {
                CpuMatrix::Packed(p) if p.dtype.is_quantized() => matmul_packed_q8(&self.pool, p, &acts, out),
                CpuMatrix::Packed(p) => matmul_packed(&self.pool, p, x, rows, out),
                CpuMatrix::KQuant(k) => matmul_kquant(&self.pool, k, x, rows, out),
            }
        }
    }

    fn silu_mul(&self, gate: &mut Vec<f32>, up: &Vec<f32>, len: usize) {
        activation::silu_mul(&self.pool, &mut gate[..len], &up[..len]);
    }

    fn add_assign(&self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) {
        add_in_place(&mut x[..len], &y[..len]);
    }

    fn rope_table(&self, positions: &[usize], inv_freq: &[f64], table: &mut Vec<(f32, f32)>) {
        rope_table(positions, inv_freq, table);
    }

    fn rope(&self, style: RopeStyle, x: &mut Vec<f32>, width: usize, head_dim: usize, table: &Vec<(f32, f32)>) {
        let rows = table.len() / (head_dim / 2);
        match style {
            RopeStyle::AdjacentPairs => rope_adjacent_pairs(&mut x[..rows * width], head_dim, table),
        }
    }

    fn write_kv(&self, w: &KvWrite, k: &Vec<f32>, v: &Vec<f32>) {
        let s = &w.seq;
        let kvd = s.layout.n_kv_heads * s.layout.head_dim;
        for (j, r) in s.rows.clone().enumerate() {
            write_kv_scaled(
                s.layout,
                s.pages,
                w.layer,
                s.start_pos + j,
                &k[r * kvd..(r + 1) * kvd],
                &v[r * kvd..(r + 1) * kvd],
                w.k_scale,
                w.v_scale,
            );
        }
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
        match seq.tree {
            Some(t) => attention_tree(&self.pool, seq.layout, seq.pages, &params, seq.start_pos, t, q, out),
            None => attention(&self.pool, seq.layout, seq.pages, &params, seq.start_pos, q, m, out),
        }
    }
}
