//! `POST /v1/chat/completions`: messages -> (tool instructions) -> chat template -> tokens ->
//! `Generation` -> text, run through the tool-call parser when tools are offered.
//!
//! A completion whose text held calls answers `tool_calls` (ids `call_...`) with
//! `finish_reason: "tool_calls"` and `content: null` when nothing else was said. Streamed,
//! each call is a delta with id + name and empty arguments, then argument fragments (one
//! for a JSON-form call, one per parameter for an XML-form call); text outside calls stays
//! `content` deltas. With `logprobs: true` the completion's `logprobs.content` lists every
//! generated token; streamed, each token's entry rides on the first chunk sent after the
//! engine produced it (content, tool call or finish chunk).
//! `response_format` `json_object` / `json_schema` add a system instruction and a grammar the
//! engine enforces (while tools are offered, only the instruction: the grammar would forbid
//! the calls). Dropping the SSE body (client gone) drops the `Generation`, aborting the
//! engine.

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

use crate::error::GatewayError;
use crate::generation::{GenEvent, Generation};
use crate::openai::{
    ChatCompletion, ChatCompletionChunk, ChoiceLogprobs, CompletionMeta, FinishReason, TokenLogprob, ToolCall, sse,
};
use crate::routes::{
    Deadline, body_bytes, json_with_cache_explain, new_meta, start_generation, with_engine, with_request_id,
};
use crate::state::AppState;
use crate::text::RenderInput;
use crate::tools::{self, ToolEvent, ToolParser};
use crate::validate::{self, ChatRequest, ResponseFormat};

const JSON_MODE_INSTRUCTION: &str =
    "Respond with a single valid JSON object and nothing else (no prose, no code fences).";
const JSON_SCHEMA_INSTRUCTION: &str =
    "Respond with a single JSON object and nothing else (no prose, no code fences) that matches this JSON schema: ";

pub(crate) async fn chat_completions(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let clock = Deadline::from_now(&state);
    let (deadline, timeout_secs) = (clock.at, clock.secs);
    let (generation, request, meta, parser) = match clock.run(start(&state, &headers, body, clock.arrival)).await {
        Ok(started) => started,
        Err(e) => return e.into_response(),
    };
    let engine = generation.engine_index();
    let resp = if request.stream {
        stream(
            generation,
            meta.clone(),
            parser,
            request.include_usage,
            request.sampling.logprobs.is_some(),
            deadline,
            timeout_secs,
        )
        .into_response()
    } else {
        let wants_logprobs = request.sampling.logprobs.is_some();
        match clock.run(collect(generation, &meta, parser, wants_logprobs)).await {
            Ok(completion) => {
                let explain = completion.usage.cache_explain();
                json_with_cache_explain(completion, &explain)
            }
            Err(e) => e.into_response(),
        }
    };
    with_engine(&state, with_request_id(resp, &meta.id), engine)
}

type Started = (Generation, ChatRequest, CompletionMeta, Option<ToolParser>);

async fn start(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
    arrival: Instant,
) -> Result<Started, GatewayError> {
    let permit = state.admit().await?;
    let body = body_bytes(state, body)?;
    let joiner = state.inner.text.template.content_parts_joiner();
    let request = validate::parse_chat_request_with(&body, joiner, &state.model().limits)?;
    let (generation, meta, parser) = start_chat(state, headers, &request, "chatcmpl", permit, arrival).await?;
    Ok((generation, request, meta, parser))
}

/// A validated chat request onto the engine: tool instructions, chat template, tokens,
/// `Generate`. Shared by the endpoints that speak chat (chat completions, Messages); the
/// completion id is `{id_prefix}-...`.
pub(crate) async fn start_chat(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    request: &ChatRequest,
    id_prefix: &str,
    permit: tokio::sync::OwnedSemaphorePermit,
    arrival: Instant,
) -> Result<(Generation, CompletionMeta, Option<ToolParser>), GatewayError> {
    let (prompt, parser) = render_chat(state, request).await?;
    let meta = new_meta(id_prefix, &state.model().id);
    let mut fields = validate::GenFields { session_id: crate::routes::session_id(headers), ..to_fields(request) };
    if request.tools.active() {
        // A grammar for the reply would forbid the calls: with tools offered the format is
        // only asked for, in the instruction. A request that must call gets the calls' grammar.
        fields.response_format = ResponseFormat::Text;
        let tail = &prompt.ids[prompt.ids.len().saturating_sub(16)..];
        let in_thinking =
            state.inner.text.tokenizer.decode(tail).is_ok_and(|text| text.trim_end().ends_with("<think>"));
        fields.grammar = tools::call_grammar(state.inner.tool_format, &request.tools, in_thinking);
    }
    let generation = start_generation(state, &meta, prompt, &fields, arrival, permit).await?;
    Ok((generation, meta, parser))
}

/// A validated chat request as prompt tokens (tool instructions, chat template), with the
/// tool-call parser its output needs.
pub(crate) async fn render_chat(
    state: &AppState,
    request: &ChatRequest,
) -> Result<(crate::text::Prompt, Option<ToolParser>), GatewayError> {
    let config = state.config();
    state.check_model(request.model.as_deref())?;
    let count = request.messages.as_array().map_or(0, Vec::len);
    if count > config.max_messages {
        return Err(GatewayError::invalid(
            format!("Too many messages: {count} (this server accepts at most {})", config.max_messages),
            "messages",
        ));
    }

    let format = state.inner.tool_format;
    let tool_req = &request.tools;
    let mut instruction = tools::system_instruction(format, tool_req);
    let format_instruction = match &request.response_format {
        ResponseFormat::Text => None,
        ResponseFormat::JsonObject => Some(JSON_MODE_INSTRUCTION.to_owned()),
        ResponseFormat::JsonSchema { schema, .. } => Some(format!("{JSON_SCHEMA_INSTRUCTION}{schema}")),
    };
    if let Some(format_instruction) = format_instruction {
        instruction = Some(match instruction {
            Some(i) => format!("{i}\n{format_instruction}"),
            None => format_instruction,
        });
    }
    let messages = tools::prepare_messages(&request.messages, format, instruction.as_deref());
    let offered = tool_req.offered();
    let template_tools =
        (tool_req.active() && format != tools::ToolFormat::Generic).then(|| serde_json::Value::Array(offered.clone()));
    let parser = tool_req.active().then(|| ToolParser::new(format, offered, tool_req.parallel));
    let prompt = state
        .inner
        .text
        .prompt(RenderInput { messages, tools: template_tools, extra: request.template_kwargs.clone() })
        .await?;
    Ok((prompt, parser))
}

fn to_fields(r: &ChatRequest) -> validate::GenFields {
    validate::GenFields {
        model: r.model.clone(),
        stream: r.stream,
        include_usage: r.include_usage,
        sampling: r.sampling.clone(),
        stop: r.stop.clone(),
        cache_salt: r.cache_salt.clone(),
        response_format: r.response_format.clone(),
        grammar: None,
        user: r.user.clone(),
        session_id: String::new(),
        speculation: r.speculation,
    }
}

/// Text events through the parser (when there is one) as tool events.
pub(crate) fn route_text(parser: &mut Option<ToolParser>, text: String) -> Vec<ToolEvent> {
    match parser {
        Some(p) => p.push(&text),
        None => vec![ToolEvent::Content(text)],
    }
}

pub(crate) fn final_reason(parser: &Option<ToolParser>, reason: FinishReason) -> FinishReason {
    match parser {
        Some(p) if p.calls() > 0 && reason == FinishReason::Stop => FinishReason::ToolCalls,
        _ => reason,
    }
}

async fn collect(
    mut generation: Generation,
    meta: &CompletionMeta,
    mut parser: Option<ToolParser>,
    wants_logprobs: bool,
) -> Result<ChatCompletion, GatewayError> {
    let mut content = String::new();
    let mut logprobs: Vec<TokenLogprob> = Vec::new();
    let mut calls = Vec::new();
    let mut absorb = |events: Vec<ToolEvent>, content: &mut String| {
        for event in events {
            match event {
                ToolEvent::Content(t) => content.push_str(&t),
                ToolEvent::CallStart { id, name, .. } => calls.push(ToolCall::started(id, name)),
                ToolEvent::CallArgs { index, fragment } => {
                    if let Some(args) = calls.get_mut(index as usize).and_then(|c| c.function.arguments.as_mut()) {
                        args.push_str(&fragment);
                    }
                }
            }
        }
    };
    while let Some(event) = generation.next().await? {
        match event {
            GenEvent::Logprobs(entries) => logprobs.extend(entries),
            GenEvent::Text(text) => absorb(route_text(&mut parser, text), &mut content),
            GenEvent::Finished { reason, usage, .. } => {
                if let Some(p) = parser.as_mut() {
                    absorb(p.finish(), &mut content);
                }
                let reason = final_reason(&parser, reason);
                let mut completion = ChatCompletion::with_tool_calls(meta, content, calls, reason, usage);
                if wants_logprobs {
                    completion.choices[0].logprobs = Some(ChoiceLogprobs::new(logprobs));
                }
                return Ok(completion);
            }
        }
    }
    Err(GatewayError::EngineProtocol("generation ended without a finish".into()))
}

/// The SSE events of some tool events; log-probabilities not sent yet ride on the first.
fn tool_chunks(
    meta: &CompletionMeta,
    events: Vec<ToolEvent>,
    unsent_logprobs: &mut Option<Vec<TokenLogprob>>,
) -> Vec<Event> {
    let mut out = Vec::new();
    for event in events {
        let chunk = match event {
            ToolEvent::Content(t) => meta.content_chunk(t),
            ToolEvent::CallStart { index, id, name } => meta.tool_call_start_chunk(index, id, name),
            ToolEvent::CallArgs { index, fragment } => meta.tool_call_args_chunk(index, fragment),
        };
        out.push(sse::json_event(&with_logprobs(chunk, unsent_logprobs)));
    }
    out
}

/// Moves the log-probabilities not sent yet (if any) onto this chunk.
fn with_logprobs(mut chunk: ChatCompletionChunk, unsent: &mut Option<Vec<TokenLogprob>>) -> ChatCompletionChunk {
    if let Some(entries) = unsent.as_mut()
        && !entries.is_empty()
        && let Some(choice) = chunk.choices.first_mut()
    {
        choice.logprobs = Some(ChoiceLogprobs::new(std::mem::take(entries)));
    }
    chunk
}

fn stream(
    mut generation: Generation,
    meta: CompletionMeta,
    mut parser: Option<ToolParser>,
    include_usage: bool,
    wants_logprobs: bool,
    deadline: Instant,
    timeout_secs: u64,
) -> Sse<impl futures::Stream<Item = Result<Event, Infallible>>> {
    let mut unsent_logprobs: Option<Vec<TokenLogprob>> = wants_logprobs.then(Vec::new);
    let events = async_stream::stream! {
        yield Ok(sse::json_event(&meta.role_chunk()));
        loop {
            match generation.next_before(deadline, timeout_secs).await {
                Err(e) => {
                    yield Ok(sse::error_event(&e));
                    break;
                }
                Ok(None) => break,
                Ok(Some(GenEvent::Logprobs(entries))) => {
                    if let Some(unsent) = unsent_logprobs.as_mut() {
                        unsent.extend(entries);
                    }
                }
                Ok(Some(GenEvent::Text(text))) => {
                    for event in tool_chunks(&meta, route_text(&mut parser, text), &mut unsent_logprobs) {
                        yield Ok(event);
                    }
                }
                Ok(Some(GenEvent::Finished { reason, usage, .. })) => {
                    if let Some(p) = parser.as_mut() {
                        for event in tool_chunks(&meta, p.finish(), &mut unsent_logprobs) {
                            yield Ok(event);
                        }
                    }
                    let finish = meta.finish_chunk(final_reason(&parser, reason));
                    yield Ok(sse::json_event(&with_logprobs(finish, &mut unsent_logprobs)));
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
