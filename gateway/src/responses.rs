//! `POST /v1/responses` (the OpenAI Responses API), stateless.
//!
//! The request is translated into a chat request (`request`) and runs the chat path: same
//! template, tool parser, admission, deadline, cache and session handling (`X-Session-ID`,
//! `cache_salt`), and the same engine. The output is a `response` object or its typed event
//! stream (`response`); errors are OpenAI error bodies, as on chat completions. Nothing is
//! stored: `previous_response_id` is a 400 and the whole conversation comes in `input`.
//! Dropping the stream (client gone) aborts the engine.

pub mod request;
pub mod response;

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::chat::{final_reason, route_text, start_chat};
use crate::error::GatewayError;
use crate::generation::{GenEvent, Generation};
use crate::routes::{Deadline, body_bytes, json_with_cache_explain, with_request_id};
use crate::state::AppState;
use crate::tools::ToolParser;
use request::parse_responses_request;
use response::{Header, Output, Sequencer, status_of};

pub(crate) async fn responses(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let clock = Deadline::from_now(&state);
    let (deadline, timeout_secs) = (clock.at, clock.secs);
    let (generation, stream, header, parser) = match clock.run(start(&state, &headers, body, clock.arrival)).await {
        Ok(started) => started,
        Err(e) => return e.into_response(),
    };
    let id = header.id.clone();
    let resp = if stream {
        stream_events(generation, header, parser, deadline, timeout_secs).into_response()
    } else {
        match clock.run(collect(generation, &header, parser)).await {
            Ok((object, explain)) => json_with_cache_explain(object, &explain),
            Err(e) => e.into_response(),
        }
    };
    with_request_id(resp, &id)
}

async fn start(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
    arrival: Instant,
) -> Result<(Generation, bool, Header, Option<ToolParser>), GatewayError> {
    let permit = state.admit().await?;
    let body = body_bytes(state, body)?;
    let joiner = state.inner.text.template.content_parts_joiner();
    let request = parse_responses_request(&body, joiner, &state.model().limits)?;
    let (generation, meta, parser) = start_chat(state, headers, &request.chat, "resp", permit, arrival).await?;
    let header = Header {
        // `resp-<hex>` -> `resp_<hex>`, the API's spelling.
        id: meta.id.replacen("resp-", "resp_", 1),
        created_at: meta.created,
        model: meta.model,
        echo: request.echo,
    };
    Ok((generation, request.chat.stream, header, parser))
}

async fn collect(
    mut generation: Generation,
    header: &Header,
    mut parser: Option<ToolParser>,
) -> Result<(Value, String), GatewayError> {
    let mut output = Output::new(&header.id);
    while let Some(event) = generation.next().await? {
        match event {
            GenEvent::Logprobs(_) => {}
            GenEvent::Text(text) => {
                output.push(route_text(&mut parser, text));
            }
            GenEvent::Finished { reason, usage, .. } => {
                if let Some(p) = parser.as_mut() {
                    output.push(p.finish());
                }
                let reason = final_reason(&parser, reason);
                output.finish(reason);
                let object = header.object(status_of(reason), output.items(), Some(&usage));
                return Ok((object, usage.cache_explain()));
            }
        }
    }
    Err(GatewayError::EngineProtocol("generation ended without a finish".into()))
}

fn stream_events(
    mut generation: Generation,
    header: Header,
    mut parser: Option<ToolParser>,
    deadline: Instant,
    timeout_secs: u64,
) -> Sse<impl futures::Stream<Item = Result<Event, Infallible>>> {
    let mut seq = Sequencer::default();
    let mut output = Output::new(&header.id);
    let events = async_stream::stream! {
        let created = header.object("in_progress", &[], None);
        yield Ok(seq.event("response.created", json!({"response": created})));
        yield Ok(seq.event("response.in_progress", json!({"response": created})));
        loop {
            match generation.next_before(deadline, timeout_secs).await {
                Err(e) => {
                    for event in seq.failure(&header, output.items(), &e) {
                        yield Ok(event);
                    }
                    break;
                }
                Ok(None) => break,
                Ok(Some(GenEvent::Logprobs(_))) => {}
                Ok(Some(GenEvent::Text(text))) => {
                    for event in seq.steps(output.push(route_text(&mut parser, text))) {
                        yield Ok(event);
                    }
                }
                Ok(Some(GenEvent::Finished { reason, usage, .. })) => {
                    if let Some(p) = parser.as_mut() {
                        for event in seq.steps(output.push(p.finish())) {
                            yield Ok(event);
                        }
                    }
                    let reason = final_reason(&parser, reason);
                    for event in seq.steps(output.finish(reason)) {
                        yield Ok(event);
                    }
                    let status = status_of(reason);
                    let object = header.object(status, output.items(), Some(&usage));
                    yield Ok(seq.event(&format!("response.{status}"), json!({"response": object})));
                }
            }
        }
    };
    Sse::new(events).keep_alive(KeepAlive::default())
}
