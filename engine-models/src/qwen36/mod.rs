//! Qwen3.5 / Qwen3.6 hybrid decoder (`model_type: qwen3_5`): Gated DeltaNet layers and gated
//! full-attention layers, SwiGLU MLPs, zero-centred RMSNorms, tied or untied head, and the
//! MTP module (docs/qwen36.md; transformers' `qwen3_5` modelling code; the layer maths live in [`gdn`] and
//! [`attention`], the MTP forward in [`mtp`]).
//!
//! Contract: [`Qwen36Model::load`] reads every tensor of the text decoder (and `mtp.*` when
//! present) from a [`WeightSource`], checking shapes against the config. [`Qwen36Model::forward`]
//! runs a [`ForwardBatch`]: rows of all sequences are concatenated so every weight is read once
//! per pass; full-attention layers write KV into the sequence's pages (the page layout's
//! `n_layers` is the number of full-attention layers, in layer order); GDN layers read and
//! advance the sequence's recurrent state in [`Qwen36States`], keyed by `seq_id`. A pass with
//! `start_pos == 0` starts from zero state; any other pass must continue exactly where the
//! sequence's state is (its last pass, or a snapshot loaded with [`Qwen36States::load`]),
//! else it is refused. Draft-tree passes keep every node's recurrent state (node `t` continues
//! its parent's); [`Qwen36Model::accept_tree_path`] makes the last accepted node's state the
//! sequence's. Tree outputs are bitwise the chain outputs of each node's root path.
//!
//! Numerics: f32 compute; weights stay in their stored float type. With the default
//! [`GdnMode::Recurrent`], every row's output is a function of the token prefix only, bit for
//! bit, whatever the split into passes (matmul rows, the paged attention kernel and the
//! token-by-token delta rule are all split-invariant), so a cached prefix plus a restored
//! state reproduces an uncached run exactly.

pub mod attention;
pub mod gdn;
pub mod gguf;
pub mod mtp;
pub mod mtp_state;
pub mod weights;

use std::collections::HashMap;

use crate::EngineError;
use crate::ModelHparams;
use crate::format::hf_config::{LayerKind, Qwen36Config};
use engine_ops::batch::{ForwardBatch, ForwardOutput, LogitsWanted};
use engine_ops::kv::{KvLayout, PageId};
use engine_ops::{Ops, TreeKeys};

use attention::{AttnDims, AttnLayer, AttnScratch, rope_inv_freq};
pub use gdn::GdnMode;
use gdn::{GdnDims, GdnLayer, GdnScratch, GdnState, reset_state, zero_state};
use weights::{WeightSource, load_matrix, load_norm_1p};

/// One sequence's rows within a pass.
pub struct Seg<'a> {
    /// First row in the concatenated batch, and the row count.
    pub r0: usize,
    pub m: usize,
    pub start_pos: usize,
    pub pages: &'a [PageId],
    /// Draft-tree parents (`SeqInput::tree`) and the attention's view of them; `None`: a chain.
    pub tree: Option<&'a [Option<usize>]>,
    pub keys: Option<&'a TreeKeys>,
}

/// SwiGLU MLP: `down(silu(gate x) * up x)`.
pub(crate) struct Mlp<O: Ops> {
    gate: O::Matrix,
    up: O::Matrix,
    down: O::Matrix,
}

impl<O: Ops> Mlp<O> {
    fn load(ops: &O, src: &dyn WeightSource, p: &str, h: usize, inter: usize) -> Result<Mlp<O>, EngineError> {
        Ok(Mlp {
            gate: load_matrix(ops, src, &format!("{p}gate_proj.weight"), inter, h)?,
            up: load_matrix(ops, src, &format!("{p}up_proj.weight"), inter, h)?,
            down: load_matrix(ops, src, &format!("{p}down_proj.weight"), h, inter)?,
        })
    }

    fn weight_bytes(&self) -> usize {
        O::matrix_bytes(&self.gate) + O::matrix_bytes(&self.up) + O::matrix_bytes(&self.down)
    }

    /// `gate` and `up` are scratch buffers (grow-only).
    fn forward(&self, ops: &O, xn: &O::Buf, n: usize, gate: &mut O::Buf, up: &mut O::Buf, out: &mut O::Buf) {
        let inter = O::matrix_shape(&self.gate).0;
        ops.grow(gate, n * inter);
        ops.grow(up, n * inter);
        ops.matmul(xn, n, &mut [(&self.gate, &mut *gate), (&self.up, &mut *up)]);
        ops.silu_mul(gate, up, n * inter);
        ops.matmul(gate, n, &mut [(&self.down, out)]);
    }
}

enum Mixer<O: Ops> {
    /// GDN layer and its index among the GDN layers (state slot).
    Linear(Box<GdnLayer<O>>, usize),
    /// Attention layer and its index among the full-attention layers (KV layer).
    Full(Box<AttnLayer<O>>, usize),
}

struct Layer<O: Ops> {
    /// Zero-centred norms as `1 + w`.
    input_norm: O::Vector,
    post_norm: O::Vector,
    mixer: Mixer<O>,
    mlp: Mlp<O>,
}

/// One sequence's recurrent state (in the device's buffers `B`): every GDN layer's, as of
/// position `pos`.
#[derive(Clone, Debug, PartialEq)]
pub struct SeqState<B> {
    pub pos: usize,
    pub layers: Vec<GdnState<B>>,
    /// Per full-attention layer, f32 `[k | v]` rows of every position; only filled by the
    /// exact-attention reference mode ([`Qwen36Model::set_exact_attention`]), never saved.
    pub exact_kv: Vec<Vec<f32>>,
    /// The last pass's draft tree, until [`Qwen36Model::accept_tree_path`] picks a path.
    pub tree: Option<PendingTree<B>>,
}

/// Per-node states of a verified draft tree (spec tree-speculative-decoding §2.4): node `t`'s
/// state is the sequence's state after its root path. `pos` of the sequence stays at the
/// tree's `start_pos` until a path is accepted.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingTree<B> {
    pub start_pos: usize,
    pub parents: Vec<Option<usize>>,
    /// `[GDN layer][node]`.
    pub nodes: Vec<Vec<GdnState<B>>>,
}

/// Snapshot header: magic, version, position (then every GDN layer's conv window and delta
/// state as little-endian f32, layer by layer).
const STATE_MAGIC: &[u8; 4] = b"Q36S";
const STATE_VERSION: u32 = 1;
const STATE_HEADER: usize = 16;

/// Bytes of one state snapshot of a model with these dims and `n_linear` GDN layers.
pub fn snapshot_bytes(d: &GdnDims, n_linear: usize) -> usize {
    STATE_HEADER + n_linear * (d.conv_state_len() + d.ssm_state_len()) * 4
}

/// Per-sequence recurrent states (in the device's buffers `B`), keyed by `SeqInput::seq_id`.
pub struct Qwen36States<B> {
    map: HashMap<u64, SeqState<B>>,
    /// Node states of finished tree passes, reused by the next ones (a node state is as large
    /// as a sequence's whole GDN layer state; allocating and zeroing them every pass cost about
    /// a third of a 16-node verify at 0.8B dimensions). Their contents are never read: a tree
    /// pass overwrites every node's conv window and delta state before use.
    spare: Vec<GdnState<B>>,
}

impl<B> Default for Qwen36States<B> {
    fn default() -> Self {
        Qwen36States { map: HashMap::new(), spare: Vec::new() }
    }
}

impl<B> Qwen36States<B> {
    pub fn get(&self, seq_id: u64) -> Option<&SeqState<B>> {
        self.map.get(&seq_id)
    }

    pub fn release(&mut self, seq_id: u64) {
        self.map.remove(&seq_id);
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Serializes the state of `seq_id` into `dst` (exactly `snapshot_bytes` long).
    pub fn save<O: Ops<Buf = B>>(&self, ops: &O, d: &GdnDims, seq_id: u64, dst: &mut [u8]) -> Result<(), EngineError> {
        let st = self
            .map
            .get(&seq_id)
            .ok_or_else(|| EngineError::Internal(format!("save_state: sequence {seq_id} has no recurrent state")))?;
        let want = snapshot_bytes(d, st.layers.len());
        if dst.len() != want {
            return Err(EngineError::Internal(format!(
                "save_state: buffer of {} bytes, snapshot needs {want}",
                dst.len()
            )));
        }
        dst[..4].copy_from_slice(STATE_MAGIC);
        dst[4..8].copy_from_slice(&STATE_VERSION.to_le_bytes());
        dst[8..16].copy_from_slice(&(st.pos as u64).to_le_bytes());
        let mut at = STATE_HEADER;
        let (conv, ssm) = (d.conv_state_len() * 4, d.ssm_state_len() * 4);
        for l in &st.layers {
            ops.save_le(&l.conv, &mut dst[at..at + conv]);
            ops.save_le(&l.ssm, &mut dst[at + conv..at + conv + ssm]);
            at += conv + ssm;
        }
        Ok(())
    }

    /// Sets the state of `seq_id` from a snapshot taken by [`Qwen36States::save`].
    pub fn load<O: Ops<Buf = B>>(
        &mut self,
        ops: &O,
        seq_id: u64,
        src: &[u8],
        d: &GdnDims,
        n_linear: usize,
    ) -> Result<(), EngineError>
    where
        B: Default,
    {
        let want = snapshot_bytes(d, n_linear);
        if src.len() != want {
            return Err(EngineError::Internal(format!(
                "load_state: snapshot of {} bytes, this model needs {want}",
                src.len()
            )));
        }
        if &src[..4] != STATE_MAGIC || src[4..8] != STATE_VERSION.to_le_bytes() {
            return Err(EngineError::Internal("load_state: not a qwen3_5 state snapshot (bad magic/version)".into()));
        }
        let pos = u64::from_le_bytes(src[8..16].try_into().expect("8 bytes")) as usize;
        let (conv, ssm) = (d.conv_state_len() * 4, d.ssm_state_len() * 4);
        let mut layers = Vec::with_capacity(n_linear);
        for bytes in src[STATE_HEADER..].chunks_exact(conv + ssm) {
            let mut st = GdnState { conv: B::default(), ssm: B::default() };
            ops.load_le(&bytes[..conv], &mut st.conv);
            ops.load_le(&bytes[conv..], &mut st.ssm);
            layers.push(st);
        }
        self.map.insert(seq_id, SeqState { pos, layers, exact_kv: Vec::new(), tree: None });
        Ok(())
    }
}

/// Buffers reused across passes (grow-only), in the device's memory.
pub struct Qwen36Scratch<O: Ops> {
    x: O::Buf,
    xn: O::Buf,
    mix: O::Buf,
    gate: O::Buf,
    up: O::Buf,
    rope: O::RopeTable,
    gdn: GdnScratch<O>,
    attn: AttnScratch<O>,
    /// Rows after the final norm (the hidden states the MTP module reads).
    hidden: O::Buf,
    head_in: O::Buf,
    head_norm: O::Buf,
    logits: O::Buf,
    /// The MTP module's inputs: embeddings, hiddens, both normed, and their concatenation.
    mtp_embed: O::Buf,
    mtp_embed_norm: O::Buf,
    mtp_hidden: O::Buf,
    mtp_hidden_norm: O::Buf,
    mtp_cat: O::Buf,
    /// Each row's token and rotary position, and the rows whose logits are wanted (host).
    tokens: Vec<u32>,
    positions: Vec<usize>,
    wanted: Vec<usize>,
}

impl<O: Ops> Default for Qwen36Scratch<O> {
    fn default() -> Self {
        Qwen36Scratch {
            x: O::Buf::default(),
            xn: O::Buf::default(),
            mix: O::Buf::default(),
            gate: O::Buf::default(),
            up: O::Buf::default(),
            rope: O::RopeTable::default(),
            gdn: GdnScratch::default(),
            attn: AttnScratch::default(),
            hidden: O::Buf::default(),
            head_in: O::Buf::default(),
            head_norm: O::Buf::default(),
            logits: O::Buf::default(),
            mtp_embed: O::Buf::default(),
            mtp_embed_norm: O::Buf::default(),
            mtp_hidden: O::Buf::default(),
            mtp_hidden_norm: O::Buf::default(),
            mtp_cat: O::Buf::default(),
            tokens: Vec::new(),
            positions: Vec::new(),
            wanted: Vec::new(),
        }
    }
}

pub struct Qwen36Model<O: Ops> {
    cfg: Qwen36Config,
    hparams: ModelHparams,
    gdn_dims: GdnDims,
    attn_dims: AttnDims,
    embed: O::Matrix,
    /// `None` when the head is tied to the embedding.
    lm_head: Option<O::Matrix>,
    layers: Vec<Layer<O>>,
    /// `1 + w`.
    final_norm: O::Vector,
    mtp: Option<mtp::Mtp<O>>,
    inv_freq: Vec<f32>,
    mode: GdnMode,
    exact_attention: bool,
}

impl<O: Ops> Qwen36Model<O> {
    /// Builds the model onto `ops` from `src`; every tensor's shape is checked against `cfg`.
    pub fn load(ops: &O, cfg: Qwen36Config, src: &dyn WeightSource) -> Result<Qwen36Model<O>, EngineError> {
        let (h, inter, v) = (cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size);
        let gdn_dims = GdnDims {
            hk: cfg.linear_num_key_heads,
            hv: cfg.linear_num_value_heads,
            dk: cfg.linear_key_head_dim,
            dv: cfg.linear_value_head_dim,
            kconv: cfg.linear_conv_kernel_dim,
            eps: cfg.rms_norm_eps,
        };
        let attn_dims = AttnDims {
            hq: cfg.num_attention_heads,
            hkv: cfg.num_key_value_heads,
            hd: cfg.head_dim,
            rot: cfg.rotary_dim(),
            eps: cfg.rms_norm_eps,
        };
        let embed = load_matrix(ops, src, "embed_tokens.weight", v, h)?;
        let lm_head = if cfg.tie_word_embeddings { None } else { Some(load_matrix(ops, src, "lm_head.weight", v, h)?) };
        let (mut n_lin, mut n_full) = (0, 0);
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for (i, kind) in cfg.layer_types.iter().enumerate() {
            let p = format!("layers.{i}.");
            let mixer = match kind {
                LayerKind::Linear => {
                    n_lin += 1;
                    let layer = GdnLayer::load(ops, src, &format!("{p}linear_attn."), &gdn_dims, h)?;
                    Mixer::Linear(Box::new(layer), n_lin - 1)
                }
                LayerKind::Full => {
                    n_full += 1;
                    let layer = AttnLayer::load(ops, src, &format!("{p}self_attn."), &attn_dims, h)?;
                    Mixer::Full(Box::new(layer), n_full - 1)
                }
            };
            layers.push(Layer {
                input_norm: load_norm_1p(ops, src, &format!("{p}input_layernorm.weight"), h)?,
                post_norm: load_norm_1p(ops, src, &format!("{p}post_attention_layernorm.weight"), h)?,
                mixer,
                mlp: Mlp::load(ops, src, &format!("{p}mlp."), h, inter)?,
            });
        }
        let mtp = if cfg.mtp_num_hidden_layers > 0 && src.has("mtp.fc.weight") {
            Some(mtp::Mtp::load(ops, src, &attn_dims, h, inter)?)
        } else {
            if cfg.mtp_num_hidden_layers > 0 {
                tracing::info!("config has an MTP module but the checkpoint has no mtp.* tensors; MTP disabled");
            }
            None
        };
        let hparams = ModelHparams {
            architecture: "qwen3_5".into(),
            n_layers: cfg.num_hidden_layers,
            hidden_size: h,
            ffn_size: inter,
            n_heads: cfg.num_attention_heads,
            n_kv_heads: cfg.num_key_value_heads,
            head_dim: cfg.head_dim,
            vocab_size: v,
            context_length: cfg.max_position_embeddings,
            rms_norm_eps: cfg.rms_norm_eps,
            rope_theta: cfg.rope_theta,
        };
        Ok(Qwen36Model {
            final_norm: load_norm_1p(ops, src, "norm.weight", h)?,
            inv_freq: rope_inv_freq(cfg.rope_theta, attn_dims.rot),
            cfg,
            hparams,
            gdn_dims,
            attn_dims,
            embed,
            lm_head,
            layers,
            mtp,
            mode: GdnMode::Recurrent,
            exact_attention: false,
        })
    }

    pub fn hparams(&self) -> &ModelHparams {
        &self.hparams
    }

    pub fn config(&self) -> &Qwen36Config {
        &self.cfg
    }

    pub fn gdn_dims(&self) -> &GdnDims {
        &self.gdn_dims
    }

    /// The KV page layout of the decoder: one layer per full-attention layer.
    pub fn kv_layout(&self, page_tokens: usize) -> KvLayout {
        let (n_layers, n_kv_heads, head_dim) = (self.cfg.n_full(), self.attn_dims.hkv, self.attn_dims.hd);
        KvLayout { n_layers, n_kv_heads, head_dim, page_tokens, dtype: engine_ops::kv::KvDtype::F16 }
    }

    /// Which form multi-token passes use for the delta rule (default: recurrent).
    pub fn set_gdn_mode(&mut self, mode: GdnMode) {
        self.mode = mode;
    }

    /// Reference mode for exactness tests: full attention keeps f32 K/V per sequence and runs
    /// a plain f32 softmax instead of the f16 KV pages (pages are then neither written nor read).
    /// Isolates the only numerical departure of the serving path from transformers: the f16
    /// rounding of cached K and V. Not for serving (no snapshots of that KV).
    pub fn set_exact_attention(&mut self, on: bool) {
        self.exact_attention = on;
    }

    pub fn gdn_mode(&self) -> GdnMode {
        self.mode
    }

    /// Bytes of one sequence's state snapshot.
    pub fn state_bytes(&self) -> usize {
        snapshot_bytes(&self.gdn_dims, self.cfg.n_linear())
    }

    /// Bytes of weights held in memory (matrices and norms; MTP included).
    pub fn weight_bytes(&self) -> usize {
        let mut total = O::matrix_bytes(&self.embed) + self.lm_head.as_ref().map_or(0, O::matrix_bytes);
        for l in &self.layers {
            total += l.mlp.weight_bytes();
            total += match &l.mixer {
                Mixer::Linear(g, _) => g.weight_bytes(),
                Mixer::Full(a, _) => a.weight_bytes(&self.attn_dims),
            };
        }
        total + self.mtp.as_ref().map_or(0, |m| m.weight_bytes(&self.attn_dims))
    }

    fn head(&self) -> &O::Matrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Loads the state snapshot `src` for `seq_id` into `states`.
    pub fn load_state(
        &self,
        ops: &O,
        states: &mut Qwen36States<O::Buf>,
        seq_id: u64,
        src: &[u8],
    ) -> Result<(), EngineError> {
        states.load(ops, seq_id, src, &self.gdn_dims, self.cfg.n_linear())
    }

    /// Writes the state snapshot of `seq_id` to `dst` ([`Qwen36Model::state_bytes`] long).
    pub fn save_state(
        &self,
        ops: &O,
        states: &Qwen36States<O::Buf>,
        seq_id: u64,
        dst: &mut [u8],
    ) -> Result<(), EngineError> {
        states.save(ops, &self.gdn_dims, seq_id, dst)
    }

    /// After a tree pass from `start_pos`: keeps the path `accepted` (node indices, root first,
    /// each the parent of the next): its KV moves from slot `start_pos + accepted[d]` to position
    /// `start_pos + d`, and the state after its last node becomes the sequence's state.
    #[allow(clippy::too_many_arguments)]
    pub fn accept_tree_path(
        &self,
        ops: &O,
        layout: &KvLayout,
        states: &mut Qwen36States<O::Buf>,
        seq_id: u64,
        pages: &[PageId],
        start_pos: usize,
        accepted: &[usize],
    ) -> Result<(), EngineError> {
        let st = states
            .map
            .get_mut(&seq_id)
            .ok_or_else(|| EngineError::Internal(format!("accept_tree_path: sequence {seq_id} has no state")))?;
        let tree = st.tree.as_ref().filter(|t| t.start_pos == start_pos).ok_or_else(|| {
            EngineError::Internal(format!("accept_tree_path: sequence {seq_id} has no tree pass at {start_pos}"))
        })?;
        let valid = accepted.first() == Some(&0)
            && accepted.windows(2).all(|w| tree.parents.get(w[1]).copied().flatten() == Some(w[0]));
        if !valid {
            return Err(EngineError::Internal(format!(
                "accept_tree_path: {accepted:?} is not a root path of the tree"
            )));
        }
        let last = accepted[accepted.len() - 1];
        for (depth, &node) in accepted.iter().enumerate() {
            if node != depth {
                ops.move_kv(layout, pages, start_pos + node, start_pos + depth)?;
            }
        }
        let tree = st.tree.take().expect("checked above");
        for (layer, mut nodes) in st.layers.iter_mut().zip(tree.nodes) {
            if let Some(node_state) = nodes.get_mut(last) {
                std::mem::swap(layer, node_state);
            }
            states.spare.append(&mut nodes);
        }
        st.pos = start_pos + accepted.len();
        Ok(())
    }

    fn validate(
        &self,
        layout: &KvLayout,
        states: &Qwen36States<O::Buf>,
        batch: &ForwardBatch<'_>,
    ) -> Result<(), EngineError> {
        let hp = &self.hparams;
        for (i, s) in batch.seqs.iter().enumerate() {
            if let Some(parents) = s.tree {
                if parents.len() != s.tokens.len() {
                    return Err(EngineError::Internal(format!(
                        "sequence {i}: {} tree parents for {} tokens",
                        parents.len(),
                        s.tokens.len()
                    )));
                }
                TreeKeys::new(parents).map_err(|e| EngineError::Internal(format!("sequence {i}: {e}")))?;
                if self.exact_attention {
                    return Err(EngineError::UnsupportedModel(
                        "draft trees in the exact-attention reference mode".into(),
                    ));
                }
            }
            if batch.seqs[..i].iter().any(|o| o.seq_id == s.seq_id) {
                return Err(EngineError::Internal(format!("sequence id {} appears twice in one pass", s.seq_id)));
            }
            s.check(i, hp, layout)?;
            if s.start_pos > 0 {
                match states.get(s.seq_id) {
                    Some(st) if st.pos == s.start_pos => {}
                    Some(st) => {
                        return Err(EngineError::Internal(format!(
                            "sequence {}: pass starts at {} but its recurrent state is at {} (load_state the snapshot for {} first)",
                            s.seq_id, s.start_pos, st.pos, s.start_pos
                        )));
                    }
                    None => {
                        return Err(EngineError::Internal(format!(
                            "sequence {}: pass starts at {} without a recurrent state (load_state first)",
                            s.seq_id, s.start_pos
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// Runs one batch; see the module contract. `layout` must be [`Qwen36Model::kv_layout`].
    pub fn forward(
        &self,
        ops: &O,
        layout: &KvLayout,
        states: &mut Qwen36States<O::Buf>,
        s: &mut Qwen36Scratch<O>,
        batch: &ForwardBatch<'_>,
    ) -> Result<ForwardOutput, EngineError> {
        Ok(self.run(ops, layout, states, s, batch, false)?.0)
    }

    /// [`Qwen36Model::forward`], also returning every row's final hidden state (after the
    /// final norm; the MTP module's input), `tokens.len() x hidden` per sequence.
    pub fn forward_with_hidden(
        &self,
        ops: &O,
        layout: &KvLayout,
        states: &mut Qwen36States<O::Buf>,
        s: &mut Qwen36Scratch<O>,
        batch: &ForwardBatch<'_>,
    ) -> Result<(ForwardOutput, Vec<Vec<f32>>), EngineError> {
        self.run(ops, layout, states, s, batch, true)
    }

    fn run(
        &self,
        ops: &O,
        layout: &KvLayout,
        states: &mut Qwen36States<O::Buf>,
        s: &mut Qwen36Scratch<O>,
        batch: &ForwardBatch<'_>,
        want_hidden: bool,
    ) -> Result<(ForwardOutput, Vec<Vec<f32>>), EngineError> {
        self.validate(layout, states, batch)?;
        let h = self.hparams.hidden_size;
        let n: usize = batch.seqs.iter().map(|q| q.tokens.len()).sum();
        let keys: Vec<Option<TreeKeys>> = batch
            .seqs
            .iter()
            .map(|q| q.tree.map(TreeKeys::new).transpose())
            .collect::<Result<_, _>>()
            .map_err(EngineError::Internal)?;
        let mut segs = Vec::with_capacity(batch.seqs.len());
        let mut r0 = 0;
        for (q, k) in batch.seqs.iter().zip(&keys) {
            let m = q.tokens.len();
            segs.push(Seg { r0, m, start_pos: q.start_pos, pages: q.pages, tree: q.tree, keys: k.as_ref() });
            r0 += m;
        }

        // Embeddings and rotary tables.
        s.tokens.clear();
        s.positions.clear();
        for (q, seg) in batch.seqs.iter().zip(&segs) {
            s.tokens.extend_from_slice(q.tokens);
            s.positions.extend((0..seg.m).map(|j| q.start_pos + seg.keys.map_or(j, |k| k.depth(j))));
        }
        ops.grow(&mut s.x, n * h);
        ops.embed_rows(&self.embed, &s.tokens, &mut s.x)?;
        ops.rope_table_f32(&s.positions, &self.inv_freq, &mut s.rope);

        // States leave the map for the pass (one `&mut` per sequence), then go back.
        let (n_lin, d) = (self.cfg.n_linear(), &self.gdn_dims);
        let mut taken: Vec<SeqState<O::Buf>> = batch
            .seqs
            .iter()
            .map(|q| {
                let mut st = states.map.remove(&q.seq_id).unwrap_or_else(|| SeqState {
                    pos: 0,
                    layers: (0..n_lin).map(|_| zero_state(ops, d)).collect(),
                    exact_kv: Vec::new(),
                    tree: None,
                });
                if let Some(old) = st.tree.take() {
                    old.nodes.into_iter().for_each(|mut v| states.spare.append(&mut v));
                }
                st.tree = q.tree.map(|parents| {
                    let m = parents.len();
                    let nodes =
                        (0..n_lin).map(|_| states.spare.split_off(states.spare.len().saturating_sub(m))).collect();
                    PendingTree { start_pos: q.start_pos, parents: parents.to_vec(), nodes }
                });
                if q.start_pos == 0 {
                    st.layers.iter_mut().for_each(|l| reset_state(ops, d, l));
                    st.exact_kv.clear();
                }
                if self.exact_attention {
                    st.exact_kv.resize(self.cfg.n_full(), Vec::new());
                }
                st
            })
            .collect();

        let (eps, nh) = (self.cfg.rms_norm_eps, n * h);
        ops.grow(&mut s.xn, nh);
        ops.grow(&mut s.mix, nh);
        for layer in &self.layers {
            ops.rms_norm(&s.x, &layer.input_norm, eps, n, &mut s.xn);
            match &layer.mixer {
                Mixer::Linear(g, idx) => {
                    let mut refs: Vec<&mut GdnState<O::Buf>> = Vec::with_capacity(taken.len());
                    let mut nodes: Vec<Option<&mut Vec<GdnState<O::Buf>>>> = Vec::with_capacity(taken.len());
                    for st in taken.iter_mut() {
                        refs.push(&mut st.layers[*idx]);
                        nodes.push(st.tree.as_mut().map(|t| &mut t.nodes[*idx]));
                    }
                    let (gdn, mix) = (&mut s.gdn, &mut s.mix);
                    g.forward(ops, d, &s.xn, n, &segs, &mut refs, &mut nodes, self.mode, gdn, mix);
                }
                Mixer::Full(a, idx) => {
                    let mut stores: Vec<&mut Vec<f32>> =
                        taken.iter_mut().filter_map(|st| st.exact_kv.get_mut(*idx)).collect();
                    let exact = if self.exact_attention { Some(&mut stores[..]) } else { None };
                    let dims = &self.attn_dims;
                    a.forward(ops, dims, layout, *idx, &s.xn, n, &segs, &s.rope, &mut s.attn, exact, &mut s.mix);
                }
            }
            ops.add_assign(&mut s.x, &s.mix, nh);
            ops.rms_norm(&s.x, &layer.post_norm, eps, n, &mut s.xn);
            layer.mlp.forward(ops, &s.xn, n, &mut s.gate, &mut s.up, &mut s.mix);
            ops.add_assign(&mut s.x, &s.mix, nh);
        }

        for ((q, mut st), seg) in batch.seqs.iter().zip(taken).zip(&segs) {
            // A tree leaves the sequence at its start until a path is accepted.
            st.pos = if q.tree.is_some() { q.start_pos } else { q.start_pos + seg.m };
            states.map.insert(q.seq_id, st);
        }

        let hidden = if want_hidden {
            ops.grow(&mut s.hidden, nh);
            ops.rms_norm(&s.x, &self.final_norm, eps, n, &mut s.hidden);
            segs.iter().map(|seg| ops.to_host(&s.hidden, seg.r0 * h..(seg.r0 + seg.m) * h)).collect()
        } else {
            Vec::new()
        };
        let logits = self.head_logits(ops, s, batch, &segs)?;
        Ok((ForwardOutput { logits }, hidden))
    }

    /// Final norm + head on the rows whose logits are wanted.
    fn head_logits(
        &self,
        ops: &O,
        s: &mut Qwen36Scratch<O>,
        batch: &ForwardBatch<'_>,
        segs: &[Seg],
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        let (h, vocab) = (self.hparams.hidden_size, self.hparams.vocab_size);
        s.wanted.clear();
        for (q, seg) in batch.seqs.iter().zip(segs) {
            match q.logits {
                LogitsWanted::None => {}
                LogitsWanted::Last => s.wanted.push(seg.r0 + seg.m - 1),
                LogitsWanted::All => s.wanted.extend(seg.r0..seg.r0 + seg.m),
            }
        }
        let w = s.wanted.len();
        if w > 0 {
            ops.grow(&mut s.head_in, w * h);
            ops.gather_rows(&s.x, h, &s.wanted, &mut s.head_in);
            ops.grow(&mut s.head_norm, w * h);
            ops.rms_norm(&s.head_in, &self.final_norm, self.cfg.rms_norm_eps, w, &mut s.head_norm);
            ops.grow(&mut s.logits, w * vocab);
            ops.matmul(&s.head_norm, w, &mut [(self.head(), &mut s.logits)]);
        }
        let mut at = 0;
        Ok(batch
            .seqs
            .iter()
            .map(|q| {
                let rows = match q.logits {
                    LogitsWanted::None => 0,
                    LogitsWanted::Last => 1,
                    LogitsWanted::All => q.tokens.len(),
                };
                let out = if rows == 0 { Vec::new() } else { ops.to_host(&s.logits, at * vocab..(at + rows) * vocab) };
                at += rows;
                out
            })
            .collect())
    }
}
