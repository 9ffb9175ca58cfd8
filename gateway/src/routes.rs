//! HTTP routes: `POST /v1/chat/completions` (`chat`), `POST /v1/completions`
//! (`completions`), `POST /v1/responses` (`responses`), `POST /v1/messages` and
//! `/v1/messages/count_tokens` (`messages`,
//! Anthropic), `GET /v1/models`, `GET /health`, `GET /metrics`, the status page (`GET /`,
//! `/status`, `/status/data`: `status`), plus OpenAI-shaped
//! 401/404/405/413 answers (Anthropic-shaped under `/v1/messages`).
//!
//! Both completion endpoints: admission (a concurrency permit, waiting in a bounded queue;
//! a full queue is 429; the permit lives as long as the stream) -> body -> validate ->
//! prompt ids -> context check -> `Generation` -> one JSON response or an SSE stream, all
//! under a deadline of `request_timeout` (504). With API keys configured every `/v1/` route
//! needs `Authorization: Bearer <key>` or `x-api-key: <key>` (401 otherwise); `/health`, `/metrics` and
//! the status page stay open (they show counts, never a prompt or an answer).

use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use proto::engine::v1::SamplingParams;
use tokio::time::Instant;
use tower_http::trace::TraceLayer;

use tokio::sync::OwnedSemaphorePermit;

use crate::engine_client::EngineHealth;
use crate::error::GatewayError;
use crate::generation::{Generation, GenerationParams};
use crate::metrics;
use crate::openai::{CompletionMeta, Model, ModelList};
use crate::routing::RouteKey;
use crate::state::AppState;
use crate::text::Prompt;
use crate::validate::{self, GenFields};

const HEALTH_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The gateway's router over `state`.
pub fn app(state: AppState) -> Router {
    let limit = state.config().max_body_bytes;
    let count = |endpoint: &'static str| {
        axum::middleware::map_response(move |resp: Response| async move {
            metrics::record_request(resp.status().as_u16(), endpoint);
            resp
        })
    };
    let v1 = Router::new()
        .route("/v1/chat/completions", post(crate::chat::chat_completions).layer(count("chat_completions")))
        .route("/v1/completions", post(crate::completions::completions).layer(count("completions")))
        .route("/v1/responses", post(crate::responses::responses).layer(count("responses")))
        .route("/v1/messages", post(crate::messages::messages).layer(count("messages")))
        .route("/v1/messages/count_tokens", post(crate::messages::count_tokens).layer(count("count_tokens")))
        .route("/v1/models", get(list_models))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), require_api_key));
    Router::new()
        .merge(v1)
        .route("/health", get(health))
        .route("/metrics", get(render_metrics))
        .route("/", get(crate::status::page))
        .route("/status", get(crate::status::page))
        .route("/status/data", get(crate::status::data))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Inside the limit layers: the body it reads is already capped.
        .layer(axum::middleware::from_fn_with_state(
            BodyRules { timeout: state.config().body_read_timeout, limit },
            read_body_within,
        ))
        .layer(DefaultBodyLimit::max(limit))
        // Outside the limit layer, so its early 413 (from Content-Length) is rewritten too.
        .layer(axum::middleware::map_response(
            move |resp: Response| async move { openai_payload_too_large(resp, limit) },
        ))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// Request bodies past this are refused at once, unread; smaller ones over the limit are read
/// and dropped first, so the client, still sending, gets the 413 instead of a reset.
const DRAIN_BYTES: usize = 64 << 20;

/// What [`read_body_within`] holds a body to.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BodyRules {
    pub timeout: Duration,
    pub limit: usize,
}

/// Reads the whole body within `timeout` from the headers (408 `request_timeout` otherwise),
/// so a client that dribbles its body holds a connection for a bounded time and never a
/// concurrency slot; until it is in, the connection may be shed to make room
/// (`server::RequestArrival`). Over the size limit: the 413 the outer layer words, after the
/// body was drained (up to [`DRAIN_BYTES`]).
pub(crate) async fn read_body_within(
    State(rules): State<BodyRules>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use futures::StreamExt;
    let (parts, body) = request.into_parts();
    let declared =
        parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > DRAIN_BYTES as u64) {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    }
    let anthropic = parts.uri.path().starts_with("/v1/messages");
    let read = async {
        let mut data = body.into_data_stream();
        let (mut kept, mut seen) = (Vec::new(), 0usize);
        while let Some(chunk) = data.next().await {
            let chunk = chunk?;
            seen += chunk.len();
            if seen <= rules.limit {
                kept.extend_from_slice(&chunk);
            } else if seen > DRAIN_BYTES {
                break;
            }
        }
        Ok::<_, axum::Error>((kept, seen))
    };
    let error = match tokio::time::timeout(rules.timeout, read).await {
        Ok(Ok((kept, seen))) if seen <= rules.limit => {
            if let Some(arrival) = parts.extensions.get::<crate::server::RequestArrival>() {
                arrival.complete();
            }
            return next.run(axum::extract::Request::from_parts(parts, axum::body::Body::from(kept))).await;
        }
        Ok(Ok(_)) => return StatusCode::PAYLOAD_TOO_LARGE.into_response(),
        Ok(Err(e)) => GatewayError::invalid(format!("could not read the request body: {e}"), None),
        Err(_) => GatewayError::BodyTimeout(rules.timeout.as_secs()),
    };
    if anthropic { crate::anthropic::response::error_response(error) } else { error.into_response() }
}

/// 401 unless the request carries one of the configured keys (no keys: everything passes).
async fn require_api_key(
    State(state): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let keys = &state.inner.api_keys;
    if keys.is_empty() {
        return next.run(request).await;
    }
    let headers = request.headers();
    // `x-api-key` is how Anthropic clients send it; either header is accepted on every route.
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim);
    let error = match presented {
        // Every key is compared in full so timing does not reveal which prefix matched.
        Some(key) if keys.iter().fold(false, |hit, k| hit | constant_time_eq(k, key)) => {
            return next.run(request).await;
        }
        Some(_) => GatewayError::Unauthorized("Incorrect API key provided"),
        None => GatewayError::Unauthorized(
            "You didn't provide an API key: send it as `Authorization: Bearer <key>` or `x-api-key: <key>`",
        ),
    };
    if request.uri().path().starts_with("/v1/messages") {
        crate::anthropic::response::error_response(error)
    } else {
        error.into_response()
    }
}

fn constant_time_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    diff == 0
}

/// tower-http's limit answers 413 with a plain body; clients expect the OpenAI error shape.
fn openai_payload_too_large(resp: Response, limit_bytes: usize) -> Response {
    let is_json =
        resp.headers().get(header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if resp.status() == StatusCode::PAYLOAD_TOO_LARGE && !is_json {
        return GatewayError::PayloadTooLarge { limit_bytes }.into_response();
    }
    resp
}

async fn not_found(method: Method, uri: Uri) -> GatewayError {
    GatewayError::RouteNotFound { method: method.to_string(), path: uri.path().to_owned() }
}

async fn method_not_allowed(method: Method) -> GatewayError {
    GatewayError::MethodNotAllowed(method.to_string())
}

async fn list_models(State(state): State<AppState>) -> Json<ModelList> {
    let model = state.model();
    Json(ModelList {
        object: "list",
        data: model
            .names
            .iter()
            .map(|name| Model {
                id: name.clone(),
                object: "model",
                created: model.created,
                owned_by: "edge",
                context_length: model.context_length,
            })
            .collect(),
    })
}

/// 200 `{"status": "ok"}`; 200 `{"status": "degraded", "cache": ..., "reason": ...}` while
/// the engine serves uncached because its cache-service stalls or is gone; 503 when the
/// engine does not answer.
/// With several engines: the best of their answers, and each engine's in `engines`.
async fn health(State(state): State<AppState>) -> Response {
    let pool = &state.inner.engines;
    let answers = futures::future::join_all(pool.engines().iter().map(|e| e.client.health(HEALTH_PROBE_TIMEOUT))).await;
    let rank = |h: &EngineHealth| match h {
        EngineHealth::Ok => 0,
        EngineHealth::Degraded { .. } => 1,
        EngineHealth::Down => 2,
    };
    let best = answers.iter().min_by_key(|h| rank(h)).cloned().unwrap_or(EngineHealth::Down);
    let mut body = match best {
        EngineHealth::Ok => serde_json::json!({"status": "ok"}),
        EngineHealth::Degraded { cache, reason } => {
            serde_json::json!({"status": "degraded", "cache": cache, "reason": reason})
        }
        EngineHealth::Down => {
            return GatewayError::Engine(tonic::Status::unavailable("no engine is answering")).into_response();
        }
    };
    if pool.engines().len() > 1 {
        body["engines"] = pool
            .engines()
            .iter()
            .zip(&answers)
            .map(|(e, h)| {
                let health = match h {
                    EngineHealth::Ok => "ok",
                    EngineHealth::Degraded { .. } => "degraded",
                    EngineHealth::Down => "down",
                };
                serde_json::json!({"endpoint": e.endpoint, "health": health, "routing": e.state_name(), "in_flight": e.in_flight()})
            })
            .collect();
    }
    (StatusCode::OK, Json(body)).into_response()
}

/// The gateway's Prometheus page, as `/metrics` serves it.
pub(crate) fn metrics_text(state: &AppState) -> String {
    // Gauges read at scrape time, so they are exact whatever path released a slot.
    let max = state.config().max_concurrent_requests;
    metrics::record_in_flight(max.saturating_sub(state.inner.limiter.available_permits()));
    metrics::record_queue_depth(state.queue_depth());
    for engine in state.inner.engines.engines() {
        metrics::record_engine_in_flight(&engine.endpoint, engine.in_flight());
    }
    state.inner.metrics.render()
}

async fn render_metrics(State(state): State<AppState>) -> Response {
    let mut resp = metrics_text(&state).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    resp
}

/// A request's deadline: `request_timeout` after its arrival.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    pub arrival: Instant,
    pub at: Instant,
    pub secs: u64,
}

impl Deadline {
    pub fn from_now(state: &AppState) -> Deadline {
        let arrival = Instant::now();
        let timeout = state.config().request_timeout;
        Deadline { arrival, at: arrival + timeout, secs: timeout.as_secs() }
    }

    /// `work`'s result, or `Timeout` once the deadline passes.
    pub async fn run<T>(
        &self,
        work: impl std::future::Future<Output = Result<T, GatewayError>>,
    ) -> Result<T, GatewayError> {
        tokio::time::timeout_at(self.at, work).await.unwrap_or(Err(GatewayError::Timeout(self.secs)))
    }
}

/// A whole (non-streamed) JSON reply with the request's cache explanation in `x-edge-cache`
/// (only whole replies carry it: a stream's headers leave before the usage is known).
pub(crate) fn json_with_cache_explain<T: serde::Serialize>(body: T, explain: &str) -> Response {
    let mut resp = Json(body).into_response();
    if let Ok(v) = HeaderValue::from_str(explain) {
        resp.headers_mut().insert("x-edge-cache", v);
    }
    resp
}

/// The body bytes, or the 413/400 their reading failed with.
pub(crate) fn body_bytes(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, GatewayError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            GatewayError::PayloadTooLarge { limit_bytes: state.config().max_body_bytes }
        } else {
            GatewayError::invalid(rejection.body_text(), None)
        }
    })
}

pub(crate) fn new_meta(prefix: &str, model: &str) -> CompletionMeta {
    CompletionMeta {
        id: format!("{prefix}-{}", uuid::Uuid::new_v4().simple()),
        created: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        model: model.to_owned(),
    }
}

/// Context check, sampling and `Generate` for a prompt already in tokens.
pub(crate) async fn start_generation(
    state: &AppState,
    meta: &CompletionMeta,
    prompt: Prompt,
    fields: &GenFields,
    arrival: Instant,
    permit: OwnedSemaphorePermit,
) -> Result<Generation, GatewayError> {
    let config = state.config();
    let Prompt { ids: prompt_ids, snapshot_hints } = prompt;
    let max_tokens = validate::resolve_max_tokens(
        fields.sampling.max_tokens,
        prompt_ids.len(),
        &state.model().limits,
        config.max_tokens_cap,
    )?;
    let s = &fields.sampling;
    let params = GenerationParams {
        request_id: meta.id.clone(),
        prompt_ids,
        sampling: SamplingParams {
            temperature: s.temperature,
            top_p: s.top_p,
            top_k: s.top_k,
            seed: s.seed,
            max_tokens,
            stop_token_ids: Vec::new(),
            ignore_eos: s.ignore_eos,
            logprobs: s.logprobs.is_some(),
            top_logprobs: s.logprobs.unwrap_or(0),
        },
        cache_salt: fields.cache_salt.clone(),
        stop: fields.stop.clone(),
        session_id: fields.session_id.clone(),
        snapshot_hints: snapshot_hints.into_iter().map(|p| p as u32).collect(),
        speculation: fields.speculation,
        grammar: fields.grammar.clone().or_else(|| fields.response_format.grammar()),
        accept_timeout: config.engine_accept_timeout,
        first_token_timeout: config.first_token_timeout,
    };
    tracing::debug!(
        request_id = %meta.id,
        session_id = %fields.session_id,
        prompt_tokens = params.prompt_ids.len(),
        max_tokens,
        stream = fields.stream,
        user = fields.user.as_deref().unwrap_or(""),
        "generate"
    );
    let route = RouteKey::new(&params.session_id, &params.cache_salt, &params.prompt_ids);
    Generation::start(&state.inner.engines, &route, state.inner.text.tokenizer.clone(), params, arrival, Some(permit))
        .await
}

/// The agent's session id from `X-Session-ID` (empty when absent or not visible ASCII).
pub(crate) fn session_id(headers: &axum::http::HeaderMap) -> String {
    headers.get("x-session-id").and_then(|v| v.to_str().ok()).map(|s| s.chars().take(256).collect()).unwrap_or_default()
}

/// With several engines, adds `x-edge-engine`: the serving engine's place (from 0) in the
/// gateway's engine list, so an operator can see where a conversation went.
pub(crate) fn with_engine(state: &AppState, mut resp: Response, engine: Option<usize>) -> Response {
    if let Some(index) = engine
        && state.inner.engines.engines().len() > 1
    {
        resp.headers_mut().insert("x-edge-engine", HeaderValue::from(index));
    }
    resp
}

/// Adds `x-request-id` (the completion id) to a response.
pub(crate) fn with_request_id(mut resp: Response, id: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

#[cfg(test)]
#[path = "routes_tests.rs"]
mod tests;
