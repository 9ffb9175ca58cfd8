//! The CUDA backend: a Llama-family GGUF model on [`CudaOps`] (the model file is the CPU's,
//! generic over the op seam). Qwen3.5/3.6 run on the GPU with the next part (their Gated
//! DeltaNet kernels); here they are refused at load with an error naming the reason, so
//! `--device auto` serves them on the CPU.
//!
//! KV pages are the same layout as the CPU's, but the fingerprint names the backend: KV a GPU
//! computed is not bit-identical to the CPU's, and a cache namespace must hold one engine's
//! numbers for cached == uncached to hold bitwise.

use std::cell::OnceCell;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use engine_cuda::cubin_cache::{self, CubinCache};
use engine_cuda::device::GpuDevice;
use engine_cuda::ops::CudaOps;
use engine_models::format::Gguf;
use engine_models::llama::{LlamaModel, LlamaScratch};
use engine_models::qwen36::gguf::{QWEN35_ARCH, QWEN35MOE_ARCH};
use engine_models::tokenizer::ModelTokenizer;
use engine_models::{KV_DTYPE_F16, ModelHparams, model_fingerprint};
use engine_ops::Ops;

use crate::EngineError;
use crate::backend::{Backend, ForwardBatch, ForwardOutput, LogitsRow, TreeVerdict, host_sample, host_verify_tree};
use crate::memory::{HostPages, KvDtype, KvLayout, PageId};
use crate::sampling::{Sampler, StepLogprobs};
use crate::speculative::{DraftTree, accept_with};

pub struct CudaBackend {
    model: LlamaModel<CudaOps>,
    scratch: LlamaScratch<CudaOps>,
    layout: KvLayout,
    ops: CudaOps,
    /// The last [`Backend::run`]'s logits stay on the device (the model's scratch); these are
    /// each sequence's rows there.
    kept: Vec<Range<usize>>,
    /// Their host copy, made when a host operation first asks (sampling with a temperature,
    /// a grammar, log-probabilities).
    kept_host: OnceCell<Vec<Vec<f32>>>,
}

/// What loading a model onto a GPU yields.
pub struct LoadedCuda {
    pub backend: CudaBackend,
    pub tokenizer: ModelTokenizer,
    pub fingerprint: String,
}

impl CudaBackend {
    /// Loads the GGUF model at `path` onto CUDA device `ordinal` with KV pages of
    /// `page_tokens` positions and `kv_dtype`.
    pub fn load(path: &Path, ordinal: usize, page_tokens: usize, kv_dtype: KvDtype) -> Result<LoadedCuda, EngineError> {
        if page_tokens == 0 {
            return Err(EngineError::InvalidRequest("page_tokens must be at least 1".into()));
        }
        if path.is_dir() || path.extension().is_some_and(|e| e == "json") {
            return Err(EngineError::UnsupportedModel(
                "the CUDA backend runs GGUF files of the Llama family (HF checkpoints and random weights are Qwen3.6, on the CPU until its GPU kernels land)".into(),
            ));
        }
        let started = std::time::Instant::now();
        let gguf = Arc::new(Gguf::open(path)?);
        if let Some(arch @ (QWEN35_ARCH | QWEN35MOE_ARCH)) = gguf.opt_str("general.architecture")? {
            return Err(EngineError::UnsupportedModel(format!(
                "the CUDA backend does not run {arch} (Gated DeltaNet) models yet"
            )));
        }
        let cache = cubin_cache::default_dir().map(CubinCache::new);
        let device = Arc::new(GpuDevice::open(ordinal, cache.as_ref())?);
        let ops = CudaOps::new(device.clone())?;
        let tokenizer = ModelTokenizer::from_gguf(&gguf)?;
        let model = LlamaModel::load(&ops, &gguf)?;
        ops.take_error()?;
        let hp = model.hparams();
        if tokenizer.vocab_size > hp.vocab_size {
            return Err(gguf.error(format!(
                "tokenizer has {} tokens but the embedding only {}",
                tokenizer.vocab_size, hp.vocab_size
            )));
        }
        if !engine_cuda::launch::attention_head_dim_ok(hp.head_dim) {
            return Err(EngineError::UnsupportedModel(format!(
                "head size {}: the CUDA attention kernel takes multiples of 32 up to {}",
                hp.head_dim,
                engine_cuda::launch::ATTENTION_MAX_HEAD_DIM
            )));
        }
        let layout = KvLayout {
            n_layers: hp.n_layers,
            n_kv_heads: hp.n_kv_heads,
            head_dim: hp.head_dim,
            page_tokens,
            dtype: kv_dtype,
        };
        let f16 = model_fingerprint(gguf.bytes(), &tokenizer.json, &tokenizer.chat_template, KV_DTYPE_F16, page_tokens);
        let fingerprint = cuda_fingerprint(&f16, kv_dtype);
        tracing::info!(
            path = %path.display(),
            device = %device.info,
            fingerprint = %fingerprint,
            load_ms = started.elapsed().as_millis() as u64,
            "model loaded onto the GPU"
        );
        let backend = CudaBackend {
            model,
            scratch: LlamaScratch::default(),
            layout,
            ops,
            kept: Vec::new(),
            kept_host: OnceCell::new(),
        };
        Ok(LoadedCuda { backend, tokenizer, fingerprint })
    }

    pub fn ops(&self) -> &CudaOps {
        &self.ops
    }
}

/// The fingerprint of a model served by this backend: the CPU's (f16) fingerprint hashed
/// with the backend and the KV dtype.
pub fn cuda_fingerprint(f16_fingerprint: &str, dtype: KvDtype) -> String {
    model_fingerprint(f16_fingerprint.as_bytes(), "cuda", "", dtype.name(), 0)
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn hparams(&self) -> &ModelHparams {
        self.model.hparams()
    }

    fn kv_layout(&self) -> KvLayout {
        self.layout
    }

    fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<ForwardOutput, EngineError> {
        for seq in &batch.seqs {
            self.ops.check_pages(seq.pages)?;
        }
        let out = self.model.forward(&self.ops, &self.layout, &mut self.scratch, batch);
        // A failed launch makes the pass fail, whatever the model returned.
        self.ops.take_error()?;
        out
    }

    fn run(&mut self, batch: &ForwardBatch<'_>) -> Result<(), EngineError> {
        for seq in &batch.seqs {
            self.ops.check_pages(seq.pages)?;
        }
        self.kept.clear();
        self.kept_host = OnceCell::new();
        let rows = self.model.forward_kept(&self.ops, &self.layout, &mut self.scratch, batch);
        self.ops.take_error()?;
        self.kept = rows?;
        Ok(())
    }

    fn kept_logits(&self, seq: usize) -> Result<&[f32], EngineError> {
        if seq >= self.kept.len() {
            return Err(EngineError::Internal(format!("no logits kept for sequence {seq} of the last pass")));
        }
        if self.kept_host.get().is_none() {
            let vocab = self.model.hparams().vocab_size;
            let all = self
                .kept
                .iter()
                .map(|r| self.ops.to_host(self.scratch.logits(), r.start * vocab..r.end * vocab))
                .collect();
            self.ops.take_error()?;
            let _ = self.kept_host.set(all);
        }
        self.kept_host
            .get()
            .map(|all| all[seq].as_slice())
            .ok_or_else(|| EngineError::Internal("the kept logits could not be copied to the host".into()))
    }

    /// Greedy without a grammar or log-probabilities: the argmax on the device (4 bytes
    /// back); anything else on the host copy.
    fn sample(
        &mut self,
        at: LogitsRow,
        sampler: &mut Sampler,
        top_n: Option<usize>,
    ) -> Result<(u32, Option<StepLogprobs>), EngineError> {
        let vocab = self.model.hparams().vocab_size;
        if top_n.is_none() && sampler.params().is_greedy() && sampler.constraint_mut().is_none() {
            let rows = self.kept.get(at.seq).cloned().unwrap_or(0..0);
            if at.row >= rows.len() {
                return Err(EngineError::Internal(format!(
                    "no logits row {} was kept for sequence {}",
                    at.row, at.seq
                )));
            }
            let token = self.ops.argmax_rows(self.scratch.logits(), rows.start + at.row, 1, vocab)?[0];
            return Ok((token, None));
        }
        host_sample(vocab, self.kept_logits(at.seq)?, at, sampler, top_n)
    }

    /// Greedy without a grammar or log-probabilities: every node's argmax on the device,
    /// then the walk; anything else on the host copy.
    fn verify_tree(
        &mut self,
        seq: usize,
        tree: &DraftTree,
        sampler: &mut Sampler,
        top_n: Option<usize>,
    ) -> Result<TreeVerdict, EngineError> {
        let vocab = self.model.hparams().vocab_size;
        if top_n.is_none() && sampler.params().is_greedy() && sampler.constraint_mut().is_none() {
            let rows = self.kept.get(seq).cloned().unwrap_or(0..0);
            if rows.len() < tree.len() {
                return Err(EngineError::Internal(format!(
                    "{} logits rows for a tree of {} nodes",
                    rows.len(),
                    tree.len()
                )));
            }
            let best = self.ops.argmax_rows(self.scratch.logits(), rows.start, tree.len(), vocab)?;
            let accepted = accept_with(tree, |at| best[at]);
            return Ok(TreeVerdict { accepted, logprobs: Vec::new() });
        }
        host_verify_tree(vocab, self.kept_logits(seq)?, tree, sampler, top_n)
    }

    fn map_pages(&mut self, space: u32, memory: Arc<dyn HostPages>) -> Result<(), EngineError> {
        self.ops.map_pages(space, memory)
    }

    fn unmap_pages(&mut self, space: u32) {
        self.ops.unmap_pages(space);
    }

    fn flush_pages(&mut self, pages: &[PageId]) -> Result<(), EngineError> {
        self.ops.flush_pages(pages)
    }

    fn copy_page(&mut self, from: PageId, to: PageId) -> Result<(), EngineError> {
        self.ops.copy_page(&self.layout, from, to)?;
        self.ops.take_error()
    }

    fn accept_tree_path(
        &mut self,
        _seq_id: u64,
        pages: &[PageId],
        start_pos: usize,
        accepted: &[usize],
    ) -> Result<(), EngineError> {
        for (depth, &node) in accepted.iter().enumerate() {
            if node != depth {
                self.ops.move_kv(&self.layout, pages, start_pos + node, start_pos + depth)?;
            }
        }
        self.ops.take_error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpu_and_the_cpu_never_share_a_cache_namespace() {
        let cpu = "0123456789abcdef0123456789abcdef";
        assert_ne!(cuda_fingerprint(cpu, KvDtype::F16), cpu);
        assert_ne!(cuda_fingerprint(cpu, KvDtype::F16), cuda_fingerprint(cpu, KvDtype::Fp8));
        assert_eq!(cuda_fingerprint(cpu, KvDtype::F16).len(), 32);
    }
}
