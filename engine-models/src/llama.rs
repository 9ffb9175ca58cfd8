//! Llama-architecture forward pass (Llama, SmolLM2): pre-norm decoder blocks with RMSNorm,
//! GQA attention with RoPE, SwiGLU MLP, and a (possibly tied) output head. Written against the
//! op seam ([`Ops`]): the same code runs on every backend.
//!
//! Contract: [`LlamaModel::load`] reads hparams from `llama.*` keys and checks every tensor's
//! shape; the backend builds its weights from the stored tensors (the CPU keeps them
//! quantized; the embedding table is read row by row from the map). [`LlamaModel::forward`]
//! runs one [`ForwardBatch`]: all sequences' rows are concatenated so every weight is read
//! once per step (one matmul per weight), attention runs per sequence over its KV pages, and
//! the head runs only on rows whose logits are wanted. Activations live in [`LlamaScratch`],
//! which only grows, so steady-state decode allocates nothing but the returned logits.
//!
//! Draft trees (`SeqInput::tree`): node `j` is rotated for position `start_pos + depth(j)`,
//! its KV goes to slot `start_pos + j`, and it attends to `[0, start_pos)` plus its
//! ancestors. Every other op is per row, so a node's logits are bitwise the logits plain
//! decoding computes for its root path.
//!
//! RoPE: llama.cpp's converter permutes Q/K rows so GGUF llama uses the "normal" rotation
//! of adjacent pairs `(x[2i], x[2i+1])` by `pos * theta^(-2i/d)` ([`RopeStyle::AdjacentPairs`]).

use std::ops::Range;
use std::sync::Arc;

use crate::EngineError;
use crate::ModelHparams;
use crate::format::Gguf;
use engine_ops::batch::{ForwardBatch, ForwardOutput, LogitsWanted};
use engine_ops::kv::KvLayout;
use engine_ops::{AttnShape, KvWrite, Ops, RopeStyle, SeqKv, TreeKeys};

struct Layer<O: Ops> {
    attn_norm: O::Vector,
    wq: O::Matrix,
    wk: O::Matrix,
    wv: O::Matrix,
    wo: O::Matrix,
    ffn_norm: O::Vector,
    w_gate: O::Matrix,
    w_up: O::Matrix,
    w_down: O::Matrix,
}

pub struct LlamaModel<O: Ops> {
    hparams: ModelHparams,
    embedding: O::Embedding,
    layers: Vec<Layer<O>>,
    output_norm: O::Vector,
    output: O::Matrix,
    /// Whether `output.weight` was absent and the head reuses `token_embd.weight`.
    tied_output: bool,
    /// `theta^(-2i/d)` for each rotated pair.
    rope_freqs: Vec<f64>,
}

/// Activation buffers reused across forward passes (grow-only), in the backend's memory.
pub struct LlamaScratch<O: Ops> {
    x: O::Buf,
    xn: O::Buf,
    q: O::Buf,
    k: O::Buf,
    v: O::Buf,
    attn: O::Buf,
    gate: O::Buf,
    up: O::Buf,
    /// Per row, per rotated pair: the row's rotary angles.
    rope: O::RopeTable,
    /// Each row's token and position (host).
    tokens: Vec<u32>,
    positions: Vec<usize>,
    /// Rows (into the batch) whose logits are wanted.
    wanted: Vec<usize>,
    head_in: O::Buf,
    logits: O::Buf,
}

impl<O: Ops> LlamaScratch<O> {
    /// The last pass's wanted logits (see [`LlamaModel::forward_kept`]).
    pub fn logits(&self) -> &O::Buf {
        &self.logits
    }
}

impl<O: Ops> Default for LlamaScratch<O> {
    fn default() -> Self {
        LlamaScratch {
            x: O::Buf::default(),
            xn: O::Buf::default(),
            q: O::Buf::default(),
            k: O::Buf::default(),
            v: O::Buf::default(),
            attn: O::Buf::default(),
            gate: O::Buf::default(),
            up: O::Buf::default(),
            rope: O::RopeTable::default(),
            tokens: Vec::new(),
            positions: Vec::new(),
            wanted: Vec::new(),
            head_in: O::Buf::default(),
            logits: O::Buf::default(),
        }
    }
}

impl<O: Ops> LlamaModel<O> {
    /// Loads hparams and weights from a `general.architecture = llama` GGUF.
    pub fn load(ops: &O, gguf: &Arc<Gguf>) -> Result<LlamaModel<O>, EngineError> {
        let g = &**gguf;
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
            || n_layers > engine_ops::MAX_LAYERS
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

        let (h, kv, f) = (hidden, n_kv_heads * head_dim, ffn);
        let mat = |name: &str, cols: usize, rows: usize| ops.matrix(&gguf.matrix_desc(name, cols, rows)?);
        let norm = |name: &str| ops.vector(&gguf.vector_desc(name, hidden)?);
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
        let output = mat(head_name, h, vocab_size)?;
        let embedding = ops.embedding(&gguf.tensor_desc("token_embd.weight", h, vocab_size)?)?;
        let half = head_dim / 2;
        let rope_freqs = (0..half).map(|i| (rope_theta as f64).powf(-2.0 * i as f64 / head_dim as f64)).collect();
        let output_norm = norm("output_norm.weight")?;
        Ok(LlamaModel { hparams, embedding, layers, output_norm, output, tied_output, rope_freqs })
    }

    pub fn hparams(&self) -> &ModelHparams {
        &self.hparams
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
        ops: &O,
        layout: &KvLayout,
        s: &mut LlamaScratch<O>,
        batch: &ForwardBatch<'_>,
    ) -> Result<ForwardOutput, EngineError> {
        let vocab = self.hparams.vocab_size;
        let rows = self.forward_kept(ops, layout, s, batch)?;
        let logits = rows
            .into_iter()
            .map(|r| if r.is_empty() { Vec::new() } else { ops.to_host(&s.logits, r.start * vocab..r.end * vocab) })
            .collect();
        Ok(ForwardOutput { logits })
    }

    /// [`LlamaModel::forward`] that leaves the wanted logits in the device's memory
    /// ([`LlamaScratch::logits`], `vocab` values a row, until the next pass): returns each
    /// sequence's rows there. A device then samples without copying whole rows back.
    pub fn forward_kept(
        &self,
        ops: &O,
        layout: &KvLayout,
        s: &mut LlamaScratch<O>,
        batch: &ForwardBatch<'_>,
    ) -> Result<Vec<Range<usize>>, EngineError> {
        let trees = self.validate(layout, batch)?;
        let hp = &self.hparams;
        let (h, hd, f) = (hp.hidden_size, hp.head_dim, hp.ffn_size);
        let qd = hp.n_heads * hd;
        let kvd = hp.n_kv_heads * hd;
        let n: usize = batch.seqs.iter().map(|s| s.tokens.len()).sum();
        if n == 0 {
            return Ok(batch.seqs.iter().map(|_| 0..0).collect());
        }
        for (buf, len) in [
            (&mut s.x, n * h),
            (&mut s.xn, n * h),
            (&mut s.q, n * qd),
            (&mut s.k, n * kvd),
            (&mut s.v, n * kvd),
            (&mut s.attn, n * qd),
            (&mut s.gate, n * f),
            (&mut s.up, n * f),
        ] {
            ops.grow(buf, len);
        }

        // Embeddings and per-row rotary angles.
        s.tokens.clear();
        s.positions.clear();
        for (seq, tree) in batch.seqs.iter().zip(&trees) {
            s.tokens.extend_from_slice(seq.tokens);
            s.positions.extend((0..seq.tokens.len()).map(|j| seq.start_pos + tree.as_ref().map_or(j, |t| t.depth(j))));
        }
        ops.embed(&self.embedding, &s.tokens, &mut s.x)?;
        ops.rope_table(&s.positions, &self.rope_freqs, &mut s.rope);

        let scale = 1.0 / (hd as f32).sqrt();
        let eps = hp.rms_norm_eps;
        for (li, layer) in self.layers.iter().enumerate() {
            // Attention block.
            ops.rms_norm(&s.x, &layer.attn_norm, eps, n, &mut s.xn);
            ops.matmul(&s.xn, n, &mut [(&layer.wq, &mut s.q), (&layer.wk, &mut s.k), (&layer.wv, &mut s.v)]);
            ops.rope(RopeStyle::AdjacentPairs, &mut s.q, qd, hd, &s.rope);
            ops.rope(RopeStyle::AdjacentPairs, &mut s.k, kvd, hd, &s.rope);
            let shape = AttnShape { layer: li, n_heads: hp.n_heads, n_kv_heads: hp.n_kv_heads, head_dim: hd, scale };
            let mut r0 = 0;
            for (seq, tree) in batch.seqs.iter().zip(&trees) {
                let m = seq.tokens.len();
                let kv =
                    SeqKv { layout, pages: seq.pages, start_pos: seq.start_pos, rows: r0..r0 + m, tree: tree.as_ref() };
                ops.write_kv(&KvWrite { seq: &kv, layer: li, k_scale: 1.0, v_scale: 1.0 }, &s.k, &s.v);
                ops.attention(&shape, &kv, &s.q, &mut s.attn);
                r0 += m;
            }
            ops.matmul(&s.attn, n, &mut [(&layer.wo, &mut s.xn)]);
            ops.add_assign(&mut s.x, &s.xn, n * h);

            // MLP block.
            ops.rms_norm(&s.x, &layer.ffn_norm, eps, n, &mut s.xn);
            ops.matmul(&s.xn, n, &mut [(&layer.w_gate, &mut s.gate), (&layer.w_up, &mut s.up)]);
            ops.silu_mul(&mut s.gate, &s.up, n * f);
            ops.matmul(&s.gate, n, &mut [(&layer.w_down, &mut s.xn)]);
            ops.add_assign(&mut s.x, &s.xn, n * h);
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
            ops.grow(&mut s.head_in, w * h);
            ops.grow(&mut s.xn, w * h);
            ops.grow(&mut s.logits, w * vocab);
            ops.gather_rows(&s.x, h, &s.wanted, &mut s.xn);
            ops.rms_norm(&s.xn, &self.output_norm, eps, w, &mut s.head_in);
            ops.matmul(&s.head_in, w, &mut [(&self.output, &mut s.logits)]);
        }
        let mut at = 0;
        Ok(batch
            .seqs
            .iter()
            .map(|seq| {
                let rows = match seq.logits {
                    LogitsWanted::None => 0,
                    LogitsWanted::Last => 1,
                    LogitsWanted::All => seq.tokens.len(),
                };
                at += rows;
                at - rows..at
            })
            .collect())
    }
}
