//! Suffix (n-gram) drafter: the sequence's own text predicts its continuation. Agent traffic
//! repeats itself (file contents, command output, code being edited), so the tokens that
//! followed an earlier occurrence of the current suffix are good drafts, and free.
//!
//! Contract: [`SuffixDrafter::propose`] looks at `context` only (prompt + generated tokens,
//! the last one being the tree's root). It finds the earlier end positions whose preceding
//! tokens match the context's suffix for the longest length `m` (at least `min_match`,
//! capped at `max_match`), takes the continuations after the most recent `max_occurrences`
//! of them, and returns them as branches of a count trie: at every trie node the `top_k` most
//! frequent next tokens (ties: the more recent occurrence first). A token's draft
//! log-probability is `ln(count(child) / count(node)) + ln(m / (m + 1))`: frequent
//! continuations of long matches score best, so a node budget goes to them first.
//! Deterministic: the same context gives the same branches.
//!
//! Cost: O(L) comparisons to scan a context of L tokens (the window is capped at
//! `max_scan` tokens), plus O(occurrences * depth) to build the trie.

use super::tree::Branch;
use super::{DraftRequest, Drafter};

#[derive(Clone, Debug, PartialEq)]
pub struct SuffixParams {
    /// Shortest suffix match worth drafting from.
    pub min_match: usize,
    /// Longest suffix compared (longer matches count as this long).
    pub max_match: usize,
    /// Most matching occurrences (the most recent) whose continuations are counted.
    pub max_occurrences: usize,
    /// Only the last `max_scan` tokens of the context are searched.
    pub max_scan: usize,
}

impl Default for SuffixParams {
    fn default() -> Self {
        SuffixParams { min_match: 2, max_match: 64, max_occurrences: 32, max_scan: 16_384 }
    }
}

pub struct SuffixDrafter {
    params: SuffixParams,
    /// Reused match list: (end index of the matched suffix, match length).
    matches: Vec<(usize, usize)>,
    trie: Vec<TrieNode>,
}

struct TrieNode {
    token: u32,
    count: u32,
    /// Position of the first occurrence (most recent) that reached this node: tie-break.
    recency: usize,
    children: Vec<usize>,
}

impl SuffixDrafter {
    pub fn new(params: SuffixParams) -> SuffixDrafter {
        SuffixDrafter { params, matches: Vec::new(), trie: Vec::new() }
    }

    pub fn params(&self) -> &SuffixParams {
        &self.params
    }

    /// The longest suffix match length and the matching end positions (most recent first);
    /// an end `e` means `context[..=e]` ends with the same `m` tokens as `context`, and
    /// `context[e + 1]` is the first continuation token.
    fn find_matches(&mut self, context: &[u32]) -> usize {
        self.matches.clear();
        let l = context.len();
        let p = &self.params;
        if l < p.min_match.max(1) + 1 {
            return 0;
        }
        let lo = l.saturating_sub(p.max_scan);
        let last = context[l - 1];
        let mut best = 0usize;
        for e in (lo..l - 1).rev() {
            if context[e] != last {
                continue;
            }
            let cap = p.max_match.min(e + 1 - lo);
            let mut m = 1;
            while m < cap && context[e - m] == context[l - 1 - m] {
                m += 1;
            }
            if m < p.min_match || m < best {
                continue;
            }
            if m > best {
                best = m;
                self.matches.clear();
            }
            if self.matches.len() < p.max_occurrences {
                self.matches.push((e, m));
            }
        }
        best
    }

    fn trie_child(&mut self, node: usize, token: u32, recency: usize) -> usize {
        if let Some(&c) = self.trie[node].children.iter().find(|&&c| self.trie[c].token == token) {
            self.trie[c].count += 1;
            return c;
        }
        self.trie.push(TrieNode { token, count: 1, recency, children: Vec::new() });
        let c = self.trie.len() - 1;
        self.trie[node].children.push(c);
        c
    }

    /// Branches from the trie below `node`: every path that follows, at each node, one of the
    /// `top_k` best children.
    fn collect(&self, node: usize, top_k: usize, prefix: &mut Branch, prior: f32, out: &mut Vec<Branch>) {
        let n = &self.trie[node];
        if n.children.is_empty() {
            if !prefix.tokens.is_empty() {
                out.push(prefix.clone());
            }
            return;
        }
        let mut kids = n.children.clone();
        kids.sort_by(|&a, &b| {
            let (a, b) = (&self.trie[a], &self.trie[b]);
            b.count.cmp(&a.count).then(b.recency.cmp(&a.recency))
        });
        for &c in kids.iter().take(top_k.max(1)) {
            let child = &self.trie[c];
            prefix.tokens.push(child.token);
            prefix.log_probs.push((child.count as f32 / n.count as f32).ln() + prior);
            self.collect(c, top_k, prefix, prior, out);
            prefix.tokens.pop();
            prefix.log_probs.pop();
        }
    }
}

impl Drafter for SuffixDrafter {
    fn name(&self) -> &'static str {
        "suffix"
    }

    fn propose(&mut self, req: &DraftRequest<'_>, out: &mut Vec<Branch>) {
        if req.max_depth == 0 {
            return;
        }
        let context = req.context;
        let m = self.find_matches(context);
        if m == 0 {
            return;
        }
        self.trie.clear();
        self.trie.push(TrieNode { token: 0, count: 0, recency: usize::MAX, children: Vec::new() });
        let matches = std::mem::take(&mut self.matches);
        for &(e, _) in &matches {
            let cont = &context[e + 1..(e + 1 + req.max_depth).min(context.len())];
            if cont.is_empty() {
                continue;
            }
            self.trie[0].count += 1;
            let mut at = 0;
            for &t in cont {
                at = self.trie_child(at, t, e);
            }
        }
        self.matches = matches;
        if self.trie[0].count == 0 {
            return;
        }
        let prior = (m as f32 / (m as f32 + 1.0)).ln();
        let mut prefix = Branch { tokens: Vec::new(), log_probs: Vec::new() };
        self.collect(0, req.top_k, &mut prefix, prior, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(ctx: &[u32], depth: usize, k: usize) -> Vec<Branch> {
        let mut d = SuffixDrafter::new(SuffixParams::default());
        let mut out = Vec::new();
        d.propose(&DraftRequest { seq_id: 1, context: ctx, max_depth: depth, top_k: k }, &mut out);
        out
    }

    #[test]
    fn a_repeated_run_is_drafted_from_its_earlier_occurrence() {
        // "1 2 3 4 5 6 7 ... 1 2 3" -> continues with 4 5 6 7.
        let ctx = [9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3];
        let b = propose(&ctx, 4, 2);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].tokens, vec![4, 5, 6, 7]);
        let prior = (3.0f32 / 4.0).ln();
        assert!(b[0].log_probs.iter().all(|&lp| (lp - prior).abs() < 1e-6), "{:?}", b[0].log_probs);
    }

    #[test]
    fn several_continuations_become_branches_scored_by_frequency() {
        // "a b" was followed by x twice and by y once; top-2 keeps both, top-1 only x.
        let (a, bb, x, y) = (10, 11, 20, 21);
        let ctx = [a, bb, x, 1, a, bb, y, 2, a, bb, x, 3, a, bb];
        let b = propose(&ctx, 1, 2);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].tokens, vec![x]);
        assert_eq!(b[1].tokens, vec![y]);
        let prior = (2.0f32 / 3.0).ln();
        assert!((b[0].log_probs[0] - ((2.0f32 / 3.0).ln() + prior)).abs() < 1e-6);
        assert!((b[1].log_probs[0] - ((1.0f32 / 3.0).ln() + prior)).abs() < 1e-6);
        assert_eq!(propose(&ctx, 1, 1).len(), 1);
    }

    #[test]
    fn the_longest_match_wins_over_shorter_ones() {
        // Suffix "5 1 2": "1 2" occurs twice, "5 1 2" once (followed by 8).
        let ctx = [1, 2, 7, 5, 1, 2, 8, 0, 5, 1, 2];
        let b = propose(&ctx, 1, 2);
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].tokens, vec![8]);
    }

    #[test]
    fn no_match_or_short_context_drafts_nothing() {
        assert!(propose(&[1, 2, 3, 4], 8, 2).is_empty());
        assert!(propose(&[1], 8, 2).is_empty());
        assert!(propose(&[], 8, 2).is_empty());
        // A single-token match is below min_match.
        assert!(propose(&[5, 1, 6, 1], 8, 2).is_empty());
        assert!(propose(&[1, 2, 3, 1, 2], 0, 2).is_empty());
    }

    #[test]
    fn continuations_stop_at_the_end_of_the_context_and_at_max_depth() {
        // Periodic text: the most recent match's continuation runs into the present.
        let ctx = [1, 2, 1, 2, 1, 2];
        let b = propose(&ctx, 8, 1);
        assert!(!b.is_empty());
        assert!(b.iter().all(|br| br.tokens.len() <= 8 && !br.tokens.is_empty()));
        let b = propose(&ctx, 1, 2);
        assert_eq!(b, vec![Branch { tokens: vec![1], log_probs: b[0].log_probs.clone() }]);
    }

    #[test]
    fn scan_window_and_occurrence_cap_are_honoured() {
        let mut d = SuffixDrafter::new(SuffixParams { max_scan: 4, ..Default::default() });
        let ctx = [1, 2, 3, 0, 0, 0, 0, 1, 2];
        let mut out = Vec::new();
        d.propose(&DraftRequest { seq_id: 1, context: &ctx, max_depth: 2, top_k: 2 }, &mut out);
        assert!(out.is_empty(), "the earlier occurrence lies outside the window");
        let mut d = SuffixDrafter::new(SuffixParams { max_occurrences: 1, ..Default::default() });
        let ctx = [1, 2, 5, 1, 2, 6, 1, 2];
        d.propose(&DraftRequest { seq_id: 1, context: &ctx, max_depth: 1, top_k: 2 }, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].tokens, vec![6], "the most recent occurrence is kept");
    }
}
