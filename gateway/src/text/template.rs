//! The model's chat template (Jinja, HuggingFace conventions) compiled once with minijinja.
//!
//! Matches what `transformers` does: `trim_blocks` + `lstrip_blocks`, loop controls, Python
//! string/dict methods (minijinja-contrib pycompat), `raise_exception`, `strftime_now`, and a
//! `tojson` that writes like Python's `json.dumps(ensure_ascii=False)` (", " and ": "
//! separators, insertion order kept) so tool schemas reach the model as it was trained on.
//! Rendering is pure CPU work: call it from a blocking thread for long conversations.

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

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
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

impl ChatTemplate {
    pub fn new(
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| TemplateError::Compile(format!("{e:#}")))?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// Renders the prompt with `add_generation_prompt = true`.
    pub fn render(&self, input: &RenderInput) -> Result<String, TemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TemplateError::Render(e.to_string()))?;
        let mut ctx: serde_json::Map<String, serde_json::Value> = input.extra.clone();
        ctx.insert("messages".into(), input.messages.clone());
        if let Some(tools) = &input.tools {
            ctx.insert("tools".into(), tools.clone());
        }
        ctx.insert("add_generation_prompt".into(), true.into());
        ctx.insert("bos_token".into(), self.bos_token.clone().into());
        ctx.insert("eos_token".into(), self.eos_token.clone().into());
        template
            .render(Value::from_serialize(&ctx))
            .map_err(|e| TemplateError::Render(render_error_message(&e)))
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

/// `json.dumps(value, ensure_ascii=False, indent=indent)`; other kwargs are accepted and ignored.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    let _: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<Value> = kwargs.get("separators")?;
    let mut out = Vec::new();
    let result = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let mut ser = serde_json::Serializer::with_formatter(
                &mut out,
                serde_json::ser::PrettyFormatter::with_indent(&pad),
            );
            value.serialize(&mut ser)
        }
        None => {
            let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
            value.serialize(&mut ser)
        }
    };
    result.map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let text = String::from_utf8(out)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from_safe_string(text))
}

/// Python's default `json.dumps` separators: `", "` between items, `": "` after keys.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// `strftime_now(format)` in UTC, supporting the directives chat templates use.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
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
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

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

    /// Qwen3.5's published template (copied from shared/data/templates, see its README).
    const QWEN3_5: &str = include_str!("testdata/qwen3_5.jinja");

    fn qwen_template() -> ChatTemplate {
        ChatTemplate::new(QWEN3_5, "", "<|im_end|>").unwrap()
    }

    #[test]
    fn chatml_template_adds_default_system_and_generation_prompt() {
        let t = ChatTemplate::new(CHATML, "<|im_start|>", "<|im_end|>").unwrap();
        let out = t
            .render(&RenderInput {
                messages: json!([{"role": "user", "content": "Hi"}]),
                ..Default::default()
            })
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
        let out = t
            .render(&RenderInput {
                messages,
                tools: Some(tools),
                extra,
            })
            .unwrap();
        // Python json.dumps layout with insertion order kept.
        assert!(out.contains(r#"{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city""#), "{out}");
        assert!(out.contains("You are an agent.<|im_end|>\n"));
        assert!(out.contains("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n[1, 2]\n</parameter>\n</function>\n</tool_call><|im_end|>\n"), "{out}");
        assert!(out.contains("<|im_start|>user\n<tool_response>\nSunny, 21°C\n</tool_response>\n<tool_response>\nsecond result\n</tool_response><|im_end|>\n"), "{out}");
        assert!(
            out.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
            "{out}"
        );
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
        assert!(
            err.to_string().contains("No user query found in messages."),
            "{err}"
        );
    }

    #[test]
    fn tojson_writes_like_python_json_dumps() {
        let t = ChatTemplate::new("{{ x | tojson }}|{{ x | tojson(indent=2) }}", "", "").unwrap();
        let mut extra = serde_json::Map::new();
        extra.insert("x".into(), json!({"b": "é<", "a": [1, 2.5, null]}));
        let out = t
            .render(&RenderInput {
                messages: json!([]),
                tools: None,
                extra,
            })
            .unwrap();
        assert_eq!(
            out,
            "{\"b\": \"é<\", \"a\": [1, 2.5, null]}|{\n  \"b\": \"é<\",\n  \"a\": [\n    1,\n    2.5,\n    null\n  ]\n}"
        );
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
