//! Tool calling: which call format the model speaks, how tools reach the prompt, and how
//! calls are parsed back out of the generated text (see `parse`).
//!
//! The format is chosen once from the chat template's source: a template that shows
//! `<function=` speaks the Qwen3.5/3.6 XML form, one that shows `<tool_call>` the Hermes /
//! Qwen2.5 JSON form, and a template with neither has no tool support, so the gateway injects
//! the tool definitions into the system prompt itself and asks for the JSON form (`Generic`).
//! `tool_choice` is honoured best effort (no constrained decoding): `none` hides the tools,
//! `required` and a named function add an instruction and, for a name, offer only that tool.

pub mod grammar;
pub mod parse;

use serde_json::{Map, Value, json};

use crate::error::GatewayError;

pub use grammar::call_grammar;
pub use parse::{ToolEvent, ToolParser};

/// The call syntax a model family was trained on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name": .., "arguments": {..}}</tool_call>` rendered by the template.
    Json,
    /// `<tool_call><function=NAME><parameter=ARG>VALUE</parameter></function></tool_call>`.
    Xml,
    /// The template knows nothing of tools: the gateway writes them into the system prompt
    /// and asks for the JSON form (a bare JSON call object is accepted too).
    Generic,
}

impl ToolFormat {
    /// Picks the format from the chat template's source text.
    pub fn detect(template_source: &str) -> ToolFormat {
        if template_source.contains("<function=") {
            ToolFormat::Xml
        } else if template_source.contains("<tool_call>") {
            ToolFormat::Json
        } else {
            ToolFormat::Generic
        }
    }
}

/// OpenAI `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Named(String),
}

/// The tool side of one request, after validation.
#[derive(Debug, Clone)]
pub struct ToolRequest {
    /// The `tools` array as sent (each item `{"type": "function", "function": {..}}`).
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    pub parallel: bool,
}

impl ToolRequest {
    /// Whether output should be parsed for calls at all.
    pub fn active(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }

    /// The tools the model is offered: all of them, or only the named one.
    pub fn offered(&self) -> Vec<Value> {
        match &self.choice {
            ToolChoice::None => Vec::new(),
            ToolChoice::Named(name) => {
                self.tools.iter().filter(|t| tool_name(t) == Some(name.as_str())).cloned().collect()
            }
            _ => self.tools.clone(),
        }
    }
}

pub fn tool_name(tool: &Value) -> Option<&str> {
    tool.get("function")?.get("name")?.as_str()
}

/// Parses `tools`, `tool_choice` and `parallel_tool_calls` from a request object.
pub fn parse_tool_request(obj: &Map<String, Value>) -> Result<ToolRequest, GatewayError> {
    let present = |k: &str| obj.get(k).filter(|v| !v.is_null());
    let tools = match present("tools") {
        None => Vec::new(),
        Some(Value::Array(tools)) => {
            for (i, tool) in tools.iter().enumerate() {
                if !tool.is_object() || tool_name(tool).is_none() {
                    return Err(GatewayError::invalid_param(
                        "Each tool must be an object with function.name",
                        format!("tools[{i}]"),
                    ));
                }
                if let Some(params) = tool["function"].get("parameters")
                    && !params.is_null()
                    && !params.is_object()
                {
                    return Err(GatewayError::invalid_param(
                        "'function.parameters' must be a JSON Schema object",
                        format!("tools[{i}].function.parameters"),
                    ));
                }
            }
            tools.clone()
        }
        Some(_) => return Err(GatewayError::invalid("'tools' must be an array", "tools")),
    };
    let choice = match present("tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            _ => {
                return Err(GatewayError::invalid(
                    "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ..}}",
                    "tool_choice",
                ));
            }
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| GatewayError::invalid("A named 'tool_choice' needs function.name", "tool_choice"))?;
            if !tools.iter().any(|t| tool_name(t) == Some(name)) {
                return Err(GatewayError::invalid(
                    format!("'tool_choice' names '{name}', which is not in 'tools'"),
                    "tool_choice",
                ));
            }
            ToolChoice::Named(name.to_owned())
        }
        Some(_) => {
            return Err(GatewayError::invalid("'tool_choice' must be a string or an object", "tool_choice"));
        }
    };
    if choice == ToolChoice::Required && tools.is_empty() {
        return Err(GatewayError::invalid("'tool_choice' is \"required\" but no 'tools' were given", "tool_choice"));
    }
    let parallel = match present("parallel_tool_calls") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(GatewayError::invalid("'parallel_tool_calls' must be a boolean", "parallel_tool_calls"));
        }
    };
    Ok(ToolRequest { tools, choice, parallel })
}

/// Extra system-prompt text for the request (tool definitions for `Generic`, the
/// `tool_choice` instruction for all formats), or `None`.
pub fn system_instruction(format: ToolFormat, request: &ToolRequest) -> Option<String> {
    if !request.active() {
        return None;
    }
    let mut text = String::new();
    if format == ToolFormat::Generic {
        text.push_str("You can call the following functions. Their JSON Schema definitions:\n");
        for tool in request.offered() {
            text.push_str(&tool.to_string());
            text.push('\n');
        }
        text.push_str(
            "To call a function, answer with only this and nothing else:\n<tool_call>\n{\"name\": \"<function name>\", \"arguments\": {<arguments as a JSON object>}}\n</tool_call>\nOtherwise answer normally.",
        );
    }
    let rule = match &request.choice {
        ToolChoice::Required => Some("You must call at least one of the functions.".to_owned()),
        ToolChoice::Named(name) => Some(format!("You must call the function `{name}`.")),
        _ => None,
    };
    if let Some(rule) = rule {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&rule);
    }
    if !request.parallel {
        text.push_str("\nCall at most one function.");
    }
    (!text.trim().is_empty()).then(|| text.trim().to_owned())
}

/// Rewrites normalized messages for a template without tool support: assistant tool calls
/// become `<tool_call>` JSON text and tool results become user turns, so the history reads
/// like the format the injected instruction asks for. `instruction` is merged into the first
/// system message (or becomes one).
pub fn prepare_messages(messages: &Value, format: ToolFormat, instruction: Option<&str>) -> Value {
    let Value::Array(items) = messages else {
        return messages.clone();
    };
    let mut out: Vec<Value> = Vec::with_capacity(items.len() + 1);
    for msg in items {
        let mut msg = msg.clone();
        if format == ToolFormat::Generic
            && let Value::Object(m) = &mut msg
        {
            let role = m.get("role").and_then(Value::as_str).unwrap_or_default().to_owned();
            if role == "assistant"
                && let Some(Value::Array(calls)) = m.remove("tool_calls")
            {
                let mut content = m.get("content").and_then(Value::as_str).unwrap_or_default().to_owned();
                for call in calls {
                    let f = &call["function"];
                    let one = json!({"name": f["name"], "arguments": f["arguments"]});
                    if !content.is_empty() {
                        content.push('\n');
                    }
                    content.push_str(&format!("<tool_call>\n{one}\n</tool_call>"));
                }
                m.insert("content".into(), content.into());
            } else if role == "tool" {
                let content = m.get("content").and_then(Value::as_str).unwrap_or_default();
                let wrapped = format!("<tool_response>\n{content}\n</tool_response>");
                m.clear();
                m.insert("role".into(), "user".into());
                m.insert("content".into(), wrapped.into());
            }
        }
        out.push(msg);
    }
    if let Some(instruction) = instruction {
        match out.first_mut() {
            Some(Value::Object(first)) if first.get("role").and_then(Value::as_str) == Some("system") => {
                let old = first.get("content").and_then(Value::as_str).unwrap_or_default();
                let merged = if old.is_empty() { instruction.to_owned() } else { format!("{old}\n\n{instruction}") };
                first.insert("content".into(), merged.into());
            }
            _ => out.insert(0, json!({"role": "system", "content": instruction})),
        }
    }
    Value::Array(out)
}

/// A fresh OpenAI-style call id.
pub fn new_call_id() -> String {
    let hex = uuid::Uuid::new_v4().simple().to_string();
    format!("call_{}", &hex[..24])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: Value) -> Result<ToolRequest, GatewayError> {
        parse_tool_request(v.as_object().unwrap())
    }

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})
    }

    #[test]
    fn format_is_detected_from_the_template() {
        let qwen = include_str!("../text/testdata/qwen3_5.jinja");
        assert_eq!(ToolFormat::detect(qwen), ToolFormat::Xml);
        assert_eq!(ToolFormat::detect("{{ '<tool_call>\\n' }}{{ tool_call | tojson }}"), ToolFormat::Json);
        assert_eq!(ToolFormat::detect("{{ message.content }}"), ToolFormat::Generic);
    }

    #[test]
    fn tool_choice_forms_parse_and_bad_ones_name_the_field() {
        let r = req(json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": false})).unwrap();
        assert_eq!(r.choice, ToolChoice::Named("get_weather".into()));
        assert!(!r.parallel && r.active());
        assert_eq!(req(json!({"tools": [weather()], "tool_choice": "none"})).unwrap().offered().len(), 0);
        for bad in [
            json!({"tools": [weather()], "tool_choice": "sometimes"}),
            json!({"tools": [weather()], "tool_choice": {"type": "function", "function": {"name": "other"}}}),
            json!({"tool_choice": "required"}),
            json!({"tools": [weather()], "tool_choice": 3}),
        ] {
            let err = req(bad.clone()).unwrap_err();
            assert_eq!(err.to_body().error.param.as_deref(), Some("tool_choice"), "{bad}");
        }
        let err = req(json!({"tools": [weather()], "parallel_tool_calls": "no"})).unwrap_err();
        assert_eq!(err.to_body().error.param.as_deref(), Some("parallel_tool_calls"));
        let err = req(json!({"tools": [{"type": "function"}]})).unwrap_err();
        assert_eq!(err.to_body().error.param.as_deref(), Some("tools[0]"));
    }

    #[test]
    fn generic_format_injects_tools_and_rewrites_history() {
        let r = req(json!({"tools": [weather()], "tool_choice": "required"})).unwrap();
        let instruction = system_instruction(ToolFormat::Generic, &r).unwrap();
        assert!(instruction.contains("\"name\":\"get_weather\""), "{instruction}");
        assert!(instruction.contains("<tool_call>"));
        assert!(instruction.ends_with("You must call at least one of the functions."));
        let messages = json!([
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}
        ]);
        let out = prepare_messages(&messages, ToolFormat::Generic, Some(&instruction));
        assert_eq!(out[0]["role"], "system");
        assert_eq!(out[0]["content"], instruction);
        assert_eq!(
            out[2]["content"],
            "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>"
        );
        assert_eq!(out[3], json!({"role": "user", "content": "<tool_response>\nSunny\n</tool_response>"}));
        // Template formats keep the history and only get the choice rule appended.
        let sys = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "x"}]);
        let rule = system_instruction(ToolFormat::Xml, &r).unwrap();
        let out = prepare_messages(&sys, ToolFormat::Xml, Some(&rule));
        assert_eq!(out[0]["content"], "Be brief.\n\nYou must call at least one of the functions.");
        assert_eq!(system_instruction(ToolFormat::Xml, &req(json!({"tools": [weather()]})).unwrap()), None);
    }

    #[test]
    fn call_ids_look_like_openai_ones() {
        let id = new_call_id();
        assert!(id.starts_with("call_") && id.len() == 29, "{id}");
        assert_ne!(id, new_call_id());
    }
}
