//! The shape of a model, as its file states it.

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
