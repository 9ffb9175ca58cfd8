//! The step loop: one OS thread that owns the backend and every running sequence.
//! Each iteration takes new commands, admits waiting sequences while pages and batch
//! slots allow, builds one forward batch (every decoding sequence contributes one token;
//! prefilling sequences share the rest of the token budget, so a long prompt is chunked
//! and never stalls the decoders), runs it, samples, and finishes sequences.

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::time::Instant;

use crate::backend::{Backend, ForwardBatch, LogitsWanted, SeqInput};
use crate::memory::store::PageStore;
use crate::memory::PagePtr;
use crate::metrics as m;
use crate::scheduler::{Command, FinishReason, SeqEvent, Sequence};

/// Limits of the running batch.
#[derive(Clone, Debug)]
pub struct StepLimits {
    pub max_batch_tokens: usize,
    pub max_running: usize,
    pub context_length: usize,
    pub page_tokens: usize,
    pub eos_token_ids: Vec<u32>,
}

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
}

/// One sequence's share of the next forward pass.
struct Planned {
    index: usize,
    n_tokens: usize,
    wants_logits: bool,
}

impl StepLoop {
    pub fn new(backend: Box<dyn Backend>, store: PageStore, limits: StepLimits, commands: Receiver<Command>) -> Self {
        StepLoop { backend, store, limits, commands, waiting: VecDeque::new(), running: Vec::new() }
    }

    /// Runs until every command sender is gone and no sequence is left.
    pub fn run(mut self) {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
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
            self.admit();
            metrics::gauge!(m::RUNNING_SEQUENCES).set(self.running.len() as f64);
            metrics::gauge!(m::WAITING_SEQUENCES).set(self.waiting.len() as f64);
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
            if self.waiting[i].is_abandoned() {
                if let Some(seq) = self.waiting.remove(i) {
                    self.finish(seq, FinishReason::Aborted);
                }
            }
        }
    }

    /// Moves waiting sequences to running while batch slots and pages allow. A sequence is
    /// admitted only if the pages for its whole prompt can be leased now.
    fn admit(&mut self) {
        while self.running.len() < self.limits.max_running {
            let Some(mut seq) = self.waiting.pop_front() else { break };
            let needed = (seq.prompt_len + 1).div_ceil(self.limits.page_tokens).saturating_sub(seq.pages.len());
            match self.store.allocate(needed) {
                Ok(Some(pages)) => {
                    seq.pages.extend(pages);
                    seq.started = Some(Instant::now());
                    self.running.push(seq);
                }
                Ok(None) => {
                    self.waiting.push_front(seq);
                    break;
                }
                Err(e) => {
                    let _ = seq.events.send(SeqEvent::Failed(tonic::Status::unavailable(e.to_string())));
                    self.release_pages(&mut seq);
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
        let got = match self.store.allocate(ahead)? {
            Some(p) => Some(p),
            None => self.store.allocate(need - have)?,
        };
        match got {
            Some(pages) => {
                self.running[index].pages.extend(pages);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Returns the plan and the sequences that failed to get pages (store error).
    fn plan(&mut self) -> (Vec<Planned>, Vec<(usize, crate::EngineError)>) {
        let mut plan = Vec::new();
        let mut failed = Vec::new();
        let mut budget = self.limits.max_batch_tokens;
        // Decoders first: one token each, so generation keeps moving under long prefills.
        let order: Vec<usize> = {
            let (mut dec, pre): (Vec<usize>, Vec<usize>) =
                (0..self.running.len()).partition(|&i| !self.running[i].in_prefill());
            dec.extend(pre);
            dec
        };
        for i in order {
            if budget == 0 {
                break;
            }
            let seq = &self.running[i];
            let n_tokens = seq.pending_tokens().min(budget);
            if n_tokens == 0 {
                continue;
            }
            let upto = seq.n_computed + n_tokens;
            let wants_logits = upto == seq.tokens.len();
            match self.ensure_pages(i, upto) {
                Ok(true) => {
                    budget -= n_tokens;
                    plan.push(Planned { index: i, n_tokens, wants_logits });
                }
                Ok(false) => {} // retried next step, when pages were freed
                Err(e) => failed.push((i, e)),
            }
        }
        (plan, failed)
    }

    fn step(&mut self) {
        let (plan, mut failed) = self.plan();
        if !failed.is_empty() {
            failed.sort_unstable_by(|a, b| b.0.cmp(&a.0));
            for (i, e) in failed {
                let mut seq = self.running.swap_remove(i);
                let _ = seq.events.send(SeqEvent::Failed(tonic::Status::unavailable(e.to_string())));
                self.release_pages(&mut seq);
            }
            return;
        }
        if plan.is_empty() {
            // Every running sequence is starved of pages: fail the newest so the rest can go on.
            if let Some(seq) = self.running.pop() {
                let _ = seq.events.send(SeqEvent::Failed(tonic::Status::resource_exhausted(
                    "KV cache is full: no page could be leased for this sequence",
                )));
                let mut seq = seq;
                self.release_pages(&mut seq);
            }
            return;
        }
        let started = Instant::now();
        let page_ptrs: Vec<Vec<PagePtr>> =
            plan.iter().map(|p| self.running[p.index].pages.iter().map(|l| l.ptr).collect()).collect();
        let batch = ForwardBatch {
            seqs: plan
                .iter()
                .zip(&page_ptrs)
                .map(|(p, pages)| {
                    let seq = &self.running[p.index];
                    SeqInput {
                        tokens: &seq.tokens[seq.n_computed..seq.n_computed + p.n_tokens],
                        start_pos: seq.n_computed,
                        pages,
                        logits: if p.wants_logits { LogitsWanted::Last } else { LogitsWanted::None },
                    }
                })
                .collect(),
        };
        let result = self.backend.forward(&batch);
        drop(batch);
        let total_tokens: usize = plan.iter().map(|p| p.n_tokens).sum();
        metrics::histogram!(m::STEP_SECONDS).record(started.elapsed().as_secs_f64());
        metrics::histogram!(m::STEP_TOKENS).record(total_tokens as f64);
        let output = match result {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(error = %e, "forward pass failed; failing its sequences");
                let mut failed: Vec<usize> = plan.iter().map(|p| p.index).collect();
                failed.sort_unstable_by(|a, b| b.cmp(a));
                for i in failed {
                    let mut seq = self.running.swap_remove(i);
                    let _ = seq.events.send(SeqEvent::Failed(tonic::Status::internal(e.to_string())));
                    self.release_pages(&mut seq);
                }
                return;
            }
        };
        let now = Instant::now();
        let mut finished: Vec<(usize, FinishReason)> = Vec::new();
        for (p, logits) in plan.iter().zip(output.logits) {
            let seq = &mut self.running[p.index];
            let was_prefill = seq.in_prefill();
            seq.n_computed += p.n_tokens;
            if was_prefill {
                metrics::counter!(m::PREFILL_TOKENS_TOTAL).increment(p.n_tokens as u64);
            }
            if was_prefill && !seq.in_prefill() {
                seq.prefilled = Some(now);
                // The prompt's pages are complete: publish them so a concurrent or later
                // request with the same prefix can reuse them right away.
                let ids = seq.page_ids();
                self.store.commit(&seq.cache_salt, &seq.tokens[..seq.n_computed], &ids);
            }
            let seq = &mut self.running[p.index];
            if !p.wants_logits {
                continue;
            }
            let token = seq.sampler.sample(&logits);
            seq.tokens.push(token);
            if seq.first_token.is_none() {
                seq.first_token = Some(now);
                metrics::histogram!(m::TIME_TO_FIRST_TOKEN_SECONDS)
                    .record(now.saturating_duration_since(seq.arrived).as_secs_f64());
            }
            metrics::counter!(m::GENERATED_TOKENS_TOTAL).increment(1);
            let _ = seq.events.send(SeqEvent::Tokens(vec![token]));
            let is_eos = !seq.stop.ignore_eos && self.limits.eos_token_ids.contains(&token);
            if is_eos || seq.stop.stop_token_ids.contains(&token) {
                finished.push((p.index, FinishReason::Stop));
            } else if seq.generated() >= seq.stop.max_tokens || seq.tokens.len() >= self.limits.context_length {
                finished.push((p.index, FinishReason::Length));
            }
        }
        finished.sort_unstable_by(|a, b| b.0.cmp(&a.0));
        for (i, reason) in finished {
            let seq = self.running.swap_remove(i);
            self.finish(seq, reason);
        }
    }

    /// Ends a sequence: commits its full pages, releases every page, reports `Finished`.
    fn finish(&mut self, mut seq: Sequence, reason: FinishReason) {
        let now = Instant::now();
        if seq.n_computed >= self.limits.page_tokens && reason != FinishReason::Aborted {
            let ids = seq.page_ids();
            self.store.commit(&seq.cache_salt, &seq.tokens[..seq.n_computed], &ids);
        }
        self.release_pages(&mut seq);
        let usage = seq.usage();
        metrics::counter!(m::REQUESTS_TOTAL, "reason" => reason_label(reason)).increment(1);
        metrics::counter!(m::PROMPT_TOKENS_TOTAL).increment(usage.prompt_tokens as u64);
        metrics::counter!(m::CACHED_PROMPT_TOKENS_TOTAL).increment(usage.cached_prompt_tokens as u64);
        let _ = seq.events.send(SeqEvent::Finished { reason, usage, timings: seq.timings(now) });
    }

    fn release_pages(&mut self, seq: &mut Sequence) {
        if !seq.pages.is_empty() {
            let ids = seq.page_ids();
            self.store.release(&ids);
            seq.pages.clear();
        }
    }
}

fn reason_label(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Aborted => "aborted",
    }
}
