//! The shape of a model, as its file states it.

/// The most layers a loader accepts. Released models have at most a few hundred; a larger
/// count in a file is corruption, and trusting it would size per-layer tables (or loop over
/// them) before any tensor is looked at: a hostile file found by fuzzing stalled the loader.
pub const MAX_LAYERS: usize = 1024;

/// Hyper-parameters read from the model file (not runtime config).
#[derive(Clone, Debug, PartialEq)]
pub struct ModelHparams {
    pub architecture: String,
    pub n_layers: usize,
    pub hidden_size: usize,
    pub ffn_size: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
}
