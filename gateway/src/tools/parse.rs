//! Incremental tool-call parser over the generated text.
//!
//! `push` takes text deltas and returns events: `Content` for text outside calls (released
//! as soon as it cannot be the start of a `<tool_call>` tag), and per call a `CallStart`
//! (id, name) followed by `CallArgs` fragments whose concatenation is the arguments JSON.
//! JSON-form calls stream when written name first with object arguments (`{"name": "f",
//! "arguments": {` — what Hermes-style templates teach): the start as soon as that head is
//! complete, then the arguments text as it arrives, verbatim, up to the `}` that closes
//! the arguments object. Other JSON shapes (arguments as a JSON string, name last) are sent
//! when their block closes (start + all arguments, normalized). XML-form calls stream: the
//! start as soon as `<function=NAME>` is complete, then one fragment per complete
//! `<parameter>` (`{"a":1`, `,"b":2`, ..., `}`). `finish` flushes the rest; an unterminated block is
//! still parsed (a model may stop right before the closing tag). A block that does not parse
//! is given back as content, verbatim, so nothing the model wrote is lost. In the `Generic`
//! format an answer that starts with `{` or a code fence is held to the end and read as a
//! bare JSON call (object or array) when it names an offered tool.
//! With `parallel_tool_calls: false` only the first call is kept.

use serde_json::{Map, Value};

use super::{ToolFormat, new_call_id, tool_name};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

#[derive(Debug, Clone, PartialEq)]
pub enum ToolEvent {
    Content(String),
    /// A call begins; `index` counts calls from 0 within the completion.
    CallStart {
        index: u32,
        id: String,
        name: String,
    },
    /// The next piece of the call's arguments JSON.
    CallArgs {
        index: u32,
        fragment: String,
    },
}

/// An XML call whose start was sent and whose parameters are being streamed.
#[derive(Debug)]
struct XmlProgress {
    index: u32,
    name: String,
    /// Bytes of the block body already parsed.
    pos: usize,
    params: usize,
    /// Parameter names sent so far: a repeated one is skipped (the first value wins, as in
    /// [`ToolParser::parse_xml`]), so the arguments never hold a key twice.
    keys: Vec<String>,
    /// Dropped (`parallel_tool_calls: false` and a call was already made): parse, send nothing.
    muted: bool,
}

/// A JSON-form call whose start was sent and whose arguments object is being streamed.
#[derive(Debug)]
struct JsonProgress {
    index: u32,
    /// Bytes of the block body up to which the arguments were scanned (and sent).
    scanned: usize,
    /// Brace/bracket depth inside the arguments; 0 again once they closed.
    depth: u32,
    in_string: bool,
    escaped: bool,
    closed: bool,
    muted: bool,
}

#[derive(Debug)]
pub struct ToolParser {
    format: ToolFormat,
    tools: Vec<Value>,
    parallel: bool,
    buf: String,
    in_call: bool,
    xml: Option<XmlProgress>,
    json: Option<JsonProgress>,
    /// Whitespace cut before an opening tag, given back if the block does not parse.
    ws_before: String,
    /// Generic format only: the answer looks like a bare JSON call, hold it all.
    bare: bool,
    seen_content: bool,
    calls: u32,
}

impl ToolParser {
    /// `tools` are the offered tools (names checked in `Generic`, schemas type XML values).
    pub fn new(format: ToolFormat, tools: Vec<Value>, parallel: bool) -> Self {
        ToolParser {
            format,
            tools,
            parallel,
            buf: String::new(),
            in_call: false,
            xml: None,
            json: None,
            ws_before: String::new(),
            bare: false,
            seen_content: false,
            calls: 0,
        }
    }

    pub fn calls(&self) -> u32 {
        self.calls
    }

    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        if self.format == ToolFormat::Generic && !self.seen_content && self.calls == 0 && !self.in_call {
            let start = self.buf.trim_start();
            if start.starts_with('{') || start.starts_with("```") || start.starts_with('[') {
                self.bare = true;
            } else if "```".starts_with(start) {
                // Only whitespace or part of a fence so far (a step may end anywhere): it is
                // not known yet whether a bare call begins, so nothing is released.
                return out;
            }
        }
        // A fence that names another language (```python) is an answer, not a call: stream it.
        if self.bare && !fence_may_hold_call(&self.buf) {
            self.bare = false;
        }
        if self.bare {
            return out;
        }
        loop {
            if self.in_call {
                let end = self.buf.find(CLOSE);
                if self.format == ToolFormat::Xml && end.is_none() {
                    self.advance_xml(&mut out);
                } else if self.format == ToolFormat::Json {
                    // Not past a closing tag that may be arriving in pieces: its first bytes
                    // are not arguments.
                    let scan_to = end.unwrap_or(self.buf.len() - partial_close_len(&self.buf));
                    self.advance_json(scan_to, &mut out);
                }
                let Some(end) = end else { break };
                let body = self.buf[..end].to_owned();
                self.buf.drain(..end + CLOSE.len());
                self.in_call = false;
                if let Some(progress) = self.xml.take() {
                    self.finish_xml(progress, &body, &mut out);
                } else if let Some(progress) = self.json.take() {
                    self.finish_json(progress, &mut out);
                } else {
                    self.emit_block(&body, &mut out);
                }
            } else if let Some(start) = self.buf.find(OPEN) {
                let before = self.buf[..start].trim_end().to_owned();
                self.ws_before = self.buf[before.len()..start].to_owned();
                self.emit_content(before, &mut out);
                self.buf.drain(..start + OPEN.len());
                self.in_call = true;
            } else {
                let keep = held_suffix(&self.buf);
                let release = self.buf[..self.buf.len() - keep].to_owned();
                self.buf.drain(..self.buf.len() - keep);
                self.emit_content(release, &mut out);
                break;
            }
        }
        out
    }

    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        let rest = std::mem::take(&mut self.buf);
        if self.bare {
            self.bare = false;
            let calls = self.bare_calls(&rest);
            if calls.is_empty() {
                self.emit_content(rest, &mut out);
            } else {
                for (name, arguments) in calls {
                    self.emit_call(name, arguments, &mut out);
                }
            }
        } else if self.in_call {
            self.in_call = false;
            if let Some(progress) = self.xml.take() {
                self.finish_xml(progress, &rest, &mut out);
            } else if self.format == ToolFormat::Json {
                self.buf = rest;
                self.advance_json(self.buf.len(), &mut out);
                let rest = std::mem::take(&mut self.buf);
                match self.json.take() {
                    Some(progress) => self.finish_json(progress, &mut out),
                    None => self.emit_block(&rest, &mut out),
                }
            } else {
                self.emit_block(&rest, &mut out);
            }
        } else {
            self.emit_content(rest, &mut out);
        }
        out
    }

    fn emit_content(&mut self, text: String, out: &mut Vec<ToolEvent>) {
        // Whitespace between calls is layout, not an answer.
        if text.is_empty() || (self.calls > 0 && text.trim().is_empty()) {
            return;
        }
        self.seen_content = true;
        out.push(ToolEvent::Content(text));
    }

    fn emit_block(&mut self, body: &str, out: &mut Vec<ToolEvent>) {
        match self.parse_block(body) {
            Some((name, arguments)) => self.emit_call(name, arguments, out),
            None => {
                let ws = std::mem::take(&mut self.ws_before);
                self.emit_content(format!("{ws}{OPEN}{body}{CLOSE}"), out);
            }
        }
    }

    fn emit_call(&mut self, name: String, arguments: String, out: &mut Vec<ToolEvent>) {
        if !self.parallel && self.calls > 0 {
            return;
        }
        let index = self.calls;
        out.push(ToolEvent::CallStart { index, id: new_call_id(), name });
        out.push(ToolEvent::CallArgs { index, fragment: arguments });
        self.calls += 1;
    }

    /// Streams what is complete of an open XML block: its start, then whole parameters.
    fn advance_xml(&mut self, out: &mut Vec<ToolEvent>) {
        if self.xml.is_none() {
            let lead = self.buf.len() - self.buf.trim_start().len();
            let Some(rest) = self.buf[lead..].strip_prefix("<function=") else {
                return;
            };
            let Some((name, _)) = rest.split_once('>') else {
                return;
            };
            let name = name.trim().to_owned();
            if name.is_empty() {
                return;
            }
            let pos = lead + "<function=".len() + rest.find('>').unwrap_or(0) + 1;
            let muted = !self.parallel && self.calls > 0;
            let index = self.calls;
            if !muted {
                out.push(ToolEvent::CallStart { index, id: new_call_id(), name: name.clone() });
                self.calls += 1;
            }
            self.xml = Some(XmlProgress { index, name, pos, params: 0, keys: Vec::new(), muted });
        }
        let Some(mut progress) = self.xml.take() else {
            return;
        };
        let buf = std::mem::take(&mut self.buf);
        while let Some((key, value, used)) = next_param(&buf[progress.pos..], false) {
            progress.pos += used;
            self.param_fragment(&mut progress, key, value, out);
        }
        self.buf = buf;
        self.xml = Some(progress);
    }

    /// Streams what is complete of an open JSON block (`self.buf[..end]` is its body so far):
    /// the start once the `{"name": .., "arguments": {` head is complete, then the
    /// arguments text scanned so far (strings and escapes tracked, so braces inside string
    /// values do not count).
    fn advance_json(&mut self, end: usize, out: &mut Vec<ToolEvent>) {
        if self.json.is_none() {
            let Some((name, args_at)) = json_head(&self.buf[..end]) else {
                return;
            };
            let muted = !self.parallel && self.calls > 0;
            let index = self.calls;
            if !muted {
                out.push(ToolEvent::CallStart { index, id: new_call_id(), name });
                self.calls += 1;
            }
            self.json = Some(JsonProgress {
                index,
                scanned: args_at,
                depth: 0,
                in_string: false,
                escaped: false,
                closed: false,
                muted,
            });
        }
        let Some(p) = self.json.as_mut() else { return };
        if p.closed {
            return;
        }
        let from = p.scanned;
        if end <= from {
            return;
        }
        for (i, b) in self.buf.as_bytes()[from..end].iter().enumerate() {
            match (p.in_string, p.escaped, b) {
                (true, true, _) => p.escaped = false,
                (true, false, b'\\') => p.escaped = true,
                (true, false, b'"') => p.in_string = false,
                (true, false, _) => {}
                (false, _, b'"') => p.in_string = true,
                (false, _, b'{' | b'[') => p.depth += 1,
                (false, _, b'}' | b']') => {
                    p.depth = p.depth.saturating_sub(1);
                    if p.depth == 0 {
                        p.closed = true;
                        p.scanned = from + i + 1;
                        break;
                    }
                }
                _ => {}
            }
            p.scanned = from + i + 1;
        }
        // Never split a UTF-8 character across fragments.
        while !self.buf.is_char_boundary(p.scanned) {
            p.scanned -= 1;
        }
        if p.scanned > from && !p.muted {
            out.push(ToolEvent::CallArgs { index: p.index, fragment: self.buf[from..p.scanned].to_owned() });
        }
    }

    /// The end of a streamed JSON block: arguments cut short (the model stopped inside
    /// them) get their open strings and brackets closed so the result stays JSON.
    fn finish_json(&mut self, progress: JsonProgress, out: &mut Vec<ToolEvent>) {
        if progress.closed || progress.muted {
            return;
        }
        let mut tail = String::new();
        if progress.in_string {
            tail.push('"');
        }
        tail.push_str(&"}".repeat(progress.depth.max(1) as usize));
        out.push(ToolEvent::CallArgs { index: progress.index, fragment: tail });
    }

    /// The rest of a streamed XML block (tolerating a missing `</parameter>`), then `}`.
    fn finish_xml(&mut self, mut progress: XmlProgress, body: &str, out: &mut Vec<ToolEvent>) {
        // Trailing whitespace is dropped as the one-piece path drops it (`parse_block`), so a
        // value cut short by the closing tag reads the same however the text was chunked.
        let mut rest = body.trim_end().get(progress.pos..).unwrap_or_default();
        while let Some((key, value, used)) = next_param(rest, true) {
            rest = &rest[used..];
            self.param_fragment(&mut progress, key, value, out);
        }
        let close = if progress.params == 0 { "{}" } else { "}" };
        if !progress.muted {
            out.push(ToolEvent::CallArgs { index: progress.index, fragment: close.to_owned() });
        }
    }

    fn param_fragment(&self, progress: &mut XmlProgress, key: &str, value: &str, out: &mut Vec<ToolEvent>) {
        if progress.keys.iter().any(|k| k == key) {
            return;
        }
        progress.keys.push(key.to_owned());
        let typed = self.typed_value(&progress.name, key, value);
        let lead = if progress.params == 0 { "{" } else { "," };
        progress.params += 1;
        if !progress.muted {
            out.push(ToolEvent::CallArgs {
                index: progress.index,
                fragment: format!("{lead}{}:{typed}", Value::String(key.to_owned())),
            });
        }
    }

    fn parse_block(&self, body: &str) -> Option<(String, String)> {
        let body = body.trim();
        if self.format == ToolFormat::Xml && body.starts_with("<function=") {
            return self.parse_xml(body);
        }
        // Models of either family sometimes write the other form; accept both.
        json_call(body).or_else(|| self.parse_xml(body))
    }

    /// `<function=NAME>` then `<parameter=KEY>\nVALUE\n</parameter>` children.
    fn parse_xml(&self, body: &str) -> Option<(String, String)> {
        let rest = body.strip_prefix("<function=")?;
        let (name, mut rest) = rest.split_once('>')?;
        let name = name.trim();
        if name.is_empty() {
            return None;
        }
        let mut args = Map::new();
        while let Some((key, value, used)) = next_param(rest, true) {
            // A repeated parameter keeps its first value: a streamed call has already sent it.
            args.entry(key.to_owned()).or_insert_with(|| self.typed_value(name, key, value));
            rest = &rest[used..];
        }
        Some((name.to_owned(), Value::Object(args).to_string()))
    }

    /// A string parameter stays a string; others are read as JSON when they parse.
    fn typed_value(&self, function: &str, key: &str, raw: &str) -> Value {
        let declared = self
            .tools
            .iter()
            .find(|t| tool_name(t) == Some(function))
            .and_then(|t| t["function"]["parameters"]["properties"][key]["type"].as_str());
        if declared == Some("string") {
            return Value::String(raw.to_owned());
        }
        // The Qwen3.5/3.6 template prints booleans and null with Python's str().
        match raw.trim() {
            "True" => Value::Bool(true),
            "False" => Value::Bool(false),
            "None" => Value::Null,
            trimmed => serde_json::from_str(trimmed).unwrap_or_else(|_| Value::String(raw.to_owned())),
        }
    }

    fn bare_calls(&self, text: &str) -> Vec<(String, String)> {
        let mut body = text.trim();
        if let Some(inner) = body.strip_prefix("```") {
            let inner = inner.strip_prefix("json").unwrap_or(inner);
            body = inner.strip_suffix("```").unwrap_or(inner).trim();
        }
        let items = match serde_json::from_str::<Value>(body) {
            Ok(Value::Array(items)) => items,
            Ok(v @ Value::Object(_)) => vec![v],
            _ => return Vec::new(),
        };
        let known = |name: &str| self.tools.iter().any(|t| tool_name(t) == Some(name));
        let calls: Vec<_> = items.iter().filter_map(call_of).collect();
        if calls.len() == items.len() && calls.iter().all(|(n, _)| known(n)) { calls } else { Vec::new() }
    }
}

/// Whether held text that opens with a code fence can still become a bare call, i.e. the
/// fence is untagged or tagged `json` (what [`ToolParser::bare_calls`] accepts) and its body,
/// so far, starts like JSON. Text that does not open with a fence answers true.
fn fence_may_hold_call(held: &str) -> bool {
    let Some(inner) = held.trim_start().strip_prefix("```") else { return true };
    if "json".starts_with(inner) {
        return true;
    }
    let body = inner.strip_prefix("json").unwrap_or(inner).trim_start();
    body.is_empty() || body.starts_with('{') || body.starts_with('[')
}

/// The next `<parameter=KEY>\nVALUE\n</parameter>` in `s`: (key, value, bytes used).
/// Without `lenient` the closing tag must be there (the value may still grow); with it, a
/// value also ends at `</function>` or the end of `s`.
fn next_param(s: &str, lenient: bool) -> Option<(&str, &str, usize)> {
    const TAG: &str = "<parameter=";
    const END: &str = "</parameter>";
    let start = s.find(TAG)?;
    let after = &s[start + TAG.len()..];
    let close = after.find('>')?;
    let key = after[..close].trim();
    let value_at = start + TAG.len() + close + 1;
    let tail = &s[value_at..];
    let (value, used) = match tail.find(END) {
        Some(end) => (&tail[..end], value_at + end + END.len()),
        None if lenient => match tail.find("</function>") {
            Some(end) => (&tail[..end], value_at + end),
            None => (tail, s.len()),
        },
        None => return None,
    };
    let value = value.strip_prefix('\n').unwrap_or(value);
    let value = value.strip_suffix('\n').unwrap_or(value);
    Some((key, value, used))
}

/// The head of a streamable JSON call, `{"name": "NAME", "arguments": {` (or
/// `"parameters"`), with any whitespace: the name and the offset of the arguments' `{`.
fn json_head(body: &str) -> Option<(String, usize)> {
    let skip_ws = |s: &str, at: usize| at + (s.len() - at - s[at..].trim_start().len());
    let expect = |s: &str, at: usize, what: &str| {
        let at = skip_ws(s, at);
        s[at..].starts_with(what).then_some(at + what.len())
    };
    let at = expect(body, 0, "{")?;
    let at = expect(body, at, "\"name\"")?;
    let at = expect(body, at, ":")?;
    let at = expect(body, at, "\"")?;
    let close = body[at..].find('"')?;
    let name = &body[at..at + close];
    if name.is_empty() || name.contains('\\') {
        return None;
    }
    let at = expect(body, at + close + 1, ",")?;
    let at = expect(body, at, "\"")?;
    let key_end = at + body[at..].find('"')?;
    if !matches!(&body[at..key_end], "arguments" | "parameters") {
        return None;
    }
    let at = expect(body, key_end + 1, ":")?;
    let brace = skip_ws(body, at);
    body[brace..].starts_with('{').then(|| (name.to_owned(), brace))
}

/// `{"name": .., "arguments": {..}}` (also `parameters`; arguments as an object or a JSON
/// string); anything else is not a call.
fn json_call(body: &str) -> Option<(String, String)> {
    call_of(&serde_json::from_str::<Value>(body).ok()?)
}

fn call_of(v: &Value) -> Option<(String, String)> {
    let name = v.get("name")?.as_str()?.to_owned();
    let args = v.get("arguments").or_else(|| v.get("parameters"));
    let arguments = match args {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(parsed @ Value::Object(_)) => parsed.to_string(),
            _ => return None,
        },
        Some(o @ Value::Object(_)) => o.to_string(),
        Some(_) => return None,
    };
    Some((name, arguments))
}

/// Length of the longest tail of `text` that could still grow into `<tool_call>` (with the
/// whitespace before it, which is dropped when a call follows).
/// Bytes at the end of `text` that may be the start of [`CLOSE`] (the rest not arrived yet).
fn partial_close_len(text: &str) -> usize {
    (1..CLOSE.len()).rev().find(|&len| text.ends_with(&CLOSE[..len])).unwrap_or(0)
}

fn held_suffix(text: &str) -> usize {
    let mut keep = 0;
    for len in (1..OPEN.len()).rev() {
        if text.len() >= len && text.is_char_boundary(text.len() - len) && OPEN.starts_with(&text[text.len() - len..]) {
            keep = len;
            break;
        }
    }
    let head = &text[..text.len() - keep];
    keep + (head.len() - head.trim_end().len())
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
