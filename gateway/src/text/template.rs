//! The model's chat template (Jinja, HuggingFace conventions) compiled once with minijinja.
//!
//! Contract: renders as Jinja2 does under `transformers`' `apply_chat_template`, byte for
//! byte (checked on the Qwen3.5/3.6 template by tests/qwen_template.rs against Jinja2's own
//! output): `trim_blocks` + `lstrip_blocks`, loop controls, Python string/dict methods
//! (minijinja-contrib pycompat; `strip`/`lstrip`/`rstrip` and the `trim` filter use Python's
//! whitespace set), `raise_exception`, `strftime_now`, a `tojson` that is
//! `json.dumps(ensure_ascii=False)` (", " and ": " separators, insertion order kept, Python
//! float repr, `indent`/`separators`/`sort_keys`/`ensure_ascii` honoured), and Python's
//! `str()` for printed and `|string` scalars (`True`, `False`, `None`, `1e-05`).
//! Rendering is pure CPU work: call it from a blocking thread for long conversations.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Output, State};

const TEMPLATE_NAME: &str = "chat";

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template does not compile: {0}")]
    Compile(String),
    #[error("{0}")]
    Render(String),
}

/// Inputs of one rendering; `extra` holds `chat_template_kwargs` (e.g. `enable_thinking`).
#[derive(Debug, Clone, Default)]
pub struct RenderInput {
    pub messages: serde_json::Value,
    pub tools: Option<serde_json::Value>,
    pub extra: serde_json::Map<String, serde_json::Value>,
}

pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
    reads_content_parts: bool,
}

/// Whether a template walks list-valued `content` itself (as Qwen3.5's and Llama 3's do,
/// concatenating the text parts with nothing between them) instead of printing `content`
/// as a string. A source-level check, like vLLM's content-format detection.
fn reads_content_parts(source: &str) -> bool {
    let squashed: String = source.split_whitespace().collect::<Vec<_>>().join(" ");
    [
        "content is iterable",
        "content is not string",
        "content is sequence",
        "in message['content']",
        "in message[\"content\"]",
        "in message.content",
    ]
    .iter()
    .any(|needle| squashed.contains(needle))
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

impl ChatTemplate {
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(python_methods);
        env.set_formatter(python_formatter);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("string", python_string);
        env.add_filter("trim", python_trim);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| TemplateError::Compile(format!("{e:#}")))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
            reads_content_parts: reads_content_parts(source),
        })
    }

    /// What joins a message's text parts into one string so the prompt reads as this
    /// template would render the parts themselves: nothing for templates that walk the
    /// parts, a newline (vLLM's choice) for templates that only print a string.
    pub fn content_parts_joiner(&self) -> &'static str {
        if self.reads_content_parts { "" } else { "\n" }
    }

    /// Renders the prompt with `add_generation_prompt = true`.
    pub fn render(&self, input: &RenderInput) -> Result<String, TemplateError> {
        self.render_with(input, true)
    }

    /// Renders with or without the generation prompt (the assistant turn's opening).
    pub fn render_with(&self, input: &RenderInput, add_generation_prompt: bool) -> Result<String, TemplateError> {
        let template = self.env.get_template(TEMPLATE_NAME).map_err(|e| TemplateError::Render(e.to_string()))?;
        let mut ctx: serde_json::Map<String, serde_json::Value> = input.extra.clone();
        ctx.insert("messages".into(), input.messages.clone());
        if let Some(tools) = &input.tools {
            ctx.insert("tools".into(), tools.clone());
        }
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        ctx.insert("bos_token".into(), self.bos_token.clone().into());
        ctx.insert("eos_token".into(), self.eos_token.clone().into());
        template.render(Value::from_serialize(&ctx)).map_err(|e| TemplateError::Render(render_error_message(&e)))
    }
}

fn render_error_message(e: &Error) -> String {
    // `raise_exception` messages are the template author's words for the user; keep them bare.
    match e.detail() {
        Some(detail) if e.kind() == ErrorKind::InvalidOperation => detail.to_owned(),
        _ => e.to_string(),
    }
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `json.dumps(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// HF's override of Jinja's HTML-escaping `tojson`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_owned(),
            None => " ".repeat(usize::try_from(v.as_i64().unwrap_or(0)).unwrap_or(0)),
        }),
    };
    // Python: (', ', ': ') without indent, (',', ': ') with one, unless given.
    let (item_sep, key_sep) = match separators.filter(|v| !v.is_none()) {
        Some(pair) => {
            let items: Vec<Value> = pair.try_iter()?.collect();
            match items.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    (a.as_str().unwrap_or_default().to_owned(), b.as_str().unwrap_or_default().to_owned())
                }
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ));
                }
            }
        }
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let json =
        serde_json::to_value(value).map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let opts = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&mut out, &json, &opts, 0);
    Ok(Value::from_safe_string(out))
}

/// The layout options of Python's `json.dumps`.
struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

fn write_json(out: &mut String, value: &serde_json::Value, style: &JsonStyle, level: usize) {
    use serde_json::Value as J;
    match value {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (None, Some(u), _) => out.push_str(&u.to_string()),
            (None, None, Some(f)) if f.is_nan() => out.push_str("NaN"),
            (None, None, Some(f)) if f.is_infinite() => out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" }),
            (None, None, Some(f)) => out.push_str(&python_float(f)),
            _ => out.push_str(&n.to_string()),
        },
        J::String(s) => write_json_string(out, s, style.ensure_ascii),
        J::Array(items) if items.is_empty() => out.push_str("[]"),
        J::Object(map) if map.is_empty() => out.push_str("{}"),
        J::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                json_separator(out, style, level + 1, i == 0);
                write_json(out, item, style, level + 1);
            }
            json_close(out, style, level, ']');
        }
        J::Object(map) => {
            let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                json_separator(out, style, level + 1, i == 0);
                write_json_string(out, key, style.ensure_ascii);
                out.push_str(&style.key_sep);
                write_json(out, item, style, level + 1);
            }
            json_close(out, style, level, '}');
        }
    }
}

fn json_separator(out: &mut String, style: &JsonStyle, level: usize, first: bool) {
    if !first {
        out.push_str(&style.item_sep);
    }
    if let Some(indent) = &style.indent {
        out.push('\n');
        out.push_str(&indent.repeat(level));
    }
}

fn json_close(out: &mut String, style: &JsonStyle, level: usize, close: char) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        out.push_str(&indent.repeat(level));
    }
    out.push(close);
}

/// Python's `json` string escaping (lowercase `\u` hex; surrogate pairs with `ensure_ascii`).
fn write_json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: shortest round-trip digits, exponent form below 1e-4 and from 1e16.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "nan".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    // `{:e}` gives the shortest round-trip digits: "-1.5e-7", "0e0".
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    // Python's float_repr_style 'short': the point sits after `decpt` digits.
    let decpt = exp + 1;
    let n = digits.len() as i32;
    if decpt > -4 && decpt <= 16 {
        if decpt <= 0 {
            format!("{sign}0.{}{digits}", "0".repeat((-decpt) as usize))
        } else if decpt < n {
            format!("{sign}{}.{}", &digits[..decpt as usize], &digits[decpt as usize..])
        } else {
            format!("{sign}{digits}{}.0", "0".repeat((decpt - n) as usize))
        }
    } else {
        let (head, tail) = digits.split_at(1);
        let frac = if tail.is_empty() { String::new() } else { format!(".{tail}") };
        let e = decpt - 1;
        let esign = if e < 0 { '-' } else { '+' };
        format!("{sign}{head}{frac}e{esign}{:02}", e.abs())
    }
}

/// `str(value)` for the scalars where Python and minijinja print differently.
fn python_scalar(value: &Value) -> Option<String> {
    match value.kind() {
        ValueKind::Bool => Some(if value.is_true() { "True" } else { "False" }.to_owned()),
        ValueKind::None => Some("None".to_owned()),
        ValueKind::Number if !value.is_integer() => f64::try_from(value.clone()).ok().map(python_float),
        _ => None,
    }
}

/// Jinja2 prints `{{ x }}` with `str(x)`.
fn python_formatter(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    match python_scalar(value) {
        Some(text) => out.write_str(&text).map_err(|_| Error::from(ErrorKind::WriteFailure)),
        None => minijinja::escape_formatter(out, state, value),
    }
}

/// Jinja2's `string` filter: `str(x)`, strings (and their safe flag) unchanged.
fn python_string(value: &Value) -> Value {
    if let Some(text) = python_scalar(value) {
        return Value::from(text);
    }
    match value.kind() {
        ValueKind::String => value.clone(),
        ValueKind::Undefined => Value::from(""),
        _ => Value::from(value.to_string()),
    }
}

/// Python's `str.isspace` set: Rust's White_Space plus the separators U+001C..U+001F.
fn python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Jinja2's `trim(chars=None)` = `str.strip(chars)`.
fn python_trim(value: &Value, chars: Option<String>) -> Value {
    let text = value.to_string();
    let text = match value.as_str() {
        Some(s) => s,
        None => text.as_str(),
    };
    Value::from(match chars {
        Some(chars) => text.trim_matches(|c| chars.contains(c)),
        None => text.trim_matches(python_space),
    })
}

/// pycompat's methods, with Python's whitespace for argument-less `strip`/`lstrip`/`rstrip`.
fn python_methods(state: &State, value: &Value, method: &str, args: &[Value]) -> Result<Value, Error> {
    if let (Some(s), [] | [_]) = (value.as_str(), args)
        && args.first().is_none_or(Value::is_none)
    {
        match method {
            "strip" => return Ok(Value::from(s.trim_matches(python_space))),
            "lstrip" => return Ok(Value::from(s.trim_start_matches(python_space))),
            "rstrip" => return Ok(Value::from(s.trim_end_matches(python_space))),
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// `strftime_now(format)` in UTC, supporting the directives chat templates use.
fn strftime_now(format: String) -> String {
    let secs =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    strftime_utc(&format, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];

fn strftime_utc(format: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs_of_day = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 with Monday = 0).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('-') if chars.clone().next() == Some('d') => {
                chars.next();
                out.push_str(&day.to_string());
            }
            Some('B') => out.push_str(month_name),
            Some('b') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(WEEKDAYS[weekday]),
            Some('a') => out.push_str(&WEEKDAYS[weekday][..3]),
            Some('H') => out.push_str(&format!("{:02}", secs_of_day / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs_of_day / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs_of_day % 60)),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month 1..=12, day 1..=31), proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

    /// Qwen3.5's published template (the chat_template.jinja of the Qwen3.5/3.6 checkpoints).
    const QWEN3_5: &str = include_str!("testdata/qwen3_5.jinja");

    fn qwen_template() -> ChatTemplate {
        ChatTemplate::new(QWEN3_5, "", "<|im_end|>").unwrap()
    }

    #[test]
    fn chatml_template_adds_default_system_and_generation_prompt() {
        let t = ChatTemplate::new(CHATML, "<|im_start|>", "<|im_end|>").unwrap();
        let out = t
            .render(&RenderInput { messages: json!([{"role": "user", "content": "Hi"}]), ..Default::default() })
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn chatml_template_keeps_a_given_system_message() {
        let t = ChatTemplate::new(CHATML, "", "").unwrap();
        let out = t
            .render(&RenderInput {
                messages: json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]),
                ..Default::default()
            })
            .unwrap();
        assert!(out.starts_with("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi"));
    }

    #[test]
    fn qwen_template_renders_tools_tool_calls_and_tool_results() {
        let t = qwen_template();
        let messages = json!([
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": "Need the tool.",
             "tool_calls": [{"id": "c1", "type": "function",
                             "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "Sunny, 21°C"},
            {"role": "tool", "tool_call_id": "c2", "content": "second result"},
        ]);
        let tools = json!([{"type": "function", "function": {"name": "get_weather",
            "description": "Weather for a city", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
        let mut extra = serde_json::Map::new();
        extra.insert("enable_thinking".into(), false.into());
        let out = t.render(&RenderInput { messages, tools: Some(tools), extra }).unwrap();
        // Python json.dumps layout with insertion order kept.
        assert!(
            out.contains(
                r#"{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city""#
            ),
            "{out}"
        );
        assert!(out.contains("You are an agent.<|im_end|>\n"));
        assert!(out.contains("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n[1, 2]\n</parameter>\n</function>\n</tool_call><|im_end|>\n"), "{out}");
        assert!(out.contains("<|im_start|>user\n<tool_response>\nSunny, 21°C\n</tool_response>\n<tool_response>\nsecond result\n</tool_response><|im_end|>\n"), "{out}");
        assert!(out.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "{out}");
    }

    #[test]
    fn qwen_template_raise_exception_becomes_a_render_error() {
        let t = qwen_template();
        let err = t
            .render(&RenderInput {
                messages: json!([{"role": "system", "content": "only system"}]),
                ..Default::default()
            })
            .unwrap_err();
        assert!(err.to_string().contains("No user query found in messages."), "{err}");
    }

    #[test]
    fn tojson_writes_like_python_json_dumps() {
        let t = ChatTemplate::new("{{ x | tojson }}|{{ x | tojson(indent=2) }}", "", "").unwrap();
        let mut extra = serde_json::Map::new();
        extra.insert("x".into(), json!({"b": "é<", "a": [1, 2.5, null]}));
        let out = t.render(&RenderInput { messages: json!([]), tools: None, extra }).unwrap();
        assert_eq!(
            out,
            "{\"b\": \"é<\", \"a\": [1, 2.5, null]}|{\n  \"b\": \"é<\",\n  \"a\": [\n    1,\n    2.5,\n    null\n  ]\n}"
        );
    }

    #[test]
    fn templates_that_walk_content_parts_are_told_apart() {
        let qwen = include_str!("testdata/qwen3_5.jinja");
        assert_eq!(ChatTemplate::new(qwen, "", "").unwrap().content_parts_joiner(), "");
        let plain = "{% for message in messages %}{{ message['content'] }}{% endfor %}";
        assert_eq!(ChatTemplate::new(plain, "", "").unwrap().content_parts_joiner(), "\n");
        let llama3 =
            "{% for c in message['content'] | selectattr('type', 'equalto', 'text') %}{{ c.text }}{% endfor %}";
        assert_eq!(ChatTemplate::new(llama3, "", "").unwrap().content_parts_joiner(), "");
    }

    fn render_x(source: &str, x: serde_json::Value) -> String {
        let t = ChatTemplate::new(source, "", "").unwrap();
        let mut extra = serde_json::Map::new();
        extra.insert("x".into(), x);
        t.render(&RenderInput { messages: json!([]), tools: None, extra }).unwrap()
    }

    #[test]
    fn floats_print_like_python_repr() {
        // Expected strings are CPython's repr().
        let cases = [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-4, "0.0001"),
            (1e-5, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (123456.789, "123456.789"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345678901234568e20, "1.2345678901234568e+20"),
            (-2.5e-300, "-2.5e-300"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (9007199254740993.0, "9007199254740992.0"),
            (0.30000000000000004, "0.30000000000000004"),
        ];
        for (f, want) in cases {
            assert_eq!(python_float(f), want, "{f:e}");
        }
    }

    #[test]
    fn scalars_print_and_stringify_like_python_str() {
        let out = render_x(
            "{{ x[0] }}|{{ x[1] }}|{{ x[2] }}|{{ x[3] }}|{{ x[4] }}|{{ x[0]|string }}{{ x[2]|string }}{{ x[3]|string }}|{{ y|string }}|",
            json!([true, false, null, 1e-5, 7]),
        );
        assert_eq!(out, "True|False|None|1e-05|7|TrueNone1e-05||");
    }

    #[test]
    fn tojson_honours_python_options() {
        let x = json!({"b": "é<\u{2028}\u{7f}\u{1b}", "a": [1, 2.5, null, true, {}], "c": {"z": 1e-05, "y": []}, "😀": "𝔘"});
        // Expected strings are CPython's json.dumps output for the same options.
        assert_eq!(
            render_x("{{ x | tojson }}", x.clone()),
            "{\"b\": \"é<\u{2028}\u{7f}\\u001b\", \"a\": [1, 2.5, null, true, {}], \"c\": {\"z\": 1e-05, \"y\": []}, \"😀\": \"𝔘\"}"
        );
        assert_eq!(
            render_x("{{ x | tojson(ensure_ascii=true, sort_keys=true) }}", x.clone()),
            r#"{"a": [1, 2.5, null, true, {}], "b": "\u00e9<\u2028\u007f\u001b", "c": {"y": [], "z": 1e-05}, "\ud83d\ude00": "\ud835\udd18"}"#
        );
        assert_eq!(
            render_x("{{ x | tojson(indent=0) }}", x.clone()),
            "{\n\"b\": \"é<\u{2028}\u{7f}\\u001b\",\n\"a\": [\n1,\n2.5,\nnull,\ntrue,\n{}\n],\n\"c\": {\n\"z\": 1e-05,\n\"y\": []\n},\n\"😀\": \"𝔘\"\n}"
        );
        assert_eq!(
            render_x("{{ x | tojson(indent='\\t', separators=[',', ':']) }}", json!({"a": [1], "b": {}})),
            "{\n\t\"a\":[\n\t\t1\n\t],\n\t\"b\":{}\n}"
        );
        let t = ChatTemplate::new("{{ x | tojson(bogus=1) }}", "", "").unwrap();
        assert!(t.render(&RenderInput { messages: json!([]), ..Default::default() }).is_err());
    }

    #[test]
    fn strip_and_trim_use_pythons_whitespace() {
        // CPython: " \x1c\x1f a\u3000\x0b".strip() == "a"; Rust's trim keeps \x1c..\x1f.
        let x = json!(" \u{1c}\u{1f} a\u{3000}\u{b}");
        assert_eq!(
            render_x("[{{ x|trim }}][{{ x.strip() }}][{{ x.lstrip() }}][{{ x.rstrip() }}]", x),
            "[a][a][a\u{3000}\u{b}][ \u{1c}\u{1f} a]"
        );
        assert_eq!(render_x("{{ x.strip('x') }}|{{ x|trim('x') }}", json!("xxaxx")), "a|a");
    }

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-02-29 13:05:09 UTC was a Thursday.
        assert_eq!(
            strftime_utc("%d %B %Y %H:%M:%S %a %b %-d %%", 1_709_211_909),
            "29 February 2024 13:05:09 Thu Feb 29 %"
        );
        assert_eq!(strftime_utc("%Y-%m-%d %A", 0), "1970-01-01 Thursday");
    }
}
