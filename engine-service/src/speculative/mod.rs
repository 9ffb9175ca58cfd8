//! Tree speculative decoding: drafters propose continuations of a sequence, merged into one
//! draft tree under one node budget; the target model verifies the whole tree in one forward
//! pass (`SeqInput::tree`); [`accept::accept`] keeps the path the target agrees with plus a
//! bonus token; `Backend::accept_tree_path` moves that path's KV into place.
//!
//! Contract: lossless. Every emitted token is drawn by the sequence's own sampler from the
//! target logits of exactly its prefix (tree rows are bitwise the rows plain decoding would
//! compute), so greedy output is token-for-token the plain output and seeded sampling is
//! draw-for-draw the plain sampling. Drafts only change how many tokens one pass yields.
//!
//! Drafters implement [`Drafter`]: given the committed context (prompt + generated, the last
//! token being the root) they return scored [`tree::Branch`]es. The suffix drafter works for
//! every model; a model-specific drafter (an MTP head) plugs in the same way, keeping its own
//! per-sequence state keyed by `seq_id`.

pub mod accept;
pub mod adapt;
pub mod mtp;
pub mod runtime;
pub mod suffix;
pub mod tree;

#[cfg(test)]
mod stats_tests;

use std::str::FromStr;

pub use accept::{Accepted, accept, accept_at, accept_with};
pub use adapt::SeqSpecState;
pub use runtime::{DraftRoom, SeqRef, SpecRuntime};
pub use suffix::{SuffixDrafter, SuffixParams};
pub use tree::{Branch, DraftTree, DrafterId};

/// What a drafter is asked for.
pub struct DraftRequest<'a> {
    /// The sequence (drafters with per-sequence state key it by this).
    pub seq_id: u64,
    /// Its cache salt: drafters that learn across requests never mix salts.
    pub salt: &'a str,
    /// Committed tokens: prompt + generated; the last one is the tree's root.
    pub context: &'a [u32],
    /// Deepest draft wanted (tokens after the root).
    pub max_depth: usize,
    /// Candidates per tree node wanted.
    pub top_k: usize,
}

/// A source of draft branches.
pub trait Drafter: Send {
    /// Short name for metrics labels and logs ("suffix", "mtp").
    fn name(&self) -> &'static str;
    /// Appends branches continuing `req.context` to `out`; nothing when it has no idea.
    fn propose(&mut self, req: &DraftRequest<'_>, out: &mut Vec<Branch>);
    /// The sequence is gone: drop any state kept for it.
    fn release(&mut self, _seq_id: u64) {}
    /// A sequence of this salt finished normally with `tokens` (prompt of `prompt_len`, then
    /// its output): drafters that learn across requests remember it.
    fn finished(&mut self, _salt: &str, _tokens: &[u32], _prompt_len: usize) {}
    /// Drafters fed by the backend's MTP head: where the step loop stages their candidates.
    fn mtp_inbox(&self) -> Option<mtp::MtpInbox> {
        None
    }
}

/// Which drafters build the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrafterKind {
    Suffix,
    /// The model's MTP head (`Backend::mtp_draft`; nothing drafted on models without one).
    Mtp,
    /// Both, merged into one tree.
    MtpSuffix,
}

impl FromStr for DrafterKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "suffix" | "ngram" => Ok(DrafterKind::Suffix),
            "mtp" => Ok(DrafterKind::Mtp),
            "mtp+suffix" | "suffix+mtp" => Ok(DrafterKind::MtpSuffix),
            other => Err(format!("unknown drafter {other:?} (known: suffix, mtp, mtp+suffix)")),
        }
    }
}

/// Tree shape: depth, fan-out, node budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeShape {
    /// D: deepest draft token below the root.
    pub max_depth: usize,
    /// k: candidates per node.
    pub top_k: usize,
    /// N: nodes verified per pass, root included.
    pub max_nodes: usize,
}

impl TreeShape {
    /// The seed runtime's configuration: 8 draft steps, top-2 per depth, 16 verified nodes.
    pub const SEED: TreeShape = TreeShape { max_depth: 8, top_k: 2, max_nodes: 16 };

    /// Largest accepted tree the verification pass allows.
    pub const MAX_NODES: usize = 64;
    /// Deepest draft: a chain of `MAX_NODES` nodes below nothing but the root.
    pub const MAX_DEPTH: usize = Self::MAX_NODES - 1;
    /// Most candidates per node; wider fans spend the node budget on the first depths.
    pub const MAX_TOP_K: usize = 8;

    /// The bounds a server setting and a request's override share.
    pub fn validate(&self) -> Result<(), String> {
        let ok = (1..=Self::MAX_DEPTH).contains(&self.max_depth)
            && (1..=Self::MAX_TOP_K).contains(&self.top_k)
            && (2..=Self::MAX_NODES).contains(&self.max_nodes);
        if !ok {
            return Err(format!(
                "speculation shape D={} k={} N={}: need 1 <= D <= {}, 1 <= k <= {}, 2 <= N <= {}",
                self.max_depth,
                self.top_k,
                self.max_nodes,
                Self::MAX_DEPTH,
                Self::MAX_TOP_K,
                Self::MAX_NODES
            ));
        }
        Ok(())
    }
}

/// Server-wide speculation settings (`[engine]` keys `speculation*`).
#[derive(Clone, Debug, PartialEq)]
pub struct SpecConfig {
    pub enabled: bool,
    pub drafter: DrafterKind,
    pub shape: TreeShape,
    /// No speculation while more sequences than this are decoding: the batch already uses
    /// the weights it reads, and verify rows would cost more than they save.
    pub max_batch: usize,
    /// Draft nodes whose path probability (by the drafters' scores) is below this are not
    /// verified: a verify row costs a fraction of a decode step (about 0.5 on a 2-core CPU),
    /// so a node must be at least that likely to be accepted to pay for itself.
    pub min_node_prob: f32,
    pub suffix: SuffixParams,
    /// Whether the backend verifies draft trees (every backend here does, the hybrid Qwen3.6
    /// included); when false nothing speculates, whatever a request asks.
    pub trees_supported: bool,
}

impl Default for SpecConfig {
    fn default() -> Self {
        SpecConfig {
            enabled: true,
            drafter: DrafterKind::Suffix,
            shape: TreeShape::SEED,
            max_batch: 4,
            min_node_prob: 0.5,
            suffix: SuffixParams::default(),
            trees_supported: true,
        }
    }
}

/// A request's override of the server settings (proto `SpeculationParams`): `None` fields
/// keep the server's value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecOverride {
    pub enabled: Option<bool>,
    pub max_depth: Option<usize>,
    pub top_k: Option<usize>,
    pub max_nodes: Option<usize>,
}

impl SpecOverride {
    /// A request's `GenerateRequest.speculation`; zero fields keep the server's value.
    pub fn from_proto(p: &proto::engine::v1::SpeculationParams) -> SpecOverride {
        use proto::engine::v1::SpeculationMode;
        let nonzero = |v: u32| (v > 0).then_some(v as usize);
        SpecOverride {
            enabled: match SpeculationMode::try_from(p.mode) {
                Ok(SpeculationMode::On) => Some(true),
                Ok(SpeculationMode::Off) => Some(false),
                _ => None,
            },
            max_depth: nonzero(p.max_depth),
            top_k: nonzero(p.top_k),
            max_nodes: nonzero(p.max_nodes),
        }
    }

    /// The effective settings for one sequence: `None` means no speculation.
    pub fn apply(&self, cfg: &SpecConfig) -> Option<TreeShape> {
        if !self.enabled.unwrap_or(cfg.enabled) {
            return None;
        }
        let s = TreeShape {
            max_depth: self.max_depth.unwrap_or(cfg.shape.max_depth).clamp(1, TreeShape::MAX_DEPTH),
            top_k: self.top_k.unwrap_or(cfg.shape.top_k).clamp(1, TreeShape::MAX_TOP_K),
            max_nodes: self.max_nodes.unwrap_or(cfg.shape.max_nodes).clamp(2, TreeShape::MAX_NODES),
        };
        Some(s)
    }
}

/// The drafters of one engine, in merge order (index = [`DrafterId`]).
pub struct DrafterSet {
    drafters: Vec<Box<dyn Drafter>>,
    branches: Vec<Branch>,
}

impl DrafterSet {
    pub fn new(drafters: Vec<Box<dyn Drafter>>) -> DrafterSet {
        DrafterSet { drafters, branches: Vec::new() }
    }

    /// The drafters `cfg` names.
    pub fn from_config(cfg: &SpecConfig) -> DrafterSet {
        let mut set: Vec<Box<dyn Drafter>> = Vec::new();
        if matches!(cfg.drafter, DrafterKind::Mtp | DrafterKind::MtpSuffix) {
            set.push(Box::new(mtp::MtpDrafter::new()));
        }
        if matches!(cfg.drafter, DrafterKind::Suffix | DrafterKind::MtpSuffix) {
            set.push(Box::new(SuffixDrafter::new(cfg.suffix.clone())));
        }
        DrafterSet::new(set)
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.drafters.iter().map(|d| d.name()).collect()
    }

    pub fn name(&self, id: DrafterId) -> &'static str {
        self.drafters.get(id as usize).map_or("unknown", |d| d.name())
    }

    /// Every drafter's branches merged under the root `context.last()`, pruned to the node
    /// budget and to nodes scoring at least `min_score`. A context without tokens gives an
    /// empty request (root 0, nothing drafted).
    pub fn draft(&mut self, seq_id: u64, salt: &str, context: &[u32], shape: &TreeShape, min_score: f32) -> DraftTree {
        let Some(&root) = context.last() else { return DraftTree::new(0) };
        let mut tree = DraftTree::new(root);
        let req = DraftRequest { seq_id, salt, context, max_depth: shape.max_depth, top_k: shape.top_k };
        for (id, d) in self.drafters.iter_mut().enumerate() {
            self.branches.clear();
            d.propose(&req, &mut self.branches);
            for b in &self.branches {
                tree.insert(b, id as DrafterId, shape.max_depth);
            }
        }
        tree.pruned_above(shape.max_nodes, min_score)
    }

    pub fn release(&mut self, seq_id: u64) {
        for d in &mut self.drafters {
            d.release(seq_id);
        }
    }

    pub fn finished(&mut self, salt: &str, tokens: &[u32], prompt_len: usize) {
        for d in &mut self.drafters {
            d.finished(salt, tokens, prompt_len);
        }
    }
}

/// Metric names (`edge_engine_spec_*`).
pub mod metric {
    /// Verification rounds run with at least one draft token (counter).
    pub const DRAFTS_TOTAL: &str = "edge_engine_spec_drafts_total";
    /// Draft tokens verified, by `drafter` (counter).
    pub const DRAFT_TOKENS_TOTAL: &str = "edge_engine_spec_draft_tokens_total";
    /// Draft tokens accepted, by `drafter` (counter).
    pub const ACCEPTED_TOKENS_TOTAL: &str = "edge_engine_spec_accepted_tokens_total";
    /// Accepted draft tokens per verification round (histogram; the round emits one more).
    pub const ACCEPTED_LENGTH: &str = "edge_engine_spec_accepted_length_tokens";
    /// Nodes verified per round, root included (histogram): the tree sizes the verify cost
    /// depends on.
    pub const TREE_NODES: &str = "edge_engine_spec_tree_nodes";
    /// Draft nodes verified at each `depth` (counter) and accepted at each `depth` (counter):
    /// their ratio is the per-depth acceptance.
    pub const DRAFTED_BY_DEPTH: &str = "edge_engine_spec_drafted_by_depth_total";
    pub const ACCEPTED_BY_DEPTH: &str = "edge_engine_spec_accepted_by_depth_total";
    /// Time building draft trees, in the forward pass of steps that verify trees, and
    /// accepting + committing (histograms).
    pub const DRAFT_SECONDS: &str = "edge_engine_spec_draft_seconds";
    pub const VERIFY_SECONDS: &str = "edge_engine_spec_verify_seconds";
    pub const COMMIT_SECONDS: &str = "edge_engine_spec_commit_seconds";

    pub fn describe() {
        use metrics::{Unit, describe_counter, describe_histogram};
        describe_counter!(DRAFTS_TOTAL, Unit::Count, "Speculative verification rounds with drafts");
        describe_counter!(DRAFT_TOKENS_TOTAL, Unit::Count, "Draft tokens verified, by drafter");
        describe_counter!(ACCEPTED_TOKENS_TOTAL, Unit::Count, "Draft tokens accepted, by drafter");
        describe_histogram!(ACCEPTED_LENGTH, Unit::Count, "Accepted draft tokens per verification round");
        describe_histogram!(TREE_NODES, Unit::Count, "Draft tree nodes verified per round, root included");
        describe_counter!(DRAFTED_BY_DEPTH, Unit::Count, "Draft nodes verified, by tree depth");
        describe_counter!(ACCEPTED_BY_DEPTH, Unit::Count, "Draft nodes accepted, by tree depth");
        describe_histogram!(DRAFT_SECONDS, Unit::Seconds, "Time spent building draft trees per step");
        describe_histogram!(VERIFY_SECONDS, Unit::Seconds, "Forward time of steps that verify draft trees");
        describe_histogram!(COMMIT_SECONDS, Unit::Seconds, "Acceptance and KV commit time per step");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_fill_from_the_server_config_and_clamp() {
        let cfg = SpecConfig::default();
        assert_eq!(SpecOverride::default().apply(&cfg), Some(TreeShape::SEED));
        let off = SpecOverride { enabled: Some(false), ..Default::default() };
        assert_eq!(off.apply(&cfg), None);
        let cfg_off = SpecConfig { enabled: false, ..SpecConfig::default() };
        assert_eq!(SpecOverride::default().apply(&cfg_off), None);
        let on = SpecOverride { enabled: Some(true), max_depth: Some(3), top_k: Some(1), max_nodes: Some(1000) };
        assert_eq!(on.apply(&cfg_off), Some(TreeShape { max_depth: 3, top_k: 1, max_nodes: TreeShape::MAX_NODES }));
        assert!(TreeShape::SEED.validate().is_ok());
        assert!(TreeShape { max_depth: 0, ..TreeShape::SEED }.validate().is_err());
        assert!(TreeShape { max_nodes: 1, ..TreeShape::SEED }.validate().is_err());
        assert_eq!("suffix".parse::<DrafterKind>(), Ok(DrafterKind::Suffix));
        use proto::engine::v1::{SpeculationMode, SpeculationParams};
        let wire = SpeculationParams { mode: SpeculationMode::On as i32, max_depth: 4, top_k: 0, max_nodes: 6 };
        let o = SpecOverride::from_proto(&wire);
        assert_eq!(o, SpecOverride { enabled: Some(true), max_depth: Some(4), top_k: None, max_nodes: Some(6) });
        assert_eq!(o.apply(&cfg_off), Some(TreeShape { max_depth: 4, top_k: 2, max_nodes: 6 }));
        let off = SpeculationParams { mode: SpeculationMode::Off as i32, ..Default::default() };
        assert_eq!(SpecOverride::from_proto(&off).apply(&cfg), None);
        assert_eq!(SpecOverride::from_proto(&SpeculationParams::default()), SpecOverride::default());
        assert_eq!("mtp+suffix".parse::<DrafterKind>(), Ok(DrafterKind::MtpSuffix));
        assert!("eagle".parse::<DrafterKind>().is_err());
    }

    /// A fixed-proposal drafter, to test merging.
    struct Fixed(&'static str, Vec<Branch>);
    impl Drafter for Fixed {
        fn name(&self) -> &'static str {
            self.0
        }
        fn propose(&mut self, _req: &DraftRequest<'_>, out: &mut Vec<Branch>) {
            out.extend(self.1.iter().cloned());
        }
    }

    #[test]
    fn branches_of_several_drafters_share_one_tree_and_one_budget() {
        let a = Fixed("a", vec![Branch::uniform(vec![1, 2, 3, 4], -0.1)]);
        let b = Fixed("b", vec![Branch::uniform(vec![1, 2, 9], -0.05), Branch::uniform(vec![7], -2.0)]);
        let mut set = DrafterSet::new(vec![Box::new(a), Box::new(b)]);
        assert_eq!(set.names(), vec!["a", "b"]);
        let shape = TreeShape { max_depth: 8, top_k: 2, max_nodes: 6 };
        let t = set.draft(1, "", &[5, 6, 0], &shape, f32::NEG_INFINITY);
        assert_eq!(t.len(), 6);
        assert_eq!(t.node(0).token, 0);
        // Shared prefix 1 2 credited to the better drafter (b), then 9 (b) and 3 (a), 4 (a);
        // 7 (score -2) does not fit.
        let toks = t.tokens();
        assert!(!toks.contains(&7), "{toks:?}");
        assert_eq!(t.node(1).source, 1);
        assert_eq!(set.name(t.node(t.child_with_token(0, 1).unwrap()).source), "b");
        let shallow = set.draft(1, "", &[0], &TreeShape { max_depth: 1, top_k: 2, max_nodes: 16 }, f32::NEG_INFINITY);
        assert_eq!(shallow.tokens(), vec![0, 1, 7]);
        let likely = set.draft(1, "", &[0], &TreeShape { max_depth: 1, top_k: 2, max_nodes: 16 }, -1.0);
        assert_eq!(likely.tokens(), vec![0, 1]);
        assert_eq!(set.draft(1, "", &[], &shape, f32::NEG_INFINITY).len(), 1);
    }
}
