//! The step's plan, computed from the scheduler's state without side effects: which running
//! sequences get which share of the next forward pass (chunk sizes, draft trees), where a
//! prefill pauses to save a recurrent-state snapshot and what is published after the pass,
//! which sequence is preempted when none can get pages, and how many pages an admission needs.
//! The step loop applies the plan (leases pages, runs the pass, samples); these functions are
//! unit-tested as functions.

/// What the planner knows of one running sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqView {
    /// Positions whose KV is computed.
    pub n_computed: usize,
    /// Prompt plus generated tokens.
    pub tokens: usize,
    pub prompt_len: usize,
    /// The next snapshot hint inside the prompt after `n_computed`, if any.
    pub next_hint: Option<usize>,
    /// Nodes (root included) of the draft tree the drafters proposed for this step, if any.
    pub draft_nodes: Option<usize>,
}

impl SeqView {
    pub fn in_prefill(&self) -> bool {
        self.n_computed < self.prompt_len
    }

    pub fn pending(&self) -> usize {
        self.tokens - self.n_computed
    }

    /// Decoding one token (what a draft tree can replace).
    pub fn decoding(&self) -> bool {
        self.pending() == 1 && !self.in_prefill()
    }
}

/// The bounds of one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepBounds {
    /// Tokens (tree nodes included) of one forward pass.
    pub max_batch_tokens: usize,
    /// `Some(k)`: the model keeps recurrent state and a cache stores snapshots; a prefill
    /// pauses every `k` tokens (0: never periodically) and at hints.
    pub snapshot_every: Option<usize>,
}

/// One sequence's share of the pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// Verify the proposed draft tree (its nodes replace the pending token).
    Tree { nodes: usize },
    /// The next `n_tokens` pending tokens as a chain.
    Chunk { n_tokens: usize, wants_logits: bool, after: AfterPass },
}

/// What a prefill chunk publishes once its pass ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterPass {
    Nothing,
    /// The prompt is complete: publish its pages (the tail page as a copy) and the state.
    PromptDone,
    /// A hinted position (e.g. the generation prompt's start): as `PromptDone`, so far.
    Hint,
    /// A periodic snapshot boundary: publish the full pages so far, then the state.
    Periodic,
}

/// One planned sequence: its index among the running ones and its work; the pages it needs
/// must cover `[0, upto)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planned {
    pub index: usize,
    pub work: Work,
    pub upto: usize,
}

impl Planned {
    pub fn n_tokens(&self) -> usize {
        match self.work {
            Work::Tree { nodes } => nodes,
            Work::Chunk { n_tokens, .. } => n_tokens,
        }
    }
}

/// The pass's shares, in the order they run: decoders first (one token each, or their
/// draft tree), so generation keeps moving under long prefills; prefills share the rest of
/// the token budget, each cut at its next snapshot boundary. A tree that does not fit the
/// budget left falls back to its one token.
pub fn plan_step(bounds: &StepBounds, seqs: &[SeqView]) -> Vec<Planned> {
    let mut order: Vec<usize> = (0..seqs.len()).filter(|&i| !seqs[i].in_prefill()).collect();
    order.extend((0..seqs.len()).filter(|&i| seqs[i].in_prefill()));
    let mut budget = bounds.max_batch_tokens;
    let mut plan = Vec::new();
    for i in order {
        if budget == 0 {
            break;
        }
        let seq = &seqs[i];
        if seq.pending() == 0 {
            continue;
        }
        if let Some(nodes) = seq.draft_nodes.filter(|&n| seq.decoding() && n >= 1 && n <= budget) {
            budget -= nodes;
            plan.push(Planned { index: i, work: Work::Tree { nodes }, upto: seq.n_computed + nodes });
            continue;
        }
        let chunk = plain_chunk(bounds, i, seq, budget);
        budget -= chunk.n_tokens();
        plan.push(chunk);
    }
    plan
}

/// The plain (chain) share of running sequence `index` with `budget` tokens left: its
/// pending tokens, a prefill cut at its next snapshot boundary. Also what a tree falls back
/// to when its pages cannot be leased.
pub fn plain_chunk(bounds: &StepBounds, index: usize, seq: &SeqView, budget: usize) -> Planned {
    let mut n_tokens = seq.pending().min(budget);
    if let Some(every) = bounds.snapshot_every
        && seq.in_prefill()
    {
        let periodic = (every > 0).then(|| (seq.n_computed / every + 1) * every);
        if let Some(boundary) = periodic.into_iter().chain(seq.next_hint).filter(|&b| b < seq.prompt_len).min() {
            n_tokens = n_tokens.min(boundary - seq.n_computed);
        }
    }
    let end = seq.n_computed + n_tokens;
    let after = if !seq.in_prefill() {
        AfterPass::Nothing
    } else if end == seq.prompt_len {
        AfterPass::PromptDone
    } else if bounds.snapshot_every.is_some() && seq.next_hint == Some(end) {
        AfterPass::Hint
    } else if bounds.snapshot_every.is_some_and(|k| k > 0 && end.is_multiple_of(k)) {
        AfterPass::Periodic
    } else {
        AfterPass::Nothing
    };
    Planned { index, work: Work::Chunk { n_tokens, wants_logits: end == seq.tokens, after }, upto: end }
}

/// When no running sequence could get pages for the step: which to take pages from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Starved {
    /// Preempt the newest (the last admitted): its pages go back and it recomputes later.
    Preempt(usize),
    /// It runs alone and still cannot fit: fail it.
    Fail(usize),
}

/// The sequence that gives way when all `running` are starved of pages, newest first.
pub fn starved(running: usize) -> Option<Starved> {
    match running {
        0 => None,
        1 => Some(Starved::Fail(0)),
        n => Some(Starved::Preempt(n - 1)),
    }
}

/// Pages an admission must lease: for its whole `tokens` (prompt, plus what a preempted
/// sequence generated before) and the first generated token, beyond the `cached` pages it
/// keeps (a cached page used only in part is replaced by a private copy, so it needs one).
pub fn admission_pages(tokens: usize, page_tokens: usize, cached: usize, partial_cached: bool) -> usize {
    let keep = cached - usize::from(partial_cached);
    (tokens + 1).div_ceil(page_tokens).saturating_sub(keep)
}

/// How many of the waiting sequences (front first, each needing `needs[i]` pages) to admit
/// with `free_slots` batch slots and `free_pages` known free (`None`: unknown, the store
/// answers each lease). Admission is in order: one that does not fit stops the rest.
pub fn admissions(free_slots: usize, needs: &[usize], free_pages: Option<usize>) -> usize {
    let mut left = free_pages;
    let mut n = 0;
    for &need in needs.iter().take(free_slots) {
        match left {
            Some(free) if need > free => break,
            Some(free) => left = Some(free - need),
            None => {}
        }
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefill(n_computed: usize, prompt: usize) -> SeqView {
        SeqView { n_computed, tokens: prompt, prompt_len: prompt, next_hint: None, draft_nodes: None }
    }

    fn decoder(at: usize) -> SeqView {
        SeqView { n_computed: at, tokens: at + 1, prompt_len: 10, next_hint: None, draft_nodes: None }
    }

    fn bounds(max_batch_tokens: usize, snapshot_every: Option<usize>) -> StepBounds {
        StepBounds { max_batch_tokens, snapshot_every }
    }

    fn chunk(n_tokens: usize, wants_logits: bool, after: AfterPass) -> Work {
        Work::Chunk { n_tokens, wants_logits, after }
    }

    #[test]
    fn decoders_go_first_and_prefills_share_the_rest_of_the_budget() {
        let seqs = [prefill(0, 100), decoder(20), prefill(0, 30), decoder(40)];
        let plan = plan_step(&bounds(64, None), &seqs);
        let got: Vec<(usize, Work)> = plan.iter().map(|p| (p.index, p.work)).collect();
        assert_eq!(
            got,
            [
                (1, chunk(1, true, AfterPass::Nothing)),
                (3, chunk(1, true, AfterPass::Nothing)),
                (0, chunk(62, false, AfterPass::Nothing)),
            ],
            "the second prefill waits: the budget is spent"
        );
        assert_eq!(plan[2].upto, 62);
        // A prefill that fits ends its prompt and wants the logits.
        let plan = plan_step(&bounds(512, None), &[prefill(70, 100)]);
        assert_eq!(plan[0].work, chunk(30, true, AfterPass::PromptDone));
    }

    #[test]
    fn trees_replace_a_decoders_token_only_when_they_fit() {
        let mut d = decoder(50);
        d.draft_nodes = Some(16);
        let plan = plan_step(&bounds(64, None), &[prefill(0, 100), d]);
        assert_eq!((plan[0].index, plan[0].work, plan[0].upto), (1, Work::Tree { nodes: 16 }, 66));
        assert_eq!(plan[1].work, chunk(48, false, AfterPass::Nothing));
        // Too big for the budget: the plain token.
        let plan = plan_step(&bounds(8, None), &[d]);
        assert_eq!(plan[0].work, chunk(1, true, AfterPass::Nothing));
        // A prefilling sequence never verifies a tree.
        let mut p = prefill(0, 5);
        p.draft_nodes = Some(4);
        assert_eq!(plan_step(&bounds(64, None), &[p])[0].work, chunk(5, true, AfterPass::PromptDone));
    }

    #[test]
    fn prefills_pause_at_snapshot_boundaries_and_say_what_to_publish() {
        // Periodic every 32 tokens: 0 -> 32 -> 64 -> 70 (the prompt's end).
        let b = bounds(512, Some(32));
        assert_eq!(plan_step(&b, &[prefill(0, 70)])[0].work, chunk(32, false, AfterPass::Periodic));
        assert_eq!(plan_step(&b, &[prefill(32, 70)])[0].work, chunk(32, false, AfterPass::Periodic));
        assert_eq!(plan_step(&b, &[prefill(64, 70)])[0].work, chunk(6, true, AfterPass::PromptDone));
        // A hint before the next periodic boundary wins; hints alone when periodic is off.
        let mut hinted = prefill(0, 70);
        hinted.next_hint = Some(20);
        assert_eq!(plan_step(&b, &[hinted])[0].work, chunk(20, false, AfterPass::Hint));
        assert_eq!(plan_step(&bounds(512, Some(0)), &[hinted])[0].work, chunk(20, false, AfterPass::Hint));
        // Without a snapshot store (attention-only model, or uncached) nothing pauses.
        assert_eq!(plan_step(&bounds(512, None), &[hinted])[0].work, chunk(70, true, AfterPass::PromptDone));
        // The budget can end a chunk before its boundary: nothing to publish there.
        assert_eq!(plan_step(&bounds(10, Some(32)), &[prefill(0, 70)])[0].work, chunk(10, false, AfterPass::Nothing));
    }

    #[test]
    fn the_newest_gives_way_and_a_lone_sequence_fails() {
        assert_eq!(starved(0), None);
        assert_eq!(starved(1), Some(Starved::Fail(0)));
        assert_eq!(starved(3), Some(Starved::Preempt(2)));
    }

    #[test]
    fn admission_stops_at_the_first_that_does_not_fit_a_full_arena() {
        // 33 tokens + 1 generated over 16-token pages: 3 pages; 2 cached whole pages kept.
        assert_eq!(admission_pages(33, 16, 0, false), 3);
        assert_eq!(admission_pages(33, 16, 2, false), 1);
        // A partly used cached page is replaced by a private copy.
        assert_eq!(admission_pages(33, 16, 3, true), 1);
        assert_eq!(admissions(4, &[2, 3, 1], Some(0)), 0, "a full arena admits nobody");
        assert_eq!(admissions(4, &[2, 3, 1], Some(4)), 1, "in order: the 3-page one stops the 1-page one");
        assert_eq!(admissions(4, &[2, 3, 1], Some(6)), 3);
        assert_eq!(admissions(2, &[1, 1, 1], Some(9)), 2, "batch slots bound it too");
        assert_eq!(admissions(2, &[100, 100], None), 2, "unknown free pages: each lease decides");
    }
}
