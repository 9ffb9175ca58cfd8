//! A forward pass's inputs and outputs: which tokens of which sequences, over which pages,
//! wanting which logits.

use crate::EngineError;
use crate::ModelHparams;
use crate::kv::{KvLayout, PageId};

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
    pub pages: &'a [PageId],
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
