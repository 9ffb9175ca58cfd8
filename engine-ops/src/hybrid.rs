//! The vocabulary of hybrid (Gated DeltaNet) layers: their shape, the recurrent state a
//! sequence carries through them, and which form a multi-token pass runs the recurrence in.
//! Device-neutral: a state's buffers are the backend's own ([`super::Ops::Buf`]).

use std::ops::Range;

/// Which form of the delta rule multi-token passes use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GdnMode {
    /// Token by token: a token's output does not depend on how the sequence was split into
    /// passes, bit for bit.
    Recurrent,
    /// Chunks of [`GDN_CHUNK`] tokens (the WY/UT form HF uses for prefill): equal to the
    /// recurrent form within f32 rounding. One-token passes always run the recurrent form.
    Chunked,
}

/// Tokens per chunk of [`GdnMode::Chunked`] (HF's value).
pub const GDN_CHUNK: usize = 64;

/// Shape of every Gated DeltaNet layer of a model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GdnDims {
    /// Key heads and value heads (value head `j` reads key head `j / (hv / hk)`).
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
    /// Conv kernel width K.
    pub kconv: usize,
    /// The gated RMSNorm's epsilon.
    pub eps: f32,
}

impl GdnDims {
    pub fn key_dim(&self) -> usize {
        self.hk * self.dk
    }
    pub fn value_dim(&self) -> usize {
        self.hv * self.dv
    }
    /// Width of the conv's rows: `q | k | v`.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    /// f32 values of one layer's conv window: `[K-1][conv_dim]`, oldest first.
    pub fn conv_state_len(&self) -> usize {
        (self.kconv - 1) * self.conv_dim()
    }
    /// f32 values of one layer's delta-rule state: `[Hv][d_k][d_v]`.
    pub fn ssm_state_len(&self) -> usize {
        self.hv * self.dk * self.dv
    }
}

/// One sequence's state for one GDN layer, in the device's buffers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GdnState<B> {
    /// Raw `in_proj_qkv` outputs of the last K-1 tokens, `[K-1][conv_dim]`, oldest first.
    pub conv: B,
    /// `[Hv][d_k][d_v]`: S such that `o = Sᵀ q`.
    pub ssm: B,
}

/// One sequence's rows of a GDN pass and the state they read and advance.
pub struct GdnSeq<'a, B> {
    /// The sequence's rows in the batch's buffers.
    pub rows: Range<usize>,
    /// The sequence's state. A chain advances it; a tree leaves it as the root's input.
    pub state: &'a mut GdnState<B>,
    /// `Some`: the rows are a draft tree.
    pub tree: Option<GdnTree<'a, B>>,
}

/// A draft tree's shape and the per-node states a GDN pass leaves.
pub struct GdnTree<'a, B> {
    /// As `SeqInput::tree`: `parents[0]` is `None`, every other entry an earlier node.
    pub parents: &'a [Option<usize>],
    /// Node `t`'s state after its root path (one per row; contents on entry unused).
    pub nodes: &'a mut [GdnState<B>],
}
