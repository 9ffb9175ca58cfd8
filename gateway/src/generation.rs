//! One generation on the engine, as a pull-based sequence of text deltas and one finish.
//!
//! Owns the gRPC stream and a `RequestGuard`: dropping a `Generation` (client gone, timeout,
//! error) drops the stream, which aborts the sequence in the engine, and the guard also sends
//! an explicit best-effort `Abort`. Text is detokenized incrementally and passed through the
//! stop-string matcher, so each `Text` event is valid UTF-8 and never shows a stop string or
//! an EOS token. On a stop-string match the engine is aborted and its final usage (which
//! carries the cached prompt tokens) is awaited briefly.

use std::collections::VecDeque;
use std::time::Duration;

use proto::engine::v1::{
    FinishReason as WireFinish, GenerateRequest, GenerateResponse, SamplingParams, generate_response::Kind,
};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use crate::engine_client::EngineClient;
use crate::error::GatewayError;
use crate::metrics;
use crate::openai::{FinishReason, TokenLogprob, TopLogprob, Usage, finite_logprob};
use crate::routing::{EnginePool, Lease, RouteKey};
use crate::text::{IncrementalDetokenizer, StopMatcher, TextTokenizer};

/// How long to wait for the engine's `Finished` after aborting on a stop string.
const ABORT_DRAIN_TIMEOUT: Duration = Duration::from_secs(1);

/// What `Generation::start` needs.
#[derive(Debug, Clone)]
pub struct GenerationParams {
    pub request_id: String,
    pub prompt_ids: Vec<u32>,
    pub sampling: SamplingParams,
    pub cache_salt: String,
    pub stop: Vec<String>,
    /// The client's `X-Session-ID`, forwarded to the engine.
    pub session_id: String,
    /// Prompt positions worth a recurrent-state snapshot (hybrid models; see the proto).
    pub snapshot_hints: Vec<u32>,
    /// Per-request speculative decoding override.
    pub speculation: Option<proto::engine::v1::SpeculationParams>,
    /// Structured outputs: the grammar the engine constrains decoding to.
    pub grammar: Option<proto::engine::v1::Grammar>,
    /// Deadline for the engine to take the call (`Config::engine_accept_timeout`).
    pub accept_timeout: Duration,
    /// Deadline for the first token, from the call.
    pub first_token_timeout: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub enum GenEvent {
    /// Log-probabilities of the tokens whose text follows (only when asked for); comes
    /// before the `Text` those tokens produced.
    Logprobs(Vec<TokenLogprob>),
    /// New visible text (never empty).
    Text(String),
    /// The last event. `stop_sequence`: the client's stop string that ended the text, if one
    /// did (reason `Stop`).
    Finished { reason: FinishReason, usage: Usage, stop_sequence: Option<String> },
}

/// Aborts the engine sequence when dropped before it finished; holds the concurrency permit
/// and the engine's lease (its load count).
struct RequestGuard {
    /// The engine the request was sent to (none before the first attempt).
    lease: Option<Lease>,
    request_id: String,
    finished: bool,
    _permit: Option<OwnedSemaphorePermit>,
}

impl RequestGuard {
    fn engine(&self) -> Option<&EngineClient> {
        self.lease.as_ref().map(Lease::client)
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let Some(engine) = self.engine().cloned() else {
            return;
        };
        tracing::debug!(request_id = %self.request_id, "request dropped before finishing; aborting");
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let request_id = std::mem::take(&mut self.request_id);
        runtime.spawn(async move {
            if let Err(status) = engine.abort(request_id.clone()).await {
                tracing::debug!(%request_id, code = ?status.code(), "best-effort Abort failed");
            }
        });
    }
}

/// Backoff between `Generate` attempts while no engine takes calls: short first (a socket
/// handover takes milliseconds), capped so a restarting engine is found soon after it is up.
const ENGINE_RETRY_FIRST_BACKOFF: std::time::Duration = std::time::Duration::from_millis(10);
const ENGINE_RETRY_MAX_BACKOFF: std::time::Duration = std::time::Duration::from_millis(500);

pub struct Generation {
    stream: tonic::Streaming<GenerateResponse>,
    /// The first message, read by `start` to enforce the first-token deadline.
    first: Option<Option<GenerateResponse>>,
    guard: RequestGuard,
    tokenizer: TextTokenizer,
    detok: IncrementalDetokenizer,
    stop: StopMatcher,
    prompt_tokens: u32,
    completion_tokens: u32,
    arrival: Instant,
    last_chunk_at: Option<Instant>,
    pending: VecDeque<GenEvent>,
    done: bool,
}

impl Generation {
    /// Sends `Generate` and waits for the first message; errors here (engine down or
    /// stalled, rejected request, no first token in time) happen before any byte of the
    /// response, so they become a plain HTTP error.
    pub async fn start(
        engines: &EnginePool,
        route: &RouteKey,
        tokenizer: TextTokenizer,
        params: GenerationParams,
        arrival: Instant,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Result<Generation, GatewayError> {
        let prompt_tokens = u32::try_from(params.prompt_ids.len()).unwrap_or(u32::MAX);
        let request = GenerateRequest {
            request_id: params.request_id.clone(),
            prompt_token_ids: params.prompt_ids,
            sampling: Some(params.sampling),
            cache_salt: params.cache_salt,
            session_id: params.session_id,
            snapshot_hints: params.snapshot_hints,
            speculation: params.speculation,
            grammar: params.grammar,
        };
        // The guard exists before the call so a drop mid-call still aborts.
        let mut guard = RequestGuard { lease: None, request_id: params.request_id, finished: false, _permit: permit };
        let (accept_timeout, first_token_timeout) = (params.accept_timeout, params.first_token_timeout);
        // A call no engine takes goes to the next engine at once; when every engine was tried
        // (one restarting, or handing its socket to a new build) they are waited for, up to
        // the accept deadline: the request is held, not failed at once.
        let accept_by = tokio::time::Instant::now() + accept_timeout;
        let mut backoff = ENGINE_RETRY_FIRST_BACKOFF;
        let mut tried: Vec<usize> = Vec::new();
        let mut stream = loop {
            let lease = engines.choose(route, &tried);
            let (engine, index) = (lease.client().clone(), lease.index);
            // Held from here: a drop mid-call aborts on this engine.
            guard.lease = Some(lease);
            match tokio::time::timeout_at(accept_by, engine.generate(request.clone())).await {
                Ok(Ok(stream)) => {
                    if let Some(lease) = &guard.lease {
                        engines.placed(route, lease);
                    }
                    break stream;
                }
                // Unavailable, or a transport failure (a status with a source: the connection
                // closed under the call, as an engine handing over its socket does).
                Ok(Err(status))
                    if (status.code() == tonic::Code::Unavailable || std::error::Error::source(&status).is_some())
                        && tokio::time::Instant::now() + backoff < accept_by =>
                {
                    tracing::debug!(
                        endpoint = guard.lease.as_ref().map(Lease::endpoint).unwrap_or(""),
                        message = status.message(),
                        "the engine took no call; retrying"
                    );
                    engines.placement_failed(index);
                    guard.lease = None;
                    tried.push(index);
                    if tried.len() >= engines.engines().len() {
                        tried.clear();
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(ENGINE_RETRY_MAX_BACKOFF);
                    }
                }
                Ok(Err(status)) => {
                    // The engine refused or never saw the request: nothing to abort.
                    guard.finished = true;
                    return Err(status.into());
                }
                // The guard aborts it, should the engine take it later.
                Err(_) => {
                    metrics::record_engine_deadline("accept");
                    return Err(GatewayError::EngineNotAnswering(accept_timeout.as_secs_f64()));
                }
            }
        };
        let first = match tokio::time::timeout(first_token_timeout, stream.message()).await {
            Ok(first) => first?,
            Err(_) => {
                metrics::record_engine_deadline("first_token");
                return Err(GatewayError::FirstTokenTimeout(first_token_timeout.as_secs_f64()));
            }
        };
        Ok(Generation {
            stream,
            first: Some(first),
            guard,
            detok: IncrementalDetokenizer::new(tokenizer.clone()),
            tokenizer,
            stop: StopMatcher::new(params.stop),
            prompt_tokens,
            completion_tokens: 0,
            arrival,
            last_chunk_at: None,
            pending: VecDeque::new(),
            done: false,
        })
    }

    /// Which engine (its place in the gateway's list) serves this generation.
    pub fn engine_index(&self) -> Option<usize> {
        self.guard.lease.as_ref().map(|l| l.index)
    }

    /// Tokens in the prompt sent to the engine.
    pub fn prompt_tokens(&self) -> u32 {
        self.prompt_tokens
    }

    pub fn request_id(&self) -> &str {
        &self.guard.request_id
    }

    /// The next event, or `None` after `Finished` was returned.
    pub async fn next(&mut self) -> Result<Option<GenEvent>, GatewayError> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(Some(event));
            }
            if self.done {
                return Ok(None);
            }
            let message = match self.first.take() {
                Some(first) => first,
                None => self.stream.message().await?,
            };
            match message.and_then(|m| m.kind) {
                None => {
                    self.done = true;
                    return Err(GatewayError::EngineProtocol("the Generate stream ended without Finished".into()));
                }
                Some(Kind::Tokens(chunk)) => self.on_tokens(&chunk.token_ids, &chunk.logprobs).await?,
                Some(Kind::Finished(finished)) => self.on_finished(finished)?,
            }
        }
    }

    /// [`Generation::next`] bounded by the request's deadline: past it, a `Timeout` error.
    /// Other failures are logged here, once for every endpoint that streams.
    pub async fn next_before(
        &mut self,
        deadline: Instant,
        timeout_secs: u64,
    ) -> Result<Option<GenEvent>, GatewayError> {
        match tokio::time::timeout_at(deadline, self.next()).await {
            Err(_) => Err(GatewayError::Timeout(timeout_secs)),
            Ok(Err(e)) => {
                tracing::warn!(request_id = self.request_id(), error = %e, "generation failed");
                Err(e)
            }
            Ok(Ok(event)) => Ok(event),
        }
    }

    /// One engine chunk: detokenize and stop-match token by token; the log-probabilities
    /// (when the engine sent them) cover exactly the tokens consumed.
    async fn on_tokens(
        &mut self,
        ids: &[u32],
        logprobs: &[proto::engine::v1::TokenLogprob],
    ) -> Result<(), GatewayError> {
        let now = Instant::now();
        match self.last_chunk_at {
            None => metrics::record_ttft((now - self.arrival).as_secs_f64()),
            Some(prev) => metrics::record_inter_token((now - prev).as_secs_f64(), ids.len()),
        }
        self.last_chunk_at = Some(now);
        let mut text = String::new();
        let mut entries = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            self.completion_tokens += 1;
            if let Some(lp) = logprobs.get(i) {
                entries.push(self.logprob_entry(id, lp));
            }
            let piece = self.detok.push(id).map_err(|e| GatewayError::Internal(e.to_string()))?;
            let out = self.stop.push(&piece);
            text.push_str(&out.text);
            if out.stopped {
                self.push_logprobs(entries);
                self.push_text(text);
                return self.finish_on_stop_string().await;
            }
        }
        self.push_logprobs(entries);
        self.push_text(text);
        Ok(())
    }

    fn logprob_entry(&self, id: u32, lp: &proto::engine::v1::TokenLogprob) -> TokenLogprob {
        let (token, bytes) = self.tokenizer.token_text_and_bytes(id);
        let top_logprobs = lp
            .top
            .iter()
            .map(|t| {
                let (token, bytes) = self.tokenizer.token_text_and_bytes(t.token_id);
                TopLogprob { token, logprob: finite_logprob(t.logprob), bytes }
            })
            .collect();
        TokenLogprob { token, logprob: finite_logprob(lp.logprob), bytes, top_logprobs }
    }

    fn push_logprobs(&mut self, entries: Vec<TokenLogprob>) {
        if !entries.is_empty() {
            self.pending.push_back(GenEvent::Logprobs(entries));
        }
    }

    fn on_finished(&mut self, finished: proto::engine::v1::Finished) -> Result<(), GatewayError> {
        self.guard.finished = true;
        self.done = true;
        let reason = match WireFinish::try_from(finished.reason) {
            Ok(WireFinish::Length) => FinishReason::Length,
            Ok(WireFinish::Aborted) => {
                return Err(GatewayError::Engine(tonic::Status::unavailable("the engine aborted the sequence")));
            }
            _ => FinishReason::Stop,
        };
        let tail = self.detok.finish().map_err(|e| GatewayError::Internal(e.to_string()))?;
        let out = self.stop.push(&tail);
        let mut text = out.text;
        let reason = if out.stopped {
            FinishReason::Stop
        } else {
            text.push_str(&self.stop.finish());
            reason
        };
        self.push_text(text);
        let wire = finished.usage.unwrap_or_default();
        let prompt_tokens = if wire.prompt_tokens > 0 { wire.prompt_tokens } else { self.prompt_tokens };
        let completion_tokens = wire.completion_tokens.max(self.completion_tokens);
        self.push_finished(reason, prompt_tokens, completion_tokens, wire.cached_prompt_tokens);
        if let Some(GenEvent::Finished { usage, .. }) = self.pending.back_mut() {
            usage.cached_partial_tokens = wire.cached_partial_page_tokens;
            usage.edge_cache = Some(usage.explain());
        }
        Ok(())
    }

    /// A stop string matched: abort the engine and wait briefly for its usage report.
    async fn finish_on_stop_string(&mut self) -> Result<(), GatewayError> {
        self.done = true;
        if let Some(engine) = self.guard.engine()
            && let Err(status) = engine.abort(self.guard.request_id.clone()).await
        {
            tracing::debug!(code = ?status.code(), "Abort after stop string failed");
        }
        let mut cached = 0;
        let drain = async {
            while let Ok(Some(message)) = self.stream.message().await {
                if let Some(Kind::Finished(f)) = message.kind {
                    return f.usage.map(|u| u.cached_prompt_tokens);
                }
            }
            None
        };
        if let Ok(Some(c)) = tokio::time::timeout(ABORT_DRAIN_TIMEOUT, drain).await {
            cached = c;
            self.guard.finished = true;
        }
        // Completion tokens are the ones consumed up to the stop string, not what the engine
        // produced before it saw the abort.
        self.push_finished(FinishReason::Stop, self.prompt_tokens, self.completion_tokens, cached);
        Ok(())
    }

    fn push_text(&mut self, text: String) {
        if !text.is_empty() {
            self.pending.push_back(GenEvent::Text(text));
        }
    }

    fn push_finished(&mut self, reason: FinishReason, prompt: u32, completion: u32, cached: u32) {
        metrics::record_usage(prompt, cached, completion);
        metrics::record_e2e((Instant::now() - self.arrival).as_secs_f64());
        let mut usage = Usage::new(prompt, completion, cached);
        usage.edge_cache = Some(usage.explain());
        let stop_sequence = self.stop.matched().map(str::to_owned);
        self.pending.push_back(GenEvent::Finished { reason, usage, stop_sequence });
    }
}
