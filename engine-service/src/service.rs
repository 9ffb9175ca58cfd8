//! gRPC `Engine` service: decode the request, validate it against the model, look up the
//! prefix cache, hand the sequence to the step loop, stream its events back. Nothing here
//! runs model code. Dropping the response stream aborts the sequence.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::time::Instant;

use futures::Stream;
use proto::engine::v1 as pb;
use tokio::sync::{mpsc, oneshot};
use tonic::{Request, Response, Status};

use crate::EngineError;
use crate::error::grpc_status;
use crate::grammar::{GrammarCompiler, GrammarSpec, TokenConstraint};
use crate::limits::RequestLimits;
use crate::memory::lease::{PageLease, Returns, StatePin};
use crate::memory::store::CacheLink;
use crate::sampling::{Sampler, SamplingParams};
use crate::scheduler::{Command, FinishReason, NewSequence, SeqEvent, StopRules};
use crate::speculative::SpecOverride;

pub struct EngineService {
    commands: Sender<Command>,
    info: pb::InfoResponse,
    cache: Option<Arc<CacheLink>>,
    /// Where the cache hits' guards give pages back (the step loop's page store).
    returns: Returns,
    limits: RequestLimits,
    /// The backend's recurrent-state snapshot size (0 for attention-only models): hybrid
    /// models resume a cached prefix only where a snapshot exists.
    state_bytes: usize,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: usize,
    next_id: AtomicUsize,
    grammars: Arc<GrammarCompiler>,
}

impl EngineService {
    pub fn new(
        commands: Sender<Command>,
        mut info: pb::InfoResponse,
        cache: Option<Arc<CacheLink>>,
        returns: Returns,
        vocab_size: usize,
        state_bytes: usize,
        max_in_flight: usize,
    ) -> Self {
        let limits = RequestLimits { context_length: info.context_length as usize, vocab_size };
        // What `Info` publishes is what `Generate` checks.
        info.limits = Some(limits.to_proto());
        let grammars =
            Arc::new(GrammarCompiler::new(info.tokenizer_json.clone(), info.eos_token_ids.clone(), vocab_size));
        EngineService {
            commands,
            info,
            cache,
            returns,
            limits,
            state_bytes,
            in_flight: Arc::new(AtomicUsize::new(0)),
            max_in_flight,
            next_id: AtomicUsize::new(0),
            grammars,
        }
    }

    /// The request's grammar compiled for this model (off the async runtime: the first one
    /// builds the vocabulary's token trie).
    async fn constraint(&self, grammar: Option<&pb::Grammar>) -> Result<Option<TokenConstraint>, Status> {
        let spec = match grammar.and_then(|g| g.kind.as_ref()) {
            None => return Ok(None),
            Some(pb::grammar::Kind::JsonSchema(s)) => GrammarSpec::JsonSchema(s.clone()),
            Some(pb::grammar::Kind::Lark(s)) => GrammarSpec::Lark(s.clone()),
        };
        let grammars = self.grammars.clone();
        let compiled = tokio::task::spawn_blocking(move || grammars.compile(&spec))
            .await
            .map_err(|e| grpc_status(EngineError::Internal(format!("grammar compiler panicked: {e}"))))?;
        compiled.map(Some).map_err(grpc_status)
    }
}

/// What a request gets once the step loop is gone.
fn stopped() -> EngineError {
    EngineError::Unavailable("engine step loop has stopped".into())
}

type GenerateStream = Pin<Box<dyn Stream<Item = Result<pb::GenerateResponse, Status>> + Send>>;

/// Ends the sequence when the gRPC stream is dropped (client went away) and keeps the
/// in-flight count honest.
struct StreamGuard {
    request_id: String,
    commands: Sender<Command>,
    in_flight: Arc<AtomicUsize>,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        let _ = self.commands.send(Command::Abort { request_id: self.request_id.clone(), found: None });
    }
}

#[tonic::async_trait]
impl pb::engine_server::Engine for EngineService {
    type GenerateStream = GenerateStream;

    async fn generate(&self, request: Request<pb::GenerateRequest>) -> Result<Response<Self::GenerateStream>, Status> {
        let arrived = Instant::now();
        let req = request.into_inner();
        self.limits.check(&req).map_err(grpc_status)?;
        let constraint = self.constraint(req.grammar.as_ref()).await?;
        if self.in_flight.fetch_add(1, Ordering::AcqRel) >= self.max_in_flight {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(grpc_status(EngineError::Exhausted("engine queue is full; retry later".into())));
        }
        let session_id = req.session_id.clone();
        let request_id = if req.request_id.is_empty() {
            format!("engine-{}", self.next_id.fetch_add(1, Ordering::Relaxed))
        } else {
            req.request_id.clone()
        };
        let guard = StreamGuard {
            request_id: request_id.clone(),
            commands: self.commands.clone(),
            in_flight: self.in_flight.clone(),
        };
        let s = req.sampling.unwrap_or_default();
        let context = self.info.context_length as usize;
        let room = context - req.prompt_token_ids.len();
        let max_tokens = if s.max_tokens == 0 { room } else { (s.max_tokens as usize).min(room) };
        let sampler = Sampler::new(SamplingParams {
            temperature: s.temperature,
            top_p: s.top_p,
            top_k: s.top_k as usize,
            seed: s.seed,
        });
        let sampler = match constraint {
            Some(c) => sampler.with_constraint(c),
            None => sampler,
        };
        // A cache failure (or no live session) only costs the hit.
        let cached = crate::memory::state::lookup_prefix_linked(
            self.cache.as_deref(),
            &req.cache_salt,
            &req.prompt_token_ids,
            self.state_bytes,
        )
        .await;
        let cached_tokens = cached.cached_tokens;
        let (tx, rx) = mpsc::unbounded_channel();
        let new = NewSequence {
            request_id: request_id.clone(),
            prompt: req.prompt_token_ids,
            sampler,
            stop: StopRules { max_tokens, stop_token_ids: s.stop_token_ids, ignore_eos: s.ignore_eos },
            cache_salt: req.cache_salt,
            logprobs: s.logprobs.then_some(s.top_logprobs as usize),
            cached_pages: PageLease::new(cached.pages, self.returns.clone()),
            cached_tokens,
            cached_partial_tokens: cached.partial_page_tokens,
            cached_state: cached.state.map(|state| StatePin::new(state, self.returns.clone())),
            spec_override: req.speculation.as_ref().map(SpecOverride::from_proto).unwrap_or_default(),
            snapshot_hints: {
                let mut hints: Vec<usize> = req.snapshot_hints.iter().map(|&h| h as usize).collect();
                hints.sort_unstable();
                hints.dedup();
                hints
            },
            events: tx,
            arrived,
        };
        if self.commands.send(Command::Admit(Box::new(new))).is_err() {
            // The step loop (and its store) is gone, so the refused sequence's pins go nowhere:
            // the engine is stopping, and its cache session, with every pin, ends with it.
            return Err(grpc_status(stopped()));
        }
        tracing::debug!(%request_id, session_id = %session_id, cached_tokens, "sequence admitted to the queue");
        // The guard lives in the stream's state: dropping the stream aborts the sequence.
        let stream = futures::stream::unfold((rx, guard, false), |(mut rx, guard, done)| async move {
            if done {
                return None;
            }
            let (item, last) = to_response(rx.recv().await?);
            Some((item, (rx, guard, last)))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn abort(&self, request: Request<pb::AbortRequest>) -> Result<Response<pb::AbortResponse>, Status> {
        let (tx, rx) = oneshot::channel();
        let request_id = request.into_inner().request_id;
        self.commands.send(Command::Abort { request_id, found: Some(tx) }).map_err(|_| grpc_status(stopped()))?;
        let found = rx.await.unwrap_or(false);
        Ok(Response::new(pb::AbortResponse { found }))
    }

    async fn info(&self, _request: Request<pb::InfoRequest>) -> Result<Response<pb::InfoResponse>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn status(&self, request: Request<pb::StatusRequest>) -> Result<Response<pb::StatusResponse>, Status> {
        use crate::memory::store::LinkStatus;
        use pb::status_response::Cache;
        let (cache, reason) = match self.cache.as_deref().map(|link| link.status()) {
            None => (Cache::None, String::new()),
            Some(LinkStatus::Attached) => (Cache::Attached, String::new()),
            Some(LinkStatus::Degraded(reason)) => (Cache::Degraded, reason),
            Some(LinkStatus::Detached) => {
                (Cache::Detached, "the cache-service is gone; re-attaching, serving uncached meanwhile".to_string())
            }
        };
        let (mut engine_metrics, mut cache_metrics) = (String::new(), String::new());
        if request.get_ref().metrics {
            engine_metrics = crate::metrics::render();
            // A stalled cache-service costs the status page its numbers, never its answer.
            if let Some((_, session)) = self.cache.as_deref().and_then(|link| link.current()) {
                let wait = STATUS_CACHE_METRICS_TIMEOUT;
                if let Ok(Ok(text)) = tokio::time::timeout(wait, session.prometheus_text()).await {
                    cache_metrics = text;
                }
            }
        }
        Ok(Response::new(pb::StatusResponse { cache: cache as i32, reason, engine_metrics, cache_metrics }))
    }
}

/// How long `Status` waits for the cache-service's metrics page.
const STATUS_CACHE_METRICS_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

/// One step-loop event as a stream item; the bool says whether it is the last.
fn to_response(event: SeqEvent) -> (Result<pb::GenerateResponse, Status>, bool) {
    use pb::generate_response::Kind;
    match event {
        SeqEvent::Tokens { ids: token_ids, logprobs } => {
            let logprobs = logprobs
                .into_iter()
                .map(|l| pb::TokenLogprob {
                    logprob: l.logprob,
                    top: l.top.into_iter().map(|(token_id, logprob)| pb::TopLogprob { token_id, logprob }).collect(),
                })
                .collect();
            (Ok(pb::GenerateResponse { kind: Some(Kind::Tokens(pb::TokenChunk { token_ids, logprobs })) }), false)
        }
        SeqEvent::Finished { reason, usage, timings } => {
            let finished = pb::Finished {
                reason: match reason {
                    FinishReason::Stop => pb::FinishReason::Stop,
                    FinishReason::Length => pb::FinishReason::Length,
                    FinishReason::Aborted => pb::FinishReason::Aborted,
                } as i32,
                usage: Some(pb::Usage {
                    prompt_tokens: usage.prompt_tokens as u32,
                    completion_tokens: usage.completion_tokens as u32,
                    cached_prompt_tokens: usage.cached_prompt_tokens as u32,
                    cached_full_page_tokens: usage.cached_full_page_tokens as u32,
                    cached_partial_page_tokens: usage.cached_partial_page_tokens as u32,
                }),
                timings: Some(pb::Timings {
                    queue_ns: timings.queue_ns,
                    prefill_ns: timings.prefill_ns,
                    decode_ns: timings.decode_ns,
                    first_token_ns: timings.first_token_ns,
                }),
            };
            (Ok(pb::GenerateResponse { kind: Some(Kind::Finished(finished)) }), true)
        }
        SeqEvent::Failed(error) => (Err(grpc_status(error)), true),
    }
}
