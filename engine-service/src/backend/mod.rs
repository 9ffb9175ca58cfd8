//! Backends: where forward passes run. Chosen once at startup ([`load_backend`]); the step
//! loop only sees `dyn Backend`. The CPU backend is the reference every other backend is
//! tested against.

pub mod cpu;

use crate::EngineError;
use std::sync::Arc;

use crate::memory::{HostPages, KvLayout, PageId};
use engine_models::ModelHparams;

pub use engine_ops::batch::{ForwardBatch, ForwardOutput, LogitsWanted, SeqInput, tree_depths};

pub trait Backend: Send {
    /// Short name for logs and `Info`, e.g. "cpu".
    fn name(&self) -> &'static str;
    fn hparams(&self) -> &ModelHparams;
    fn kv_layout(&self) -> KvLayout;
    /// Runs the batch, writing each sequence's new KV into its pages.
    fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<ForwardOutput, EngineError>;

    /// Makes the pages of `space` usable in passes (the engine's local pool, or one attachment
    /// of the cache-service's arena): the backend maps the memory (on the CPU and on unified
    /// memory the pages are used in place). A pass over pages of a space that is not mapped
    /// fails with an error.
    fn map_pages(&mut self, space: u32, memory: Arc<dyn HostPages>) -> Result<(), EngineError>;
    /// Forgets a space (its session died, or the pool is gone); its pages are unusable after.
    fn unmap_pages(&mut self, space: u32);
    /// Copies one whole page (copy on write of a shared page a sequence will append to).
    fn copy_page(&mut self, from: PageId, to: PageId) -> Result<(), EngineError>;

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
