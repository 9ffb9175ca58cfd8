//! The step loop: one OS thread that owns the backend and every running sequence.
//! Each iteration takes new commands, admits waiting sequences while pages and batch
//! slots allow, builds one forward batch (every decoding sequence contributes one token;
//! prefilling sequences share the rest of the token budget, so a long prompt is chunked
//! and never stalls the decoders), runs it, samples, and finishes sequences.
//!
//! Speculative decoding ([`crate::speculative`]): a decoding sequence whose drafters propose
//! something runs a draft tree instead of its one token (rows in the same forward pass as
//! everyone else's). The accepted path's KV moves into place (`Backend::accept_tree_path`)
//! and its tokens are pushed one at a time under exactly the stop rules of plain decoding;
//! `n_computed` only ever counts committed positions, so the cache sees only committed KV.
//!
//! Prefix cache: a sequence arrives with the pages its lookup pinned. A last page used only
//! in part is shared and immutable, so admission copies it into a fresh page before the
//! sequence appends (copy on write). At the end of the prompt the full pages are committed,
//! and the partial tail as a *copy* (the sequence keeps writing its own tail page); at the
//! end of generation every page is committed, the tail as a partial page. If the cache
//! session dies, sequences holding its pages fail with UNAVAILABLE and the rest (and new
//! ones) run on local pages until the store is re-linked ([`PageStore::refresh`]).

mod publish;

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use crate::EngineError;
use crate::backend::{Backend, ForwardBatch, LogitsRow, LogitsWanted, SeqInput};
use crate::memory::PageId;
use crate::memory::store::{LeasedPage, PageSource, PageStore, Refresh, SpaceChange};
use crate::metrics as m;
use crate::scheduler::plan::{self, AfterPass, SeqView, Starved, StepBounds, Work};
use crate::scheduler::{Command, FinishReason, SeqEvent, Sequence};
use crate::speculative::{DraftRoom, DraftTree, DrafterKind, SeqRef, SpecConfig, SpecOverride, SpecRuntime};

/// Limits of the running batch.
#[derive(Clone, Debug)]
pub struct StepLimits {
    pub max_batch_tokens: usize,
    pub max_running: usize,
    pub context_length: usize,
    pub page_tokens: usize,
    pub eos_token_ids: Vec<u32>,
}

/// Default of [`StepLoop::with_state_snapshots`].
pub const DEFAULT_STATE_SNAPSHOT_EVERY: usize = 2048;

/// Prompt tokens served from the cache, by `kind` (`full_page`, `partial_page`) (counter).
pub(crate) const CACHED_PROMPT_TOKENS_BY_KIND: &str = "edge_engine_cached_prompt_tokens_by_kind_total";
/// Sequences preempted because the KV pages ran out (counter).
pub(crate) const PREEMPTIONS_TOTAL: &str = "edge_engine_preemptions_total";

/// Pages are leased in chunks of this many beyond what the next step needs, so decoding
/// does not call the cache-service every page.
const PAGE_LEASE_AHEAD: usize = 4;

pub struct StepLoop {
    backend: Box<dyn Backend>,
    store: PageStore,
    limits: StepLimits,
    commands: Receiver<Command>,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    spec: SpecRuntime,
    /// See [`StepLoop::with_state_snapshots`].
    state_snapshot_every: usize,
}

/// One sequence's share of the next forward pass, its pages leased.
struct Scheduled {
    index: usize,
    n_tokens: usize,
    wants_logits: bool,
    /// What the pass's end publishes (prefill chunks).
    after: AfterPass,
    /// A draft tree to verify instead of the pending token (its tokens and parents layout).
    tree: Option<PlannedTree>,
}

struct PlannedTree {
    tree: DraftTree,
    tokens: Vec<u32>,
    parents: Vec<Option<usize>>,
}

impl StepLoop {
    pub fn new(backend: Box<dyn Backend>, store: PageStore, limits: StepLimits, commands: Receiver<Command>) -> Self {
        let mut step_loop = StepLoop {
            backend,
            store,
            limits,
            commands,
            waiting: VecDeque::new(),
            running: Vec::new(),
            spec: SpecRuntime::disabled(),
            state_snapshot_every: DEFAULT_STATE_SNAPSHOT_EVERY,
        };
        step_loop.sync_page_spaces();
        step_loop
    }

    /// Tells the backend which page memory appeared (the local pool, a session's arena) or
    /// went (a dead session's) in the store. Call after anything that may allocate or refresh
    /// and before pages are used: a page of an unmapped space fails its pass, never reads
    /// stale memory.
    fn sync_page_spaces(&mut self) {
        for change in self.store.take_space_changes() {
            match change {
                SpaceChange::Map(space, memory) => {
                    if let Err(e) = self.backend.map_pages(space, memory) {
                        tracing::error!(space, error = %e, "the backend could not map a page space");
                    }
                }
                SpaceChange::Unmap(space) => self.backend.unmap_pages(space),
            }
        }
    }

    /// Hybrid models: a long prefill also saves a recurrent-state snapshot every `every`
    /// tokens (rounded up to whole pages; 0 = only at the end of prompts and generations),
    /// so a prompt that diverges late still resumes near its divergence.
    pub fn with_state_snapshots(mut self, every: usize) -> Self {
        self.state_snapshot_every = every;
        self
    }

    /// Sets the server's speculative decoding settings (off unless called).
    pub fn with_speculation(mut self, cfg: SpecConfig) -> Self {
        // Hybrid models verify trees too (per-node recurrent states). An MTP drafter needs the
        // backend's head: the probe turns its bookkeeping on, or says there is none.
        if matches!(cfg.drafter, DrafterKind::Mtp | DrafterKind::MtpSuffix)
            && !matches!(self.backend.mtp_draft(0, 0, 0, 0, 0.0), Ok(Some(_)))
        {
            tracing::warn!("speculation_drafter asks for MTP drafts but this model has no MTP head");
        }
        self.spec = SpecRuntime::new(cfg);
        self
    }

    /// Runs until every command sender is gone and no sequence is left.
    pub fn run(mut self) {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                // Idle: what finished sequences gave back must not wait for the next request,
                // nor the gauges, which would show the last batch until then.
                self.store.apply_returns();
                m::record_queue(0, 0);
                m::record_kv_usage(0, self.store.capacity_pages());
                match self.commands.recv() {
                    Ok(cmd) => self.handle(cmd),
                    Err(_) => return,
                }
            }
            loop {
                match self.commands.try_recv() {
                    Ok(cmd) => self.handle(cmd),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => break,
                }
            }
            self.drop_abandoned();
            self.refresh_store();
            self.admit();
            m::record_queue(self.running.len(), self.waiting.len());
            let held: usize = self.running.iter().chain(&self.waiting).map(|seq| seq.pages.len()).sum();
            m::record_kv_usage(held, self.store.capacity_pages());
            if self.running.is_empty() {
                if !self.waiting.is_empty() {
                    // Nothing runs and nothing fits: the arena is full of pinned pages held
                    // by others. Wait for a command instead of spinning.
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                continue;
            }
            self.step();
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Admit(new) => self.waiting.push_back(Sequence::from_new(*new)),
            Command::Abort { request_id, found } => {
                let mut hit = false;
                for i in (0..self.running.len()).rev() {
                    if self.running[i].request_id == request_id {
                        let seq = self.running.swap_remove(i);
                        self.finish(seq, FinishReason::Aborted);
                        hit = true;
                    }
                }
                for i in (0..self.waiting.len()).rev() {
                    if self.waiting[i].request_id == request_id {
                        if let Some(seq) = self.waiting.remove(i) {
                            self.finish(seq, FinishReason::Aborted);
                        }
                        hit = true;
                    }
                }
                if let Some(tx) = found {
                    let _ = tx.send(hit);
                }
            }
        }
    }

    fn drop_abandoned(&mut self) {
        for i in (0..self.running.len()).rev() {
            if self.running[i].is_abandoned() {
                let seq = self.running.swap_remove(i);
                self.finish(seq, FinishReason::Aborted);
            }
        }
        for i in (0..self.waiting.len()).rev() {
            if self.waiting[i].is_abandoned()
                && let Some(seq) = self.waiting.remove(i)
            {
                self.finish(seq, FinishReason::Aborted);
            }
        }
    }

    /// Follows the cache link; when the session died, fails the sequences running on its
    /// pages (the pages are gone) and makes waiting ones forget their cache hits.
    fn refresh_store(&mut self) {
        let refresh = self.store.refresh();
        self.sync_page_spaces();
        let Refresh::Lost(generation) = refresh else { return };
        let lost = PageSource::Shared(generation);
        for i in (0..self.running.len()).rev() {
            if self.running[i].pages.iter().any(|p| p.source == lost) {
                let seq = self.running.swap_remove(i);
                tracing::warn!(request_id = %seq.request_id, "failing a sequence whose KV pages were in the lost cache arena");
                self.fail(
                    seq,
                    EngineError::Unavailable(
                        "the cache-service went away while this request's KV pages were in its arena; retry \
                         (the engine serves uncached until it reconnects)"
                            .into(),
                    ),
                );
            }
        }
        for seq in self.waiting.iter_mut() {
            if seq.pages.iter().any(|p| p.source == lost) {
                seq.forget_cache_hit();
            }
        }
    }

    /// Moves waiting sequences to running while batch slots and pages allow. A sequence is
    /// admitted only if the pages for its whole prompt can be leased now.
    fn admit(&mut self) {
        while self.running.len() < self.limits.max_running {
            let Some(mut seq) = self.waiting.pop_front() else { break };
            if seq.pages.iter().any(|p| !self.store.is_usable(p)) {
                // Pinned through a cache session that has died since the lookup.
                seq.forget_cache_hit();
            }
            // Admitted only if its pages fit (when the store knows what is free), checked
            // before its snapshot is loaded: a sequence that waits keeps its pinned state.
            let optimistic = plan::admission_pages(
                seq.tokens.len(),
                self.limits.page_tokens,
                seq.pages.len(),
                seq.cached_partial_tokens > 0,
            );
            if plan::admissions(1, &[optimistic], self.store.free_pages_hint()) == 0 {
                self.waiting.push_front(seq);
                break;
            }
            self.restore_state(&mut seq);
            let needed = plan::admission_pages(
                seq.tokens.len(),
                self.limits.page_tokens,
                seq.pages.len(),
                seq.cached_partial_tokens > 0,
            );
            let allocated = self.store.allocate_lease(needed);
            self.sync_page_spaces();
            match allocated {
                Ok(Some(pages)) => {
                    if seq.cached_partial_tokens > 0 {
                        // Copy on write: the shared page is replaced by a private copy (the
                        // shared one is given back when `shared` drops).
                        if let (Some(shared), Some(fresh)) = (seq.pages.pop(), pages.first())
                            && let Err(e) = self.backend.copy_page(shared[0].page_id(), fresh.page_id())
                        {
                            self.fail(seq, e);
                            continue;
                        }
                        seq.cached_partial_tokens = 0;
                    }
                    seq.pages.append(pages);
                    seq.started = Some(Instant::now());
                    self.running.push(seq);
                }
                Ok(None) => {
                    self.waiting.push_front(seq);
                    break;
                }
                Err(e) => {
                    // The session may have just died: then the sequence runs on the new store
                    // (uncached) instead of failing.
                    let before = self.store.generation();
                    self.waiting.push_front(seq);
                    self.refresh_store();
                    if self.store.generation() != before {
                        continue;
                    }
                    if let Some(seq) = self.waiting.pop_front() {
                        self.fail(seq, e);
                    }
                }
            }
        }
    }

    /// Ensures the sequence has pages for positions `[0, upto)`; false if the store is full.
    fn ensure_pages(&mut self, index: usize, upto: usize) -> Result<bool, crate::EngineError> {
        let have = self.running[index].pages.len();
        let need = upto.div_ceil(self.limits.page_tokens);
        if need <= have {
            return Ok(true);
        }
        let ahead = (need - have + PAGE_LEASE_AHEAD)
            .min(self.limits.context_length.div_ceil(self.limits.page_tokens).saturating_sub(have))
            .max(need - have);
        let got = match self.store.allocate_lease(ahead)? {
            Some(p) => Some(p),
            None => self.store.allocate_lease(need - have)?,
        };
        match got {
            Some(pages) => {
                self.running[index].pages.append(pages);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// What the planner sees of each running sequence, with the draft tree proposed for it
    /// (drafting needs the backend, so it happens here, before the pure plan): every decoder
    /// drafts while the batch is small enough to speculate.
    fn views_and_drafts(&mut self) -> (Vec<SeqView>, Vec<Option<DraftTree>>) {
        let n_decoding = self.running.iter().filter(|s| s.pending_tokens() == 1).count();
        let speculate = self.spec.batch_allows(n_decoding);
        let mut views = Vec::with_capacity(self.running.len());
        let mut drafts = Vec::with_capacity(self.running.len());
        for seq in &self.running {
            let mut view = SeqView {
                n_computed: seq.n_computed,
                tokens: seq.tokens.len(),
                prompt_len: seq.prompt_len,
                next_hint: seq.next_snapshot_hint(),
                draft_nodes: None,
            };
            let tree = if speculate && view.decoding() {
                let room = DraftRoom {
                    emit_left: seq
                        .stop
                        .max_tokens
                        .saturating_sub(seq.generated())
                        .min(self.limits.context_length.saturating_sub(seq.tokens.len())),
                    nodes_left: self
                        .limits
                        .context_length
                        .saturating_sub(seq.n_computed)
                        .min(self.limits.max_batch_tokens),
                };
                let at = SeqRef { seq_id: seq.seq_id, salt: &seq.cache_salt, tokens: &seq.tokens };
                self.spec.draft_using(at, &seq_override(seq), room, Some(self.backend.as_mut()))
            } else {
                None
            };
            view.draft_nodes = tree.as_ref().map(DraftTree::len);
            views.push(view);
            drafts.push(tree);
        }
        (views, drafts)
    }

    /// The step's plan ([`plan::plan_step`]) with pages leased for it: a tree whose pages
    /// cannot be leased runs as the plain token; a chunk whose pages cannot be leased waits
    /// for the next step. Returns what runs and the sequences the store failed.
    fn plan(&mut self) -> (Vec<Scheduled>, Vec<(usize, crate::EngineError)>) {
        let (views, mut drafts) = self.views_and_drafts();
        let bounds =
            StepBounds { max_batch_tokens: self.limits.max_batch_tokens, snapshot_every: self.snapshot_every() };
        let mut scheduled = Vec::new();
        let mut failed = Vec::new();
        for planned in plan::plan_step(&bounds, &views) {
            let i = planned.index;
            let planned = match (planned.work, drafts[i].take()) {
                (Work::Tree { .. }, Some(tree)) => match self.ensure_pages(i, planned.upto) {
                    Ok(true) => {
                        let tree = PlannedTree { tokens: tree.tokens(), parents: tree.parents(), tree };
                        scheduled.push(Scheduled {
                            index: i,
                            n_tokens: planned.n_tokens(),
                            wants_logits: true,
                            after: AfterPass::Nothing,
                            tree: Some(tree),
                        });
                        continue;
                    }
                    Ok(false) => plan::plain_chunk(&bounds, i, &views[i], 1),
                    Err(e) => {
                        failed.push((i, e));
                        continue;
                    }
                },
                // A plan only proposes trees that were drafted; the plain token otherwise.
                (Work::Tree { .. }, None) => plan::plain_chunk(&bounds, i, &views[i], 1),
                (Work::Chunk { .. }, _) => planned,
            };
            let Work::Chunk { n_tokens, wants_logits, after } = planned.work else { continue };
            match self.ensure_pages(i, planned.upto) {
                Ok(true) => scheduled.push(Scheduled { index: i, n_tokens, wants_logits, after, tree: None }),
                Ok(false) => {} // retried next step, when pages were freed
                Err(e) => failed.push((i, e)),
            }
        }
        (scheduled, failed)
    }

    fn step(&mut self) {
        let (plan, mut failed) = self.plan();
        self.sync_page_spaces();
        if !failed.is_empty() {
            failed.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
            for (i, e) in failed {
                let seq = self.running.swap_remove(i);
                self.fail(seq, e);
            }
            return;
        }
        if plan.is_empty() {
            // Every running sequence is starved of pages: one gives way (see plan::starved).
            match plan::starved(self.running.len()) {
                Some(Starved::Preempt(i)) => {
                    let seq = self.running.remove(i);
                    self.preempt(seq);
                }
                Some(Starved::Fail(i)) => {
                    let seq = self.running.remove(i);
                    let full =
                        EngineError::Exhausted("KV cache is full: no page could be leased for this sequence".into());
                    self.fail(seq, full);
                }
                None => {}
            }
            return;
        }
        let started = Instant::now();
        let page_ids: Vec<Vec<PageId>> =
            plan.iter().map(|p| self.running[p.index].pages.iter().map(LeasedPage::page_id).collect()).collect();
        let batch = ForwardBatch {
            seqs: plan
                .iter()
                .zip(&page_ids)
                .map(|(p, pages)| {
                    let seq = &self.running[p.index];
                    match &p.tree {
                        Some(t) => SeqInput {
                            seq_id: seq.seq_id,
                            tree: Some(&t.parents),
                            tokens: &t.tokens,
                            start_pos: seq.n_computed,
                            pages,
                            logits: LogitsWanted::All,
                        },
                        None => SeqInput {
                            seq_id: seq.seq_id,
                            tree: None,
                            tokens: &seq.tokens[seq.n_computed..seq.n_computed + p.n_tokens],
                            start_pos: seq.n_computed,
                            pages,
                            logits: if p.wants_logits { LogitsWanted::Last } else { LogitsWanted::None },
                        },
                    }
                })
                .collect(),
        };
        // The logits stay in the backend; below only sampled tokens (and asked-for
        // log-probabilities) come back.
        let result = self.backend.run(&batch);
        drop(batch);
        let total_tokens: usize = plan.iter().map(|p| p.n_tokens).sum();
        metrics::histogram!(m::STEP_SECONDS).record(started.elapsed().as_secs_f64());
        metrics::histogram!(m::STEP_TOKENS).record(total_tokens as f64);
        match result {
            Ok(()) => {}
            Err(e) => {
                tracing::error!(error = %e, "forward pass failed; failing its sequences");
                let mut failed: Vec<usize> = plan.iter().map(|p| p.index).collect();
                failed.sort_unstable_by(|a, b| b.cmp(a));
                for i in failed {
                    let seq = self.running.swap_remove(i);
                    self.fail(seq, e.clone());
                }
                return;
            }
        }
        let now = Instant::now();
        let verify_time = now.saturating_duration_since(started);
        let mut finished: Vec<(usize, FinishReason)> = Vec::new();
        let mut broken: Vec<(usize, crate::EngineError)> = Vec::new();
        for (k, (p, pages)) in plan.iter().zip(&page_ids).enumerate() {
            if let Some(t) = &p.tree {
                let commit_started = Instant::now();
                match self.commit_tree(p.index, k, &t.tree, pages) {
                    Ok(Some(reason)) => finished.push((p.index, reason)),
                    Ok(None) => {}
                    Err(e) => broken.push((p.index, e)),
                }
                SpecRuntime::record_times(verify_time, commit_started.elapsed());
                continue;
            }
            match self.apply_chunk(p, k, now) {
                Ok(Some(reason)) => finished.push((p.index, reason)),
                Ok(None) => {}
                Err(e) => broken.push((p.index, e)),
            }
        }
        // Removed from the highest index down, so swap_remove never moves a pending one.
        let mut ends: Vec<(usize, Result<FinishReason, crate::EngineError>)> =
            finished.into_iter().map(|(i, r)| (i, Ok(r))).chain(broken.into_iter().map(|(i, e)| (i, Err(e)))).collect();
        ends.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
        for (i, end) in ends {
            let seq = self.running.swap_remove(i);
            match end {
                Ok(reason) => self.finish(seq, reason),
                Err(e) => {
                    tracing::error!(error = %e, "committing an accepted draft path failed; failing the sequence");
                    self.fail(seq, e);
                }
            }
        }
    }

    /// After the pass: a plain chunk's positions are computed; publishes what its plan says
    /// and, when it wanted logits, samples and reports the next token. Returns why the
    /// sequence finished, if it did.
    fn apply_chunk(&mut self, p: &Scheduled, k: usize, now: Instant) -> Result<Option<FinishReason>, EngineError> {
        let seq = &mut self.running[p.index];
        let was_prefill = seq.in_prefill();
        seq.n_computed += p.n_tokens;
        if was_prefill {
            metrics::counter!(m::PREFILL_TOKENS_TOTAL).increment(p.n_tokens as u64);
        }
        match p.after {
            AfterPass::PromptDone => {
                seq.prefilled = Some(now);
                // The prompt's pages are complete: publish them so a concurrent or later
                // request with the same prefix can reuse them right away.
                self.commit_prompt(p.index);
            }
            // A hinted position: publish the prompt so far (its tail page as a copy) and
            // the state after it.
            AfterPass::Hint => self.commit_prompt(p.index),
            AfterPass::Periodic => {
                // A snapshot boundary inside a long prompt: publish the full pages so far,
                // then the state after them.
                let seq = &self.running[p.index];
                let (n, pt) = (seq.n_computed, self.limits.page_tokens);
                let (salt, tokens, pages) =
                    (seq.cache_salt.clone(), seq.tokens[..n].to_vec(), seq.pages[..n / pt].to_vec());
                self.commit_pages(&salt, &tokens, &pages, false);
                self.snapshot(p.index);
            }
            AfterPass::Nothing => {}
        }
        let seq = &mut self.running[p.index];
        if !p.wants_logits {
            return Ok(None);
        }
        let (token, logprobs) = self.backend.sample(LogitsRow { seq: k, row: 0 }, &mut seq.sampler, seq.logprobs)?;
        seq.tokens.push(token);
        if seq.first_token.is_none() {
            seq.first_token = Some(now);
            metrics::histogram!(m::TIME_TO_FIRST_TOKEN_SECONDS)
                .record(now.saturating_duration_since(seq.arrived).as_secs_f64());
        }
        metrics::counter!(m::GENERATED_TOKENS_TOTAL).increment(1);
        let _ = seq.events.send(SeqEvent::Tokens { ids: vec![token], logprobs: logprobs.into_iter().collect() });
        Ok(stop_reason(&self.limits, seq, token))
    }

    /// Accepts the verified tree of the sequence at `index`, moves the kept path's KV into
    /// place and pushes the emitted tokens one at a time under plain decoding's stop rules.
    /// Returns why the sequence finished, if it did.
    fn commit_tree(
        &mut self,
        index: usize,
        k: usize,
        tree: &DraftTree,
        pages: &[PageId],
    ) -> Result<Option<FinishReason>, crate::EngineError> {
        let seq = &mut self.running[index];
        let start_pos = seq.n_computed;
        let verdict = self.backend.verify_tree(k, tree, &mut seq.sampler, seq.logprobs)?;
        let (accepted, mut path_logprobs) = (verdict.accepted, verdict.logprobs);
        let (drafted, forbidden) = seq.sampler.take_draft_stats();
        if drafted > 0 {
            metrics::counter!(m::GRAMMAR_DRAFT_TOKENS_TOTAL).increment(drafted);
            metrics::counter!(m::GRAMMAR_FORBIDDEN_DRAFT_TOKENS_TOTAL).increment(forbidden);
        }
        self.spec.record(seq.seq_id, tree, &accepted);
        let mut ids = Vec::with_capacity(accepted.tokens.len());
        let mut reason = None;
        for &token in &accepted.tokens {
            seq.tokens.push(token);
            ids.push(token);
            reason = stop_reason(&self.limits, seq, token);
            if reason.is_some() {
                break;
            }
        }
        // The root and the accepted nodes before the last emitted token are computed; the last
        // emitted token is the next step's input, as in plain decoding.
        let kept = &accepted.path[..ids.len()];
        let seq_id = seq.seq_id;
        self.backend.accept_tree_path(seq_id, pages, start_pos, kept)?;
        let seq = &mut self.running[index];
        seq.n_computed = start_pos + ids.len();
        metrics::counter!(m::GENERATED_TOKENS_TOTAL).increment(ids.len() as u64);
        // Only the emitted tokens' log-probabilities (the walk may have gone past a stop).
        path_logprobs.truncate(ids.len());
        let _ = seq.events.send(SeqEvent::Tokens { ids, logprobs: path_logprobs });
        Ok(reason)
    }

    /// Takes a running sequence's pages away and queues it first in line; on readmission it
    /// recomputes prompt and generated tokens (its sampler state is kept, so generation goes
    /// on exactly where it stopped).
    fn preempt(&mut self, mut seq: Sequence) {
        tracing::info!(request_id = %seq.request_id, computed = seq.n_computed, "KV pages exhausted: preempting a sequence");
        metrics::counter!(PREEMPTIONS_TOTAL).increment(1);
        self.forget_progress(&mut seq);
        seq.n_computed = 0;
        seq.cached_partial_tokens = 0;
        self.waiting.push_front(seq);
    }

    /// Ends a sequence: commits its pages (the tail as a partial page), releases every page,
    /// reports `Finished`.
    fn finish(&mut self, mut seq: Sequence, reason: FinishReason) {
        let now = Instant::now();
        if reason != FinishReason::Aborted {
            let at = SeqRef { seq_id: seq.seq_id, salt: &seq.cache_salt, tokens: &seq.tokens };
            self.spec.finished(at, seq.prompt_len);
        }
        if seq.n_computed > 0 && reason != FinishReason::Aborted {
            let used = seq.n_computed.div_ceil(self.limits.page_tokens).min(seq.pages.len());
            self.commit_pages(&seq.cache_salt, &seq.tokens[..seq.n_computed], &seq.pages[..used], true);
            if self.snapshot_every().is_some() {
                // The state after the generation: the conversation's next turn resumes here.
                Self::save_snapshot(self.backend.as_ref(), &mut self.store, &seq);
            }
        }
        self.forget_progress(&mut seq);
        let usage = seq.usage();
        metrics::counter!(m::REQUESTS_TOTAL, "reason" => reason_label(reason)).increment(1);
        metrics::counter!(m::PROMPT_TOKENS_TOTAL).increment(usage.prompt_tokens as u64);
        metrics::counter!(m::CACHED_PROMPT_TOKENS_TOTAL).increment(usage.cached_prompt_tokens as u64);
        metrics::counter!(CACHED_PROMPT_TOKENS_BY_KIND, "kind" => "full_page")
            .increment(usage.cached_full_page_tokens as u64);
        metrics::counter!(CACHED_PROMPT_TOKENS_BY_KIND, "kind" => "partial_page")
            .increment(usage.cached_partial_page_tokens as u64);
        let _ = seq.events.send(SeqEvent::Finished { reason, usage, timings: seq.timings(now) });
    }

    /// Reports the failure and ends the sequence (its pages and pins go back as it drops).
    fn fail(&mut self, mut seq: Sequence, error: EngineError) {
        let _ = seq.events.send(SeqEvent::Failed(error));
        self.forget_progress(&mut seq);
    }

    /// Drops everything the sequence computed: its pages and pins (given back by their
    /// guards) and the per-sequence state of the backend and the drafters (a preempted
    /// sequence recomputes from position 0, so its state goes too).
    fn forget_progress(&mut self, seq: &mut Sequence) {
        self.backend.release_seq(seq.seq_id);
        self.spec.release(seq.seq_id);
        seq.pages.release();
        seq.cached_state = None;
    }
}

/// Why the sequence ends after `token` (already pushed), under plain decoding's rules: an
/// EOS or stop id, then the length and context limits.
fn stop_reason(limits: &StepLimits, seq: &Sequence, token: u32) -> Option<FinishReason> {
    let is_eos = !seq.stop.ignore_eos && limits.eos_token_ids.contains(&token);
    if is_eos || seq.stop.stop_token_ids.contains(&token) {
        Some(FinishReason::Stop)
    } else if seq.generated() >= seq.stop.max_tokens || seq.tokens.len() >= limits.context_length {
        Some(FinishReason::Length)
    } else {
        None
    }
}

/// The request's speculation override.
fn seq_override(seq: &Sequence) -> SpecOverride {
    seq.spec_override
}

fn reason_label(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Aborted => "aborted",
    }
}
