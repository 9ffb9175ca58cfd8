//! Draft trees: candidate continuations under the root (the last accepted token, whose
//! target forward has not run yet), merged from any number of drafters' branches.
//!
//! Contract: node 0 is the root (depth 0, score 0). Every other node has a parent with a
//! smaller index, `depth = depth(parent) + 1`, and siblings carry distinct tokens (so greedy
//! and sampled acceptance walks are unambiguous). A node's score is the cumulative draft
//! log-probability of its root path (the best over the branches that proposed it); scores
//! never increase along a path. [`DraftTree::pruned`] keeps the `N` best nodes (root
//! included) by best-first expansion, so the result stays prefix-closed and topologically
//! ordered. [`DraftTree::parents`] is the `SeqInput::tree` layout.
//!
//! Cost: inserting a branch of length `d` is O(d * fan-out); pruning is O(n log n).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// One candidate continuation of the root: `tokens[0]` is the root's child.
#[derive(Clone, Debug, PartialEq)]
pub struct Branch {
    pub tokens: Vec<u32>,
    /// Per-token draft log-probability (<= 0), same length as `tokens`.
    pub log_probs: Vec<f32>,
}

impl Branch {
    /// A branch whose tokens all carry the same log-probability.
    pub fn uniform(tokens: Vec<u32>, log_prob: f32) -> Branch {
        let log_probs = vec![log_prob.min(0.0); tokens.len()];
        Branch { tokens, log_probs }
    }
}

/// Which drafter proposed a node (for per-drafter acceptance metrics); the best-scoring one
/// when several did.
pub type DrafterId = u8;

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub token: u32,
    pub parent: Option<usize>,
    pub depth: usize,
    /// Cumulative draft log-probability of the path root..=this.
    pub score: f32,
    pub source: DrafterId,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DraftTree {
    nodes: Vec<Node>,
    /// Children of each node, in insertion order.
    children: Vec<Vec<usize>>,
}

/// Best-first frontier entry: higher score first, then shallower, then lower index.
#[derive(PartialEq)]
struct Cand {
    score: f32,
    depth: usize,
    index: usize,
}

impl Eq for Cand {}

impl Ord for Cand {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then(other.depth.cmp(&self.depth)).then(other.index.cmp(&self.index))
    }
}

impl PartialOrd for Cand {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl DraftTree {
    /// A tree holding only the root token.
    pub fn new(root: u32) -> DraftTree {
        DraftTree {
            nodes: vec![Node { token: root, parent: None, depth: 0, score: 0.0, source: 0 }],
            children: vec![Vec::new()],
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always false: the root is always there.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    pub fn children(&self, i: usize) -> &[usize] {
        &self.children[i]
    }

    /// The child of `i` carrying `token`, if any.
    pub fn child_with_token(&self, i: usize, token: u32) -> Option<usize> {
        self.children[i].iter().copied().find(|&c| self.nodes[c].token == token)
    }

    pub fn max_depth(&self) -> usize {
        self.nodes.iter().map(|n| n.depth).max().unwrap_or(0)
    }

    /// Merges a branch under the root, up to `max_depth` tokens: shared prefixes reuse
    /// existing nodes (their score becomes the better of the two), the rest become new nodes.
    /// Log-probabilities are clamped to <= 0 (NaN counts as impossible and ends the branch).
    pub fn insert(&mut self, branch: &Branch, source: DrafterId, max_depth: usize) {
        let mut at = 0usize;
        let mut score = 0.0f32;
        for (&tok, &lp) in branch.tokens.iter().zip(&branch.log_probs).take(max_depth) {
            if lp.is_nan() {
                break;
            }
            score += lp.min(0.0);
            at = match self.child_with_token(at, tok) {
                Some(c) => {
                    let n = &mut self.nodes[c];
                    if score > n.score {
                        n.score = score;
                        n.source = source;
                    }
                    c
                }
                None => {
                    let depth = self.nodes[at].depth + 1;
                    self.nodes.push(Node { token: tok, parent: Some(at), depth, score, source });
                    self.children.push(Vec::new());
                    self.children[at].push(self.nodes.len() - 1);
                    self.nodes.len() - 1
                }
            };
        }
    }

    /// The `max_nodes` best nodes (root included, so at least the root) chosen best-first
    /// from the root: each pick is the best child of an already picked node. Renumbered so
    /// parents precede children.
    pub fn pruned(&self, max_nodes: usize) -> DraftTree {
        self.pruned_above(max_nodes, f32::NEG_INFINITY)
    }

    /// [`DraftTree::pruned`], keeping only nodes scoring at least `min_score` (a node is worth
    /// verifying only if its path is likely enough to pay for its row).
    pub fn pruned_above(&self, max_nodes: usize, min_score: f32) -> DraftTree {
        let mut out = DraftTree::new(self.nodes[0].token);
        let mut heap = BinaryHeap::new();
        let push_children = |heap: &mut BinaryHeap<(Cand, usize)>, old: usize, new: usize| {
            for &c in &self.children[old] {
                let n = &self.nodes[c];
                heap.push((Cand { score: n.score, depth: n.depth, index: c }, new));
            }
        };
        push_children(&mut heap, 0, 0);
        while out.len() < max_nodes.max(1) {
            let Some((cand, new_parent)) = heap.pop() else { break };
            if cand.score < min_score {
                break;
            }
            let n = &self.nodes[cand.index];
            out.nodes.push(Node { parent: Some(new_parent), ..n.clone() });
            out.children.push(Vec::new());
            let new = out.nodes.len() - 1;
            out.children[new_parent].push(new);
            push_children(&mut heap, cand.index, new);
        }
        // Best-first order keeps scores non-increasing along paths only if the inputs do; it
        // always emits parents first, which is what the layout needs.
        out
    }

    /// Tokens in node order (root first): the verification pass's input.
    pub fn tokens(&self) -> Vec<u32> {
        self.nodes.iter().map(|n| n.token).collect()
    }

    /// Parent of every node in node order (`None` only for the root): `SeqInput::tree`.
    pub fn parents(&self) -> Vec<Option<usize>> {
        self.nodes.iter().map(|n| n.parent).collect()
    }

    /// Node indices from the root to `i`, root first.
    pub fn path_to(&self, i: usize) -> Vec<usize> {
        let mut path = vec![i];
        let mut at = i;
        while let Some(p) = self.nodes[at].parent {
            path.push(p);
            at = p;
        }
        path.reverse();
        path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_invariants(t: &DraftTree) {
        assert_eq!(t.node(0).parent, None);
        assert_eq!(t.node(0).depth, 0);
        for (i, n) in t.nodes().iter().enumerate().skip(1) {
            let p = n.parent.expect("non-root has a parent");
            assert!(p < i, "parent before child");
            assert_eq!(n.depth, t.node(p).depth + 1);
            assert!(n.score <= t.node(p).score + 1e-6, "scores never increase along a path");
        }
        for i in 0..t.len() {
            let mut toks: Vec<u32> = t.children(i).iter().map(|&c| t.node(c).token).collect();
            let n = toks.len();
            toks.sort_unstable();
            toks.dedup();
            assert_eq!(toks.len(), n, "siblings carry distinct tokens");
            for &c in t.children(i) {
                assert_eq!(t.node(c).parent, Some(i));
            }
        }
        assert_eq!(
            crate::backend::tree_depths(&t.parents()).unwrap(),
            t.nodes().iter().map(|n| n.depth).collect::<Vec<_>>()
        );
    }

    #[test]
    fn shared_prefixes_merge_and_keep_the_best_score() {
        let mut t = DraftTree::new(7);
        t.insert(&Branch { tokens: vec![1, 2, 3], log_probs: vec![-1.0, -0.5, -0.5] }, 0, 8);
        t.insert(&Branch { tokens: vec![1, 2, 4], log_probs: vec![-0.1, -0.1, -2.0] }, 1, 8);
        t.insert(&Branch { tokens: vec![5], log_probs: vec![-3.0] }, 1, 8);
        assert_eq!(t.tokens(), vec![7, 1, 2, 3, 4, 5]);
        assert_eq!(t.parents(), vec![None, Some(0), Some(1), Some(2), Some(2), Some(0)]);
        assert!((t.node(1).score + 0.1).abs() < 1e-6 && t.node(1).source == 1);
        assert!((t.node(3).score + 2.0).abs() < 1e-6, "node 3 keeps its own branch's score");
        check_invariants(&t);
        assert_eq!(t.path_to(4), vec![0, 1, 2, 4]);
    }

    #[test]
    fn insert_respects_max_depth_and_clamps_positive_log_probs() {
        let mut t = DraftTree::new(0);
        t.insert(&Branch { tokens: vec![1, 2, 3, 4], log_probs: vec![0.5, -0.1, -0.1, -0.1] }, 0, 2);
        assert_eq!(t.len(), 3);
        assert_eq!(t.node(1).score, 0.0);
        t.insert(&Branch { tokens: vec![9, 8], log_probs: vec![f32::NAN, -1.0] }, 0, 8);
        assert_eq!(t.len(), 3, "a NaN log-prob ends the branch");
    }

    #[test]
    fn pruning_keeps_the_best_prefix_closed_nodes() {
        let mut t = DraftTree::new(0);
        t.insert(&Branch { tokens: vec![1, 2, 3, 4], log_probs: vec![-0.1, -0.1, -0.1, -5.0] }, 0, 8);
        t.insert(&Branch { tokens: vec![10, 11], log_probs: vec![-0.2, -0.2] }, 0, 8);
        t.insert(&Branch { tokens: vec![20], log_probs: vec![-3.0] }, 0, 8);
        let p = t.pruned(5);
        assert_eq!(p.len(), 5);
        let mut toks = p.tokens();
        toks.sort_unstable();
        assert_eq!(toks, vec![0, 1, 2, 3, 10]);
        check_invariants(&p);
        assert_eq!(t.pruned(0).len(), 1, "the root always stays");
        assert_eq!(t.pruned(100).len(), t.len());
        let sure = t.pruned_above(100, -0.25);
        let mut toks = sure.tokens();
        toks.sort_unstable();
        assert_eq!(toks, vec![0, 1, 2, 10], "only nodes scoring >= -0.25");
        assert_eq!(t.pruned_above(100, -0.01).len(), 1);
    }

    #[test]
    fn random_trees_keep_their_invariants_and_pruning_picks_the_top_scores() {
        let mut x = 0x9e37_79b9u64;
        let mut rnd = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for _ in 0..200 {
            let mut t = DraftTree::new(rnd(50) as u32);
            for _ in 0..rnd(6) {
                let len = 1 + rnd(8) as usize;
                let tokens: Vec<u32> = (0..len).map(|_| rnd(4) as u32).collect();
                let log_probs: Vec<f32> = (0..len).map(|_| -(rnd(100) as f32) / 50.0).collect();
                t.insert(&Branch { tokens, log_probs }, rnd(2) as u8, 1 + rnd(8) as usize);
            }
            check_invariants(&t);
            let n = 1 + rnd(12) as usize;
            let p = t.pruned(n);
            check_invariants(&p);
            assert_eq!(p.len(), n.min(t.len()));
            // Best-first over non-increasing scores = the top scores: nothing left out beats
            // the worst kept node.
            let worst_kept = p.nodes().iter().skip(1).map(|n| n.score).fold(f32::INFINITY, f32::min);
            let mut all: Vec<f32> = t.nodes().iter().skip(1).map(|n| n.score).collect();
            all.sort_by(|a, b| b.total_cmp(a));
            if p.len() > 1 && p.len() < t.len() {
                assert!(all[p.len() - 1] <= worst_kept + 1e-6);
            }
        }
    }

    #[test]
    fn bad_parent_layouts_are_errors() {
        assert_eq!(crate::backend::tree_depths(&[None, Some(0), Some(0), Some(2)]).unwrap(), vec![0, 1, 1, 2]);
        assert!(crate::backend::tree_depths(&[Some(0)]).is_err());
        assert!(crate::backend::tree_depths(&[None, None]).is_err());
        assert!(crate::backend::tree_depths(&[None, Some(1)]).is_err());
        assert!(crate::backend::tree_depths(&[]).unwrap().is_empty());
    }
}
