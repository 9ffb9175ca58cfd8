//! Backends: where forward passes run. Chosen once at startup ([`load_backend`]); the step
//! loop only sees `dyn Backend`. The CPU backend is the reference every other backend is
//! tested against.

pub mod cpu;

use crate::EngineError;
use crate::memory::{KvLayout, PagePtr};
use crate::model::ModelHparams;

/// Which logits a sequence needs from a forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsWanted {
    /// None (a prefill chunk that does not end the prompt).
    None,
    /// Only for the last token of the chunk.
    Last,
    /// For every token of the chunk (verification of drafts).
    All,
}

/// One sequence's share of a forward pass.
pub struct SeqInput<'a> {
    /// Identifies the sequence across passes: backends with per-sequence state (the recurrent
    /// layers of hybrid models) keep it under this id until [`Backend::release_seq`].
    pub seq_id: u64,
    /// New tokens to run; their KV is written into `pages`.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; KV for positions `[0, start_pos)` is already in `pages`.
    pub start_pos: usize,
    /// The sequence's pages, covering at least `start_pos + tokens.len()` positions.
    pub pages: &'a [PagePtr],
    pub logits: LogitsWanted,
    /// `None`: the tokens are a chain (token `j` at position `start_pos + j`). `Some(parents)`:
    /// they are a draft tree to verify. `parents[j]` is the index of token `j`'s parent among
    /// `tokens` (always `< j`), `None` only for token 0, the root (the last accepted token).
    /// Token `j` sits at position `start_pos + depth(j)` and attends to positions
    /// `[0, start_pos)` plus its ancestors; its KV goes to slot `start_pos + j` until
    /// [`Backend::accept_tree_path`] moves the accepted path into place.
    pub tree: Option<&'a [Option<usize>]>,
}

/// Depth of every node of a [`SeqInput::tree`] parents array, or why it is not a valid tree
/// layout (the root first without a parent, every other node's parent earlier).
pub fn tree_depths(parents: &[Option<usize>]) -> Result<Vec<usize>, String> {
    let mut depth = Vec::with_capacity(parents.len());
    for (j, p) in parents.iter().enumerate() {
        match (j, p) {
            (0, None) => depth.push(0),
            (0, Some(_)) => return Err("tree node 0 (the root) has a parent".into()),
            (_, None) => return Err(format!("tree node {j} has no parent")),
            (_, Some(p)) if *p >= j => return Err(format!("tree node {j} has parent {p}, not an earlier node")),
            (_, Some(p)) => depth.push(depth[*p] + 1),
        }
    }
    Ok(depth)
}

impl SeqInput<'_> {
    /// The checks every model makes of sequence `i` of a pass: tokens inside the vocabulary,
    /// positions inside the context, pages covering them, logits only for real tokens.
    pub fn check(&self, i: usize, hp: &ModelHparams, layout: &KvLayout) -> Result<(), EngineError> {
        if let Some(&bad) = self.tokens.iter().find(|&&t| t as usize >= hp.vocab_size) {
            return Err(EngineError::InvalidRequest(format!(
                "sequence {i}: token id {bad} >= vocab {}",
                hp.vocab_size
            )));
        }
        let end = self.start_pos.saturating_add(self.tokens.len());
        if end > hp.context_length {
            return Err(EngineError::InvalidRequest(format!(
                "sequence {i}: position {end} exceeds the context length {}",
                hp.context_length
            )));
        }
        if self.pages.len().saturating_mul(layout.page_tokens) < end {
            return Err(EngineError::Internal(format!(
                "sequence {i}: {} pages of {} tokens do not cover {end} positions",
                self.pages.len(),
                layout.page_tokens
            )));
        }
        if self.tokens.is_empty() && self.logits != LogitsWanted::None {
            return Err(EngineError::Internal(format!("sequence {i}: logits wanted for no tokens")));
        }
        Ok(())
    }
}

/// Several sequences run together: their rows share every weight read.
pub struct ForwardBatch<'a> {
    pub seqs: Vec<SeqInput<'a>>,
}

/// Logits per sequence of the batch, in batch order: empty for `LogitsWanted::None`,
/// `vocab` values for `Last`, `tokens.len() * vocab` (row-major) for `All`.
pub struct ForwardOutput {
    pub logits: Vec<Vec<f32>>,
}

pub trait Backend: Send {
    /// Short name for logs and `Info`, e.g. "cpu".
    fn name(&self) -> &'static str;
    fn hparams(&self) -> &ModelHparams;
    fn kv_layout(&self) -> KvLayout;
    /// Runs the batch, writing each sequence's new KV into its pages.
    fn forward(&mut self, batch: &ForwardBatch<'_>) -> Result<ForwardOutput, EngineError>;

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
        _seq_id: u64,
        pages: &[PagePtr],
        start_pos: usize,
        accepted: &[usize],
    ) -> Result<(), EngineError> {
        let layout = self.kv_layout();
        for (depth, &node) in accepted.iter().enumerate() {
            if node != depth {
                crate::memory::move_kv_position(&layout, pages, start_pos + node, start_pos + depth)?;
            }
        }
        Ok(())
    }
}
