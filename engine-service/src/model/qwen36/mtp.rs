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
use crate::backend::cpu::kernels::ThreadPool;
use crate::memory::{KvLayout, PagePtr};

use super::attention::{AttnDims, AttnLayer, rope_row};
use super::weights::{WeightSource, load_matrix};
use super::{Mlp, Qwen36Model, Qwen36Scratch, Seg, add_in_place, grow, rms_norm_1p};
use crate::backend::cpu::ops::CpuMatrix;

pub(crate) struct Mtp {
    fc: CpuMatrix,
    pre_fc_norm_embedding: Vec<f32>,
    pre_fc_norm_hidden: Vec<f32>,
    norm: Vec<f32>,
    input_norm: Vec<f32>,
    post_norm: Vec<f32>,
    attn: AttnLayer,
    mlp: Mlp,
}

impl Mtp {
    pub(crate) fn weight_bytes(&self) -> usize {
        self.fc.bytes() + self.attn.weight_bytes() + self.mlp.gate.bytes() + self.mlp.up.bytes() + self.mlp.down.bytes()
    }

    pub(crate) fn load(src: &dyn WeightSource, d: &AttnDims, h: usize, inter: usize) -> Result<Mtp, EngineError> {
        Ok(Mtp {
            fc: load_matrix(src, "mtp.fc.weight", h, 2 * h)?,
            pre_fc_norm_embedding: src.vector("mtp.pre_fc_norm_embedding.weight", &[h])?,
            pre_fc_norm_hidden: src.vector("mtp.pre_fc_norm_hidden.weight", &[h])?,
            norm: src.vector("mtp.norm.weight", &[h])?,
            input_norm: src.vector("mtp.layers.0.input_layernorm.weight", &[h])?,
            post_norm: src.vector("mtp.layers.0.post_attention_layernorm.weight", &[h])?,
            attn: AttnLayer::load(src, "mtp.layers.0.self_attn.", d, h)?,
            mlp: Mlp::load(src, "mtp.layers.0.mlp.", h, inter)?,
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
    pub pages: &'a [PagePtr],
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

impl Qwen36Model {
    /// Whether the checkpoint has an MTP module.
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// KV layout of the MTP layer (one full-attention layer).
    pub fn mtp_kv_layout(&self, page_tokens: usize) -> KvLayout {
        let (n_kv_heads, head_dim) = (self.attn_dims.hkv, self.attn_dims.hd);
        KvLayout { n_layers: 1, n_kv_heads, head_dim, page_tokens, dtype: crate::memory::KvDtype::F16 }
    }

    /// Runs the MTP module; see the module contract. `exact_kv`: when given, the layer's
    /// attention keeps f32 K/V there instead of the pages (the exactness reference of
    /// [`Qwen36Model::set_exact_attention`]; the pages are then untouched).
    pub fn mtp_forward(
        &self,
        pool: &ThreadPool,
        layout: &KvLayout,
        input: &MtpInput<'_>,
        exact_kv: Option<&mut Vec<f32>>,
        s: &mut Qwen36Scratch,
    ) -> Result<MtpOutput, EngineError> {
        self.mtp_forward_with(pool, layout, input, exact_kv, s, MtpLogits::All)
    }

    /// [`Qwen36Model::mtp_forward`] computing the head only for the rows `logits` asks for
    /// (`MtpOutput::logits` then holds 0, 1 or `m` rows): the catch-up over committed
    /// positions only needs the last row's, and the head is the widest matrix of the model.
    pub fn mtp_forward_with(
        &self,
        pool: &ThreadPool,
        layout: &KvLayout,
        input: &MtpInput<'_>,
        exact_kv: Option<&mut Vec<f32>>,
        s: &mut Qwen36Scratch,
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
        let eps = self.cfg.rms_norm_eps;
        let half = self.attn_dims.rot / 2;

        // u = fc · [norm_e(embed(y)); norm_h(h)]
        let mut cat = vec![0.0f32; m * 2 * h];
        let mut e = vec![0.0f32; h];
        for (r, &tok) in input.tokens.iter().enumerate() {
            self.embed.row_f32(tok as usize, &mut e)?;
            let row = &mut cat[r * 2 * h..(r + 1) * 2 * h];
            let (ce, ch) = row.split_at_mut(h);
            rms_norm_1p(&e, &mtp.pre_fc_norm_embedding, eps, ce);
            rms_norm_1p(&input.hidden[r * h..(r + 1) * h], &mtp.pre_fc_norm_hidden, eps, ch);
        }
        let x = grow(&mut s.x, m * h);
        mtp.fc.matmul(pool, &cat, m, x);
        if s.rope.len() < m * half {
            s.rope.resize(m * half, (0.0, 0.0));
        }
        for r in 0..m {
            rope_row(input.start_pos + r, &self.inv_freq, &mut s.rope[r * half..(r + 1) * half]);
        }

        // The decoder layer (gated attention + SwiGLU), pre-norm residual.
        let segs = [Seg { r0: 0, m, start_pos: input.start_pos, pages: input.pages, tree: None, keys: None }];
        rms_norm_1p(&s.x[..m * h], &mtp.input_norm, eps, grow(&mut s.xn, m * h));
        let mix = grow(&mut s.mix, m * h);
        let mut store = exact_kv;
        let mut stores: Vec<&mut Vec<f32>> = store.iter_mut().map(|v| &mut **v).collect();
        let exact = if stores.is_empty() { None } else { Some(&mut stores[..]) };
        mtp.attn.forward(
            &self.attn_dims,
            pool,
            layout,
            0,
            &s.xn[..m * h],
            m,
            &segs,
            &s.rope[..m * half],
            &mut s.attn,
            exact,
            mix,
        );
        add_in_place(&mut s.x[..m * h], &s.mix[..m * h]);
        rms_norm_1p(&s.x[..m * h], &mtp.post_norm, eps, grow(&mut s.xn, m * h));
        let mix = grow(&mut s.mix, m * h);
        mtp.mlp.forward(pool, &s.xn[..m * h], m, &mut s.gate, &mut s.up, mix);
        add_in_place(&mut s.x[..m * h], &s.mix[..m * h]);

        let mut hidden = vec![0.0f32; m * h];
        rms_norm_1p(&s.x[..m * h], &mtp.norm, eps, &mut hidden);
        let (first, rows) = match logits {
            MtpLogits::None => (m, 0),
            MtpLogits::Last => (m - 1, 1),
            MtpLogits::All => (0, m),
        };
        let mut out = vec![0.0f32; rows * vocab];
        if rows > 0 {
            self.head().matmul(pool, &hidden[first * h..], rows, &mut out);
        }
        Ok(MtpOutput { logits: out, hidden })
    }
}
