//! Backends: where forward passes run. Chosen once at startup ([`device::load`]); the step
//! loop only sees `dyn Backend`. The CPU backend is the reference every other backend is
//! tested against.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod device;

use crate::EngineError;
use std::sync::Arc;

use crate::memory::{HostPages, KvLayout, PageId};
use crate::sampling::{Sampler, StepLogprobs, step_logprobs};
use crate::speculative::{Accepted, DraftTree, accept_at};
use engine_models::ModelHparams;

pub use engine_ops::batch::{ForwardBatch, ForwardOutput, LogitsWanted, SeqInput, tree_depths};

/// A row of the last pass's logits: the batch's `seq`-th sequence, its `row`-th wanted row
/// (`LogitsWanted::Last`: row 0; `All`: one row per token or tree node).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogitsRow {
    pub seq: usize,
    pub row: usize,
}

/// A verified draft tree: the accepted walk and, when asked, the log-probabilities of its
/// emitted tokens (all that leaves the backend of a verify step besides the tokens).
#[derive(Clone, Debug, PartialEq)]
pub struct TreeVerdict {
    pub accepted: Accepted,
    pub logprobs: Vec<StepLogprobs>,
}

/// Logits stay in the backend: the step loop runs a pass ([`Backend::run`]) and then asks for
/// tokens ([`Backend::sample`], [`Backend::verify_tree`]) and the log-probabilities a request
/// wants; only those come back. The default operations read the kept rows on the host
/// ([`Backend::kept_logits`]); a device backend overrides them and computes on the device.
pub trait Backend: Send {
    /// Short name for logs and `Info`, e.g. "cpu".
    fn name(&self) -> &'static str;
    fn hparams(&self) -> &ModelHparams;
    fn kv_layout(&self) -> KvLayout;
    /// Runs the batch, writing each sequence's new KV into its pages, and returns every
    /// wanted logits row (to the host: references and benches compare them).
    fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<ForwardOutput, EngineError>;

    /// Runs the batch like [`Backend::forward`] but keeps the logits in the backend, for the
    /// logits operations below, until the next pass.
    fn run(&mut self, batch: &ForwardBatch<'_>) -> Result<(), EngineError>;

    /// The kept logits of the batch's `seq`-th sequence (its wanted rows, `vocab` each), on
    /// the host. What the default logits operations read.
    fn kept_logits(&self, seq: usize) -> Result<&[f32], EngineError>;

    /// Draws the next token from a kept row with the request's sampler (seeded, under its
    /// grammar) and, with `top_n`, its log-probabilities.
    fn sample(
        &mut self,
        at: LogitsRow,
        sampler: &mut Sampler,
        top_n: Option<usize>,
    ) -> Result<(u32, Option<StepLogprobs>), EngineError> {
        host_sample(self.hparams().vocab_size, self.kept_logits(at.seq)?, at, sampler, top_n)
    }

    /// The acceptance walk over a verified tree (the batch's `seq`-th sequence, one kept row
    /// per node) with the request's sampler, and, with `top_n`, the emitted tokens'
    /// log-probabilities.
    fn verify_tree(
        &mut self,
        seq: usize,
        tree: &DraftTree,
        sampler: &mut Sampler,
        top_n: Option<usize>,
    ) -> Result<TreeVerdict, EngineError> {
        host_verify_tree(self.hparams().vocab_size, self.kept_logits(seq)?, tree, sampler, top_n)
    }

    /// Makes the pages of `space` usable in passes (the engine's local pool, or one attachment
    /// of the cache-service's arena): the backend maps the memory (on the CPU and on unified
    /// memory the pages are used in place). A pass over pages of a space that is not mapped
    /// fails with an error.
    fn map_pages(&mut self, space: u32, memory: Arc<dyn HostPages>) -> Result<(), EngineError>;
    /// Forgets a space (its session died, or the pool is gone); its pages are unusable after.
    fn unmap_pages(&mut self, space: u32);
    /// Copies one whole page (copy on write of a shared page a sequence will append to).
    fn copy_page(&mut self, from: PageId, to: PageId) -> Result<(), EngineError>;
    /// Makes the pages' memory (the arena) hold what the passes wrote into them, before they
    /// are committed to the cache. A backend that writes pages in place has nothing to do; one
    /// that keeps device copies (a discrete GPU) copies its newer pages back.
    fn flush_pages(&mut self, _pages: &[PageId]) -> Result<(), EngineError> {
        Ok(())
    }

    /// Bytes of one sequence's recurrent state snapshot (0 for attention-only models).
    fn state_bytes(&self) -> usize {
        0
    }

    /// Writes the sequence's recurrent state, as of its last pass, into `dst`
    /// (`state_bytes()` long).
    fn save_state(&self, _seq_id: u64, _dst: &mut [u8]) -> Result<(), EngineError> {
        Ok(())
    }

    /// Sets the sequence's recurrent state from a snapshot taken by [`Backend::save_state`]
    /// at the position the next pass starts from.
    fn load_state(&mut self, _seq_id: u64, _src: &[u8]) -> Result<(), EngineError> {
        Ok(())
    }

    /// Forgets the sequence's per-sequence state (it finished, failed or was preempted).
    fn release_seq(&mut self, _seq_id: u64) {}

    /// Draft candidates from the model's own MTP head (spec tree-speculative-decoding §1.3):
    /// for the sequence whose committed tokens end just before `root` (the next pass's first
    /// token), the top-`top_k` tokens with log-probabilities at each depth `1..=max_depth`
    /// along the head's greedy chain, stopping before a depth whose greedy path log-probability
    /// is below `min_score`. The backend keeps the head's per-sequence state (its KV and the
    /// target hiddens it has not consumed) from the passes it runs; draft entries never outlive
    /// the call. `None`: no MTP drafting for this sequence now. `max_depth == 0` only asks
    /// whether the backend drafts (and turns on the bookkeeping it needs for later passes).
    #[allow(clippy::type_complexity)]
    fn mtp_draft(
        &mut self,
        _seq_id: u64,
        _root: u32,
        _max_depth: usize,
        _top_k: usize,
        _min_score: f32,
    ) -> Result<Option<Vec<Vec<(u32, f32)>>>, EngineError> {
        Ok(None)
    }

    /// After a tree pass from `start_pos`: keeps the path `accepted` (token indices of that
    /// pass, root first, each the parent of the next). Its KV moves from slot
    /// `start_pos + accepted[d]` to position `start_pos + d`, and the state after its last
    /// node becomes the sequence's state. Everything else of the tree is discarded.
    fn accept_tree_path(
        &mut self,
        seq_id: u64,
        pages: &[PageId],
        start_pos: usize,
        accepted: &[usize],
    ) -> Result<(), EngineError>;
}

/// Row `row` of a sequence's kept logits.
fn kept_row(logits: &[f32], row: usize, vocab: usize) -> Result<&[f32], EngineError> {
    logits
        .get(row * vocab..(row + 1) * vocab)
        .ok_or_else(|| EngineError::Internal(format!("no logits row {row} was kept ({} values)", logits.len())))
}

/// [`Backend::sample`] on a sequence's kept logits on the host (`logits`, `vocab` a row).
pub(crate) fn host_sample(
    vocab: usize,
    logits: &[f32],
    at: LogitsRow,
    sampler: &mut Sampler,
    top_n: Option<usize>,
) -> Result<(u32, Option<StepLogprobs>), EngineError> {
    let row = kept_row(logits, at.row, vocab)?;
    let token = sampler.sample(row);
    Ok((token, top_n.map(|n| step_logprobs(row, token, n))))
}

/// [`Backend::verify_tree`] on a sequence's kept logits on the host.
pub(crate) fn host_verify_tree(
    vocab: usize,
    logits: &[f32],
    tree: &DraftTree,
    sampler: &mut Sampler,
    top_n: Option<usize>,
) -> Result<TreeVerdict, EngineError> {
    if logits.len() < tree.len() * vocab {
        return Err(EngineError::Internal(format!(
            "{} logits for a tree of {} nodes over {vocab} tokens",
            logits.len(),
            tree.len()
        )));
    }
    let accepted = accept_at(tree, logits, vocab, |at, row| {
        let token = sampler.sample(row);
        sampler.note_drafts(tree.children(at).iter().map(|&c| tree.node(c).token));
        token
    });
    let logprobs = match top_n {
        Some(n) => accepted
            .tokens
            .iter()
            .zip(&accepted.path)
            .map(|(&token, &node)| step_logprobs(&logits[node * vocab..(node + 1) * vocab], token, n))
            .collect(),
        None => Vec::new(),
    };
    Ok(TreeVerdict { accepted, logprobs })
}
