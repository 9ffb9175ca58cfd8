//! Llama-architecture forward pass (Llama, SmolLM2): pre-norm decoder blocks with RMSNorm,
//! GQA attention with RoPE, SwiGLU MLP, and a (possibly tied) output head.
//!
//! Contract: [`LlamaModel::load`] reads hparams from `llama.*` keys and checks every tensor's
//! shape; weights stay quantized (re-laid once into [`PackedMatrix`] tiles for the kernels;
//! the embedding table is read row by row from the map). [`LlamaModel::forward`] runs one
//! [`ForwardBatch`]: all sequences' rows are concatenated so every weight is read once per
//! step (one matmul per weight), attention runs per sequence over its KV pages, and the head
//! runs only on rows whose logits are wanted. Scratch space lives in [`LlamaScratch`] and
//! only grows, so steady-state decode allocates nothing but the returned logits.
//!
//! Draft trees (`SeqInput::tree`): node `j` is rotated for position `start_pos + depth(j)`,
//! its KV goes to slot `start_pos + j`, and it attends to `[0, start_pos)` plus its
//! ancestors ([`attention_tree`]). Every other op is per row, so a node's logits are bitwise
//! the logits plain decoding computes for its root path.
//!
//! RoPE: llama.cpp's converter permutes Q/K rows so GGUF llama uses the "normal" rotation
//! of adjacent pairs `(x[2i], x[2i+1])` by `pos * theta^(-2i/d)`.

use std::sync::Arc;

use crate::EngineError;
use crate::backend::cpu::kernels::activation::silu_mul;
use crate::backend::cpu::kernels::attention::{TreeKeys, attention_tree};
use crate::backend::cpu::kernels::kquant::{KQuantMatrix, matmul_kquant};
use crate::backend::cpu::kernels::{
    AttnParams, GgmlType, PackedMatrix, Q8Acts, QMatrix, ThreadPool, attention, dequantize_row, matmul_packed,
    matmul_packed_q8, write_kv,
};
use crate::backend::{ForwardBatch, ForwardOutput, LogitsWanted};
use crate::format::Gguf;
use crate::memory::KvLayout;
use crate::model::ModelHparams;

/// A weight matrix: the packed tiles of the Q8-activation GEMM, or a K-quant matrix (Q4_K,
/// Q5_K, Q6_K: weight-only, [`matmul_kquant`]).
enum Matrix {
    Packed(PackedMatrix),
    KQuant(KQuantMatrix),
}

impl Matrix {
    fn cols(&self) -> usize {
        match self {
            Matrix::Packed(p) => p.cols,
            Matrix::KQuant(k) => k.cols,
        }
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    wq: Matrix,
    wk: Matrix,
    wv: Matrix,
    wo: Matrix,
    ffn_norm: Vec<f32>,
    w_gate: Matrix,
    w_up: Matrix,
    w_down: Matrix,
}

/// The embedding table, left in the map: one row is dequantized per input token.
struct Embedding {
    dtype: GgmlType,
    offset: usize,
    row_bytes: usize,
}

pub struct LlamaModel {
    gguf: Arc<Gguf>,
    hparams: ModelHparams,
    embedding: Embedding,
    layers: Vec<Layer>,
    output_norm: Vec<f32>,
    output: Matrix,
    /// Whether `output.weight` was absent and the head reuses `token_embd.weight`.
    tied_output: bool,
    /// `theta^(-2i/d)` for each rotated pair.
    rope_freqs: Vec<f64>,
}

/// Per-backend buffers reused across forward passes (grow-only).
#[derive(Default)]
pub struct LlamaScratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// Per row, per rotated pair: (cos, sin).
    rope: Vec<(f32, f32)>,
    /// Rows (into the batch) whose logits are wanted.
    wanted: Vec<usize>,
    head_in: Vec<f32>,
    logits: Vec<f32>,
    acts: Q8Acts,
}

fn grow(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

impl LlamaModel {
    /// Loads hparams and weights from a `general.architecture = llama` GGUF.
    pub fn load(gguf: Arc<Gguf>) -> Result<LlamaModel, EngineError> {
        let g = &*gguf;
        let arch = g.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(EngineError::UnsupportedModel(format!("architecture {arch:?} (this loader reads llama)")));
        }
        if let Some(kind) = g.opt_str("llama.rope.scaling.type")?.filter(|k| *k != "none") {
            return Err(EngineError::UnsupportedModel(format!("rope scaling {kind:?}")));
        }
        if g.has_tensor("rope_freqs.weight") {
            return Err(EngineError::UnsupportedModel("per-dimension rope frequencies (rope_freqs.weight)".into()));
        }
        let n_layers = g.get_usize("llama.block_count")?;
        let hidden = g.get_usize("llama.embedding_length")?;
        let ffn = g.get_usize("llama.feed_forward_length")?;
        let n_heads = g.get_usize("llama.attention.head_count")?;
        let n_kv_heads = match g.opt_u32("llama.attention.head_count_kv")? {
            Some(n) => n as usize,
            None => n_heads,
        };
        if n_layers == 0
            || hidden == 0
            || n_heads == 0
            || n_kv_heads == 0
            || hidden % n_heads != 0
            || n_heads % n_kv_heads != 0
        {
            return Err(g.error(format!(
                "inconsistent hparams: {n_layers} layers, hidden {hidden}, {n_heads} heads, {n_kv_heads} kv heads"
            )));
        }
        let head_dim = hidden / n_heads;
        let rope_dim = match g.opt_u32("llama.rope.dimension_count")? {
            Some(d) => d as usize,
            None => head_dim,
        };
        if rope_dim != head_dim {
            return Err(EngineError::UnsupportedModel(format!("partial rotary ({rope_dim} of {head_dim} dims)")));
        }
        if head_dim % 2 != 0 {
            return Err(g.error(format!("head_dim {head_dim} is odd")));
        }
        let embd = g.tensor("token_embd.weight")?;
        let vocab_size = match embd.dims {
            [c, v] if *c as usize == hidden => *v as usize,
            d => {
                return Err(g.error(format!(
                    "tensor token_embd.weight: shape mismatch: expected [{hidden}, vocab], found {d:?}"
                )));
            }
        };
        if let Some(v) = g.opt_u32("llama.vocab_size")?.filter(|&v| v as usize != vocab_size) {
            return Err(g.error(format!("llama.vocab_size {v} but token_embd.weight has {vocab_size} rows")));
        }
        let rope_theta = g.opt_f32("llama.rope.freq_base")?.unwrap_or(10_000.0);
        let hparams = ModelHparams {
            architecture: arch.to_string(),
            n_layers,
            hidden_size: hidden,
            ffn_size: ffn,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab_size,
            context_length: g.get_usize("llama.context_length")?,
            rms_norm_eps: g.get_f32("llama.attention.layer_norm_rms_epsilon")?,
            rope_theta,
        };

        let (h, kv, f) = (hidden as u64, (n_kv_heads * head_dim) as u64, ffn as u64);
        let mat = |name: &str, cols: u64, rows: u64| -> Result<Matrix, EngineError> {
            let t = g.tensor_with_shape(name, &[cols, rows])?;
            if let Some(kind) = t.dtype.kquant() {
                return KQuantMatrix::new(kind, rows as usize, cols as usize, t.data)
                    .map(Matrix::KQuant)
                    .map_err(|e| g.error(format!("tensor {name}: {e}")));
            }
            let q = QMatrix { dtype: t.dtype, rows: rows as usize, cols: cols as usize, data: t.data };
            PackedMatrix::pack(&q)
                .map(Matrix::Packed)
                .ok_or_else(|| g.error(format!("tensor {name}: bytes do not match shape")))
        };
        let norm = |name: &str| -> Result<Vec<f32>, EngineError> {
            let t = g.tensor_with_shape(name, &[h])?;
            let mut out = vec![0.0; hidden];
            dequantize_row(t.dtype, t.data, &mut out);
            Ok(out)
        };
        let layers = (0..n_layers)
            .map(|i| {
                let p = |s: &str| format!("blk.{i}.{s}.weight");
                Ok(Layer {
                    attn_norm: norm(&p("attn_norm"))?,
                    wq: mat(&p("attn_q"), h, h)?,
                    wk: mat(&p("attn_k"), h, kv)?,
                    wv: mat(&p("attn_v"), h, kv)?,
                    wo: mat(&p("attn_output"), h, h)?,
                    ffn_norm: norm(&p("ffn_norm"))?,
                    w_gate: mat(&p("ffn_gate"), h, f)?,
                    w_up: mat(&p("ffn_up"), h, f)?,
                    w_down: mat(&p("ffn_down"), f, h)?,
                })
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        let tied_output = !g.has_tensor("output.weight");
        let head_name = if tied_output { "token_embd.weight" } else { "output.weight" };
        let output = mat(head_name, h, vocab_size as u64)?;
        let embedding = Embedding {
            dtype: embd.dtype,
            offset: g.tensor_info("token_embd.weight").map(|t| t.offset).unwrap_or(0),
            row_bytes: embd.dtype.row_bytes(hidden).ok_or_else(|| g.error("token_embd.weight: bad row size"))?,
        };
        let half = head_dim / 2;
        let rope_freqs = (0..half).map(|i| (rope_theta as f64).powf(-2.0 * i as f64 / head_dim as f64)).collect();
        let output_norm = norm("output_norm.weight")?;
        Ok(LlamaModel { gguf, hparams, embedding, layers, output_norm, output, tied_output, rope_freqs })
    }

    pub fn hparams(&self) -> &ModelHparams {
        &self.hparams
    }

    pub fn gguf(&self) -> &Arc<Gguf> {
        &self.gguf
    }

    pub fn tied_output(&self) -> bool {
        self.tied_output
    }

    /// Checks a batch against the model and the page layout before any work is done; returns
    /// each sequence's draft-tree keys (`None` for chains).
    fn validate(&self, layout: &KvLayout, batch: &ForwardBatch<'_>) -> Result<Vec<Option<TreeKeys>>, EngineError> {
        let hp = &self.hparams;
        let mut trees = Vec::with_capacity(batch.seqs.len());
        for (i, s) in batch.seqs.iter().enumerate() {
            trees.push(match s.tree {
                None => None,
                Some(parents) if parents.len() != s.tokens.len() => {
                    return Err(EngineError::InvalidRequest(format!(
                        "sequence {i}: {} tree parents for {} tokens",
                        parents.len(),
                        s.tokens.len()
                    )));
                }
                Some(parents) => Some(
                    TreeKeys::new(parents).map_err(|e| EngineError::InvalidRequest(format!("sequence {i}: {e}")))?,
                ),
            });
            s.check(i, hp, layout)?;
        }
        Ok(trees)
    }

    /// Runs one batch; see the module contract. `layout` must be this model's KV layout.
    pub fn forward(
        &self,
        pool: &ThreadPool,
        layout: &KvLayout,
        s: &mut LlamaScratch,
        batch: &ForwardBatch<'_>,
    ) -> Result<ForwardOutput, EngineError> {
        let trees = self.validate(layout, batch)?;
        let hp = &self.hparams;
        let (h, hd, f) = (hp.hidden_size, hp.head_dim, hp.ffn_size);
        let qd = hp.n_heads * hd;
        let kvd = hp.n_kv_heads * hd;
        let half = hd / 2;
        let n: usize = batch.seqs.iter().map(|s| s.tokens.len()).sum();
        if n == 0 {
            return Ok(ForwardOutput { logits: batch.seqs.iter().map(|_| Vec::new()).collect() });
        }

        // Embeddings and per-row rotary tables.
        let bytes = self.gguf.bytes();
        grow(&mut s.x, n * h);
        if s.rope.len() < n * half {
            s.rope.resize(n * half, (0.0, 0.0));
        }
        let mut row = 0;
        for (seq, tree) in batch.seqs.iter().zip(&trees) {
            for (j, &tok) in seq.tokens.iter().enumerate() {
                let at = self.embedding.offset + tok as usize * self.embedding.row_bytes;
                let src = bytes
                    .get(at..at + self.embedding.row_bytes)
                    .ok_or_else(|| EngineError::Internal(format!("embedding row {tok} outside the model file")))?;
                dequantize_row(self.embedding.dtype, src, &mut s.x[row * h..(row + 1) * h]);
                let pos = (seq.start_pos + tree.as_ref().map_or(j, |t| t.depth(j))) as f64;
                for (i, &fr) in self.rope_freqs.iter().enumerate() {
                    let (sin, cos) = (pos * fr).sin_cos();
                    s.rope[row * half + i] = (cos as f32, sin as f32);
                }
                row += 1;
            }
        }

        let scale = 1.0 / (hd as f32).sqrt();
        for (li, layer) in self.layers.iter().enumerate() {
            // Attention block.
            rms_norm(&s.x[..n * h], &layer.attn_norm, hp.rms_norm_eps, grow(&mut s.xn, n * h));
            let q = grow(&mut s.q, n * qd);
            let k = grow(&mut s.k, n * kvd);
            let v = grow(&mut s.v, n * kvd);
            project(pool, &mut s.acts, &s.xn[..n * h], n, &mut [(&layer.wq, q), (&layer.wk, k), (&layer.wv, v)]);
            rope(&mut s.q[..n * qd], hd, &s.rope[..n * half]);
            rope(&mut s.k[..n * kvd], hd, &s.rope[..n * half]);
            let attn = grow(&mut s.attn, n * qd);
            let params = AttnParams { layer: li, n_heads: hp.n_heads, n_kv_heads: hp.n_kv_heads, head_dim: hd, scale };
            let mut r0 = 0;
            for (seq, tree) in batch.seqs.iter().zip(&trees) {
                let m = seq.tokens.len();
                for j in 0..m {
                    let r = r0 + j;
                    write_kv(
                        layout,
                        seq.pages,
                        li,
                        seq.start_pos + j,
                        &s.k[r * kvd..(r + 1) * kvd],
                        &s.v[r * kvd..(r + 1) * kvd],
                    );
                }
                let (q, out) = (&s.q[r0 * qd..(r0 + m) * qd], &mut attn[r0 * qd..(r0 + m) * qd]);
                match tree {
                    _ if m == 0 => {}
                    Some(t) => attention_tree(pool, layout, seq.pages, &params, seq.start_pos, t, q, out),
                    None => attention(pool, layout, seq.pages, &params, seq.start_pos, q, m, out),
                }
                r0 += m;
            }
            let o = grow(&mut s.xn, n * h);
            project(pool, &mut s.acts, &s.attn[..n * qd], n, &mut [(&layer.wo, o)]);
            add_in_place(&mut s.x[..n * h], o);

            // MLP block.
            rms_norm(&s.x[..n * h], &layer.ffn_norm, hp.rms_norm_eps, grow(&mut s.xn, n * h));
            let gate = grow(&mut s.gate, n * f);
            let up = grow(&mut s.up, n * f);
            project(pool, &mut s.acts, &s.xn[..n * h], n, &mut [(&layer.w_gate, gate), (&layer.w_up, up)]);
            silu_mul(pool, &mut s.gate[..n * f], &s.up[..n * f]);
            let d = grow(&mut s.xn, n * h);
            project(pool, &mut s.acts, &s.gate[..n * f], n, &mut [(&layer.w_down, d)]);
            add_in_place(&mut s.x[..n * h], d);
        }

        // Head, only on wanted rows.
        s.wanted.clear();
        let mut r0 = 0;
        for seq in &batch.seqs {
            let m = seq.tokens.len();
            match seq.logits {
                LogitsWanted::None => {}
                LogitsWanted::Last => s.wanted.push(r0 + m - 1),
                LogitsWanted::All => s.wanted.extend(r0..r0 + m),
            }
            r0 += m;
        }
        let w = s.wanted.len();
        let vocab = hp.vocab_size;
        if w > 0 {
            let head_in = grow(&mut s.head_in, w * h);
            for (i, &r) in s.wanted.iter().enumerate() {
                rms_norm(
                    &s.x[r * h..(r + 1) * h],
                    &self.output_norm,
                    hp.rms_norm_eps,
                    &mut head_in[i * h..(i + 1) * h],
                );
            }
            let logits = grow(&mut s.logits, w * vocab);
            project(pool, &mut s.acts, &s.head_in[..w * h], w, &mut [(&self.output, logits)]);
        }
        let mut at = 0;
        let logits = batch
            .seqs
            .iter()
            .map(|seq| {
                let rows = match seq.logits {
                    LogitsWanted::None => 0,
                    LogitsWanted::Last => 1,
                    LogitsWanted::All => seq.tokens.len(),
                };
                let out = s.logits[at * vocab..(at + rows) * vocab].to_vec();
                at += rows;
                out
            })
            .collect();
        Ok(ForwardOutput { logits })
    }
}

/// Multiplies `x` by each matrix (all of the same width); quantized matrices share one
/// activation quantization, held in `acts` so no step allocates.
fn project(pool: &ThreadPool, acts: &mut Q8Acts, x: &[f32], m: usize, outs: &mut [(&Matrix, &mut [f32])]) {
    let cols = outs.first().map_or(0, |(w, _)| w.cols());
    let quantized = outs.iter().any(|(w, _)| matches!(w, Matrix::Packed(p) if p.dtype.is_quantized()));
    if quantized {
        acts.quantize_into(x, m, cols);
    }
    for (w, out) in outs.iter_mut() {
        match w {
            Matrix::Packed(p) if p.dtype.is_quantized() => matmul_packed_q8(pool, p, acts, out),
            Matrix::Packed(p) => matmul_packed(pool, p, x, m, out),
            Matrix::KQuant(k) => matmul_kquant(pool, k, x, m, out),
        }
    }
}

/// `out = x / rms(x) * weight`, row by row (rows of `weight.len()` values).
fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ss: f32 = xr.iter().map(|v| v * v).sum();
        let inv = 1.0 / (ss / d as f32 + eps).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * inv * w;
        }
    }
}

/// Rotates adjacent pairs of every head of every row; `cs` holds (cos, sin) per row and pair.
fn rope(x: &mut [f32], head_dim: usize, cs: &[(f32, f32)]) {
    let half = head_dim / 2;
    let n_rows = cs.len() / half;
    let row_len = x.len() / n_rows.max(1);
    for (xr, csr) in x.chunks_exact_mut(row_len).zip(cs.chunks_exact(half)) {
        for head in xr.chunks_exact_mut(head_dim) {
            for (pair, &(c, s)) in head.chunks_exact_mut(2).zip(csr) {
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * c - b * s;
                pair[1] = a * s + b * c;
            }
        }
    }
}

/// `gate = silu(gate) * up`.
fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_rotates_adjacent_pairs_by_position_times_frequency() {
        // One row, head_dim 4: pairs (0,1) at freq 1 and (2,3) at freq theta^(-1/2).
        let theta: f64 = 100.0;
        let pos = 3.0f64;
        let freqs = [1.0, theta.powf(-0.5)];
        let cs: Vec<(f32, f32)> = freqs.iter().map(|f| ((pos * f).cos() as f32, (pos * f).sin() as f32)).collect();
        let mut x = vec![1.0, 0.0, 0.0, 1.0];
        rope(&mut x, 4, &cs);
        let a = pos;
        let b = pos * theta.powf(-0.5);
        let want = [a.cos(), a.sin(), -b.sin(), b.cos()];
        for (g, w) in x.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{x:?} vs {want:?}");
        }
    }

    #[test]
    fn rms_norm_scales_rows_to_unit_rms_times_weight() {
        let x = [3.0, 4.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0];
        let w = [1.0, 2.0, 1.0, 1.0];
        let mut out = [0.0; 8];
        rms_norm(&x, &w, 0.0, &mut out);
        let inv = 1.0 / (25.0f32 / 4.0).sqrt();
        assert!((out[0] - 3.0 * inv).abs() < 1e-6 && (out[1] - 8.0 * inv).abs() < 1e-6);
        assert!(out[4..].iter().zip(&w).all(|(o, w)| (o - w).abs() < 1e-6));
    }
}
