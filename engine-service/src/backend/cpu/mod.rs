//! CPU backend: the reference every other backend is tested against, and fast in its own
//! right (SIMD kernels in [`kernels`], one thread pool per backend).
//!
//! Contract: [`CpuBackend::load`] opens a GGUF, builds the model and its tokenizer, and
//! computes the model fingerprint the cache-service keys pages by. The backend owns its
//! scratch buffers and thread pool; `forward` takes `&mut self`, so one step runs at a time.

pub mod kernels;

use std::path::Path;
use std::sync::Arc;

use crate::backend::{Backend, ForwardBatch, ForwardOutput};
use crate::format::Gguf;
use crate::memory::KvLayout;
use crate::model::llama::{LlamaModel, LlamaScratch};
use crate::model::{model_fingerprint, ModelHparams, KV_DTYPE_F16};
use crate::tokenizer::ModelTokenizer;
use crate::EngineError;

use kernels::ThreadPool;

pub struct CpuBackend {
    model: LlamaModel,
    layout: KvLayout,
    pool: ThreadPool,
    scratch: LlamaScratch,
}

/// Everything loading a model file yields.
pub struct LoadedModel {
    pub backend: CpuBackend,
    pub tokenizer: ModelTokenizer,
    /// 32 hex digits; see [`model_fingerprint`].
    pub fingerprint: String,
}

impl CpuBackend {
    /// Loads the GGUF at `path` with `n_threads` compute threads (0 = 1) and KV pages of
    /// `page_tokens` positions.
    pub fn load(path: &Path, n_threads: usize, page_tokens: usize) -> Result<LoadedModel, EngineError> {
        let started = std::time::Instant::now();
        let gguf = Arc::new(Gguf::open(path)?);
        let tokenizer = ModelTokenizer::from_gguf(&gguf)?;
        let model = LlamaModel::load(Arc::clone(&gguf))?;
        if tokenizer.vocab_size > model.hparams().vocab_size {
            return Err(gguf.error(format!(
                "tokenizer has {} tokens but the embedding only {}",
                tokenizer.vocab_size,
                model.hparams().vocab_size
            )));
        }
        let backend = CpuBackend::new(model, n_threads, page_tokens)?;
        let fingerprint =
            model_fingerprint(gguf.bytes(), &tokenizer.json, &tokenizer.chat_template, KV_DTYPE_F16, page_tokens);
        tracing::info!(
            path = %path.display(),
            threads = backend.pool.n_threads(),
            page_tokens,
            isa = kernels::isa_name(),
            fingerprint = %fingerprint,
            load_ms = started.elapsed().as_millis() as u64,
            "model loaded"
        );
        Ok(LoadedModel { backend, tokenizer, fingerprint })
    }

    /// A backend around an already loaded model.
    pub fn new(model: LlamaModel, n_threads: usize, page_tokens: usize) -> Result<CpuBackend, EngineError> {
        if page_tokens == 0 {
            return Err(EngineError::InvalidRequest("page_tokens must be at least 1".into()));
        }
        let hp = model.hparams();
        let layout =
            KvLayout { n_layers: hp.n_layers, n_kv_heads: hp.n_kv_heads, head_dim: hp.head_dim, page_tokens };
        Ok(CpuBackend { model, layout, pool: ThreadPool::new(n_threads), scratch: LlamaScratch::default() })
    }

    pub fn model(&self) -> &LlamaModel {
        &self.model
    }

    pub fn n_threads(&self) -> usize {
        self.pool.n_threads()
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn hparams(&self) -> &ModelHparams {
        self.model.hparams()
    }

    fn kv_layout(&self) -> KvLayout {
        self.layout
    }

    fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<ForwardOutput, EngineError> {
        self.model.forward(&self.pool, &self.layout, &mut self.scratch, batch)
    }
}
