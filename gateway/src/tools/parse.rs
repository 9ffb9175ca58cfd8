//! Incremental tool-call parser over the generated text.
//!
//! `push` takes text deltas and returns events: `Content` for text outside calls (released
//! as soon as it cannot be the start of a `<tool_call>` tag) and one `Call` per complete
//! `<tool_call>..</tool_call>` block. `finish` flushes the rest; an unterminated block is
//! still parsed (a model may stop right before the closing tag). A block that does not parse
//! is given back as content, verbatim, so nothing the model wrote is lost. In the `Generic`
//! format an answer that starts with `{` or a code fence is held to the end and read as a
//! bare JSON call (object or array) when it names an offered tool.
//! With `parallel_tool_calls: false` only the first call is kept.

use serde_json::{Map, Value};

use super::{ToolFormat, new_call_id, tool_name};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// One parsed call; `arguments` is a JSON object serialized as OpenAI sends it.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ToolEvent {
    Content(String),
    /// `index` counts calls from 0 within the completion.
    Call {
        index: u32,
        call: ParsedCall,
    },
}

#[derive(Debug)]
pub struct ToolParser {
    format: ToolFormat,
    tools: Vec<Value>,
    parallel: bool,
    buf: String,
    in_call: bool,
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
        if self.format == ToolFormat::Generic
            && !self.seen_content
            && self.calls == 0
            && !self.in_call
        {
            let start = self.buf.trim_start();
            if start.starts_with('{') || start.starts_with("```") || start.starts_with('[') {
                self.bare = true;
            }
        }
        if self.bare {
            return out;
        }
        loop {
            if self.in_call {
                let Some(end) = self.buf.find(CLOSE) else {
                    break;
                };
                let body = self.buf[..end].to_owned();
                self.buf.drain(..end + CLOSE.len());
                self.in_call = false;
                self.emit_block(&body, &mut out);
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
            self.emit_block(&rest, &mut out);
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
        out.push(ToolEvent::Call {
            index: self.calls,
            call: ParsedCall {
                id: new_call_id(),
                name,
                arguments,
            },
        });
        self.calls += 1;
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
        while let Some(start) = rest.find("<parameter=") {
            let after = &rest[start + "<parameter=".len()..];
            let (key, after) = after.split_once('>')?;
            let (value, after) = match after.find("</parameter>") {
                Some(end) => (&after[..end], &after[end + "</parameter>".len()..]),
                // The closing tag may be missing before `</function>`.
                None => match after.find("</function>") {
                    Some(end) => (&after[..end], &after[end..]),
                    None => (after, ""),
                },
            };
            let value = value.strip_prefix('\n').unwrap_or(value);
            let value = value.strip_suffix('\n').unwrap_or(value);
            args.insert(
                key.trim().to_owned(),
                self.typed_value(name, key.trim(), value),
            );
            rest = after;
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
        serde_json::from_str(raw.trim()).unwrap_or_else(|_| Value::String(raw.to_owned()))
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
        if calls.len() == items.len() && calls.iter().all(|(n, _)| known(n)) {
            calls
        } else {
            Vec::new()
        }
    }
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
fn held_suffix(text: &str) -> usize {
    let mut keep = 0;
    for len in (1..OPEN.len()).rev() {
        if text.len() >= len
            && text.is_char_boundary(text.len() - len)
            && OPEN.starts_with(&text[text.len() - len..])
        {
            keep = len;
            break;
        }
    }
    let head = &text[..text.len() - keep];
    keep + (head.len() - head.trim_end().len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}),
        ]
    }

    /// Feeds `text` in pieces of `step` bytes (on char boundaries) and collects the events.
    fn run(format: ToolFormat, text: &str, step: usize, parallel: bool) -> Vec<ToolEvent> {
        let mut p = ToolParser::new(format, tools(), parallel);
        let mut out = Vec::new();
        let mut i = 0;
        while i < text.len() {
            let mut j = (i + step).min(text.len());
            while !text.is_char_boundary(j) {
                j += 1;
            }
            out.extend(p.push(&text[i..j]));
            i = j;
        }
        out.extend(p.finish());
        merge(out)
    }

    /// Joins adjacent content events and blanks call ids, for comparison.
    fn merge(events: Vec<ToolEvent>) -> Vec<ToolEvent> {
        let mut out: Vec<ToolEvent> = Vec::new();
        for e in events {
            match (out.last_mut(), e) {
                (Some(ToolEvent::Content(a)), ToolEvent::Content(b)) => a.push_str(&b),
                (_, ToolEvent::Call { index, mut call }) => {
                    assert!(call.id.starts_with("call_"));
                    call.id.clear();
                    out.push(ToolEvent::Call { index, call });
                }
                (_, e) => out.push(e),
            }
        }
        out
    }

    fn call(index: u32, name: &str, arguments: Value) -> ToolEvent {
        ToolEvent::Call {
            index,
            call: ParsedCall {
                id: String::new(),
                name: name.into(),
                arguments: arguments.to_string(),
            },
        }
    }

    fn content(s: &str) -> ToolEvent {
        ToolEvent::Content(s.into())
    }

    #[test]
    fn json_form_calls_are_parsed_at_any_chunking() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}\n</tool_call>";
        for step in [1, 2, 3, 7, 1000] {
            assert_eq!(
                run(ToolFormat::Json, text, step, true),
                vec![
                    content("Let me check."),
                    call(0, "get_weather", json!({"city": "Paris"})),
                    call(1, "get_weather", json!({"city": "Oslo"})),
                ],
                "step {step}"
            );
        }
        let first_only = run(ToolFormat::Json, text, 5, false);
        assert_eq!(first_only.len(), 2);
    }

    #[test]
    fn xml_form_values_follow_the_schema() {
        let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=extra>\n{\"a\": [1]}\n</parameter>\n</function>\n</tool_call>";
        for step in [1, 4, 1000] {
            assert_eq!(
                run(ToolFormat::Xml, text, step, true),
                vec![call(
                    0,
                    "get_weather",
                    json!({"city": "42", "days": 3, "extra": {"a": [1]}})
                )],
                "step {step}"
            );
        }
        // Multi-line string values keep their inner newlines; a missing close is tolerated.
        let text = "Sure.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan\nFrancisco\n</parameter>\n</function>\n";
        assert_eq!(
            run(ToolFormat::Xml, text, 3, true),
            vec![
                content("Sure."),
                call(0, "get_weather", json!({"city": "San\nFrancisco"}))
            ]
        );
    }

    #[test]
    fn text_without_calls_passes_through_and_broken_blocks_stay_content() {
        let plain = "a < b and <tool is not <tool_call";
        assert_eq!(run(ToolFormat::Json, plain, 2, true), vec![content(plain)]);
        let broken = "x <tool_call>not json</tool_call> y";
        assert_eq!(
            run(ToolFormat::Json, broken, 3, true),
            vec![content(broken)]
        );
        // Content is released before the end when it cannot start a tag.
        let mut p = ToolParser::new(ToolFormat::Json, tools(), true);
        assert_eq!(p.push("hello <tool"), vec![content("hello")]);
        assert_eq!(p.push("box"), vec![content(" <toolbox")]);
    }

    #[test]
    fn generic_format_reads_bare_json_calls_of_offered_tools() {
        let bare = "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n```";
        assert_eq!(
            run(ToolFormat::Generic, bare, 4, true),
            vec![call(0, "get_weather", json!({"city": "Rome"}))]
        );
        let unknown = "{\"name\": \"launch\", \"arguments\": {}}";
        assert_eq!(
            run(ToolFormat::Generic, unknown, 4, true),
            vec![content(unknown)]
        );
        let tagged = "<tool_call>{\"name\": \"get_weather\"}</tool_call>";
        assert_eq!(
            run(ToolFormat::Generic, tagged, 4, true),
            vec![call(0, "get_weather", json!({}))]
        );
        assert_eq!(
            run(ToolFormat::Generic, "It is sunny.", 4, true),
            vec![content("It is sunny.")]
        );
    }
}
