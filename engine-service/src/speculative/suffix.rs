//! Suffix (n-gram) drafter: the sequence's own text predicts its continuation. Agent traffic
//! repeats itself (file contents, command output, code being edited), so the tokens that
//! followed an earlier occurrence of the current suffix are good drafts, and free.
//!
//! Contract: [`SuffixDrafter::propose`] searches the context (prompt + generated tokens, the
//! last one being the tree's root) and the recent outputs of earlier requests with the same
//! cache salt (agents re-emit the same scaffolding turn after turn; kept by
//! [`Drafter::finished`]) for end positions whose preceding tokens match the context's
//! suffix for the longest length `m` (at least `min_match`, capped at `max_match`). It takes
//! the continuations after the `max_occurrences` most recent such matches (the context's own,
//! newest first, then earlier outputs, newest first) and returns them as branches of a count
//! trie: at every trie node the `top_k` most frequent next tokens (ties: the more recent
//! occurrence first). A token's draft log-probability is
//! `ln(count(child) / count(node)) + ln(m / (m + 1))`: frequent continuations of long matches
//! score best, so a node budget goes to them first. Deterministic: the same context and
//! history give the same branches.
//!
//! Cost: O(L + H) comparisons for a context of L tokens (capped at `max_scan`) and H history
//! tokens (at most `history_outputs` outputs of `history_context` + generated tokens each,
//! per salt), plus O(occurrences * depth) to build the trie.

use std::collections::{HashMap, VecDeque};

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
    /// Finished outputs remembered per cache salt (0: no cross-request drafting).
    pub history_outputs: usize,
    /// Prompt tokens kept before each remembered output (so its start can be matched).
    pub history_context: usize,
    /// Salts remembered (the least recently finished one is forgotten first).
    pub history_salts: usize,
}

impl Default for SuffixParams {
    fn default() -> Self {
        SuffixParams {
            min_match: 2,
            max_match: 64,
            max_occurrences: 32,
            max_scan: 16_384,
            history_outputs: 16,
            history_context: 32,
            history_salts: 64,
        }
    }
}

pub struct SuffixDrafter {
    params: SuffixParams,
    /// Reused match list: (corpus: 0 = the context, i = history output i - 1; end index of
    /// the matched suffix in it).
    matches: Vec<(usize, usize)>,
    trie: Vec<TrieNode>,
    /// Recent outputs (with a little prompt before them) by salt, newest first.
    history: HashMap<String, VecDeque<Vec<u32>>>,
    /// Salts by last use, oldest first.
    salts: VecDeque<String>,
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
        SuffixDrafter { params, matches: Vec::new(), trie: Vec::new(), history: HashMap::new(), salts: VecDeque::new() }
    }

    pub fn params(&self) -> &SuffixParams {
        &self.params
    }

    /// Folds the matches of `pattern`'s suffix in `corpus[lo..end]` (ends `e` in
    /// `[lo, end)`, newest first) into the match list, keeping only the longest length;
    /// an end `e` means `corpus[..=e]` ends with the same `m` tokens as `pattern`, and
    /// `corpus[e + 1]` is the first continuation token.
    fn scan(&mut self, id: usize, corpus: &[u32], lo: usize, end: usize, pattern: &[u32], best: &mut usize) {
        let p = &self.params;
        let l = pattern.len();
        let Some(&last) = pattern.last() else { return };
        for e in (lo..end).rev() {
            if corpus[e] != last {
                continue;
            }
            let cap = p.max_match.min(e + 1 - lo).min(l);
            let mut m = 1;
            while m < cap && corpus[e - m] == pattern[l - 1 - m] {
                m += 1;
            }
            if m < p.min_match || m < *best {
                continue;
            }
            if m > *best {
                *best = m;
                self.matches.clear();
            }
            if self.matches.len() < p.max_occurrences {
                self.matches.push((id, e));
            }
        }
    }

    /// The longest suffix match length over the context and the salt's history; the matches
    /// are left in `self.matches`.
    fn find_matches(&mut self, context: &[u32], salt: &str) -> usize {
        self.matches.clear();
        let l = context.len();
        if l < self.params.min_match.max(1) {
            return 0;
        }
        let mut best = 0usize;
        let lo = l.saturating_sub(self.params.max_scan);
        self.scan(0, context, lo, l - 1, context, &mut best);
        if let Some(outputs) = self.history.remove(salt) {
            for (i, out) in outputs.iter().enumerate() {
                // The last position has no continuation.
                self.scan(i + 1, out, 0, out.len().saturating_sub(1), context, &mut best);
            }
            self.history.insert(salt.to_string(), outputs);
        }
        best
    }

    /// Corpus `id` of the last [`SuffixDrafter::find_matches`].
    fn corpus<'a>(&'a self, id: usize, context: &'a [u32], salt: &str) -> &'a [u32] {
        match id {
            0 => context,
            i => self.history.get(salt).and_then(|h| h.get(i - 1)).map_or(&[], |v| v.as_slice()),
        }
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
        let m = self.find_matches(context, req.salt);
        if m == 0 {
            return;
        }
        self.trie.clear();
        self.trie.push(TrieNode { token: 0, count: 0, recency: usize::MAX, children: Vec::new() });
        let matches = std::mem::take(&mut self.matches);
        let mut cont = Vec::with_capacity(req.max_depth);
        for (rank, &(id, e)) in matches.iter().enumerate() {
            let corpus = self.corpus(id, context, req.salt);
            cont.clear();
            cont.extend_from_slice(&corpus[e + 1..(e + 1 + req.max_depth).min(corpus.len())]);
            if cont.is_empty() {
                continue;
            }
            self.trie[0].count += 1;
            let mut at = 0;
            // Earlier in the match list = more recent = wins ties.
            let recency = usize::MAX - 1 - rank;
            for &t in &cont {
                at = self.trie_child(at, t, recency);
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

    fn finished(&mut self, salt: &str, tokens: &[u32], prompt_len: usize) {
        let p = &self.params;
        if p.history_outputs == 0 || p.history_salts == 0 || tokens.len() <= prompt_len {
            return;
        }
        let start = prompt_len.saturating_sub(p.history_context);
        let out = tokens[start..].to_vec();
        if let Some(i) = self.salts.iter().position(|s| s == salt) {
            self.salts.remove(i);
        }
        self.salts.push_back(salt.to_string());
        let outputs = self.history.entry(salt.to_string()).or_default();
        outputs.push_front(out);
        outputs.truncate(p.history_outputs);
        while self.salts.len() > p.history_salts {
            if let Some(old) = self.salts.pop_front() {
                self.history.remove(&old);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(ctx: &[u32], depth: usize, k: usize) -> Vec<Branch> {
        let mut d = SuffixDrafter::new(SuffixParams::default());
        let mut out = Vec::new();
        d.propose(&DraftRequest { seq_id: 1, salt: "", context: ctx, max_depth: depth, top_k: k }, &mut out);
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
    fn earlier_outputs_of_the_same_salt_are_drafted_from() {
        let mut d = SuffixDrafter::new(SuffixParams { history_context: 2, ..Default::default() });
        // An earlier request (prompt 1 2 3) produced 7 8 9 10 11.
        d.finished("tenant", &[1, 2, 3, 7, 8, 9, 10, 11], 3);
        let mut out = Vec::new();
        let ask = |d: &mut SuffixDrafter, salt: &str, out: &mut Vec<Branch>| {
            out.clear();
            d.propose(&DraftRequest { seq_id: 2, salt, context: &[40, 41, 7, 8], max_depth: 3, top_k: 2 }, out);
        };
        ask(&mut d, "tenant", &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].tokens, vec![9, 10, 11]);
        ask(&mut d, "other", &mut out);
        assert!(out.is_empty(), "other salts never see the output");
        // Only the kept prompt context is matched: 2 3 + output.
        out.clear();
        d.propose(&DraftRequest { seq_id: 2, salt: "tenant", context: &[50, 1, 2], max_depth: 3, top_k: 2 }, &mut out);
        assert!(out.is_empty());
        // Outputs beyond the per-salt and salt caps are forgotten.
        let mut d = SuffixDrafter::new(SuffixParams { history_outputs: 1, history_salts: 1, ..Default::default() });
        d.finished("a", &[1, 7, 8, 9], 1);
        d.finished("a", &[1, 5, 6], 1);
        ask(&mut d, "a", &mut out);
        assert!(out.is_empty(), "the older output is gone");
        d.finished("b", &[1, 7, 8, 9], 1);
        ask(&mut d, "b", &mut out);
        assert_eq!(out[0].tokens, vec![9]);
        assert!(!d.history.contains_key("a"));
        // Nothing generated: nothing kept.
        d.finished("c", &[1, 2], 2);
        assert!(!d.history.contains_key("c"));
    }

    #[test]
    fn scan_window_and_occurrence_cap_are_honoured() {
        let mut d = SuffixDrafter::new(SuffixParams { max_scan: 4, ..Default::default() });
        let ctx = [1, 2, 3, 0, 0, 0, 0, 1, 2];
        let mut out = Vec::new();
        d.propose(&DraftRequest { seq_id: 1, salt: "", context: &ctx, max_depth: 2, top_k: 2 }, &mut out);
        assert!(out.is_empty(), "the earlier occurrence lies outside the window");
        let mut d = SuffixDrafter::new(SuffixParams { max_occurrences: 1, ..Default::default() });
        let ctx = [1, 2, 5, 1, 2, 6, 1, 2];
        d.propose(&DraftRequest { seq_id: 1, salt: "", context: &ctx, max_depth: 1, top_k: 2 }, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].tokens, vec![6], "the most recent occurrence is kept");
    }
}
