//! `POST /v1/messages` (Anthropic Messages) and `POST /v1/messages/count_tokens`.
//!
//! The request is translated into a chat request (`anthropic::request`) and runs the chat
//! path: same template, tool parser, admission, deadline, cache and session handling
//! (`X-Session-ID`, `cache_salt`), and the same engine. The output is a `message` (text and
//! `tool_use` blocks) or Anthropic's event stream; every error is an Anthropic error body with
//! the status the OpenAI endpoints use. Dropping the stream (client gone) aborts the engine.

use std::convert::Infallible;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

use crate::anthropic::request::{parse_count_tokens_request, parse_messages_request};
use crate::anthropic::response::{self, ContentCollector, EventStream, Message, MessageUsage, StopReason};
use crate::chat::{final_reason, render_chat, route_text, start_chat};
use crate::error::GatewayError;
use crate::generation::{GenEvent, Generation};
use crate::openai::CompletionMeta;
use crate::routes::{Deadline, body_bytes, json_with_cache_explain, with_request_id};
use crate::state::AppState;
use crate::tools::ToolParser;

pub(crate) async fn messages(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let clock = Deadline::from_now(&state);
    let (deadline, timeout_secs) = (clock.at, clock.secs);
    let (generation, stream, meta, parser) = match clock.run(start(&state, &headers, body, clock.arrival)).await {
        Ok(started) => started,
        Err(e) => return response::error_response(e),
    };
    let resp = if stream {
        stream_events(generation, meta.clone(), parser, deadline, timeout_secs).into_response()
    } else {
        match clock.run(collect(generation, &meta, parser)).await {
            Ok((message, explain)) => json_with_cache_explain(message, &explain),
            Err(e) => response::error_response(e),
        }
    };
    with_request_id(resp, &meta.id)
}

async fn start(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
    arrival: Instant,
) -> Result<(Generation, bool, CompletionMeta, Option<ToolParser>), GatewayError> {
    let permit = state.admit().await?;
    let body = body_bytes(state, body)?;
    let joiner = state.inner.text.template.content_parts_joiner();
    let request = parse_messages_request(&body, joiner, &state.model().limits)?;
    let (generation, meta, parser) = start_chat(state, headers, &request, "msg", permit, arrival).await?;
    Ok((generation, request.stream, meta, parser))
}

/// `{"input_tokens": n}`: the prompt the same body would run, in tokens (tool definitions and
/// the chat template included).
pub(crate) async fn count_tokens(State(state): State<AppState>, body: Result<Bytes, BytesRejection>) -> Response {
    let counted = async {
        let body = body_bytes(&state, body)?;
        let request =
            parse_count_tokens_request(&body, state.inner.text.template.content_parts_joiner(), &state.model().limits)?;
        let (prompt, _) = render_chat(&state, &request).await?;
        Ok::<_, GatewayError>(prompt.ids.len())
    };
    match counted.await {
        Ok(n) => Json(serde_json::json!({"input_tokens": n})).into_response(),
        Err(e) => response::error_response(e),
    }
}

fn message_id(meta: &CompletionMeta) -> String {
    // `msg-<hex>` -> `msg_<hex>`, Anthropic's spelling.
    meta.id.replacen("msg-", "msg_", 1)
}

async fn collect(
    mut generation: Generation,
    meta: &CompletionMeta,
    mut parser: Option<ToolParser>,
) -> Result<(Message, String), GatewayError> {
    let mut content = ContentCollector::default();
    while let Some(event) = generation.next().await? {
        match event {
            GenEvent::Logprobs(_) => {}
            GenEvent::Text(text) => content.absorb(route_text(&mut parser, text)),
            GenEvent::Finished { reason, usage, stop_sequence } => {
                if let Some(p) = parser.as_mut() {
                    content.absorb(p.finish());
                }
                let reason = final_reason(&parser, reason);
                let mut message = Message::new(&message_id(meta), &meta.model);
                message.stop_reason = Some(StopReason::of(reason, content.calls() > 0, stop_sequence.as_deref()));
                message.stop_sequence = stop_sequence;
                message.usage = MessageUsage::from(&usage);
                message.content = content.finish();
                return Ok((message, usage.cache_explain()));
            }
        }
    }
    Err(GatewayError::EngineProtocol("generation ended without a finish".into()))
}

fn stream_events(
    mut generation: Generation,
    meta: CompletionMeta,
    mut parser: Option<ToolParser>,
    deadline: Instant,
    timeout_secs: u64,
) -> Sse<impl futures::Stream<Item = Result<Event, Infallible>>> {
    let mut blocks = EventStream::new();
    let skeleton = Message::new(&message_id(&meta), &meta.model);
    let events = async_stream::stream! {
        yield Ok(blocks.start(&skeleton, generation.prompt_tokens()));
        yield Ok(EventStream::ping());
        loop {
            match generation.next_before(deadline, timeout_secs).await {
                Err(e) => {
                    yield Ok(response::error_event(&e));
                    break;
                }
                Ok(None) => break,
                Ok(Some(GenEvent::Logprobs(_))) => {}
                Ok(Some(GenEvent::Text(text))) => {
                    for event in blocks.push(route_text(&mut parser, text)) {
                        yield Ok(event);
                    }
                }
                Ok(Some(GenEvent::Finished { reason, usage, stop_sequence })) => {
                    if let Some(p) = parser.as_mut() {
                        for event in blocks.push(p.finish()) {
                            yield Ok(event);
                        }
                    }
                    let reason = final_reason(&parser, reason);
                    let stop = StopReason::of(reason, blocks.calls() > 0, stop_sequence.as_deref());
                    for event in blocks.finish(stop, stop_sequence, &usage) {
                        yield Ok(event);
                    }
                }
            }
        }
    };
    // Anthropic's keep-alive is a `ping` event; a comment line keeps proxies open the same way.
    Sse::new(events).keep_alive(KeepAlive::default())
}
