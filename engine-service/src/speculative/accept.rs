//! Acceptance: which draft-tree path the target model agrees with, and the bonus token.
//!
//! Contract: [`accept`] walks from the root. At node `c` it draws the next token `y` from
//! the target's logits row of `c` with the sequence's own sampler, exactly as plain decoding
//! would at that context; if a child of `c` carries `y` the walk descends, otherwise it stops
//! and `y` is the bonus token. Greedy decoding is the special case of an argmax sampler (the
//! walk along the target's argmax). For temperature > 0 this is the lossless rule for
//! deterministic drafts (spec section 3.2: "sample `y ~ p_c`, then check whether `y` is a
//! child"): every emitted token is a draw from the target distribution of its own prefix,
//! and since the sampler is called once per emitted token, a seeded sequence emits exactly
//! the tokens it would emit without speculation (given the same logits).

use super::tree::DraftTree;

/// The outcome of one verification round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// Node indices from the root to the last accepted node, root first.
    pub path: Vec<usize>,
    /// Emitted tokens: the accepted nodes' tokens (`path[1..]`) then the bonus token.
    /// `tokens[i]` was drawn from the logits row of node `path[i]`.
    pub tokens: Vec<u32>,
}

impl Accepted {
    /// Accepted draft tokens (without the bonus).
    pub fn accepted_drafts(&self) -> usize {
        self.path.len() - 1
    }
}

/// Walks the tree with `sample` (one logits row in, one token out); `logits` holds one row of
/// `vocab` values per tree node, in node order.
pub fn accept(tree: &DraftTree, logits: &[f32], vocab: usize, mut sample: impl FnMut(&[f32]) -> u32) -> Accepted {
    accept_at(tree, logits, vocab, |_, row| sample(row))
}

/// [`accept`] with the node each row belongs to passed to `sample` (for statistics about the
/// drafts below it).
pub fn accept_at(
    tree: &DraftTree,
    logits: &[f32],
    vocab: usize,
    mut sample: impl FnMut(usize, &[f32]) -> u32,
) -> Accepted {
    debug_assert!(logits.len() >= tree.len() * vocab);
    accept_with(tree, |at| sample(at, &logits[at * vocab..(at + 1) * vocab]))
}

/// The acceptance walk with each node's token from `choose` (the node's index): a device
/// that picked every node's token already (greedy, on the device) walks without rows.
pub fn accept_with(tree: &DraftTree, mut choose: impl FnMut(usize) -> u32) -> Accepted {
    let mut path = vec![0usize];
    let mut tokens = Vec::with_capacity(tree.max_depth() + 1);
    let mut at = 0usize;
    loop {
        let y = choose(at);
        tokens.push(y);
        match tree.child_with_token(at, y) {
            Some(c) => {
                path.push(c);
                at = c;
            }
            None => return Accepted { path, tokens },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{Sampler, SamplingParams, argmax};
    use crate::speculative::tree::Branch;

    /// Vocabulary of 4; row for node i puts its max on `best[i]`.
    fn rows(best: &[u32]) -> Vec<f32> {
        best.iter().flat_map(|&b| (0..4u32).map(move |t| if t == b { 1.0 } else { 0.0 })).collect()
    }

    #[test]
    fn greedy_walk_follows_the_argmax_and_ends_with_the_bonus() {
        // root 0 -> 1 -> 2, and root -> 3.
        let mut t = DraftTree::new(0);
        t.insert(&Branch::uniform(vec![1, 2], -0.1), 0, 8);
        t.insert(&Branch::uniform(vec![3], -0.5), 0, 8);
        // Nodes: 0 root, 1 tok1, 2 tok2, 3 tok3. Target: root->1, node1->2, node2->0.
        let a = accept(&t, &rows(&[1, 2, 0, 0]), 4, argmax);
        assert_eq!(a.path, vec![0, 1, 2]);
        assert_eq!(a.tokens, vec![1, 2, 0]);
        assert_eq!(a.accepted_drafts(), 2);
        // Target prefers the second branch at the root.
        let a = accept(&t, &rows(&[3, 2, 0, 1]), 4, argmax);
        assert_eq!(a.path, vec![0, 3]);
        assert_eq!(a.tokens, vec![3, 1]);
        // Nothing accepted: one token, like a plain decode step.
        let a = accept(&t, &rows(&[2, 2, 0, 1]), 4, argmax);
        assert_eq!((a.path, a.tokens), (vec![0], vec![2]));
        // Root only.
        let a = accept(&DraftTree::new(5), &rows(&[3]), 4, argmax);
        assert_eq!((a.path, a.tokens), (vec![0], vec![3]));
    }

    #[test]
    fn seeded_sampling_emits_exactly_the_plain_samples() {
        let mut t = DraftTree::new(0);
        t.insert(&Branch::uniform(vec![1, 2, 3], -0.1), 0, 8);
        t.insert(&Branch::uniform(vec![2, 2], -0.2), 0, 8);
        let logits: Vec<f32> = (0..t.len() * 4).map(|i| ((i * 7) % 5) as f32 * 0.4).collect();
        for seed in 0..50 {
            let params = SamplingParams { temperature: 1.3, top_p: 1.0, top_k: 0, seed: Some(seed) };
            let mut spec = Sampler::new(params);
            let a = accept(&t, &logits, 4, |r| spec.sample(r));
            let mut plain = Sampler::new(params);
            for (i, &node) in a.path.iter().enumerate() {
                assert_eq!(plain.sample(&logits[node * 4..(node + 1) * 4]), a.tokens[i]);
            }
        }
    }
}
