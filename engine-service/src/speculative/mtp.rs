//! The MTP drafter: branches from the target model's own multi-token-prediction head
//! (Qwen3.5 / Qwen3.6), merged into the draft tree with every other drafter's.
//!
//! Contract: the backend owns the head and its per-sequence state
//! (`Backend::mtp_draft`), since only it sees the target's hidden states; it answers with the
//! top-k candidates and log-probabilities of each depth along the head's greedy chain. Drafters
//! never see the backend, so the step loop asks it through [`MtpInbox::fetch`] just before the
//! sequence's tree is built; the fetched candidates become branches ([`ddtree_branches`]) that
//! [`MtpDrafter::propose`] hands to the tree, once, for that sequence and root only.
//!
//! Tree shape (spec tree-speculative-decoding §1.3, "DDTree"): best-first growth of the implicit
//! tree in which every node at depth `d` has the depth-`d + 1` candidates as children, a node's
//! score being its path's summed log-probabilities; the `max_nodes` best nodes (root included)
//! are prefix-closed, and each leaf's path becomes one branch. With `k = 1` this is the greedy
//! chain. The candidate lists are computed once, on the greedy prefix, so off-chain children
//! are approximations: that only changes what is accepted, never what is emitted.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use super::{Branch, DraftRequest, Drafter, DrafterSet, TreeShape};
use crate::backend::Backend;

/// Per-depth candidates from `Backend::mtp_draft`: `cands[d - 1]` = `(token, log-prob)` of
/// depth `d`, best first.
pub type Candidates = [Vec<(u32, f32)>];

/// Best-first frontier entry of [`ddtree_branches`]: higher score, then lower parent index,
/// then lower slot (spec §1.3 tie-break).
#[derive(PartialEq)]
struct Child {
    score: f32,
    parent: usize,
    slot: usize,
}

impl Eq for Child {}

impl Ord for Child {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then(other.parent.cmp(&self.parent)).then(other.slot.cmp(&self.slot))
    }
}

impl PartialOrd for Child {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The DDTree of `cands` with at most `max_nodes` nodes (root included), as one branch per
/// leaf (see the module contract). Candidates with non-finite log-probabilities are skipped.
pub fn ddtree_branches(cands: &Candidates, max_nodes: usize) -> Vec<Branch> {
    let lists: Vec<Vec<(u32, f32)>> =
        cands.iter().map(|l| l.iter().copied().filter(|c| c.1.is_finite()).collect()).collect();
    // Nodes: (parent, depth, token, log-prob, score); node 0 is the root.
    let mut nodes: Vec<(usize, usize, u32, f32, f32)> = vec![(0, 0, 0, 0.0, 0.0)];
    let mut has_child = vec![false];
    let mut heap = BinaryHeap::new();
    let offer = |heap: &mut BinaryHeap<Child>, parent: usize, depth: usize, score: f32, slot: usize| {
        if let Some(&(_, lp)) = lists.get(depth).and_then(|l| l.get(slot)) {
            heap.push(Child { score: score + lp, parent, slot });
        }
    };
    offer(&mut heap, 0, 0, 0.0, 0);
    while nodes.len() < max_nodes {
        let Some(c) = heap.pop() else { break };
        let (_, pdepth, _, _, pscore) = nodes[c.parent];
        let (token, lp) = lists[pdepth][c.slot];
        nodes.push((c.parent, pdepth + 1, token, lp, c.score));
        has_child.push(false);
        has_child[c.parent] = true;
        let me = nodes.len() - 1;
        // The parent's next candidate, and this node's first child.
        offer(&mut heap, c.parent, pdepth, pscore, c.slot + 1);
        offer(&mut heap, me, pdepth + 1, c.score, 0);
    }
    let mut out = Vec::new();
    for leaf in (1..nodes.len()).filter(|&i| !has_child[i]) {
        let (mut tokens, mut log_probs) = (Vec::new(), Vec::new());
        let mut at = leaf;
        while at != 0 {
            let (parent, _, token, lp, _) = nodes[at];
            tokens.push(token);
            log_probs.push(lp);
            at = parent;
        }
        tokens.reverse();
        log_probs.reverse();
        out.push(Branch { tokens, log_probs });
    }
    out
}

type Staged = HashMap<u64, (u32, Vec<Branch>)>;

/// The step loop's handle on the MTP drafter's staged branches.
#[derive(Clone, Default)]
pub struct MtpInbox(Arc<Mutex<Staged>>);

impl MtpInbox {
    /// Asks the backend's MTP head for `seq_id`'s drafts under `root` with the tree `shape`
    /// (nodes whose path log-probability is below `min_score` are not worth drafting) and
    /// stages them for the next [`MtpDrafter::propose`]. A backend error only costs drafts.
    pub fn fetch(&self, backend: &mut dyn Backend, seq_id: u64, root: u32, shape: &TreeShape, min_score: f32) {
        let cands = match backend.mtp_draft(seq_id, root, shape.max_depth, shape.top_k, min_score) {
            Ok(Some(c)) => c,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(seq_id, error = %e, "MTP drafting failed; drafting without it");
                return;
            }
        };
        let branches = ddtree_branches(&cands, shape.max_nodes);
        self.0.lock().unwrap_or_else(PoisonError::into_inner).insert(seq_id, (root, branches));
    }
}

/// Proposes the branches [`MtpInbox::fetch`] staged for the sequence (nothing otherwise).
#[derive(Default)]
pub struct MtpDrafter {
    inbox: MtpInbox,
}

impl MtpDrafter {
    pub fn new() -> MtpDrafter {
        MtpDrafter::default()
    }

    /// The handle that stages branches for this drafter.
    pub fn inbox(&self) -> MtpInbox {
        self.inbox.clone()
    }
}

impl Drafter for MtpDrafter {
    fn name(&self) -> &'static str {
        "mtp"
    }

    fn propose(&mut self, req: &DraftRequest<'_>, out: &mut Vec<Branch>) {
        let staged = self.inbox.0.lock().unwrap_or_else(PoisonError::into_inner).remove(&req.seq_id);
        // Branches drafted under another root (a stale fetch) continue nothing.
        if let Some((_, branches)) = staged.filter(|(root, _)| req.context.last() == Some(root)) {
            out.extend(branches);
        }
    }

    fn release(&mut self, seq_id: u64) {
        self.inbox.0.lock().unwrap_or_else(PoisonError::into_inner).remove(&seq_id);
    }

    fn mtp_inbox(&self) -> Option<MtpInbox> {
        Some(self.inbox())
    }
}

impl DrafterSet {
    /// The inbox of the set's MTP drafter, if it has one.
    pub fn mtp_inbox(&self) -> Option<MtpInbox> {
        self.drafters.iter().find_map(|d| d.mtp_inbox())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::speculative::DraftTree;

    fn tree_of(branches: &[Branch], root: u32) -> DraftTree {
        let mut t = DraftTree::new(root);
        for b in branches {
            t.insert(b, 0, 64);
        }
        t
    }

    /// Brute force: every node of the implicit k-ary tree of depth D with its score.
    fn all_scores(cands: &Candidates) -> Vec<f32> {
        let mut out = Vec::new();
        let mut frontier = vec![0.0f32];
        for list in cands {
            let mut next = Vec::new();
            for &s in &frontier {
                for &(_, lp) in list {
                    next.push(s + lp);
                }
            }
            out.extend(&next);
            frontier = next;
        }
        out
    }

    #[test]
    fn k1_is_the_greedy_chain_and_budget_limits_depth() {
        let cands = vec![vec![(5, -0.1)], vec![(6, -0.2)], vec![(7, -0.3)]];
        let b = ddtree_branches(&cands, 16);
        assert_eq!(b, vec![Branch { tokens: vec![5, 6, 7], log_probs: vec![-0.1, -0.2, -0.3] }]);
        let b = ddtree_branches(&cands, 3);
        assert_eq!(b[0].tokens, vec![5, 6]);
        assert!(ddtree_branches(&cands, 1).is_empty());
        assert!(ddtree_branches(&[], 16).is_empty());
    }

    #[test]
    fn ddtree_keeps_the_best_scoring_prefix_closed_nodes() {
        let mut x = 0x2545_f491u64;
        let mut rnd = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for _ in 0..100 {
            let (d, k) = (1 + rnd(5) as usize, 1 + rnd(3) as usize);
            let cands: Vec<Vec<(u32, f32)>> = (0..d)
                .map(|_| {
                    let mut lps: Vec<f32> = (0..k).map(|_| -((1 + rnd(400)) as f32) / 100.0).collect();
                    lps.sort_by(|a, b| b.total_cmp(a));
                    lps.into_iter().enumerate().map(|(i, lp)| (10 + i as u32, lp)).collect()
                })
                .collect();
            let n = 2 + rnd(20) as usize;
            let t = tree_of(&ddtree_branches(&cands, n), 1);
            let mut all = all_scores(&cands);
            all.sort_by(|a, b| b.total_cmp(a));
            let want = (n - 1).min(all.len());
            assert_eq!(t.len() - 1, want, "d={d} k={k} n={n}");
            let mut got: Vec<f32> = t.nodes()[1..].iter().map(|n| n.score).collect();
            got.sort_by(|a, b| b.total_cmp(a));
            for (g, w) in got.iter().zip(&all) {
                assert!((g - w).abs() < 1e-4, "kept scores are the top ones: {got:?} vs {all:?}");
            }
            for (i, node) in t.nodes().iter().enumerate().skip(1) {
                assert!(node.depth <= d && t.children(i).len() <= k);
                let slot = (node.token - 10) as usize;
                assert!((node.score - t.node(node.parent.unwrap()).score - cands[node.depth - 1][slot].1).abs() < 1e-4);
            }
        }
    }

    #[test]
    fn staged_branches_go_to_their_sequence_and_root_once() {
        let mut d = MtpDrafter::new();
        let inbox = d.inbox();
        inbox.0.lock().unwrap().insert(7, (3, vec![Branch::uniform(vec![4, 5], -0.1)]));
        let req = |seq_id, context: &'static [u32]| DraftRequest { seq_id, salt: "", context, max_depth: 8, top_k: 2 };
        let mut out = Vec::new();
        d.propose(&req(8, &[1, 3]), &mut out);
        assert!(out.is_empty(), "another sequence");
        d.propose(&req(7, &[1, 2]), &mut out);
        assert!(out.is_empty(), "another root drops the staged drafts");
        inbox.0.lock().unwrap().insert(7, (3, vec![Branch::uniform(vec![4, 5], -0.1)]));
        d.propose(&req(7, &[1, 3]), &mut out);
        assert_eq!(out.len(), 1);
        out.clear();
        d.propose(&req(7, &[1, 3]), &mut out);
        assert!(out.is_empty(), "used once");
        inbox.0.lock().unwrap().insert(9, (3, Vec::new()));
        d.release(9);
        assert!(inbox.0.lock().unwrap().is_empty());
    }
}
