//! Sequences and the queues that hold them. The step loop ([`crate::step`]) is the only
//! owner of running sequences; everything else talks to it through [`Command`]s.
//!
//! A sequence's life: waiting (queued, holds only the pages a cache lookup pinned) ->
//! running/prefill (its prompt is fed in chunks under a per-step token budget, so a long
//! prompt never stalls the decoders) -> running/decode (one token per step) -> finished
//! (full pages committed to the cache, every page released, `Finished` sent).

pub mod plan;

use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use crate::EngineError;
use crate::memory::lease::{PageLease, StatePin};
use crate::sampling::{Sampler, StepLogprobs};
use crate::speculative::SpecOverride;

/// What the sampler and the stop rules need from a request.
#[derive(Clone, Debug)]
pub struct StopRules {
    pub max_tokens: usize,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    Aborted,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct SeqTimings {
    pub queue_ns: u64,
    pub prefill_ns: u64,
    pub decode_ns: u64,
    pub first_token_ns: u64,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct SeqUsage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub cached_prompt_tokens: usize,
    /// Of `cached_prompt_tokens`: from whole pages, and from a page used in part.
    pub cached_full_page_tokens: usize,
    pub cached_partial_page_tokens: usize,
}

/// What the step loop reports to a request's stream.
#[derive(Debug)]
pub enum SeqEvent {
    /// Newly accepted tokens; `logprobs` has one entry per id when the request asked for
    /// them, and is empty otherwise.
    Tokens {
        ids: Vec<u32>,
        logprobs: Vec<StepLogprobs>,
    },
    Finished {
        reason: FinishReason,
        usage: SeqUsage,
        timings: SeqTimings,
    },
    /// The sequence could not be completed; the stream ends with this status.
    Failed(EngineError),
}

/// A validated request, with the prefix pages a cache lookup already pinned for it.
pub struct NewSequence {
    pub request_id: String,
    pub prompt: Vec<u32>,
    pub sampler: Sampler,
    pub stop: StopRules,
    pub cache_salt: String,
    /// `Some(n)`: report each token's log-probability and the `n` best alternatives.
    pub logprobs: Option<usize>,
    /// Pages covering the first `cached_tokens` prompt positions (read-only, committed).
    pub cached_pages: PageLease,
    pub cached_tokens: usize,
    /// Of `cached_tokens`, those taken from the last cached page used in part; that page is
    /// shared and is copied into a fresh page at admission (copy on write).
    pub cached_partial_tokens: usize,
    /// Hybrid models: the recurrent-state snapshot after exactly `cached_tokens` tokens
    /// (pinned); loaded into the backend at admission, then released.
    pub cached_state: Option<StatePin>,
    /// Hybrid models: prompt positions where prefill pauses to save a state snapshot
    /// (ascending, inside the prompt; `GenerateRequest.snapshot_hints`).
    pub snapshot_hints: Vec<usize>,
    /// This request's speculative decoding settings over the server's.
    pub spec_override: SpecOverride,
    pub events: mpsc::UnboundedSender<SeqEvent>,
    pub arrived: Instant,
}

impl NewSequence {
    /// A request with no cache hit, no salt, no logprobs and the server's speculation
    /// settings (tests, benchmarks); set other fields on the result.
    pub fn new(
        request_id: String,
        prompt: Vec<u32>,
        sampler: Sampler,
        stop: StopRules,
        events: mpsc::UnboundedSender<SeqEvent>,
    ) -> NewSequence {
        NewSequence {
            request_id,
            prompt,
            sampler,
            stop,
            cache_salt: String::new(),
            logprobs: None,
            cached_pages: PageLease::default(),
            cached_tokens: 0,
            cached_partial_tokens: 0,
            cached_state: None,
            snapshot_hints: Vec::new(),
            spec_override: SpecOverride::default(),
            events,
            arrived: Instant::now(),
        }
    }
}

pub enum Command {
    Admit(Box<NewSequence>),
    /// Abort every sequence with this request id; answers whether one was found.
    Abort {
        request_id: String,
        found: Option<oneshot::Sender<bool>>,
    },
}

/// Process-unique sequence ids, so backends can key per-sequence state.
static NEXT_SEQ_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A sequence owned by the step loop.
pub struct Sequence {
    /// Unique in this process; the backend keys per-sequence state by it.
    pub seq_id: u64,
    pub request_id: String,
    /// Prompt followed by the generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Positions whose KV is in `pages`: `[0, n_computed)`.
    pub n_computed: usize,
    /// Pages covering the computed positions (and leased ahead); given back when dropped.
    pub pages: PageLease,
    pub sampler: Sampler,
    pub stop: StopRules,
    pub cache_salt: String,
    /// See [`NewSequence::logprobs`].
    pub logprobs: Option<usize>,
    pub cached_tokens: usize,
    /// See [`NewSequence::cached_partial_tokens`]; 0 once the shared page was copied.
    pub cached_partial_tokens: usize,
    /// Partial-page tokens served (kept for usage after the copy).
    pub served_partial_tokens: usize,
    /// See [`NewSequence::cached_state`]; `None` once loaded (or dropped).
    pub cached_state: Option<StatePin>,
    /// See [`NewSequence::snapshot_hints`].
    pub snapshot_hints: Vec<usize>,
    /// See [`NewSequence::spec_override`].
    pub spec_override: SpecOverride,
    pub events: mpsc::UnboundedSender<SeqEvent>,
    pub arrived: Instant,
    pub started: Option<Instant>,
    pub prefilled: Option<Instant>,
    pub first_token: Option<Instant>,
}

impl Sequence {
    pub fn from_new(new: NewSequence) -> Sequence {
        Sequence {
            seq_id: NEXT_SEQ_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            request_id: new.request_id,
            prompt_len: new.prompt.len(),
            tokens: new.prompt,
            n_computed: new.cached_tokens,
            pages: new.cached_pages,
            sampler: new.sampler,
            stop: new.stop,
            cache_salt: new.cache_salt,
            logprobs: new.logprobs,
            cached_tokens: new.cached_tokens,
            cached_partial_tokens: new.cached_partial_tokens,
            served_partial_tokens: new.cached_partial_tokens,
            cached_state: new.cached_state,
            snapshot_hints: new.snapshot_hints,
            spec_override: new.spec_override,
            events: new.events,
            arrived: new.arrived,
            started: None,
            prefilled: None,
            first_token: None,
        }
    }

    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    pub fn in_prefill(&self) -> bool {
        self.n_computed < self.prompt_len
    }

    /// Tokens to feed next: the rest of the prompt (prefill) or the last sampled token (decode).
    pub fn pending_tokens(&self) -> usize {
        self.tokens.len() - self.n_computed
    }

    /// The next snapshot hint after the computed tokens, if the prompt reaches past it.
    pub fn next_snapshot_hint(&self) -> Option<usize> {
        self.snapshot_hints.iter().copied().find(|&h| h > self.n_computed && h < self.prompt_len)
    }

    pub fn page_ids(&self) -> Vec<u32> {
        self.pages.iter().map(|p| p.id).collect()
    }

    /// Drops the cache hit (its pages are gone with a dead cache session): the whole prompt
    /// is computed instead. Only for sequences that have not run yet.
    pub fn forget_cache_hit(&mut self) {
        self.pages.release();
        self.cached_state = None;
        self.n_computed = 0;
        self.cached_tokens = 0;
        self.cached_partial_tokens = 0;
        self.served_partial_tokens = 0;
    }

    pub fn usage(&self) -> SeqUsage {
        SeqUsage {
            prompt_tokens: self.prompt_len,
            completion_tokens: self.generated(),
            cached_prompt_tokens: self.cached_tokens,
            cached_full_page_tokens: self.cached_tokens - self.served_partial_tokens,
            cached_partial_page_tokens: self.served_partial_tokens,
        }
    }

    pub fn timings(&self, now: Instant) -> SeqTimings {
        let ns = |a: Instant, b: Instant| b.saturating_duration_since(a).as_nanos() as u64;
        let started = self.started.unwrap_or(now);
        let prefilled = self.prefilled.unwrap_or(now);
        SeqTimings {
            queue_ns: ns(self.arrived, started),
            prefill_ns: ns(started, prefilled),
            decode_ns: ns(prefilled, now),
            first_token_ns: self.first_token.map(|t| ns(self.arrived, t)).unwrap_or(0),
        }
    }

    /// The stream was dropped: nobody will read further tokens.
    pub fn is_abandoned(&self) -> bool {
        self.events.is_closed()
    }
}
