//! The step loop's speculation state: server settings, drafters, per-sequence controllers,
//! and the metrics of each verification round.
//!
//! Contract: [`SpecRuntime::draft`] returns a draft tree for a decoding sequence, or `None`
//! when this step should be a plain decode (speculation off for the server, the request or
//! the batch size; paused by the sequence's controller; no room; nothing drafted).
//! The tree respects every limit the caller passes, so verifying it never writes past the
//! context or the step's token budget. [`SpecRuntime::record`] feeds the controller and the
//! `edge_engine_spec_*` metrics; [`SpecRuntime::release`] forgets a sequence.

use std::collections::HashMap;
use std::time::Duration;

use super::adapt::SeqSpecState;
use super::metric as mt;
use super::{Accepted, DraftTree, DrafterSet, SpecConfig, SpecOverride, TreeShape};

/// Limits on one sequence's tree this step.
#[derive(Clone, Copy, Debug)]
pub struct DraftRoom {
    /// Tokens the sequence may still emit (max_tokens, context); the tree's depth stays below.
    pub emit_left: usize,
    /// Tree nodes that fit: KV slots left in the context and the step's token budget.
    pub nodes_left: usize,
}

pub struct SpecRuntime {
    cfg: SpecConfig,
    drafters: DrafterSet,
    /// Per sequence: its controller, or `None` when speculation is off for it.
    states: HashMap<u64, Option<SeqSpecState>>,
}

impl SpecRuntime {
    pub fn new(cfg: SpecConfig) -> SpecRuntime {
        let drafters = DrafterSet::from_config(&cfg);
        if cfg.enabled && !cfg.trees_supported {
            tracing::info!("speculative decoding off: this model's backend does not verify draft trees");
        } else if cfg.enabled {
            tracing::info!(
                drafters = ?drafters.names(),
                max_depth = cfg.shape.max_depth,
                top_k = cfg.shape.top_k,
                max_nodes = cfg.shape.max_nodes,
                max_batch = cfg.max_batch,
                "speculative decoding on"
            );
        }
        mt::describe();
        SpecRuntime { cfg, drafters, states: HashMap::new() }
    }

    /// Speculation off for every request that does not ask for it.
    pub fn disabled() -> SpecRuntime {
        SpecRuntime::new(SpecConfig { enabled: false, ..SpecConfig::default() })
    }

    pub fn config(&self) -> &SpecConfig {
        &self.cfg
    }

    /// Whether any sequence may speculate with `n_decoding` sequences decoding this step.
    pub fn batch_allows(&self, n_decoding: usize) -> bool {
        n_decoding <= self.cfg.max_batch
    }

    /// A draft tree for the sequence's next step (see the module contract). `context` is the
    /// sequence's tokens (the last one is the root); `over` its request's override.
    pub fn draft(&mut self, seq: SeqRef<'_>, over: &SpecOverride, room: DraftRoom) -> Option<DraftTree> {
        self.draft_using(seq, over, room, None)
    }

    /// [`SpecRuntime::draft`] that first asks `backend` for MTP drafts when a drafter takes
    /// them (`Backend::mtp_draft`, staged through [`super::mtp::MtpInbox`]).
    pub fn draft_using(
        &mut self,
        seq: SeqRef<'_>,
        over: &SpecOverride,
        room: DraftRoom,
        backend: Option<&mut dyn crate::backend::Backend>,
    ) -> Option<DraftTree> {
        let (seq_id, context) = (seq.seq_id, seq.tokens);
        let cfg = &self.cfg;
        if !cfg.trees_supported {
            return None;
        }
        let state = self.states.entry(seq_id).or_insert_with(|| over.apply(cfg).map(SeqSpecState::new));
        let shape = state.as_mut()?.shape_now()?;
        let shape = TreeShape {
            max_depth: shape.max_depth.min(room.emit_left.saturating_sub(1)),
            max_nodes: shape.max_nodes.min(room.nodes_left),
            ..shape
        };
        if shape.max_depth == 0 || shape.max_nodes < 2 {
            return None;
        }
        let started = std::time::Instant::now();
        let min_score = self.cfg.min_node_prob.clamp(0.0, 1.0).ln();
        let asked_mtp = match (backend, self.drafters.mtp_inbox(), context.last()) {
            (Some(b), Some(inbox), Some(&root)) => {
                inbox.fetch(b, seq_id, root, &shape, min_score);
                true
            }
            _ => false,
        };
        let tree = self.drafters.draft(seq_id, seq.salt, context, &shape, min_score);
        metrics::histogram!(mt::DRAFT_SECONDS).record(started.elapsed().as_secs_f64());
        if asked_mtp && tree.len() == 1 {
            // Unlike a suffix miss, an MTP call costs a head pass even when it drafts nothing:
            // count it as a failed round, so a head that keeps missing gets paused.
            if let Some(Some(state)) = self.states.get_mut(&seq_id) {
                state.record(1, 0);
            }
        }
        (tree.len() > 1).then_some(tree)
    }

    /// Records a verified tree and what was accepted (before any stop rule cut it).
    pub fn record(&mut self, seq_id: u64, tree: &DraftTree, accepted: &Accepted) {
        let drafted = tree.len() - 1;
        let n_acc = accepted.accepted_drafts();
        tracing::debug!(seq_id, nodes = tree.len(), depth = tree.max_depth(), accepted = n_acc, "verified draft tree");
        if let Some(Some(state)) = self.states.get_mut(&seq_id) {
            state.record(drafted, n_acc);
        }
        metrics::counter!(mt::DRAFTS_TOTAL).increment(1);
        metrics::histogram!(mt::ACCEPTED_LENGTH).record(n_acc as f64);
        metrics::histogram!(mt::TREE_NODES).record(tree.len() as f64);
        for n in &tree.nodes()[1..] {
            let name = self.drafters.name(n.source);
            metrics::counter!(mt::DRAFT_TOKENS_TOTAL, "drafter" => name).increment(1);
            metrics::counter!(mt::DRAFTED_BY_DEPTH, "depth" => depth_label(n.depth)).increment(1);
        }
        for &i in &accepted.path[1..] {
            let n = tree.node(i);
            let name = self.drafters.name(n.source);
            metrics::counter!(mt::ACCEPTED_TOKENS_TOTAL, "drafter" => name).increment(1);
            metrics::counter!(mt::ACCEPTED_BY_DEPTH, "depth" => depth_label(n.depth)).increment(1);
        }
    }

    pub fn record_times(verify: Duration, commit: Duration) {
        metrics::histogram!(mt::VERIFY_SECONDS).record(verify.as_secs_f64());
        metrics::histogram!(mt::COMMIT_SECONDS).record(commit.as_secs_f64());
    }

    pub fn release(&mut self, seq_id: u64) {
        self.states.remove(&seq_id);
        self.drafters.release(seq_id);
    }

    /// A sequence finished normally: cross-request drafters learn its output.
    pub fn finished(&mut self, seq: SeqRef<'_>, prompt_len: usize) {
        if self.cfg.trees_supported {
            self.drafters.finished(seq.salt, seq.tokens, prompt_len);
        }
    }
}

/// What the runtime needs to know of a sequence.
#[derive(Clone, Copy)]
pub struct SeqRef<'a> {
    pub seq_id: u64,
    pub salt: &'a str,
    /// Prompt + generated tokens.
    pub tokens: &'a [u32],
}

/// Bounded label values: depths above 16 share one.
fn depth_label(depth: usize) -> &'static str {
    const LABELS: [&str; 17] =
        ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16"];
    LABELS.get(depth).copied().unwrap_or("17+")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(seq_id: u64, tokens: &[u32]) -> SeqRef<'_> {
        SeqRef { seq_id, salt: "", tokens }
    }

    fn repeating() -> Vec<u32> {
        let mut v: Vec<u32> = (100..140).collect();
        v.extend(100..110);
        v
    }

    #[test]
    fn trees_respect_the_room_and_the_switches() {
        let mut rt = SpecRuntime::new(SpecConfig::default());
        let ctx = repeating();
        let room = DraftRoom { emit_left: 100, nodes_left: 100 };
        let t = rt.draft(r(1, &ctx), &SpecOverride::default(), room).expect("a repeat is drafted");
        assert_eq!(t.tokens()[..4], [109, 110, 111, 112]);
        assert!(t.len() <= TreeShape::SEED.max_nodes && t.max_depth() <= TreeShape::SEED.max_depth);
        let small =
            rt.draft(r(2, &ctx), &SpecOverride::default(), DraftRoom { emit_left: 3, nodes_left: 100 }).unwrap();
        assert_eq!(small.max_depth(), 2, "depth stays below the tokens left to emit");
        let narrow =
            rt.draft(r(3, &ctx), &SpecOverride::default(), DraftRoom { emit_left: 100, nodes_left: 3 }).unwrap();
        assert_eq!(narrow.len(), 3);
        assert!(rt.draft(r(4, &ctx), &SpecOverride::default(), DraftRoom { emit_left: 1, nodes_left: 100 }).is_none());
        let off = SpecOverride { enabled: Some(false), ..Default::default() };
        assert!(rt.draft(r(5, &ctx), &off, room).is_none());
        assert!(rt.draft(r(6, &[1, 2, 3]), &SpecOverride::default(), room).is_none(), "nothing to draft");
        let mut rt_off = SpecRuntime::disabled();
        assert!(rt_off.draft(r(1, &ctx), &SpecOverride::default(), room).is_none());
        let on = SpecOverride { enabled: Some(true), max_depth: Some(2), ..Default::default() };
        assert_eq!(rt_off.draft(r(2, &ctx), &on, room).map(|t| t.max_depth()), Some(2));
        assert!(rt.batch_allows(4) && !rt.batch_allows(5));
        let mut no_trees = SpecRuntime::new(SpecConfig { trees_supported: false, ..SpecConfig::default() });
        let on = SpecOverride { enabled: Some(true), ..Default::default() };
        assert!(no_trees.draft(r(1, &ctx), &on, room).is_none(), "a backend without tree passes never speculates");
        rt.release(1);
        assert!(!rt.states.contains_key(&1));
    }
}
