//! CPU backend: the reference every other backend is tested against, and fast in its own
//! right (SIMD kernels in [`kernels`], one thread pool per backend).
//!
//! Contract: [`CpuBackend::load`] opens a model — a GGUF file (llama architecture, or llama.cpp's
//! `qwen35` = Qwen3.5 / Qwen3.6, run by the hybrid model) or an HF
//! checkpoint directory (Qwen3.5 / Qwen3.6: `config.json`, safetensors, `tokenizer.json`, chat
//! template from `chat_template.jinja` or `tokenizer_config.json`, else the bundled Qwen3.5
//! template) — builds its tokenizer, and computes the model fingerprint the cache-service keys
//! pages by. [`CpuBackend::random_from_config`] runs the Qwen architecture of a `config.json`
//! with seeded random weights (no checkpoint; speed measurements). The backend owns its scratch
//! buffers, thread pool and (for the hybrid model) every sequence's recurrent state; `forward`
//! takes `&mut self`, so one step runs at a time.

use std::path::Path;
use std::sync::Arc;

use crate::EngineError;
use crate::backend::{Backend, ForwardBatch, ForwardOutput};
use crate::memory::{HostPages, KvDtype, KvLayout, PageId};
use engine_models::format::Gguf;
use engine_models::format::hf_config::Qwen36Config;
use engine_models::format::safetensors::SafeTensors;
use engine_models::llama::{LlamaModel, LlamaScratch};
use engine_models::qwen36::gguf::{GgufQwen35Weights, QWEN35_ARCH, QWEN35MOE_ARCH, config_from_gguf};
use engine_models::qwen36::mtp_state::MtpStates;
use engine_models::qwen36::weights::{RandomWeights, SafetensorsWeights};
use engine_models::qwen36::{Qwen36Model, Qwen36Scratch, Qwen36States};
use engine_models::tokenizer::ModelTokenizer;
use engine_models::{KV_DTYPE_F16, ModelHparams, model_fingerprint};

use engine_cpu::CpuOps;
use engine_cpu::kernels::{GgmlType, ThreadPool};
use engine_ops::Ops;

/// The chat template used for Qwen3.5/3.6 checkpoints that ship none.
pub const QWEN35_DEFAULT_TEMPLATE: &str = include_str!("../../../templates/qwen3_5.jinja");

/// Seeded random weights for [`CpuBackend::random_from_config`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RandomSpec {
    pub seed: u64,
    /// Storage type of float matrices: BF16 for real sizes, F32 for exactness tests.
    pub dtype: GgmlType,
    /// Quantize the decoder's Linears to NVFP4.
    pub nvfp4: bool,
}

impl Default for RandomSpec {
    fn default() -> Self {
        RandomSpec { seed: 0, dtype: GgmlType::BF16, nvfp4: false }
    }
}

/// The fingerprint of the same model with KV pages of `dtype` instead of f16: a
/// [`model_fingerprint`] over the f16 fingerprint with the dtype's name, so f16 and FP8 pages
/// never share a cache namespace.
fn kv_fingerprint(f16_fingerprint: &str, dtype: KvDtype) -> String {
    if dtype == KvDtype::F16 {
        return f16_fingerprint.to_string();
    }
    model_fingerprint(f16_fingerprint.as_bytes(), "", "", dtype.name(), 0)
}

/// The architectures the CPU backend runs.
// One per process; boxing the llama variant would only add an indirection to its hot path.
#[allow(clippy::large_enum_variant)]
pub enum CpuModel {
    Llama {
        model: LlamaModel<CpuOps>,
        scratch: LlamaScratch<CpuOps>,
    },
    Qwen36 {
        model: Box<Qwen36Model<CpuOps>>,
        scratch: Box<Qwen36Scratch<CpuOps>>,
        states: Qwen36States<Vec<f32>>,
        mtp: MtpStates,
    },
}

pub struct CpuBackend {
    model: CpuModel,
    layout: KvLayout,
    /// The CPU's ops (thread pool, kernel scratch): what the models run on.
    ops: CpuOps,
    /// The last [`Backend::run`]'s logits, per sequence of its batch.
    kept: Vec<Vec<f32>>,
}

/// Everything loading a model file yields.
pub struct LoadedModel {
    pub backend: CpuBackend,
    pub tokenizer: ModelTokenizer,
    /// 32 hex digits; see [`model_fingerprint`].
    pub fingerprint: String,
}

impl CpuBackend {
    /// Loads the model at `path` with `n_threads` compute threads (0 = 1) and KV pages of
    /// `page_tokens` positions. `path`: a GGUF file, an HF checkpoint directory, or a
    /// `config.json` file (random weights drawn as [`RandomSpec::default`]; see
    /// [`CpuBackend::load_with`]).
    pub fn load(path: &Path, n_threads: usize, page_tokens: usize) -> Result<LoadedModel, EngineError> {
        CpuBackend::load_kv(path, n_threads, page_tokens, KvDtype::F16)
    }

    /// [`CpuBackend::load`] with KV pages of `kv_dtype` (the fingerprint names the dtype, so
    /// pages of different dtypes never mix in the cache).
    pub fn load_kv(
        path: &Path,
        n_threads: usize,
        page_tokens: usize,
        kv_dtype: KvDtype,
    ) -> Result<LoadedModel, EngineError> {
        CpuBackend::load_with(path, n_threads, page_tokens, kv_dtype, &RandomSpec::default())
    }

    /// [`CpuBackend::load_kv`], drawing the weights of a `config.json` path as `random` says.
    pub fn load_with(
        path: &Path,
        n_threads: usize,
        page_tokens: usize,
        kv_dtype: KvDtype,
        random: &RandomSpec,
    ) -> Result<LoadedModel, EngineError> {
        let mut loaded = CpuBackend::load_f16(path, n_threads, page_tokens, random)?;
        if kv_dtype != KvDtype::F16 {
            loaded.backend.layout.dtype = kv_dtype;
            loaded.fingerprint = kv_fingerprint(&loaded.fingerprint, kv_dtype);
            tracing::info!(kv_dtype = kv_dtype.name(), fingerprint = %loaded.fingerprint, "KV pages of a non-default dtype");
        }
        Ok(loaded)
    }

    /// A backend with KV pages of `dtype` (f16 by default).
    pub fn with_kv_dtype(mut self, dtype: KvDtype) -> CpuBackend {
        self.layout.dtype = dtype;
        self
    }

    fn load_f16(
        path: &Path,
        n_threads: usize,
        page_tokens: usize,
        random: &RandomSpec,
    ) -> Result<LoadedModel, EngineError> {
        // Before any weight is staged: see `pin_malloc_mmap_threshold`.
        engine_cpu::ops::pin_malloc_mmap_threshold();
        if path.is_dir() {
            return CpuBackend::load_hf(path, n_threads, page_tokens);
        }
        if path.extension().is_some_and(|e| e == "json") {
            return CpuBackend::random_from_config(path, random, None, n_threads, page_tokens);
        }
        let started = std::time::Instant::now();
        let gguf = Arc::new(Gguf::open(path)?);
        if matches!(gguf.opt_str("general.architecture")?, Some(QWEN35_ARCH | QWEN35MOE_ARCH)) {
            return CpuBackend::load_gguf_qwen35(&gguf, n_threads, page_tokens, started);
        }
        let tokenizer = ModelTokenizer::from_gguf(&gguf)?;
        let ops = CpuOps::new(n_threads);
        let model = LlamaModel::load(&ops, &gguf)?;
        if tokenizer.vocab_size > model.hparams().vocab_size {
            return Err(gguf.error(format!(
                "tokenizer has {} tokens but the embedding only {}",
                tokenizer.vocab_size,
                model.hparams().vocab_size
            )));
        }
        let backend = CpuBackend::new(model, ops, page_tokens)?;
        let fingerprint =
            model_fingerprint(gguf.bytes(), &tokenizer.json, &tokenizer.chat_template, KV_DTYPE_F16, page_tokens);
        backend.log_loaded(path, &fingerprint, started);
        Ok(LoadedModel { backend, tokenizer, fingerprint })
    }

    /// Loads a llama.cpp `qwen35` GGUF (Qwen3.5 / Qwen3.6) as the hybrid model: config from
    /// the metadata, weights through [`GgufQwen35Weights`] (converter transforms undone),
    /// tokenizer and chat template from the metadata (the bundled Qwen3.5 template when the
    /// file has none). The fingerprint hashes the whole file, like the llama path.
    fn load_gguf_qwen35(
        gguf: &Gguf,
        n_threads: usize,
        page_tokens: usize,
        started: std::time::Instant,
    ) -> Result<LoadedModel, EngineError> {
        let cfg = config_from_gguf(gguf)?;
        let mut tokenizer = ModelTokenizer::from_gguf(gguf)?;
        if tokenizer.chat_template.is_empty() {
            tokenizer.chat_template = QWEN35_DEFAULT_TEMPLATE.to_string();
        }
        if tokenizer.vocab_size > cfg.vocab_size {
            return Err(gguf.error(format!(
                "tokenizer has {} tokens but the embedding only {}",
                tokenizer.vocab_size, cfg.vocab_size
            )));
        }
        let ops = CpuOps::new(n_threads);
        let model = Qwen36Model::load(&ops, cfg.clone(), &GgufQwen35Weights::new(gguf, &cfg))?;
        let fingerprint =
            model_fingerprint(gguf.bytes(), &tokenizer.json, &tokenizer.chat_template, KV_DTYPE_F16, page_tokens);
        let backend = CpuBackend::new_qwen36(model, ops, page_tokens)?;
        backend.log_loaded(gguf.path(), &fingerprint, started);
        Ok(LoadedModel { backend, tokenizer, fingerprint })
    }

    /// Loads an HF Qwen3.5 / Qwen3.6 checkpoint directory.
    fn load_hf(dir: &Path, n_threads: usize, page_tokens: usize) -> Result<LoadedModel, EngineError> {
        let started = std::time::Instant::now();
        let config_path = dir.join("config.json");
        let config_text =
            std::fs::read_to_string(&config_path).map_err(|e| EngineError::model_file(&config_path, e.to_string()))?;
        let cfg = Qwen36Config::parse(&config_path, &config_text)?;
        let st = SafeTensors::open(dir)?;
        let tokenizer = ModelTokenizer::from_hf_dir(dir, QWEN35_DEFAULT_TEMPLATE, &cfg.eos_token_ids)?;
        if tokenizer.vocab_size > cfg.vocab_size {
            return Err(EngineError::model_file(
                dir.join("tokenizer.json"),
                format!("tokenizer has {} tokens but the embedding only {}", tokenizer.vocab_size, cfg.vocab_size),
            ));
        }
        let ops = CpuOps::new(n_threads);
        let model = Qwen36Model::load(&ops, cfg, &SafetensorsWeights::new(&st)?)?;
        // The fingerprint covers the config and every shard (name and bytes).
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&(config_text.len() as u64).to_le_bytes());
        h.update(config_text.as_bytes());
        for (path, bytes) in st.shard_bytes() {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            h.update(&(name.len() as u64).to_le_bytes());
            h.update(name.as_bytes());
            h.update(&(bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        }
        let weights_digest = h.digest128().to_le_bytes();
        let fingerprint =
            model_fingerprint(&weights_digest, &tokenizer.json, &tokenizer.chat_template, KV_DTYPE_F16, page_tokens);
        let backend = CpuBackend::new_qwen36(model, ops, page_tokens)?;
        backend.log_loaded(dir, &fingerprint, started);
        Ok(LoadedModel { backend, tokenizer, fingerprint })
    }

    /// The Qwen3.5/3.6 architecture of `config_json` with seeded random weights ([`RandomSpec`]),
    /// no checkpoint. The tokenizer is
    /// `tokenizer_json` when given, else a byte-level fallback
    /// ([`ModelTokenizer::byte_level_fallback`]); the chat template is the bundled Qwen3.5 one.
    pub fn random_from_config(
        config_json: &Path,
        spec: &RandomSpec,
        tokenizer_json: Option<&Path>,
        n_threads: usize,
        page_tokens: usize,
    ) -> Result<LoadedModel, EngineError> {
        engine_cpu::ops::pin_malloc_mmap_threshold();
        let started = std::time::Instant::now();
        let config_text =
            std::fs::read_to_string(config_json).map_err(|e| EngineError::model_file(config_json, e.to_string()))?;
        let cfg = Qwen36Config::parse(config_json, &config_text)?;
        let tokenizer = match tokenizer_json {
            Some(p) => {
                let dir = p.parent().unwrap_or(Path::new("."));
                if p.file_name().and_then(|f| f.to_str()) != Some("tokenizer.json") {
                    return Err(EngineError::model_file(p, "the tokenizer file must be named tokenizer.json"));
                }
                ModelTokenizer::from_hf_dir(dir, QWEN35_DEFAULT_TEMPLATE, &cfg.eos_token_ids)?
            }
            None => ModelTokenizer::byte_level_fallback(cfg.vocab_size, QWEN35_DEFAULT_TEMPLATE)?,
        };
        let (seed, dtype) = (spec.seed, spec.dtype);
        let src = RandomWeights {
            seed,
            dtype,
            nvfp4: spec.nvfp4,
            with_mtp: cfg.mtp_num_hidden_layers > 0,
            with_lm_head: !cfg.tie_word_embeddings,
        };
        let ops = CpuOps::new(n_threads);
        let model = Qwen36Model::load(&ops, cfg, &src)?;
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(b"random-weights");
        h.update(config_text.as_bytes());
        h.update(&seed.to_le_bytes());
        h.update(format!("{dtype:?} nvfp4={}", spec.nvfp4).as_bytes());
        let fingerprint = model_fingerprint(
            &h.digest128().to_le_bytes(),
            &tokenizer.json,
            &tokenizer.chat_template,
            KV_DTYPE_F16,
            page_tokens,
        );
        let backend = CpuBackend::new_qwen36(model, ops, page_tokens)?;
        backend.log_loaded(config_json, &fingerprint, started);
        Ok(LoadedModel { backend, tokenizer, fingerprint })
    }

    fn log_loaded(&self, path: &Path, fingerprint: &str, started: std::time::Instant) {
        tracing::info!(
            path = %path.display(),
            architecture = %self.hparams().architecture,
            threads = self.ops.pool().n_threads(),
            page_tokens = self.layout.page_tokens,
            isa = engine_cpu::kernels::isa_name(),
            fingerprint = %fingerprint,
            load_ms = started.elapsed().as_millis() as u64,
            "model loaded"
        );
    }

    /// A backend around a llama model loaded onto `ops`.
    pub fn new(model: LlamaModel<CpuOps>, ops: CpuOps, page_tokens: usize) -> Result<CpuBackend, EngineError> {
        if page_tokens == 0 {
            return Err(EngineError::InvalidRequest("page_tokens must be at least 1".into()));
        }
        let hp = model.hparams();
        let (n_layers, n_kv_heads, head_dim) = (hp.n_layers, hp.n_kv_heads, hp.head_dim);
        let layout = KvLayout { n_layers, n_kv_heads, head_dim, page_tokens, dtype: KvDtype::F16 };
        Ok(CpuBackend {
            model: CpuModel::Llama { model, scratch: LlamaScratch::default() },
            layout,
            ops,
            kept: Vec::new(),
        })
    }

    /// A backend around an already loaded Qwen3.5 / Qwen3.6 model.
    /// A backend around a Qwen3.5 / Qwen3.6 model loaded onto `ops`.
    pub fn new_qwen36(model: Qwen36Model<CpuOps>, ops: CpuOps, page_tokens: usize) -> Result<CpuBackend, EngineError> {
        if page_tokens == 0 {
            return Err(EngineError::InvalidRequest("page_tokens must be at least 1".into()));
        }
        let layout = model.kv_layout(page_tokens);
        Ok(CpuBackend {
            model: CpuModel::Qwen36 {
                model: Box::new(model),
                scratch: Box::default(),
                states: Qwen36States::default(),
                mtp: MtpStates::new(page_tokens),
            },
            layout,
            ops,
            kept: Vec::new(),
        })
    }

    pub fn model(&self) -> &CpuModel {
        &self.model
    }

    /// The llama model, when that is the architecture.
    pub fn llama(&self) -> Option<&LlamaModel<CpuOps>> {
        match &self.model {
            CpuModel::Llama { model, .. } => Some(model),
            CpuModel::Qwen36 { .. } => None,
        }
    }

    /// The Qwen3.5 / Qwen3.6 model, when that is the architecture.
    pub fn qwen36(&self) -> Option<&Qwen36Model<CpuOps>> {
        match &self.model {
            CpuModel::Qwen36 { model, .. } => Some(model),
            CpuModel::Llama { .. } => None,
        }
    }

    /// Mutable access to the Qwen model and its scratch (the MTP forward, mode switches).
    pub fn qwen36_mut(&mut self) -> Option<(&mut Qwen36Model<CpuOps>, &mut Qwen36Scratch<CpuOps>, &CpuOps)> {
        match &mut self.model {
            CpuModel::Qwen36 { model, scratch, .. } => Some((model, scratch, &self.ops)),
            CpuModel::Llama { .. } => None,
        }
    }

    /// [`Backend::forward`] that also returns every row's final hidden state (Qwen only:
    /// the MTP module's input).
    pub fn forward_with_hidden(
        &mut self,
        batch: &ForwardBatch<'_>,
    ) -> Result<(ForwardOutput, Vec<Vec<f32>>), EngineError> {
        match &mut self.model {
            CpuModel::Qwen36 { model, scratch, states, mtp } => {
                let (out, hidden) = model.forward_with_hidden(&self.ops, &self.layout, states, scratch, batch)?;
                mtp.observe(model, &self.ops, scratch, batch, &hidden)?;
                Ok((out, hidden))
            }
            CpuModel::Llama { .. } => {
                Err(EngineError::UnsupportedModel("hidden states are exposed for qwen3_5 only".into()))
            }
        }
    }

    /// Turns MTP drafting ([`Backend::mtp_draft`]) on or off; off by default, also turned on
    /// by a `max_depth == 0` probe. While on, every pass also keeps its rows' final hiddens
    /// until the MTP head has consumed them. False when the model has no MTP module.
    pub fn set_mtp_drafting(&mut self, on: bool) -> bool {
        match &mut self.model {
            CpuModel::Qwen36 { model, mtp, .. } if model.has_mtp() => {
                mtp.set_enabled(on);
                true
            }
            _ => false,
        }
    }

    /// The sequence's MTP KV pages and the count of leading positions holding committed
    /// entries (tests compare them against a from-scratch catch-up).
    pub fn mtp_kv(&self, seq_id: u64) -> Option<(Vec<crate::memory::PageId>, usize)> {
        match &self.model {
            CpuModel::Qwen36 { mtp, .. } => mtp.kv(seq_id).map(|(p, n)| (p.to_vec(), n)),
            CpuModel::Llama { .. } => None,
        }
    }

    pub fn pool(&self) -> &ThreadPool {
        self.ops.pool()
    }

    pub fn ops(&self) -> &CpuOps {
        &self.ops
    }

    pub fn n_threads(&self) -> usize {
        self.ops.pool().n_threads()
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn hparams(&self) -> &ModelHparams {
        match &self.model {
            CpuModel::Llama { model, .. } => model.hparams(),
            CpuModel::Qwen36 { model, .. } => model.hparams(),
        }
    }

    fn kv_layout(&self) -> KvLayout {
        self.layout
    }

    fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<ForwardOutput, EngineError> {
        for seq in &batch.seqs {
            self.ops.check_pages(seq.pages)?;
        }
        match &mut self.model {
            CpuModel::Llama { model, scratch } => model.forward(&self.ops, &self.layout, scratch, batch),
            CpuModel::Qwen36 { model, scratch, states, mtp } if mtp.enabled() => {
                let (out, hidden) = model.forward_with_hidden(&self.ops, &self.layout, states, scratch, batch)?;
                mtp.observe(model, &self.ops, scratch, batch, &hidden)?;
                Ok(out)
            }
            CpuModel::Qwen36 { model, scratch, states, .. } => {
                model.forward(&self.ops, &self.layout, states, scratch, batch)
            }
        }
    }

    fn run(&mut self, batch: &ForwardBatch<'_>) -> Result<(), EngineError> {
        self.kept = self.forward(batch)?.logits;
        Ok(())
    }

    fn kept_logits(&self, seq: usize) -> Result<&[f32], EngineError> {
        self.kept
            .get(seq)
            .map(Vec::as_slice)
            .ok_or_else(|| EngineError::Internal(format!("no logits kept for sequence {seq} of the last pass")))
    }

    fn map_pages(&mut self, space: u32, memory: Arc<dyn HostPages>) -> Result<(), EngineError> {
        self.ops.map_pages(space, memory)
    }

    fn unmap_pages(&mut self, space: u32) {
        self.ops.unmap_pages(space);
    }

    fn copy_page(&mut self, from: PageId, to: PageId) -> Result<(), EngineError> {
        self.ops.copy_page(&self.layout, from, to)
    }

    fn state_bytes(&self) -> usize {
        match &self.model {
            CpuModel::Llama { .. } => 0,
            CpuModel::Qwen36 { model, .. } => model.state_bytes(),
        }
    }

    fn save_state(&self, seq_id: u64, dst: &mut [u8]) -> Result<(), EngineError> {
        match &self.model {
            CpuModel::Llama { .. } => Ok(()),
            CpuModel::Qwen36 { model, states, .. } => model.save_state(&self.ops, states, seq_id, dst),
        }
    }

    fn load_state(&mut self, seq_id: u64, src: &[u8]) -> Result<(), EngineError> {
        match &mut self.model {
            CpuModel::Llama { .. } => Ok(()),
            CpuModel::Qwen36 { model, states, mtp, .. } => {
                // The MTP head missed the restored positions: it resynchronises at the next pass.
                mtp.release(seq_id);
                model.load_state(&self.ops, states, seq_id, src)
            }
        }
    }

    fn accept_tree_path(
        &mut self,
        seq_id: u64,
        pages: &[PageId],
        start_pos: usize,
        accepted: &[usize],
    ) -> Result<(), EngineError> {
        match &mut self.model {
            CpuModel::Qwen36 { model, states, mtp, .. } => {
                model.accept_tree_path(&self.ops, &self.layout, states, seq_id, pages, start_pos, accepted)?;
                mtp.accept_tree_path(seq_id, start_pos, accepted);
                Ok(())
            }
            CpuModel::Llama { .. } => {
                for (depth, &node) in accepted.iter().enumerate() {
                    if node != depth {
                        self.ops.move_kv(&self.layout, pages, start_pos + node, start_pos + depth)?;
                    }
                }
                Ok(())
            }
        }
    }

    fn release_seq(&mut self, seq_id: u64) {
        if let CpuModel::Qwen36 { states, mtp, .. } = &mut self.model {
            states.release(seq_id);
            mtp.release(seq_id);
        }
    }

    fn mtp_draft(
        &mut self,
        seq_id: u64,
        root: u32,
        max_depth: usize,
        top_k: usize,
        min_score: f32,
    ) -> Result<Option<Vec<Vec<(u32, f32)>>>, EngineError> {
        let CpuModel::Qwen36 { model, scratch, states, mtp } = &mut self.model else { return Ok(None) };
        if !model.has_mtp() {
            return Ok(None);
        }
        if max_depth == 0 {
            mtp.set_enabled(true);
            return Ok(Some(Vec::new()));
        }
        let Some(pos) = states.get(seq_id).map(|st| st.pos) else { return Ok(None) };
        mtp.draft(model, &self.ops, scratch, seq_id, pos, root, max_depth, top_k, min_score)
    }
}
