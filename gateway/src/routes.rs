//! HTTP routes: `POST /v1/chat/completions`, `GET /v1/models`, `GET /health`, `GET /metrics`,
//! plus OpenAI-shaped 404/405/413 answers for everything else.
//!
//! A chat completion: body -> `validate` -> template + tokenize (blocking pool) -> context
//! check -> `Generation` on the engine -> one JSON response or an SSE stream. Limits: at
//! most `max_concurrent_requests` at once (more get 429, the permit lives as long as the
//! stream), a deadline of `request_timeout` over the whole request, `max_body_bytes`.

use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use proto::engine::v1::SamplingParams;
use tokio::time::Instant;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::trace::TraceLayer;

use crate::error::GatewayError;
use crate::generation::{GenEvent, Generation, GenerationParams};
use crate::metrics;
use crate::openai::{ChatCompletion, CompletionMeta, Model, ModelList, sse};
use crate::state::AppState;
use crate::text::RenderInput;
use crate::validate::{self, ChatRequest};

const HEALTH_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The gateway's router over `state`.
pub fn app(state: AppState) -> Router {
    let limit = state.config().max_body_bytes;
    let chat = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route_layer(axum::middleware::map_response(count_request));
    Router::new()
        .merge(chat)
        .route("/v1/models", get(list_models))
        .route("/health", get(health))
        .route("/metrics", get(render_metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(RequestBodyLimitLayer::new(limit))
        // Outside the limit layer, so its early 413 (from Content-Length) is rewritten too.
        .layer(axum::middleware::map_response(
            move |resp: Response| async move { openai_payload_too_large(resp, limit) },
        ))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

async fn count_request(resp: Response) -> Response {
    metrics::record_request(resp.status().as_u16());
    resp
}

/// tower-http's limit answers 413 with a plain body; clients expect the OpenAI error shape.
fn openai_payload_too_large(resp: Response, limit_bytes: usize) -> Response {
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if resp.status() == StatusCode::PAYLOAD_TOO_LARGE && !is_json {
        return GatewayError::PayloadTooLarge { limit_bytes }.into_response();
    }
    resp
}

async fn not_found(method: Method, uri: Uri) -> GatewayError {
    GatewayError::RouteNotFound {
        method: method.to_string(),
        path: uri.path().to_owned(),
    }
}

async fn method_not_allowed(method: Method) -> GatewayError {
    GatewayError::MethodNotAllowed(method.to_string())
}

async fn list_models(State(state): State<AppState>) -> Json<ModelList> {
    let model = state.model();
    Json(ModelList {
        object: "list",
        data: vec![Model {
            id: model.id.clone(),
            object: "model",
            created: model.created,
            owned_by: "edge",
            context_length: model.context_length,
        }],
    })
}

async fn health(State(state): State<AppState>) -> Response {
    if state.inner.engine.is_alive(HEALTH_PROBE_TIMEOUT).await {
        (StatusCode::OK, Json(serde_json::json!({"status": "ok"}))).into_response()
    } else {
        GatewayError::Engine(tonic::Status::unavailable("the engine is not answering"))
            .into_response()
    }
}

async fn render_metrics(State(state): State<AppState>) -> Response {
    let body = state.inner.metrics.render();
    let mut resp = body.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

async fn chat_completions(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrival = Instant::now();
    let deadline = arrival + state.config().request_timeout;
    let timeout_secs = state.config().request_timeout.as_secs();
    let started = tokio::time::timeout_at(deadline, start_completion(&state, body, arrival)).await;
    let (generation, request, meta) = match started {
        Ok(Ok(started)) => started,
        Ok(Err(e)) => return e.into_response(),
        Err(_) => return GatewayError::Timeout(timeout_secs).into_response(),
    };
    if request.stream {
        stream_response(
            generation,
            meta,
            request.include_usage,
            deadline,
            timeout_secs,
        )
        .into_response()
    } else {
        match tokio::time::timeout_at(deadline, collect_response(generation, &meta)).await {
            Ok(Ok(completion)) => Json(completion).into_response(),
            Ok(Err(e)) => e.into_response(),
            Err(_) => GatewayError::Timeout(timeout_secs).into_response(),
        }
    }
}

/// Everything before the first generated token: limits, validation, prompt, `Generate`.
async fn start_completion(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
    arrival: Instant,
) -> Result<(Generation, ChatRequest, CompletionMeta), GatewayError> {
    let config = state.config();
    let permit = state
        .inner
        .limiter
        .clone()
        .try_acquire_owned()
        .map_err(|_| GatewayError::Overloaded(config.max_concurrent_requests))?;
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            GatewayError::PayloadTooLarge {
                limit_bytes: config.max_body_bytes,
            }
        } else {
            GatewayError::invalid(rejection.body_text(), None)
        }
    })?;
    let request = validate::parse_chat_request(&body)?;
    let model = state.model();
    validate::check_model(request.model.as_deref(), &model.id, config.accept_any_model)?;

    let prompt_ids = state
        .inner
        .text
        .prompt_ids(RenderInput {
            messages: request.messages.clone(),
            tools: request.tools.clone(),
            extra: request.template_kwargs.clone(),
        })
        .await?;
    let max_tokens = validate::resolve_max_tokens(
        request.sampling.max_tokens,
        prompt_ids.len(),
        model.context_length,
        config.max_tokens_cap,
    )?;

    let meta = CompletionMeta {
        id: format!("chatcmpl-{}", uuid::Uuid::new_v4().simple()),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        model: model.id.clone(),
    };
    let s = &request.sampling;
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
        },
        cache_salt: request.cache_salt.clone(),
        stop: request.stop.clone(),
    };
    tracing::debug!(request_id = %meta.id, prompt_tokens = params.prompt_ids.len(), max_tokens, stream = request.stream, "generate");
    let generation = Generation::start(
        &state.inner.engine,
        state.inner.text.tokenizer.clone(),
        params,
        arrival,
        Some(permit),
    )
    .await?;
    Ok((generation, request, meta))
}

async fn collect_response(
    mut generation: Generation,
    meta: &CompletionMeta,
) -> Result<ChatCompletion, GatewayError> {
    let mut content = String::new();
    while let Some(event) = generation.next().await? {
        match event {
            GenEvent::Text(text) => content.push_str(&text),
            GenEvent::Finished { reason, usage } => {
                return Ok(ChatCompletion::new(meta, content, reason, usage));
            }
        }
    }
    Err(GatewayError::EngineProtocol(
        "generation ended without a finish".into(),
    ))
}

/// The SSE body. Dropping it (client disconnect) drops the `Generation`, aborting the engine.
fn stream_response(
    mut generation: Generation,
    meta: CompletionMeta,
    include_usage: bool,
    deadline: Instant,
    timeout_secs: u64,
) -> Sse<impl futures::Stream<Item = Result<Event, Infallible>>> {
    let events = async_stream::stream! {
        yield Ok(sse::json_event(&meta.role_chunk()));
        loop {
            match tokio::time::timeout_at(deadline, generation.next()).await {
                Err(_) => {
                    yield Ok(sse::error_event(&GatewayError::Timeout(timeout_secs)));
                    break;
                }
                Ok(Err(e)) => {
                    tracing::warn!(request_id = generation.request_id(), error = %e, "stream failed");
                    yield Ok(sse::error_event(&e));
                    break;
                }
                Ok(Ok(None)) => break,
                Ok(Ok(Some(GenEvent::Text(text)))) => yield Ok(sse::json_event(&meta.content_chunk(text))),
                Ok(Ok(Some(GenEvent::Finished { reason, usage }))) => {
                    yield Ok(sse::json_event(&meta.finish_chunk(reason)));
                    if include_usage {
                        yield Ok(sse::json_event(&meta.usage_chunk(usage)));
                    }
                }
            }
        }
        yield Ok(sse::done_event());
    };
    Sse::new(events).keep_alive(KeepAlive::default())
}

#[cfg(test)]
#[path = "routes_tests.rs"]
mod tests;
