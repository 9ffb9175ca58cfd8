//! engine-models: what a model is, independent of the device it runs on. Model file formats
//! ([`format`]: GGUF, safetensors, NVFP4 checkpoints, HF configs, tiktoken), the tokenizer,
//! and the architectures ([`llama`], [`qwen36`]), one file each, readable top to bottom,
//! written against the op seam (`engine-ops`) and generic over its backend.
//!
//! No `unsafe` but the two file mappings (`format::gguf`, `format::safetensors`): weights are
//! read from `mmap`ed files, which the OS shares between processes and never copies.

#![deny(unsafe_code)]

pub mod format;
pub mod llama;
pub mod qwen36;
pub mod tokenizer;

pub use engine_ops::{EngineError, ModelHparams};

/// KV cache element type name used in the model fingerprint (pages hold f16).
pub const KV_DTYPE_F16: &str = "f16";

/// The model fingerprint the cache keys pages by: hex of an xxh3-128 over the model file,
/// the tokenizer json, the chat template, the KV dtype name and the page size. Each part is
/// length-prefixed so no two different inputs hash the same byte stream.
pub fn model_fingerprint(
    model_file: &[u8],
    tokenizer_json: &str,
    chat_template: &str,
    kv_dtype: &str,
    page_tokens: usize,
) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for part in [model_file, tokenizer_json.as_bytes(), chat_template.as_bytes(), kv_dtype.as_bytes()] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    h.update(&(page_tokens as u64).to_le_bytes());
    format!("{:032x}", h.digest128())
}
