//! A Responses request body -> the chat request the rest of the gateway runs, or a 400 that
//! names the offending field in the Responses API's terms.
//!
//! The translation: `instructions` becomes the first system message; `input` as a string is
//! one user message; as items, each `message` item (`type` may be left out) becomes a message
//! of its role (`developer` is `system`; `input_text` / `output_text` parts are its text),
//! consecutive `function_call` items become one assistant message's `tool_calls` (joined to
//! the assistant message just before them, as one turn), each `function_call_output` a `tool`
//! message, and a `reasoning` item's text the next assistant message's `reasoning_content`.
//! Function `tools` (`name`, `description`, `parameters`) become chat function tools;
//! `tool_choice` (`auto`, `none`, `required`, `{"type": "function", "name"}`) and
//! `parallel_tool_calls` keep their meaning; `max_output_tokens` is `max_tokens`;
//! `text.format` (`text`, `json_object`, `json_schema` with `name` / `schema` / `strict`) is
//! `response_format`, enforced by the engine's grammar; `reasoning.effort` `none` or
//! `minimal` turns the template's thinking off, any other effort on.
//! Accepted and ignored: `store` (nothing is stored; the response says `store: false`),
//! `include`, `truncation`, `prompt_cache_key` (the prefix cache is automatic),
//! `service_tier`, `safety_identifier`, `max_tool_calls`, `stream_options`, `metadata`
//! (echoed back). Not supported, a 400 naming the field: `previous_response_id` and
//! `conversation` (this server is stateless: send the whole conversation in `input`),
//! `background`, `prompt` (stored prompt templates), image / file / audio input parts,
//! `item_reference` items, and hosted tools (anything but `function`).
//! This server's extensions (`cache_salt`, `speculation`, `top_k`, `seed`) pass through.

use serde_json::{Map, Value, json};

use crate::error::GatewayError;
use crate::validate::{self, ChatRequest, field};

/// What the response object echoes back from the request.
#[derive(Debug, Clone, Default)]
pub struct Echo {
    pub instructions: Option<String>,
    pub max_output_tokens: Option<Value>,
    pub tools: Vec<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub temperature: Option<Value>,
    pub top_p: Option<Value>,
    pub reasoning_effort: Option<String>,
    pub metadata: Map<String, Value>,
    pub user: Option<String>,
    pub text_format: Option<Value>,
}

/// A parsed Responses request: the chat request it runs as, and what its response repeats.
#[derive(Debug, Clone)]
pub struct ResponsesRequest {
    pub chat: ChatRequest,
    pub echo: Echo,
}

/// Parses a `POST /v1/responses` body (text parts joined by `parts_joiner`, as for chat
/// completions).
pub fn parse_responses_request(
    body: &[u8],
    parts_joiner: &str,
    limits: &validate::Limits,
) -> Result<ResponsesRequest, GatewayError> {
    let obj = validate::parse_object(body)?;
    let (chat, echo) = to_chat_object(&obj)?;
    let chat = validate::parse_chat_object(&chat, parts_joiner, limits).map_err(rename_param)?;
    Ok(ResponsesRequest { chat, echo })
}

/// Chat parameter names in errors -> the Responses names they came from.
fn rename_param(error: GatewayError) -> GatewayError {
    match error {
        GatewayError::InvalidRequest { message, param: Some(param) } => {
            let renamed = match param.as_str() {
                "max_tokens" => "max_output_tokens".to_owned(),
                "response_format" => "text.format".to_owned(),
                other if other.starts_with("response_format.json_schema.") => {
                    other.replacen("response_format.json_schema.", "text.format.", 1)
                }
                "chat_template_kwargs" => "reasoning".to_owned(),
                other => match other.strip_prefix("messages") {
                    // Message indices no longer match input items one to one.
                    Some(_) => "input".to_owned(),
                    None => other.to_owned(),
                },
            };
            GatewayError::InvalidRequest { message, param: Some(renamed) }
        }
        other => other,
    }
}

fn to_chat_object(obj: &Map<String, Value>) -> Result<(Map<String, Value>, Echo), GatewayError> {
    for (key, why) in [
        ("previous_response_id", "this server is stateless: send the whole conversation in 'input'"),
        ("conversation", "this server is stateless: send the whole conversation in 'input'"),
        ("prompt", "stored prompt templates need a store this server does not keep"),
    ] {
        if field(obj, key).is_some() {
            return Err(GatewayError::invalid(format!("'{key}' is not supported: {why}"), key));
        }
    }
    if field(obj, "background") == Some(&Value::Bool(true)) {
        return Err(GatewayError::invalid(
            "'background' responses are not supported: this server answers in the request (stream for progress)",
            "background",
        ));
    }
    let mut chat = Map::new();
    let mut echo = Echo::default();
    // Fields with the same meaning and name (range checks happen in the chat parser).
    for key in ["model", "stream", "temperature", "top_p", "top_k", "cache_salt", "speculation", "seed", "user"] {
        if let Some(v) = field(obj, key) {
            chat.insert(key.into(), v.clone());
        }
    }
    echo.temperature = field(obj, "temperature").cloned();
    echo.top_p = field(obj, "top_p").cloned();
    echo.user = field(obj, "user").and_then(Value::as_str).map(str::to_owned);
    if let Some(v) = field(obj, "max_output_tokens") {
        chat.insert("max_tokens".into(), v.clone());
        echo.max_output_tokens = Some(v.clone());
    }
    match field(obj, "metadata") {
        None => {}
        Some(Value::Object(m)) => echo.metadata = m.clone(),
        Some(_) => return Err(GatewayError::invalid("'metadata' must be an object", "metadata")),
    }
    if let Some(text) = field(obj, "text") {
        let format = text.get("format");
        match format.and_then(|f| f.get("type")).and_then(Value::as_str) {
            None if format.is_none() => {}
            Some("text") => {}
            Some("json_object") => {
                chat.insert("response_format".into(), json!({"type": "json_object"}));
            }
            Some("json_schema") => {
                // The Responses API flattens what chat nests under `json_schema`.
                let mut spec = Map::new();
                for key in ["name", "schema", "strict", "description"] {
                    if let Some(v) = format.and_then(|f| f.get(key)) {
                        spec.insert(key.into(), v.clone());
                    }
                }
                chat.insert("response_format".into(), json!({"type": "json_schema", "json_schema": spec}));
            }
            _ => {
                return Err(GatewayError::invalid(
                    "'text.format.type' must be \"text\", \"json_object\" or \"json_schema\"",
                    "text.format.type",
                ));
            }
        }
        echo.text_format = format.cloned();
    }
    if let Some(reasoning) = field(obj, "reasoning") {
        let effort = match reasoning.get("effort") {
            None | Some(Value::Null) => None,
            Some(Value::String(e)) => Some(e.as_str()),
            Some(_) => return Err(GatewayError::invalid("'reasoning.effort' must be a string", "reasoning.effort")),
        };
        match effort {
            None => {}
            Some("none" | "minimal") => {
                chat.insert("chat_template_kwargs".into(), json!({"enable_thinking": false}));
            }
            Some("low" | "medium" | "high" | "xhigh") => {
                chat.insert("chat_template_kwargs".into(), json!({"enable_thinking": true}));
            }
            Some(other) => {
                return Err(GatewayError::invalid(
                    format!("Unknown reasoning effort '{other}' (expected none, minimal, low, medium, high or xhigh)"),
                    "reasoning.effort",
                ));
            }
        }
        echo.reasoning_effort = effort.map(str::to_owned);
    }

    let mut messages = Vec::new();
    if let Some(instructions) = field(obj, "instructions") {
        let Value::String(text) = instructions else {
            return Err(GatewayError::invalid("'instructions' must be a string", "instructions"));
        };
        messages.push(json!({"role": "system", "content": text}));
        echo.instructions = Some(text.clone());
    }
    match field(obj, "input") {
        Some(Value::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => {
            let mut turns = Turns::default();
            for (i, item) in items.iter().enumerate() {
                turns.add(i, item)?;
            }
            messages.extend(turns.finish());
        }
        None => return Err(GatewayError::invalid("Missing required parameter: 'input'", "input")),
        Some(_) => return Err(GatewayError::invalid("'input' must be a string or an array of items", "input")),
    }
    if !messages.iter().any(|m| m["role"] != "system") {
        return Err(GatewayError::invalid("'input' must contain at least one item", "input"));
    }
    chat.insert("messages".into(), Value::Array(messages));

    let tools = match field(obj, "tools") {
        None => Vec::new(),
        Some(Value::Array(tools)) => {
            echo.tools = tools.clone();
            tools.iter().enumerate().map(|(i, t)| translate_tool(i, t)).collect::<Result<_, _>>()?
        }
        Some(_) => return Err(GatewayError::invalid("'tools' must be an array", "tools")),
    };
    if !tools.is_empty() {
        chat.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = field(obj, "tool_choice") {
        chat.insert("tool_choice".into(), translate_tool_choice(choice)?);
        echo.tool_choice = Some(choice.clone());
    }
    if let Some(parallel) = field(obj, "parallel_tool_calls") {
        chat.insert("parallel_tool_calls".into(), parallel.clone());
        echo.parallel_tool_calls = parallel.as_bool();
    }
    Ok((chat, echo))
}

/// Input items gathered into chat messages.
#[derive(Debug, Default)]
struct Turns {
    messages: Vec<Value>,
    /// Reasoning text waiting for the assistant message it belongs to.
    reasoning: String,
}

impl Turns {
    fn add(&mut self, i: usize, item: &Value) -> Result<(), GatewayError> {
        let at = |f: &str| format!("input[{i}].{f}");
        let Value::Object(_) = item else {
            return Err(GatewayError::invalid_param("An input item must be an object", format!("input[{i}]")));
        };
        let kind = match item.get("type") {
            None | Some(Value::Null) => "message",
            Some(Value::String(t)) => t.as_str(),
            Some(_) => return Err(GatewayError::invalid_param("'type' must be a string", at("type"))),
        };
        match kind {
            "message" => self.message(i, item),
            "function_call" => {
                let call_id = string_field(item, "call_id", &at("call_id"))?;
                let name = string_field(item, "name", &at("name"))?;
                let arguments = match item.get("arguments") {
                    None | Some(Value::Null) => String::from("{}"),
                    Some(Value::String(a)) => a.clone(),
                    Some(_) => {
                        return Err(GatewayError::invalid_param("'arguments' must be a JSON string", at("arguments")));
                    }
                };
                let call =
                    json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
                // Calls right after an assistant message (or after other calls) are that turn's.
                match self.messages.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                            Some(calls) => calls.push(call),
                            None => last["tool_calls"] = json!([call]),
                        }
                    }
                    _ => {
                        let mut message = json!({"role": "assistant", "content": "", "tool_calls": [call]});
                        self.take_reasoning(&mut message);
                        self.messages.push(message);
                    }
                }
                Ok(())
            }
            "function_call_output" => {
                let call_id = string_field(item, "call_id", &at("call_id"))?;
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => parts_text(parts, &at("output"))?,
                    _ => {
                        return Err(GatewayError::invalid_param(
                            "'output' must be a string or an array of input_text parts",
                            at("output"),
                        ));
                    }
                };
                self.messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
                Ok(())
            }
            "reasoning" => {
                // Readable text (summary or content); encrypted content from another server is
                // nothing this model can read.
                for key in ["content", "summary"] {
                    if let Some(Value::Array(parts)) = item.get(key) {
                        for part in parts {
                            if let Some(Value::String(t)) = part.get("text") {
                                self.reasoning.push_str(t);
                            }
                        }
                        if !self.reasoning.is_empty() {
                            break;
                        }
                    }
                }
                Ok(())
            }
            other => Err(GatewayError::invalid_param(
                format!(
                    "Input items of type '{other}' are not supported (this server takes message, function_call, \
                     function_call_output and reasoning items)"
                ),
                at("type"),
            )),
        }
    }

    fn message(&mut self, i: usize, item: &Value) -> Result<(), GatewayError> {
        let at = |f: &str| format!("input[{i}].{f}");
        let role = match item.get("role").and_then(Value::as_str) {
            Some(r @ ("user" | "assistant" | "system")) => r,
            Some("developer") => "system",
            Some(other) => {
                return Err(GatewayError::invalid_param(
                    format!("Unsupported role '{other}' (expected user, assistant, system or developer)"),
                    at("role"),
                ));
            }
            None => return Err(GatewayError::invalid_param("Missing 'role'", at("role"))),
        };
        let text = match item.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts_text(parts, &at("content"))?,
            _ => {
                return Err(GatewayError::invalid_param(
                    "'content' must be a string or an array of content parts",
                    at("content"),
                ));
            }
        };
        let mut message = json!({"role": role, "content": text});
        if role == "assistant" {
            self.take_reasoning(&mut message);
        }
        self.messages.push(message);
        Ok(())
    }

    fn take_reasoning(&mut self, message: &mut Value) {
        if !self.reasoning.is_empty() {
            message["reasoning_content"] = std::mem::take(&mut self.reasoning).into();
        }
    }

    fn finish(self) -> Vec<Value> {
        self.messages
    }
}

/// The text of `input_text` / `output_text` parts, joined with nothing between them.
fn parts_text(parts: &[Value], at: &str) -> Result<String, GatewayError> {
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        match (part.get("type").and_then(Value::as_str), part.get("text")) {
            (Some("input_text" | "output_text" | "text"), Some(Value::String(t))) => text.push_str(t),
            (Some(kind @ ("input_image" | "input_file" | "input_audio")), _) => {
                return Err(GatewayError::invalid_param(
                    format!("'{kind}' parts are not supported: this server serves a text model"),
                    format!("{at}[{j}].type"),
                ));
            }
            (Some("refusal"), _) => {}
            _ => {
                return Err(GatewayError::invalid_param(
                    "Expected a text part ({\"type\": \"input_text\", \"text\": ...})",
                    format!("{at}[{j}]"),
                ));
            }
        }
    }
    Ok(text)
}

fn string_field(item: &Value, key: &str, at: &str) -> Result<String, GatewayError> {
    match item.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(GatewayError::invalid_param(format!("'{key}' must be a string"), at.to_owned())),
    }
}

/// `{"type": "function", name, description, parameters, strict}` -> a chat function tool.
/// `strict: true` holds the tool's arguments to its schema (see `tools::grammar`).
fn translate_tool(i: usize, tool: &Value) -> Result<Value, GatewayError> {
    let at = |f: &str| format!("tools[{i}].{f}");
    match tool.get("type").and_then(Value::as_str) {
        Some("function") => {}
        Some(kind) => {
            return Err(GatewayError::invalid_param(
                format!("Tool type '{kind}' is not supported: this server runs function tools"),
                at("type"),
            ));
        }
        None => return Err(GatewayError::invalid_param("Missing tool 'type' (\"function\")", at("type"))),
    }
    let name = string_field(tool, "name", &at("name"))?;
    let mut function = json!({"name": name});
    match tool.get("parameters") {
        None | Some(Value::Null) => function["parameters"] = json!({"type": "object", "properties": {}}),
        Some(v @ Value::Object(_)) => function["parameters"] = v.clone(),
        Some(_) => {
            return Err(GatewayError::invalid_param("'parameters' must be a JSON Schema object", at("parameters")));
        }
    }
    if let Some(Value::String(d)) = tool.get("description") {
        function["description"] = d.clone().into();
    }
    if let Some(strict @ Value::Bool(_)) = tool.get("strict") {
        function["strict"] = strict.clone();
    }
    Ok(json!({"type": "function", "function": function}))
}

fn translate_tool_choice(choice: &Value) -> Result<Value, GatewayError> {
    match choice {
        Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => Ok(choice.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => match o.get("name") {
            Some(Value::String(name)) => Ok(json!({"type": "function", "function": {"name": name}})),
            _ => Err(GatewayError::invalid("A function tool_choice needs a 'name'", "tool_choice.name")),
        },
        _ => Err(GatewayError::invalid(
            "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}",
            "tool_choice",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<ResponsesRequest, GatewayError> {
        parse_responses_request(v.to_string().as_bytes(), "\n", &validate::test_limits())
    }

    fn param(v: Value) -> Option<String> {
        parse(v).unwrap_err().to_body().error.param
    }

    #[test]
    fn a_function_round_trip_becomes_chat_messages_in_order() {
        let r = parse(json!({
            "model": "m", "instructions": "Be brief.", "max_output_tokens": 64, "temperature": 0.5,
            "tools": [{"type": "function", "name": "get_weather", "description": "Weather", "strict": true,
                       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": "required", "parallel_tool_calls": false, "store": false,
            "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "low"},
            "metadata": {"k": "v"},
            "input": [
                {"role": "developer", "content": "Use tools."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris"},
                                                                 {"type": "input_text", "text": " and Rome?"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Call it."}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
                {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
                {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "Rain"}]},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Sunny and rain.", "annotations": []}]},
                {"role": "user", "content": "Thanks"}
            ]
        }))
        .unwrap();
        let m = r.chat.messages.as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[1], json!({"role": "system", "content": "Use tools."}));
        assert_eq!(m[2], json!({"role": "user", "content": "Weather in Paris and Rome?"}));
        assert_eq!(m[3]["role"], "assistant");
        assert_eq!(m[3]["reasoning_content"], "Call it.");
        let calls = m[3]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1]["id"], "call_2");
        assert_eq!(calls[1]["function"]["arguments"], json!({"city": "Rome"}));
        assert_eq!(m[4], json!({"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}));
        assert_eq!(m[5], json!({"role": "tool", "tool_call_id": "call_2", "content": "Rain"}));
        assert_eq!(m[6], json!({"role": "assistant", "content": "Sunny and rain."}));
        assert_eq!(m[7], json!({"role": "user", "content": "Thanks"}));
        assert_eq!(m.len(), 8);
        assert_eq!(r.chat.tools.choice, crate::tools::ToolChoice::Required);
        assert!(!r.chat.tools.parallel);
        assert_eq!(r.chat.tools.tools[0]["function"]["parameters"]["properties"]["city"]["type"], "string");
        assert_eq!(r.chat.tools.tools[0]["function"]["strict"], true);
        assert_eq!(r.chat.sampling.max_tokens, Some(64));
        assert_eq!(r.chat.sampling.temperature, 0.5);
        assert_eq!(r.chat.template_kwargs["enable_thinking"], true);
        assert_eq!(r.echo.instructions.as_deref(), Some("Be brief."));
        assert_eq!(r.echo.metadata["k"], "v");
        assert_eq!(r.echo.tools.len(), 1);
    }

    #[test]
    fn a_string_input_named_tool_choice_and_thinking_off_translate() {
        let r = parse(json!({"input": "Hi", "reasoning": {"effort": "none"},
            "tools": [{"type": "function", "name": "f"}],
            "tool_choice": {"type": "function", "name": "f"}, "text": {"format": {"type": "json_object"}}}))
        .unwrap();
        assert_eq!(r.chat.messages, json!([{"role": "user", "content": "Hi"}]));
        assert_eq!(r.chat.template_kwargs["enable_thinking"], false);
        assert_eq!(r.chat.tools.choice, crate::tools::ToolChoice::Named("f".into()));
        assert_eq!(r.chat.response_format, crate::validate::ResponseFormat::JsonObject);
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
        let r = parse(json!({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "thing",
            "strict": true, "schema": schema}}}))
        .unwrap();
        assert_eq!(
            r.chat.response_format,
            crate::validate::ResponseFormat::JsonSchema { name: Some("thing".into()), schema }
        );
        assert_eq!(r.chat.sampling.max_tokens, None);
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let input = json!("hi");
        for (body, expected) in [
            (json!({}), "input"),
            (json!({"input": []}), "input"),
            (json!({"input": 3}), "input"),
            (json!({"input": input, "previous_response_id": "resp_1"}), "previous_response_id"),
            (json!({"input": input, "conversation": "conv_1"}), "conversation"),
            (json!({"input": input, "background": true}), "background"),
            (json!({"input": input, "max_output_tokens": 0}), "max_output_tokens"),
            (json!({"input": input, "temperature": 3}), "temperature"),
            (json!({"input": input, "text": {"format": {"type": "json_schema", "name": "x"}}}), "text.format.schema"),
            (json!({"input": input, "text": {"format": {"type": "yaml"}}}), "text.format.type"),
            (json!({"input": input, "reasoning": {"effort": "max"}}), "reasoning.effort"),
            (json!({"input": input, "tools": [{"type": "web_search"}]}), "tools[0].type"),
            (json!({"input": input, "tools": [{"type": "function"}]}), "tools[0].name"),
            (json!({"input": input, "tool_choice": "sometimes"}), "tool_choice"),
            (json!({"input": [{"type": "item_reference", "id": "x"}]}), "input[0].type"),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
                "input[0].content[0].type",
            ),
            (json!({"input": [{"role": "tool", "content": "x"}]}), "input[0].role"),
            (json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}), "input[0].call_id"),
            (json!({"input": [{"type": "function_call_output", "call_id": "c"}]}), "input[0].output"),
        ] {
            assert_eq!(param(body.clone()).as_deref(), Some(expected), "{body}");
        }
    }
}
