//! engine-ops: the op seam, the vocabulary model files are written in. A model architecture
//! holds weights of a device's own types and calls [`Ops`] for every piece of arithmetic; a
//! backend (the CPU's in `engine-cpu`, a GPU's later) implements it. Models never see a thread
//! pool, a SIMD type or a pointer. Beside the trait: the data both sides share (tensor
//! descriptions and the weight encodings they name, the KV page layout, a pass's batch) and
//! the engine's error type. No `unsafe`, no other engine crate.
//!
//! Contract:
//! - Dispatch is static: a model is generic over `O: Ops`, so each backend's forward pass is
//!   monomorphic (no virtual call per op).
//! - Activations live in [`Ops::Buf`], a grow-only f32 buffer in the device's memory. Ops
//!   read and write a buffer's leading `rows * width` values (row-major); ops that work on
//!   one sequence's rows of a batch take the row range. A buffer is grown with
//!   [`Ops::grow`] before an op writes it; ops never allocate activations themselves.
//! - Weights are created by the backend from device-neutral descriptions that `format/`
//!   yields ([`MatrixDesc`] for matrices, [`TensorDesc`] for embeddings and vectors: dtype,
//!   shape, bytes), so a device chooses its own layout (the CPU packs tiles).
//! - Every op gives the bits the CPU reference gives for the same inputs, whatever the batch
//!   composition, so the model-level contracts (cached == uncached, chunked == one pass,
//!   tree node == chain, speculative == plain) hold on every backend that keeps them per op.

#![forbid(unsafe_code)]

pub mod batch;
pub mod error;
pub mod fp8;
mod hparams;
mod hybrid;
pub mod kquant;
pub mod kv;
pub mod nvfp4;
pub mod rope;
pub mod tensor;
mod tree;

use std::ops::Range;

pub use hybrid::{GDN_CHUNK, GdnDims, GdnMode, GdnSeq, GdnState, GdnTree};
pub use tree::TreeKeys;

pub use error::EngineError;
pub use hparams::{MAX_LAYERS, ModelHparams};
use kv::{KvLayout, PageId};
use tensor::{MatrixDesc, TensorDesc};

/// The shape of one attention layer's heads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnShape {
    /// Index of the layer among the layers that keep KV (the page layout's layer).
    pub layer: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies `q · k` before the softmax (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
}

/// Where one sequence's rows of a batch read and write KV.
pub struct SeqKv<'a> {
    pub layout: &'a KvLayout,
    /// The sequence's pages, covering every position the call touches.
    pub pages: &'a [PageId],
    /// Position (KV slot) of the first row.
    pub start_pos: usize,
    /// The sequence's rows in the batch's buffers.
    pub rows: Range<usize>,
    /// `Some`: the rows are a draft tree (row `j` is node `j`, its KV in slot `start_pos + j`);
    /// `None`: a chain (row `j` at position `start_pos + j`).
    pub tree: Option<&'a TreeKeys>,
}

/// [`Ops::write_kv`]'s arguments: rows of `k` and `v` (`n_kv_heads * head_dim` wide) into
/// slots `start_pos..` of layer `layer`.
pub struct KvWrite<'a> {
    pub seq: &'a SeqKv<'a>,
    pub layer: usize,
    /// Per-tensor scales of FP8 pages (stored values are `k / k_scale`, `v / v_scale`); f16
    /// pages ignore them. 1.0 when the checkpoint has none.
    pub k_scale: f32,
    pub v_scale: f32,
}

/// Rotary embedding layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(x[2i], x[2i+1])` of every head rotate together (GGUF llama, whose
    /// converter permutes Q/K rows into this order).
    AdjacentPairs,
    /// Rotate-half (NeoX, HF's `rotate_half`) on the first `rotated` values of every head:
    /// pairs `(x[i], x[i + rotated/2])`; the rest of the head passes through (Qwen3.6's
    /// partial RoPE).
    HalfSplit { rotated: usize },
}

impl RopeStyle {
    /// Rotated pairs per head (the rotary table's pairs per row).
    pub fn pairs(self, head_dim: usize) -> usize {
        match self {
            RopeStyle::AdjacentPairs => head_dim / 2,
            RopeStyle::HalfSplit { rotated } => rotated / 2,
        }
    }
}

/// What a device does for a model. See the module contract.
pub trait Ops: Send {
    /// An f32 activation buffer in the device's memory; grow-only.
    type Buf: Default + Send;
    /// A weight matrix `[rows][cols]` (`out = x · Wᵀ`) in the device's layout.
    type Matrix: Send + Sync;
    /// An embedding table whose rows are gathered by token id.
    type Embedding: Send + Sync;
    /// A small f32 vector held on the device (norm weights).
    type Vector: Send + Sync;
    /// Per-row rotary angles for one pass, made by [`Ops::rope_table`].
    type RopeTable: Default + Send;

    // ---- weights ----

    /// A weight matrix from its stored form (any [`MatrixDesc`] storage); `rows`/`cols` are
    /// the output/input widths. Errors name the tensor.
    fn matrix(&self, t: &MatrixDesc) -> Result<Self::Matrix, EngineError>;
    /// An embedding table (`rows` tokens of `cols` values).
    fn embedding(&self, t: &TensorDesc) -> Result<Self::Embedding, EngineError>;
    /// A vector of `t.cols` values (a one-row tensor), as f32.
    fn vector(&self, t: &TensorDesc) -> Result<Self::Vector, EngineError>;
    /// A vector from host values (weights a model derives while loading, e.g. `1 + w`).
    fn vector_from(&self, values: &[f32]) -> Self::Vector;
    /// The matrix's `(rows, cols)`.
    fn matrix_shape(w: &Self::Matrix) -> (usize, usize);
    /// Bytes the matrix occupies in the device's memory.
    fn matrix_bytes(w: &Self::Matrix) -> usize;

    // ---- buffers ----

    /// Makes `buf` hold at least `len` values (contents unspecified).
    fn grow(&self, buf: &mut Self::Buf, len: usize);
    /// Copies `buf[range]` to the host.
    fn to_host(&self, buf: &Self::Buf, range: Range<usize>) -> Vec<f32>;
    /// Writes host `values` to `buf[at..at + values.len()]`, growing `buf` as needed.
    fn upload(&self, values: &[f32], buf: &mut Self::Buf, at: usize);
    /// Writes `buf[..dst.len() / 4]` to `dst` as little-endian f32 (a state snapshot).
    fn save_le(&self, buf: &Self::Buf, dst: &mut [u8]);
    /// Makes `buf` the little-endian f32 values of `src` (a state snapshot's).
    fn load_le(&self, src: &[u8], buf: &mut Self::Buf);
    /// Makes `buf` hold exactly `len` zeros (a fresh recurrent state).
    fn zeros(&self, buf: &mut Self::Buf, len: usize);
    /// `out` row `i` = `src` row `rows[i]` (rows of `width` values).
    fn gather_rows(&self, src: &Self::Buf, width: usize, rows: &[usize], out: &mut Self::Buf);
    /// `out` row `i` = `a` row `i` (`wa` values) followed by `b` row `i` (`wb` values).
    fn concat_cols(&self, a: &Self::Buf, wa: usize, b: &Self::Buf, wb: usize, rows: usize, out: &mut Self::Buf);
    /// Splits rows of `n_heads` blocks `[first_h | second_h]` (`head_dim` values each) into
    /// `first` and `second` (rows of `n_heads * head_dim`).
    fn deinterleave_heads(
        &self,
        x: &Self::Buf,
        rows: usize,
        n_heads: usize,
        head_dim: usize,
        first: &mut Self::Buf,
        second: &mut Self::Buf,
    );

    // ---- arithmetic ----

    /// `out` row `i` = embedding row `tokens[i]`. Fails on a token outside the table.
    fn embed(&self, table: &Self::Embedding, tokens: &[u32], out: &mut Self::Buf) -> Result<(), EngineError>;
    /// `out` row `i` = row `tokens[i]` of `table` as f32 (a matrix that is also the tied
    /// head). Fails on a token outside the table.
    fn embed_rows(&self, table: &Self::Matrix, tokens: &[u32], out: &mut Self::Buf) -> Result<(), EngineError>;
    /// `out = x / rms(x) * w`, row by row over `rows` rows of `w`'s length.
    fn rms_norm(&self, x: &Self::Buf, w: &Self::Vector, eps: f32, rows: usize, out: &mut Self::Buf);
    /// `out_i = x · W_iᵀ` for `rows` rows of `x`, for each `(W_i, out_i)`; all matrices have the
    /// same `cols` (they may share work on `x`, e.g. one activation quantization).
    fn matmul(&self, x: &Self::Buf, rows: usize, outs: &mut [(&Self::Matrix, &mut Self::Buf)]);
    /// `gate = silu(gate) * up` over the first `len` values.
    fn silu_mul(&self, gate: &mut Self::Buf, up: &Self::Buf, len: usize);
    /// `x += y` over the first `len` values.
    fn add_assign(&self, x: &mut Self::Buf, y: &Self::Buf, len: usize);
    /// `x *= sigmoid(gate)` over the first `len` values.
    fn sigmoid_mul(&self, x: &mut Self::Buf, gate: &Self::Buf, len: usize);
    /// `x *= s` over the first `len` values.
    fn scale(&self, x: &mut Self::Buf, s: f32, len: usize);

    /// The rotary angles of rows at `positions`: pair `i` of a row at position `p` turns by
    /// `p * inv_freq[i]` (computed in f64, rounded to f32 cos/sin).
    fn rope_table(&self, positions: &[usize], inv_freq: &[f64], table: &mut Self::RopeTable);
    /// The rotary angles as HF computes them: `p * inv_freq[i]` rounded to f32 before the
    /// f64 cos/sin.
    fn rope_table_f32(&self, positions: &[usize], inv_freq: &[f32], table: &mut Self::RopeTable);
    /// Rotates every head (`head_dim` values, as `style` says) of the table's rows of `x`
    /// (rows of `width` values: whole heads).
    fn rope(&self, style: RopeStyle, x: &mut Self::Buf, width: usize, head_dim: usize, table: &Self::RopeTable);

    /// Writes rows `seq.rows` of `k` and `v` into the sequence's pages.
    fn write_kv(&self, w: &KvWrite, k: &Self::Buf, v: &Self::Buf);
    /// Copies the K and V of every layer and KV head at position `from` to position `to` of
    /// the same sequence (a draft tree's accepted path moves from its scratch slots into
    /// place). Both positions must lie inside `pages`.
    fn move_kv(&self, layout: &KvLayout, pages: &[PageId], from: usize, to: usize) -> Result<(), EngineError>;
    /// Copies one whole page (copy on write of a shared page a sequence will append to).
    fn copy_page(&self, layout: &KvLayout, from: PageId, to: PageId) -> Result<(), EngineError>;
    /// `n` zeroed pages of the backend's own, for KV that lives only in the model (the MTP
    /// head's); given back with [`Ops::free_private_pages`].
    fn private_pages(&self, layout: &KvLayout, n: usize) -> Result<Vec<PageId>, EngineError>;
    /// Zeroes pages that [`Ops::private_pages`] gave out.
    fn zero_private_pages(&self, layout: &KvLayout, pages: &[PageId]) -> Result<(), EngineError>;
    fn free_private_pages(&self, pages: &[PageId]);
    /// Causal paged attention of rows `seq.rows` of `q` (`n_heads * head_dim` wide) over the
    /// sequence's KV: a chain row at position `p` sees `[0, p]`; a tree row sees
    /// `[0, start_pos)` and its ancestors. Writes the same rows of `out`.
    fn attention(&self, shape: &AttnShape, seq: &SeqKv, q: &Self::Buf, out: &mut Self::Buf);

    // ---- Gated DeltaNet ----

    /// The gates, in place, over `rows` rows of `hv` values: `beta = sigmoid(beta)`,
    /// `g = neg_a * softplus(g + dt_bias)` (the log-decay; `neg_a = -exp(A_log)`).
    fn gdn_gates(
        &self,
        beta: &mut Self::Buf,
        g: &mut Self::Buf,
        neg_a: &Self::Vector,
        dt_bias: &Self::Vector,
        rows: usize,
    );
    /// Causal depthwise conv over each sequence's rows of `qkv` (`d.conv_dim()` wide) with
    /// `taps` (`[K][conv_dim]`, tap-major), then SiLU, into the same rows of `out`. A chain
    /// reads and advances its state's conv window; a tree's node `t` convolves its parent's
    /// window (the root: the state's) and leaves its own in `nodes[t].conv`.
    fn causal_conv1d_silu(
        &self,
        d: &GdnDims,
        taps: &Self::Vector,
        qkv: &Self::Buf,
        seqs: &mut [GdnSeq<'_, Self::Buf>],
        out: &mut Self::Buf,
    );
    /// Per-head L2 norm (eps 1e-6 on the sum of squares) of the q and k parts of `rows` rows
    /// of `x` (`d.conv_dim()` wide), q also scaled by `1/sqrt(d_k)`; v is untouched.
    fn gdn_qk_norm(&self, d: &GdnDims, x: &mut Self::Buf, rows: usize);
    /// The gated delta rule per value head over each sequence's rows of `x` (`q | k | v`, as
    /// [`Ops::gdn_qk_norm`] leaves them), with `beta` and `g` from [`Ops::gdn_gates`]; writes
    /// `d.value_dim()`-wide rows of `out`. A chain advances its state's `ssm` (in `mode`); a
    /// tree's node `t` continues its parent's state (the root: the sequence's, unchanged)
    /// token by token and leaves its own in `nodes[t].ssm`.
    #[allow(clippy::too_many_arguments)]
    fn delta_rule(
        &self,
        d: &GdnDims,
        mode: GdnMode,
        x: &Self::Buf,
        beta: &Self::Buf,
        g: &Self::Buf,
        seqs: &mut [GdnSeq<'_, Self::Buf>],
        out: &mut Self::Buf,
    );
    /// `x = x / rms(x) * w * silu(z)`, row by row over `rows` rows of `w`'s length.
    fn gated_rms_norm(&self, x: &mut Self::Buf, z: &Self::Buf, w: &Self::Vector, eps: f32, rows: usize);
}
