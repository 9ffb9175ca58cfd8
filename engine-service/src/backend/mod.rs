//! Backends: where forward passes run. Chosen once at startup ([`load_backend`]); the step
//! loop only sees `dyn Backend`. The CPU backend is the reference every other backend is
//! tested against.

pub mod cpu;

use crate::memory::{KvLayout, PagePtr};
use crate::model::ModelHparams;
use crate::EngineError;

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
    /// New tokens to run; their KV is written into `pages`.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`; KV for positions `[0, start_pos)` is already in `pages`.
    pub start_pos: usize,
    /// The sequence's pages, covering at least `start_pos + tokens.len()` positions.
    pub pages: &'a [PagePtr],
    pub logits: LogitsWanted,
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
}
