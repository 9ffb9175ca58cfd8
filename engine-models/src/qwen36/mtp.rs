//! The MTP (multi-token prediction) module of Qwen3.5 / Qwen3.6 (architecture spec §5.1).
//!
//! Contract: [`Qwen36Model::mtp_forward`] runs the module on `m` (hidden, token) pairs at
//! positions `start_pos..start_pos+m`:
//! `u = fc · [RMSNorm1p(embed(y)); RMSNorm1p(h)]` (embedding first), one gated full-attention
//! decoder layer with its own KV (a one-layer [`KvLayout`] from [`Qwen36Model::mtp_kv_layout`],
//! pages supplied by the caller), `out = RMSNorm1p(x, mtp.norm)`, `logits = head · out` (the
//! shared head). `h` is the target's final hidden state after `model.norm`
//! ([`Qwen36Model::forward_with_hidden`]) for the catch-up pass, or the previous
//! [`MtpOutput::hidden`] for further drafts. KV of position `p` is written, so a caller
//! re-running a position overwrites its stale entry.

use crate::EngineError;
use engine_ops::Ops;
use engine_ops::kv::{KvLayout, PageId};

use super::attention::{AttnDims, AttnLayer};
use super::weights::{WeightSource, load_matrix, load_norm_1p};
use super::{Mlp, Qwen36Model, Qwen36Scratch, Seg};

/// The module's weights; norms are zero-centred, held as `1 + w`.
pub(crate) struct Mtp<O: Ops> {
    fc: O::Matrix,
    pre_fc_norm_embedding: O::Vector,
    pre_fc_norm_hidden: O::Vector,
    norm: O::Vector,
    input_norm: O::Vector,
    post_norm: O::Vector,
    attn: AttnLayer<O>,
    mlp: Mlp<O>,
}

impl<O: Ops> Mtp<O> {
    pub(crate) fn weight_bytes(&self, d: &AttnDims) -> usize {
        O::matrix_bytes(&self.fc) + self.attn.weight_bytes(d) + self.mlp.weight_bytes()
    }

    pub(crate) fn load(
        ops: &O,
        src: &dyn WeightSource,
        d: &AttnDims,
        h: usize,
        inter: usize,
    ) -> Result<Mtp<O>, EngineError> {
        Ok(Mtp {
            fc: load_matrix(ops, src, "mtp.fc.weight", h, 2 * h)?,
            pre_fc_norm_embedding: load_norm_1p(ops, src, "mtp.pre_fc_norm_embedding.weight", h)?,
            pre_fc_norm_hidden: load_norm_1p(ops, src, "mtp.pre_fc_norm_hidden.weight", h)?,
            norm: load_norm_1p(ops, src, "mtp.norm.weight", h)?,
            input_norm: load_norm_1p(ops, src, "mtp.layers.0.input_layernorm.weight", h)?,
            post_norm: load_norm_1p(ops, src, "mtp.layers.0.post_attention_layernorm.weight", h)?,
            attn: AttnLayer::load(ops, src, "mtp.layers.0.self_attn.", d, h)?,
            mlp: Mlp::load(ops, src, "mtp.layers.0.mlp.", h, inter)?,
        })
    }
}

/// One MTP pass over a run of consecutive positions of one sequence.
pub struct MtpInput<'a> {
    /// `m` input tokens (the token after each hidden's position).
    pub tokens: &'a [u32],
    /// `m x hidden` hidden states.
    pub hidden: &'a [f32],
    /// Position of the first pair (the position of its hidden state).
    pub start_pos: usize,
    /// MTP KV pages covering `start_pos + m` positions ([`Qwen36Model::mtp_kv_layout`]).
    pub pages: &'a [PageId],
}

/// Which rows of an MTP pass get logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MtpLogits {
    None,
    Last,
    All,
}

pub struct MtpOutput {
    /// `m x vocab` logits (the draft for the position after each pair's token); fewer rows
    /// when [`Qwen36Model::mtp_forward_with`] asked for fewer.
    pub logits: Vec<f32>,
    /// `m x hidden`, after `mtp.norm`: the hidden input of the next draft step.
    pub hidden: Vec<f32>,
}

impl<O: Ops> Qwen36Model<O> {
    /// Whether the checkpoint has an MTP module.
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// KV layout of the MTP layer (one full-attention layer).
    pub fn mtp_kv_layout(&self, page_tokens: usize) -> KvLayout {
        let (n_kv_heads, head_dim) = (self.attn_dims.hkv, self.attn_dims.hd);
        KvLayout { n_layers: 1, n_kv_heads, head_dim, page_tokens, dtype: engine_ops::kv::KvDtype::F16 }
    }

    /// Runs the MTP module; see the module contract. `exact_kv`: when given, the layer's
    /// attention keeps f32 K/V there instead of the pages (the exactness reference of
    /// [`Qwen36Model::set_exact_attention`]; the pages are then untouched).
    pub fn mtp_forward(
        &self,
        ops: &O,
        layout: &KvLayout,
        input: &MtpInput<'_>,
        exact_kv: Option<&mut Vec<f32>>,
        s: &mut Qwen36Scratch<O>,
    ) -> Result<MtpOutput, EngineError> {
        self.mtp_forward_with(ops, layout, input, exact_kv, s, MtpLogits::All)
    }

    /// [`Qwen36Model::mtp_forward`] computing the head only for the rows `logits` asks for
    /// (`MtpOutput::logits` then holds 0, 1 or `m` rows): the catch-up over committed
    /// positions only needs the last row's, and the head is the widest matrix of the model.
    pub fn mtp_forward_with(
        &self,
        ops: &O,
        layout: &KvLayout,
        input: &MtpInput<'_>,
        exact_kv: Option<&mut Vec<f32>>,
        s: &mut Qwen36Scratch<O>,
        logits: MtpLogits,
    ) -> Result<MtpOutput, EngineError> {
        let mtp = self
            .mtp
            .as_ref()
            .ok_or_else(|| EngineError::UnsupportedModel("this checkpoint has no MTP module".into()))?;
        let (h, vocab) = (self.hparams.hidden_size, self.hparams.vocab_size);
        let m = input.tokens.len();
        if input.hidden.len() != m * h {
            return Err(EngineError::InvalidRequest(format!(
                "mtp: {} hidden values for {m} tokens of width {h}",
                input.hidden.len()
            )));
        }
        if let Some(&bad) = input.tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(EngineError::InvalidRequest(format!("mtp: token id {bad} >= vocab {vocab}")));
        }
        if *layout != self.mtp_kv_layout(layout.page_tokens) {
            return Err(EngineError::Internal("mtp: KV layout is not mtp_kv_layout()".into()));
        }
        if input.pages.len() * layout.page_tokens < input.start_pos + m {
            return Err(EngineError::Internal(format!("mtp: pages do not cover {} positions", input.start_pos + m)));
        }
        if m == 0 {
            return Ok(MtpOutput { logits: Vec::new(), hidden: Vec::new() });
        }
        let (eps, mh) = (self.cfg.rms_norm_eps, m * h);

        // u = fc · [norm_e(embed(y)); norm_h(h)]
        for buf in [&mut s.mtp_embed, &mut s.mtp_embed_norm, &mut s.mtp_hidden_norm, &mut s.x, &mut s.xn, &mut s.mix] {
            ops.grow(buf, mh);
        }
        ops.embed_rows(&self.embed, input.tokens, &mut s.mtp_embed)?;
        ops.rms_norm(&s.mtp_embed, &mtp.pre_fc_norm_embedding, eps, m, &mut s.mtp_embed_norm);
        ops.upload(input.hidden, &mut s.mtp_hidden, 0);
        ops.rms_norm(&s.mtp_hidden, &mtp.pre_fc_norm_hidden, eps, m, &mut s.mtp_hidden_norm);
        ops.grow(&mut s.mtp_cat, 2 * mh);
        ops.concat_cols(&s.mtp_embed_norm, h, &s.mtp_hidden_norm, h, m, &mut s.mtp_cat);
        ops.matmul(&s.mtp_cat, m, &mut [(&mtp.fc, &mut s.x)]);
        s.positions.clear();
        s.positions.extend(input.start_pos..input.start_pos + m);
        ops.rope_table_f32(&s.positions, &self.inv_freq, &mut s.rope);

        // The decoder layer (gated attention + SwiGLU), pre-norm residual.
        let segs = [Seg { r0: 0, m, start_pos: input.start_pos, pages: input.pages, tree: None, keys: None }];
        ops.rms_norm(&s.x, &mtp.input_norm, eps, m, &mut s.xn);
        let mut store = exact_kv;
        let mut stores: Vec<&mut Vec<f32>> = store.iter_mut().map(|v| &mut **v).collect();
        let exact = if stores.is_empty() { None } else { Some(&mut stores[..]) };
        let d = &self.attn_dims;
        mtp.attn.forward(ops, d, layout, 0, &s.xn, m, &segs, &s.rope, &mut s.attn, exact, &mut s.mix);
        ops.add_assign(&mut s.x, &s.mix, mh);
        ops.rms_norm(&s.x, &mtp.post_norm, eps, m, &mut s.xn);
        mtp.mlp.forward(ops, &s.xn, m, &mut s.gate, &mut s.up, &mut s.mix);
        ops.add_assign(&mut s.x, &s.mix, mh);

        ops.grow(&mut s.hidden, mh);
        ops.rms_norm(&s.x, &mtp.norm, eps, m, &mut s.hidden);
        let hidden = ops.to_host(&s.hidden, 0..mh);
        let rows = match logits {
            MtpLogits::None => 0,
            MtpLogits::Last => 1,
            MtpLogits::All => m,
        };
        let mut out = Vec::new();
        if rows > 0 {
            let head_in = if rows == m {
                &s.hidden
            } else {
                ops.grow(&mut s.head_in, h);
                ops.gather_rows(&s.hidden, h, &[m - 1], &mut s.head_in);
                &s.head_in
            };
            ops.grow(&mut s.logits, rows * vocab);
            ops.matmul(head_in, rows, &mut [(self.head(), &mut s.logits)]);
            out = ops.to_host(&s.logits, 0..rows * vocab);
        }
        Ok(MtpOutput { logits: out, hidden })
    }
}
