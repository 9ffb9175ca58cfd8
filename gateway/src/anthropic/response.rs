//! What `/v1/messages` writes: the `message` object, the streamed event sequence
//! (`message_start`, `content_block_start` / `content_block_delta` / `content_block_stop` per
//! block, `message_delta`, `message_stop`, and `ping` while waiting), and Anthropic error
//! bodies `{"type": "error", "error": {"type", "message"}}`.
//!
//! Usage: `input_tokens` counts the prompt tokens that were prefilled, `cache_read_input_tokens`
//! those served from the prefix cache (they add up to the prompt); the cache is written
//! automatically, so `cache_creation_input_tokens` is always 0. Streamed, `message_start`
//! carries the whole prompt as `input_tokens` (the cache split is known only at the end) and
//! `message_delta` the final figures.

use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Value, json};

use crate::error::GatewayError;
use crate::openai::{FinishReason, Usage};
use crate::tools::ToolEvent;

/// Why the message ended, as Anthropic names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    MaxTokens,
    StopSequence,
    ToolUse,
}

impl StopReason {
    /// From the generation's finish, whether calls were parsed, and the stop string that
    /// matched (if any).
    pub fn of(reason: FinishReason, made_calls: bool, stop_sequence: Option<&str>) -> StopReason {
        match reason {
            FinishReason::Length => StopReason::MaxTokens,
            _ if made_calls => StopReason::ToolUse,
            FinishReason::ToolCalls => StopReason::ToolUse,
            FinishReason::Stop if stop_sequence.is_some() => StopReason::StopSequence,
            FinishReason::Stop => StopReason::EndTurn,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MessageUsage {
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub cache_creation_input_tokens: u32,
    pub cache_read_input_tokens: u32,
}

impl From<&Usage> for MessageUsage {
    fn from(u: &Usage) -> Self {
        let cached = u.prompt_tokens_details.cached_tokens.min(u.prompt_tokens);
        MessageUsage {
            input_tokens: u.prompt_tokens - cached,
            output_tokens: u.completion_tokens,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: cached,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text { text: String },
    ToolUse { id: String, name: String, input: Value },
}

/// The `message` object (whole response, and the skeleton in `message_start`).
#[derive(Debug, Clone, Serialize)]
pub struct Message {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: String,
    pub content: Vec<ContentBlock>,
    pub stop_reason: Option<StopReason>,
    pub stop_sequence: Option<String>,
    pub usage: MessageUsage,
}

impl Message {
    pub fn new(id: &str, model: &str) -> Message {
        Message {
            id: id.to_owned(),
            kind: "message",
            role: "assistant",
            model: model.to_owned(),
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: MessageUsage {
                input_tokens: 0,
                output_tokens: 0,
                cache_creation_input_tokens: 0,
                cache_read_input_tokens: 0,
            },
        }
    }
}

/// Tool-call ids as Anthropic spells them (`toolu_...`); the parser makes `call_...`.
pub fn tool_use_id(call_id: &str) -> String {
    match call_id.strip_prefix("call_") {
        Some(rest) => format!("toolu_{rest}"),
        None => call_id.to_owned(),
    }
}

/// Builds a whole message's content from tool events: text joins into the open text block,
/// each call is a `tool_use` block whose argument fragments are parsed once complete.
#[derive(Debug, Default)]
pub struct ContentCollector {
    blocks: Vec<ContentBlock>,
    /// Per call, in call order: its block index and its arguments text so far.
    calls: Vec<(usize, String)>,
}

impl ContentCollector {
    pub fn absorb(&mut self, events: Vec<ToolEvent>) {
        for event in events {
            match event {
                ToolEvent::Content(t) => match self.blocks.last_mut() {
                    Some(ContentBlock::Text { text }) => text.push_str(&t),
                    _ => self.blocks.push(ContentBlock::Text { text: t }),
                },
                ToolEvent::CallStart { id, name, .. } => {
                    self.calls.push((self.blocks.len(), String::new()));
                    self.blocks.push(ContentBlock::ToolUse { id: tool_use_id(&id), name, input: Value::Null });
                }
                ToolEvent::CallArgs { index, fragment } => {
                    if let Some((_, args)) = self.calls.get_mut(index as usize) {
                        args.push_str(&fragment);
                    }
                }
            }
        }
    }

    pub fn calls(&self) -> usize {
        self.calls.len()
    }

    /// The blocks; text that is only whitespace next to tool calls is dropped (the model's
    /// line breaks around its call tags).
    pub fn finish(mut self) -> Vec<ContentBlock> {
        for (block, args) in std::mem::take(&mut self.calls) {
            if let Some(ContentBlock::ToolUse { input, name, .. }) = self.blocks.get_mut(block) {
                *input = parse_input(name, &args);
            }
        }
        let has_calls = self.blocks.iter().any(|b| matches!(b, ContentBlock::ToolUse { .. }));
        self.blocks.retain(|b| match b {
            ContentBlock::Text { text } => !(text.is_empty() || has_calls && text.trim().is_empty()),
            ContentBlock::ToolUse { .. } => true,
        });
        self.blocks
    }
}

/// A call's arguments text as its `input` object. The parser's JSON-form arguments are the
/// model's own text: if the model wrote something that is not a JSON object, `input` keeps
/// it whole under `"arguments"` rather than dropping it.
fn parse_input(name: &str, args: &str) -> Value {
    match serde_json::from_str::<Value>(args) {
        Ok(v @ Value::Object(_)) => v,
        _ if args.trim().is_empty() => json!({}),
        _ => {
            tracing::warn!(tool = name, arguments = args, "tool call arguments are not a JSON object");
            json!({ "arguments": args })
        }
    }
}

/// An SSE event named `kind` whose data is `data` with `"type": kind` first.
fn event(kind: &str, data: Value) -> Event {
    let mut body = serde_json::Map::new();
    body.insert("type".into(), kind.into());
    if let Value::Object(fields) = data {
        body.extend(fields);
    }
    Event::default().event(kind).data(Value::Object(body).to_string())
}

/// The open content block of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpenBlock {
    None,
    Text,
    /// A tool_use block for the call with this index.
    Tool(u32),
}

/// Turns a generation's tool events into Anthropic's streamed event sequence.
#[derive(Debug)]
pub struct EventStream {
    open: OpenBlock,
    /// Index of the next content block.
    next_index: u32,
    calls: u32,
    /// Whitespace-only text outside a text block, held back (as a whole message drops it next
    /// to calls) until text or the end shows it is part of the answer.
    held_space: String,
}

impl EventStream {
    pub fn new() -> EventStream {
        EventStream { open: OpenBlock::None, next_index: 0, calls: 0, held_space: String::new() }
    }

    /// `message_start`, with the prompt's token count as `input_tokens`.
    pub fn start(&self, message: &Message, prompt_tokens: u32) -> Event {
        let mut message = message.clone();
        message.usage.input_tokens = prompt_tokens;
        event("message_start", json!({ "message": message }))
    }

    pub fn ping() -> Event {
        event("ping", json!({}))
    }

    pub fn calls(&self) -> u32 {
        self.calls
    }

    pub fn push(&mut self, events: Vec<ToolEvent>) -> Vec<Event> {
        let mut out = Vec::new();
        for e in events {
            match e {
                ToolEvent::Content(text) => self.text(text, &mut out),
                ToolEvent::CallStart { index, id, name } => {
                    self.held_space.clear();
                    self.close(&mut out);
                    self.calls += 1;
                    self.open = OpenBlock::Tool(index);
                    out.push(event(
                        "content_block_start",
                        json!({"index": self.next_index, "content_block": {"type": "tool_use", "id": tool_use_id(&id), "name": name, "input": {}}}),
                    ));
                }
                ToolEvent::CallArgs { index, fragment } => {
                    if self.open == OpenBlock::Tool(index) {
                        out.push(event(
                            "content_block_delta",
                            json!({"index": self.next_index, "delta": {"type": "input_json_delta", "partial_json": fragment}}),
                        ));
                    } else {
                        tracing::warn!(call = index, "arguments for a call that is not the open block; dropped");
                    }
                }
            }
        }
        out
    }

    fn text(&mut self, text: String, out: &mut Vec<Event>) {
        if text.is_empty() {
            return;
        }
        // Whitespace alone (line breaks around call tags) opens no block yet.
        if self.open != OpenBlock::Text && text.trim().is_empty() {
            self.held_space.push_str(&text);
            return;
        }
        let text = std::mem::take(&mut self.held_space) + &text;
        self.send_text(text, out);
    }

    /// Appends to the open text block, opening one first if needed.
    fn send_text(&mut self, text: String, out: &mut Vec<Event>) {
        if self.open != OpenBlock::Text {
            self.close(out);
            self.open = OpenBlock::Text;
            out.push(event(
                "content_block_start",
                json!({"index": self.next_index, "content_block": {"type": "text", "text": ""}}),
            ));
        }
        out.push(event(
            "content_block_delta",
            json!({"index": self.next_index, "delta": {"type": "text_delta", "text": text}}),
        ));
    }

    fn close(&mut self, out: &mut Vec<Event>) {
        if self.open != OpenBlock::None {
            out.push(event("content_block_stop", json!({"index": self.next_index})));
            self.next_index += 1;
            self.open = OpenBlock::None;
        }
    }

    /// Closes the open block, then `message_delta` (stop reason, final usage) and
    /// `message_stop`.
    pub fn finish(&mut self, reason: StopReason, stop_sequence: Option<String>, usage: &Usage) -> Vec<Event> {
        let mut out = Vec::new();
        if self.calls == 0 && !self.held_space.is_empty() {
            let space = std::mem::take(&mut self.held_space);
            self.send_text(space, &mut out);
        }
        self.close(&mut out);
        out.push(event(
            "message_delta",
            json!({"delta": {"stop_reason": reason, "stop_sequence": stop_sequence}, "usage": MessageUsage::from(usage)}),
        ));
        out.push(event("message_stop", json!({})));
        out
    }
}

impl Default for EventStream {
    fn default() -> Self {
        EventStream::new()
    }
}

/// The Anthropic error type for a status.
fn error_type(error: &GatewayError) -> &'static str {
    match error.status().as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        504 => "timeout_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// `{"type": "error", "error": {"type", "message"}}`; the message names the field when the
/// error has one (Anthropic bodies have no `param`).
pub fn error_body(error: &GatewayError) -> Value {
    let body = error.to_body().error;
    let message = match &body.param {
        Some(param) if !body.message.contains(param.as_str()) => format!("{param}: {}", body.message),
        _ => body.message,
    };
    json!({"type": "error", "error": {"type": error_type(error), "message": message}})
}

/// The error as an HTTP response with an Anthropic body (same status as elsewhere).
pub fn error_response(error: GatewayError) -> Response {
    let status = error.status();
    if status.is_server_error() {
        tracing::warn!(error = %error, status = status.as_u16(), "messages request failed");
    }
    (status, axum::Json(error_body(&error))).into_response()
}

/// The `error` event of a stream that fails after it began.
pub fn error_event(error: &GatewayError) -> Event {
    let body = error_body(error);
    Event::default().event("error").data(body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(events: Vec<Event>) -> Vec<(String, Value)> {
        let stream = futures::stream::iter(events.into_iter().map(Ok::<_, std::convert::Infallible>));
        let response = axum::response::sse::Sse::new(stream).into_response();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let bytes = rt.block_on(axum::body::to_bytes(response.into_body(), 1 << 20)).unwrap();
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let name = e.lines().find_map(|l| l.strip_prefix("event: ")).unwrap().to_owned();
                let data = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
                let data: Value = serde_json::from_str(data).unwrap();
                assert_eq!(data["type"], name.as_str(), "{e}");
                (name, data)
            })
            .collect()
    }

    fn call_start(index: u32) -> ToolEvent {
        ToolEvent::CallStart { index, id: format!("call_{index}"), name: "f".into() }
    }

    fn args(index: u32, s: &str) -> ToolEvent {
        ToolEvent::CallArgs { index, fragment: s.into() }
    }

    #[test]
    fn text_then_two_calls_stream_as_three_blocks() {
        let mut s = EventStream::new();
        let mut events = s.push(vec![ToolEvent::Content("Let me check.".into()), ToolEvent::Content("\n".into())]);
        events.extend(s.push(vec![call_start(0), args(0, "{\"a\":"), args(0, "1}")]));
        events.extend(s.push(vec![ToolEvent::Content("\n".into()), call_start(1), args(1, "{}")]));
        events.extend(s.finish(StopReason::ToolUse, None, &Usage::new(10, 5, 4)));
        let got = wire(events);
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(got[4].1["index"], 1);
        assert_eq!(got[4].1["content_block"], json!({"type": "tool_use", "id": "toolu_0", "name": "f", "input": {}}));
        assert_eq!(got[6].1["delta"], json!({"type": "input_json_delta", "partial_json": "1}"}));
        assert_eq!(got[8].1["index"], 2);
        assert_eq!(got[11].1["delta"], json!({"stop_reason": "tool_use", "stop_sequence": null}));
        assert_eq!(
            got[11].1["usage"],
            json!({"input_tokens": 6, "output_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4})
        );
    }

    #[test]
    fn collected_content_parses_arguments_and_drops_blank_text_around_calls() {
        let mut c = ContentCollector::default();
        c.absorb(vec![ToolEvent::Content("\n".into()), call_start(0), args(0, "{\"city\":"), args(0, "\"Paris\"}")]);
        c.absorb(vec![ToolEvent::Content("\n\n".into()), call_start(1), args(1, "not json")]);
        assert_eq!(c.calls(), 2);
        assert_eq!(
            c.finish(),
            vec![
                ContentBlock::ToolUse { id: "toolu_0".into(), name: "f".into(), input: json!({"city": "Paris"}) },
                ContentBlock::ToolUse {
                    id: "toolu_1".into(),
                    name: "f".into(),
                    input: json!({"arguments": "not json"})
                },
            ]
        );
        let mut c = ContentCollector::default();
        c.absorb(vec![ToolEvent::Content("Hi ".into()), ToolEvent::Content("there".into())]);
        assert_eq!(c.finish(), vec![ContentBlock::Text { text: "Hi there".into() }]);
    }

    #[test]
    fn stop_reasons_and_error_bodies_follow_anthropic() {
        assert_eq!(StopReason::of(FinishReason::Stop, false, None), StopReason::EndTurn);
        assert_eq!(StopReason::of(FinishReason::Stop, false, Some("END")), StopReason::StopSequence);
        assert_eq!(StopReason::of(FinishReason::Stop, true, None), StopReason::ToolUse);
        assert_eq!(StopReason::of(FinishReason::Length, true, None), StopReason::MaxTokens);
        let body = error_body(&GatewayError::invalid("must be >= 1", "max_tokens"));
        assert_eq!(
            body,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: must be >= 1"}})
        );
        let body = error_body(&GatewayError::Unauthorized("bad key"));
        assert_eq!(body["error"]["type"], "authentication_error");
        let body = error_body(&GatewayError::Engine(tonic::Status::unavailable("down")));
        assert_eq!(body["error"]["type"], "overloaded_error");
    }
}
