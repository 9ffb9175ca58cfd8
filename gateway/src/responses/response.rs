//! What `/v1/responses` writes: the `response` object and its typed event stream.
//!
//! Output items follow the generation: text outside tool calls is a `message` item with one
//! `output_text` part, each call a `function_call` item (`call_id` `call_...`, `arguments` the
//! JSON text); whitespace alone between calls (the model's line breaks around call tags) makes
//! no item. One builder ([`Output`]) turns the parser's tool events into both the items and the
//! stream's events, so a stream and a whole response cannot disagree.
//!
//! The stream: `response.created`, `response.in_progress`; per item `response.output_item.added`,
//! then for a message `response.content_part.added`, `response.output_text.delta`...,
//! `response.output_text.done`, `response.content_part.done`, for a call
//! `response.function_call_arguments.delta`..., `response.function_call_arguments.done`; then
//! `response.output_item.done`; last `response.completed` (or `response.incomplete` when
//! `max_output_tokens` cut it short). Every event carries `type` and `sequence_number`; a stream
//! that fails after it began sends `error` and `response.failed`. There is no `[DONE]` line.
//!
//! Usage: `input_tokens` is the whole prompt, `input_tokens_details.cached_tokens` the part
//! served from the prefix cache (as chat completions' `prompt_tokens` / `cached_tokens`);
//! `edge_cache` is this server's split of how the prompt was served.

use axum::response::sse::Event;
use serde_json::{Map, Value, json};

use crate::error::GatewayError;
use crate::openai::{FinishReason, Usage};
use crate::responses::request::Echo;
use crate::tools::ToolEvent;

/// The parts of a response object known before generation starts.
#[derive(Debug, Clone)]
pub struct Header {
    /// `resp_<hex>`.
    pub id: String,
    pub created_at: u64,
    pub model: String,
    pub echo: Echo,
}

impl Header {
    /// The `response` object in `status` with these items and (once known) usage.
    pub fn object(&self, status: &str, output: &[Value], usage: Option<&Usage>) -> Value {
        let echo = &self.echo;
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": echo.instructions,
            "max_output_tokens": echo.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": echo.parallel_tool_calls.unwrap_or(true),
            "previous_response_id": null,
            "reasoning": {"effort": echo.reasoning_effort, "summary": null},
            "store": false,
            "temperature": echo.temperature.clone().unwrap_or(json!(1.0)),
            "text": {"format": echo.text_format.clone().unwrap_or(json!({"type": "text"}))},
            "tool_choice": echo.tool_choice.clone().unwrap_or(json!("auto")),
            "tools": echo.tools,
            "top_p": echo.top_p.clone().unwrap_or(json!(1.0)),
            "truncation": "disabled",
            "usage": usage.map(usage_object),
            "user": echo.user,
            "metadata": echo.metadata,
        })
    }

    /// The `error` member of a failed response.
    fn failed_object(&self, output: &[Value], error: &GatewayError) -> Value {
        let mut object = self.object("failed", output, None);
        object["error"] = json!({"code": error_code(error), "message": error.to_string()});
        object
    }
}

/// `"completed"`, or `"incomplete"` when the token limit ended it.
pub fn status_of(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "incomplete",
        FinishReason::Stop | FinishReason::ToolCalls => "completed",
    }
}

pub fn usage_object(u: &Usage) -> Value {
    let mut usage = json!({
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": u.prompt_tokens_details.cached_tokens.min(u.prompt_tokens)},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.total_tokens,
    });
    if let Some(explain) = &u.edge_cache {
        usage["edge_cache"] = json!(explain);
    }
    usage
}

/// The item being written.
#[derive(Debug)]
enum Open {
    None,
    Message { id: String, text: String },
    Call { id: String, call_id: String, name: String, index: u32, arguments: String },
}

/// Builds the output items from the parser's tool events, and says what a stream sends for
/// each step (`(type, data)` pairs; the stream numbers them).
#[derive(Debug)]
pub struct Output {
    /// Item ids are `msg_<this>_<n>` / `fc_<this>_<n>`: unique per response, stable in tests.
    id_base: String,
    items: Vec<Value>,
    open: Open,
    calls: u32,
    /// Whitespace-only text outside a message, held back until text shows it belongs to the
    /// answer (dropped when a call follows).
    held_space: String,
}

pub type StreamStep = (&'static str, Value);

impl Output {
    pub fn new(response_id: &str) -> Output {
        let id_base = response_id.strip_prefix("resp_").unwrap_or(response_id).to_owned();
        Output { id_base, items: Vec::new(), open: Open::None, calls: 0, held_space: String::new() }
    }

    pub fn calls(&self) -> u32 {
        self.calls
    }

    pub fn push(&mut self, events: Vec<ToolEvent>) -> Vec<StreamStep> {
        let mut out = Vec::new();
        for event in events {
            match event {
                ToolEvent::Content(text) => self.text(text, &mut out),
                ToolEvent::CallStart { index, id, name } => {
                    self.held_space.clear();
                    self.close("completed", &mut out);
                    self.calls += 1;
                    let item_id = format!("fc_{}_{}", self.id_base, self.items.len());
                    let item = call_item(&item_id, &id, &name, "", "in_progress");
                    out.push(("response.output_item.added", json!({"output_index": self.items.len(), "item": item})));
                    self.open = Open::Call { id: item_id, call_id: id, name, index, arguments: String::new() };
                }
                ToolEvent::CallArgs { index, fragment } => match &mut self.open {
                    Open::Call { id, index: open, arguments, .. } if *open == index => {
                        arguments.push_str(&fragment);
                        out.push((
                            "response.function_call_arguments.delta",
                            json!({"item_id": id, "output_index": self.items.len(), "delta": fragment}),
                        ));
                    }
                    _ => tracing::warn!(call = index, "arguments for a call that is not the open item; dropped"),
                },
            }
        }
        out
    }

    fn text(&mut self, text: String, out: &mut Vec<StreamStep>) {
        if text.is_empty() {
            return;
        }
        let in_message = matches!(self.open, Open::Message { .. });
        if !in_message && text.trim().is_empty() {
            self.held_space.push_str(&text);
            return;
        }
        let text = std::mem::take(&mut self.held_space) + &text;
        self.send_text(text, out);
    }

    fn send_text(&mut self, delta: String, out: &mut Vec<StreamStep>) {
        let output_index = self.items.len();
        if !matches!(self.open, Open::Message { .. }) {
            self.close("completed", out);
            let id = format!("msg_{}_{}", self.id_base, output_index);
            out.push((
                "response.output_item.added",
                json!({"output_index": output_index, "item": message_item(&id, None, "in_progress")}),
            ));
            out.push((
                "response.content_part.added",
                json!({"item_id": id, "output_index": output_index, "content_index": 0, "part": text_part("")}),
            ));
            self.open = Open::Message { id, text: String::new() };
        }
        if let Open::Message { id, text } = &mut self.open {
            text.push_str(&delta);
            out.push((
                "response.output_text.delta",
                json!({"item_id": id, "output_index": output_index, "content_index": 0, "delta": delta, "logprobs": []}),
            ));
        }
    }

    /// Finishes the open item with `status`: its `.done` events, and the item joins the output.
    fn close(&mut self, status: &str, out: &mut Vec<StreamStep>) {
        let output_index = self.items.len();
        let item = match std::mem::replace(&mut self.open, Open::None) {
            Open::None => return,
            Open::Message { id, text } => {
                let at = json!({"item_id": id, "output_index": output_index, "content_index": 0});
                out.push(("response.output_text.done", merged(&at, json!({"text": text, "logprobs": []}))));
                out.push(("response.content_part.done", merged(&at, json!({"part": text_part(&text)}))));
                message_item(&id, Some(&text), status)
            }
            Open::Call { id, call_id, name, arguments, .. } => {
                out.push((
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": output_index, "name": name, "arguments": arguments}),
                ));
                call_item(&id, &call_id, &name, &arguments, status)
            }
        };
        out.push(("response.output_item.done", json!({"output_index": output_index, "item": item})));
        self.items.push(item);
    }

    /// Closes the last item (`incomplete` when the token limit cut it); the items are final.
    pub fn finish(&mut self, reason: FinishReason) -> Vec<StreamStep> {
        let mut out = Vec::new();
        if self.calls == 0 && !self.held_space.is_empty() {
            let space = std::mem::take(&mut self.held_space);
            self.send_text(space, &mut out);
        }
        let status = if reason == FinishReason::Length { "incomplete" } else { "completed" };
        self.close(status, &mut out);
        out
    }

    pub fn items(&self) -> &[Value] {
        &self.items
    }
}

fn merged(base: &Value, extra: Value) -> Value {
    let mut object = base.clone();
    if let (Value::Object(o), Value::Object(e)) = (&mut object, extra) {
        o.extend(e);
    }
    object
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn message_item(id: &str, text: Option<&str>, status: &str) -> Value {
    let content: Vec<Value> = text.map(text_part).into_iter().collect();
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments, "status": status})
}

/// Numbers a stream's events and frames them as SSE (`event: <type>`, data with `type` and
/// `sequence_number` first).
#[derive(Debug, Default)]
pub struct Sequencer {
    next: u64,
}

impl Sequencer {
    pub fn event(&mut self, kind: &str, data: Value) -> Event {
        let mut body = Map::new();
        body.insert("type".into(), kind.into());
        body.insert("sequence_number".into(), self.next.into());
        self.next += 1;
        if let Value::Object(fields) = data {
            body.extend(fields);
        }
        Event::default().event(kind).data(Value::Object(body).to_string())
    }

    pub fn steps(&mut self, steps: Vec<StreamStep>) -> Vec<Event> {
        steps.into_iter().map(|(kind, data)| self.event(kind, data)).collect()
    }

    /// `error`, then `response.failed` with the items written so far.
    pub fn failure(&mut self, header: &Header, output: &[Value], error: &GatewayError) -> Vec<Event> {
        let body = error.to_body().error;
        vec![
            self.event("error", json!({"code": error_code(error), "message": body.message, "param": body.param})),
            self.event("response.failed", json!({"response": header.failed_object(output, error)})),
        ]
    }
}

/// The OpenAI error code for an error (its `code`, else its `type`).
fn error_code(error: &GatewayError) -> String {
    let body = error.to_body().error;
    body.code.map(str::to_owned).unwrap_or_else(|| body.kind.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call_start(index: u32) -> ToolEvent {
        ToolEvent::CallStart { index, id: format!("call_{index}"), name: "f".into() }
    }

    fn args(index: u32, s: &str) -> ToolEvent {
        ToolEvent::CallArgs { index, fragment: s.into() }
    }

    fn kinds(steps: &[StreamStep]) -> Vec<&'static str> {
        steps.iter().map(|(k, _)| *k).collect()
    }

    #[test]
    fn text_then_two_calls_make_three_items_and_their_events() {
        let mut o = Output::new("resp_abc");
        let mut steps = o.push(vec![ToolEvent::Content("Let me check.".into()), ToolEvent::Content("\n".into())]);
        steps.extend(o.push(vec![call_start(0), args(0, "{\"a\":"), args(0, "1}")]));
        steps.extend(o.push(vec![ToolEvent::Content("\n".into()), call_start(1), args(1, "{}")]));
        steps.extend(o.finish(FinishReason::ToolCalls));
        assert_eq!(
            kinds(&steps),
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        assert_eq!(steps[4].1["text"], "Let me check.\n");
        assert_eq!(
            steps[10].1,
            json!({"item_id": "fc_abc_1", "output_index": 1, "name": "f", "arguments": "{\"a\":1}"})
        );
        let items = o.items();
        assert_eq!(items.len(), 3);
        assert_eq!(items[0]["content"][0]["text"], "Let me check.\n");
        assert_eq!(items[0]["id"], "msg_abc_0");
        assert_eq!(
            items[2],
            json!({"type": "function_call", "id": "fc_abc_2", "call_id": "call_1", "name": "f", "arguments": "{}", "status": "completed"})
        );
        assert_eq!(o.calls(), 2);
    }

    #[test]
    fn a_cut_short_message_is_incomplete_and_blank_text_alone_is_kept() {
        let mut o = Output::new("resp_x");
        o.push(vec![ToolEvent::Content("Once upon".into())]);
        let steps = o.finish(FinishReason::Length);
        assert_eq!(steps.last().unwrap().1["item"]["status"], "incomplete");
        assert_eq!(status_of(FinishReason::Length), "incomplete");
        let mut o = Output::new("resp_y");
        o.push(vec![ToolEvent::Content("\n".into())]);
        o.finish(FinishReason::Stop);
        assert_eq!(o.items()[0]["content"][0]["text"], "\n");
    }

    #[test]
    fn the_object_echoes_the_request_and_reports_cached_tokens() {
        let header = Header {
            id: "resp_1".into(),
            created_at: 7,
            model: "m".into(),
            echo: Echo { instructions: Some("Be brief.".into()), ..Echo::default() },
        };
        let usage = Usage::new(10, 3, 8);
        let object = header.object("incomplete", &[], Some(&usage));
        assert_eq!(object["incomplete_details"], json!({"reason": "max_output_tokens"}));
        assert_eq!(object["instructions"], "Be brief.");
        assert_eq!(object["tool_choice"], "auto");
        assert_eq!(object["usage"]["input_tokens"], 10);
        assert_eq!(object["usage"]["input_tokens_details"]["cached_tokens"], 8);
        assert_eq!(object["usage"]["total_tokens"], 13);
        let mut seq = Sequencer::default();
        let events = seq.failure(&header, &[], &GatewayError::Timeout(5));
        assert_eq!(events.len(), 2);
        assert_eq!(seq.next, 2);
    }
}
