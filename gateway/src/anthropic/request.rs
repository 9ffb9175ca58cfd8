//! A Messages request body -> the chat request the rest of the gateway runs, or a 400 that
//! names the offending field in Anthropic's terms.
//!
//! The translation: `system` (a string or text blocks) becomes the first system message;
//! user text blocks become a user message and each `tool_result` block a `tool` message
//! (in the order the blocks came); assistant text, `thinking` and `tool_use` blocks become
//! one assistant message with `reasoning_content` and `tool_calls` (input objects as
//! arguments); `tools` (`name`, `description`, `input_schema`) become function tools;
//! `tool_choice` `auto`/`any`/`tool`/`none` becomes `auto`/`required`/a named function/`none`
//! and `disable_parallel_tool_use` turns parallel calls off; `stop_sequences` are stop
//! strings; `thinking` `enabled`/`disabled` sets the template's `enable_thinking`;
//! `metadata.user_id` is logged as the user; `output_config.format` (`json_schema`) is enforced
//! by the engine's grammar. `cache_control` marks are accepted and ignored:
//! the prefix cache is automatic. This server's extensions (`cache_salt`, `speculation`)
//! pass through. Not supported, a 400 naming the block or field: image and document
//! blocks, server tools (a `type` other than `custom`), `mcp_servers`, `container`.

use serde_json::{Map, Value, json};

use crate::error::GatewayError;
use crate::validate::{self, ChatRequest, field};

/// Parses a `POST /v1/messages` body into a chat request (text parts joined by
/// `parts_joiner`, as for chat completions).
pub fn parse_messages_request(
    body: &[u8],
    parts_joiner: &str,
    limits: &validate::Limits,
) -> Result<ChatRequest, GatewayError> {
    let obj = validate::parse_object(body)?;
    let chat = to_chat_object(&obj)?;
    validate::parse_chat_object(&chat, parts_joiner, limits)
}

/// A `POST /v1/messages/count_tokens` body (a Messages body without `max_tokens`) as a chat
/// request, for rendering only.
pub fn parse_count_tokens_request(
    body: &[u8],
    parts_joiner: &str,
    limits: &validate::Limits,
) -> Result<ChatRequest, GatewayError> {
    let mut obj = validate::parse_object(body)?;
    obj.insert("max_tokens".into(), 1.into());
    let chat = to_chat_object(&obj)?;
    validate::parse_chat_object(&chat, parts_joiner, limits)
}

/// The body's fields as a chat completions request object.
fn to_chat_object(obj: &Map<String, Value>) -> Result<Map<String, Value>, GatewayError> {
    for unsupported in ["mcp_servers", "container"] {
        if field(obj, unsupported).is_some() {
            return Err(GatewayError::invalid(format!("'{unsupported}' is not supported by this server"), unsupported));
        }
    }
    let mut chat = Map::new();
    // Fields with the same meaning and name (range checks happen in the chat parser).
    for key in ["model", "stream", "temperature", "top_p", "top_k", "cache_salt", "speculation", "seed"] {
        if let Some(v) = field(obj, key) {
            chat.insert(key.into(), v.clone());
        }
    }
    match field(obj, "max_tokens") {
        Some(v) => {
            chat.insert("max_tokens".into(), v.clone());
        }
        None => return Err(GatewayError::invalid("Missing required parameter: 'max_tokens'", "max_tokens")),
    }
    if let Some(t) = field(obj, "temperature")
        && t.as_f64().is_some_and(|t| !(0.0..=1.0).contains(&t))
    {
        return Err(GatewayError::invalid("'temperature' must be in [0, 1]", "temperature"));
    }
    if let Some(stops) = field(obj, "stop_sequences") {
        if !stops.as_array().is_some_and(|a| a.iter().all(Value::is_string)) {
            return Err(GatewayError::invalid("'stop_sequences' must be an array of strings", "stop_sequences"));
        }
        chat.insert("stop".into(), stops.clone());
    }
    if let Some(metadata) = field(obj, "metadata") {
        let Value::Object(m) = metadata else {
            return Err(GatewayError::invalid("'metadata' must be an object", "metadata"));
        };
        if let Some(user) = field(m, "user_id") {
            chat.insert("user".into(), user.clone());
        }
    }
    // Structured outputs: `output_config.format` (or the beta's `output_format`)
    // `{"type": "json_schema", "schema"}`, enforced like chat's `response_format`.
    let format = field(obj, "output_config").and_then(|c| c.get("format")).or_else(|| field(obj, "output_format"));
    if let Some(format) = format.filter(|f| !f.is_null()) {
        match (format.get("type").and_then(Value::as_str), format.get("schema")) {
            (Some("json_schema"), Some(schema @ Value::Object(_))) => {
                chat.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": {"schema": schema}}),
                );
            }
            _ => {
                return Err(GatewayError::invalid(
                    "'output_config.format' must be {\"type\": \"json_schema\", \"schema\": {...}}",
                    "output_config.format",
                ));
            }
        }
    }
    if let Some(thinking) = field(obj, "thinking") {
        let on = match thinking.get("type").and_then(Value::as_str) {
            Some("enabled") => true,
            Some("disabled") => false,
            _ => {
                return Err(GatewayError::invalid(
                    "'thinking' must be {\"type\": \"enabled\", ...} or {\"type\": \"disabled\"}",
                    "thinking.type",
                ));
            }
        };
        chat.insert("chat_template_kwargs".into(), json!({"enable_thinking": on}));
    }

    let mut messages = Vec::new();
    if let Some(system) = field(obj, "system") {
        let text = text_of(system, "system")?;
        messages.push(json!({"role": "system", "content": text}));
    }
    let Some(Value::Array(items)) = field(obj, "messages") else {
        return Err(GatewayError::invalid("'messages' must be an array", "messages"));
    };
    if items.is_empty() {
        return Err(GatewayError::invalid("'messages' must contain at least one message", "messages"));
    }
    for (i, message) in items.iter().enumerate() {
        translate_message(i, message, &mut messages)?;
    }
    chat.insert("messages".into(), Value::Array(messages));

    let tools = match field(obj, "tools") {
        None => Vec::new(),
        Some(Value::Array(tools)) => {
            tools.iter().enumerate().map(|(i, t)| translate_tool(i, t)).collect::<Result<_, _>>()?
        }
        Some(_) => return Err(GatewayError::invalid("'tools' must be an array", "tools")),
    };
    if !tools.is_empty() {
        chat.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = field(obj, "tool_choice") {
        let (choice, parallel) = translate_tool_choice(choice)?;
        chat.insert("tool_choice".into(), choice);
        if let Some(parallel) = parallel {
            chat.insert("parallel_tool_calls".into(), parallel.into());
        }
    }
    Ok(chat)
}

/// A string, or an array of text blocks joined with nothing between them (how the API
/// concatenates a system prompt's blocks).
fn text_of(value: &Value, at: &str) -> Result<String, GatewayError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut text = String::new();
            for (j, block) in blocks.iter().enumerate() {
                match (block_type(block), block.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    _ => {
                        return Err(GatewayError::invalid_param(
                            "Expected a text block ({\"type\": \"text\", \"text\": ...})",
                            format!("{at}[{j}]"),
                        ));
                    }
                }
            }
            Ok(text)
        }
        _ => Err(GatewayError::invalid_param("Expected a string or an array of text blocks", at.to_owned())),
    }
}

fn block_type(block: &Value) -> Option<&str> {
    block.get("type").and_then(Value::as_str)
}

fn translate_message(i: usize, message: &Value, out: &mut Vec<Value>) -> Result<(), GatewayError> {
    let at = |f: &str| format!("messages[{i}].{f}");
    let role = match message.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        Some(other) => {
            return Err(GatewayError::invalid_param(
                format!("Unsupported role '{other}' (expected user or assistant; the system prompt is 'system')"),
                at("role"),
            ));
        }
        None => return Err(GatewayError::invalid_param("Missing 'role'", at("role"))),
    };
    let blocks = match message.get("content") {
        Some(Value::String(s)) => {
            out.push(json!({"role": role, "content": s}));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(GatewayError::invalid_param(
                "'content' must be a string or an array of content blocks",
                at("content"),
            ));
        }
    };
    if role == "assistant" {
        out.push(assistant_message(i, blocks)?);
        return Ok(());
    }
    // User turn: text blocks gather into user messages, each tool result is a tool message,
    // in the order they came.
    let mut parts: Vec<Value> = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = |f: &str| format!("messages[{i}].content[{j}]{f}");
        match block_type(block) {
            Some("text") => parts.push(json!({"type": "text", "text": string_field(block, "text", &at(".text"))?})),
            Some("tool_result") => {
                if !parts.is_empty() {
                    out.push(json!({"role": "user", "content": std::mem::take(&mut parts)}));
                }
                let id = string_field(block, "tool_use_id", &at(".tool_use_id"))?;
                let mut content = match block.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(c) => text_of(c, &at(".content"))?,
                };
                if block.get("is_error") == Some(&Value::Bool(true)) {
                    content = format!("Error: {content}");
                }
                out.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            other => return Err(unsupported_block(other, at(".type"))),
        }
    }
    if !parts.is_empty() || blocks.is_empty() {
        out.push(json!({"role": "user", "content": parts}));
    }
    Ok(())
}

fn assistant_message(i: usize, blocks: &[Value]) -> Result<Value, GatewayError> {
    let mut parts = Vec::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = |f: &str| format!("messages[{i}].content[{j}]{f}");
        match block_type(block) {
            Some("text") => parts.push(json!({"type": "text", "text": string_field(block, "text", &at(".text"))?})),
            Some("thinking") => reasoning.push_str(&string_field(block, "thinking", &at(".thinking"))?),
            // Encrypted reasoning from another server: nothing this model can read.
            Some("redacted_thinking") => {}
            Some("tool_use") => {
                let id = string_field(block, "id", &at(".id"))?;
                let name = string_field(block, "name", &at(".name"))?;
                let input = match block.get("input") {
                    None | Some(Value::Null) => Value::Object(Map::new()),
                    Some(v @ Value::Object(_)) => v.clone(),
                    Some(_) => return Err(GatewayError::invalid_param("'input' must be an object", at(".input"))),
                };
                calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}));
            }
            other => return Err(unsupported_block(other, at(".type"))),
        }
    }
    let mut message = json!({"role": "assistant", "content": parts});
    if !reasoning.is_empty() {
        message["reasoning_content"] = reasoning.into();
    }
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    Ok(message)
}

fn string_field(block: &Value, key: &str, at: &str) -> Result<String, GatewayError> {
    match block.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(GatewayError::invalid_param(format!("'{key}' must be a string"), at.to_owned())),
    }
}

fn unsupported_block(kind: Option<&str>, at: String) -> GatewayError {
    let what = kind.map_or_else(|| "A content block without a 'type'".to_owned(), |k| format!("'{k}' blocks are"));
    let verb = if kind.is_some() { "not supported here" } else { "is not valid" };
    GatewayError::invalid_param(
        format!("{what} {verb} (this server takes text, thinking, tool_use and tool_result blocks)"),
        at,
    )
}

/// `{name, description, input_schema}` -> a function tool.
fn translate_tool(i: usize, tool: &Value) -> Result<Value, GatewayError> {
    let at = |f: &str| format!("tools[{i}].{f}");
    if let Some(kind) = tool.get("type").and_then(Value::as_str)
        && kind != "custom"
    {
        return Err(GatewayError::invalid_param(
            format!(
                "Tool type '{kind}' is not supported: this server runs client tools (name, description, input_schema)"
            ),
            at("type"),
        ));
    }
    let name = string_field(tool, "name", &at("name"))?;
    let schema = match tool.get("input_schema") {
        Some(v @ Value::Object(_)) => v.clone(),
        _ => {
            return Err(GatewayError::invalid_param("'input_schema' must be a JSON Schema object", at("input_schema")));
        }
    };
    let mut function = json!({"name": name, "parameters": schema});
    if let Some(Value::String(d)) = tool.get("description") {
        function["description"] = d.clone().into();
    }
    if let Some(strict @ Value::Bool(_)) = tool.get("strict") {
        function["strict"] = strict.clone();
    }
    Ok(json!({"type": "function", "function": function}))
}

/// Anthropic's `tool_choice` -> (chat `tool_choice`, `parallel_tool_calls` when set).
fn translate_tool_choice(choice: &Value) -> Result<(Value, Option<bool>), GatewayError> {
    let parallel = match choice.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(disable)) => Some(!disable),
        Some(_) => {
            return Err(GatewayError::invalid(
                "'disable_parallel_tool_use' must be a boolean",
                "tool_choice.disable_parallel_tool_use",
            ));
        }
    };
    let chat = match block_type(choice) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match choice.get("name") {
            Some(Value::String(name)) => json!({"type": "function", "function": {"name": name}}),
            _ => return Err(GatewayError::invalid("A 'tool' tool_choice needs a 'name'", "tool_choice.name")),
        },
        _ => {
            return Err(GatewayError::invalid(
                "'tool_choice.type' must be \"auto\", \"any\", \"tool\" or \"none\"",
                "tool_choice.type",
            ));
        }
    };
    Ok((chat, parallel))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<ChatRequest, GatewayError> {
        parse_messages_request(v.to_string().as_bytes(), "\n", &validate::test_limits())
    }

    fn param(v: Value) -> Option<String> {
        parse(v).unwrap_err().to_body().error.param
    }

    #[test]
    fn a_tool_round_trip_becomes_chat_messages_in_order() {
        let r = parse(json!({
            "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["END"], "temperature": 0.5, "metadata": {"user_id": "u1"},
            "tools": [{"name": "get_weather", "description": "Weather", "cache_control": {"type": "ephemeral"},
                       "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Use the tool.", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Sunny"}]},
                    {"type": "text", "text": "And tomorrow?"}]}
            ]
        }))
        .unwrap();
        let m = r.messages.as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[1], json!({"role": "user", "content": "Weather in Paris?"}));
        assert_eq!(m[2]["content"], "Checking.");
        assert_eq!(m[2]["reasoning_content"], "Use the tool.");
        assert_eq!(m[2]["tool_calls"][0]["id"], "toolu_1");
        assert_eq!(m[2]["tool_calls"][0]["function"]["arguments"], json!({"city": "Paris"}));
        assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"}));
        assert_eq!(m[4], json!({"role": "user", "content": "And tomorrow?"}));
        assert_eq!(m.len(), 5);
        assert_eq!(r.tools.choice, crate::tools::ToolChoice::Required);
        assert!(!r.tools.parallel);
        assert_eq!(r.tools.tools[0]["function"]["parameters"]["properties"]["city"]["type"], "string");
        assert_eq!(r.stop, vec!["END".to_owned()]);
        assert_eq!(r.sampling.max_tokens, Some(64));
        assert_eq!(r.sampling.temperature, 0.5);
        assert_eq!(r.user.as_deref(), Some("u1"));
    }

    #[test]
    fn thinking_and_named_tool_choice_translate() {
        let r = parse(json!({"max_tokens": 8, "thinking": {"type": "disabled"},
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "f"},
            "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": true, "content": "boom"}]}]}))
        .unwrap();
        assert_eq!(r.template_kwargs["enable_thinking"], false);
        assert_eq!(r.tools.choice, crate::tools::ToolChoice::Named("f".into()));
        assert_eq!(r.messages[0], json!({"role": "tool", "tool_call_id": "t", "content": "Error: boom"}));
        let schema = json!({"type": "object", "properties": {"a": {"type": "string"}}});
        let r = parse(json!({"max_tokens": 8, "output_config": {"format": {"type": "json_schema", "schema": schema}},
            "messages": [{"role": "user", "content": "x"}]}))
        .unwrap();
        assert_eq!(r.response_format, crate::validate::ResponseFormat::JsonSchema { name: None, schema });
        let bad = json!({"max_tokens": 8, "output_config": {"format": {"type": "yaml"}},
            "messages": [{"role": "user", "content": "x"}]});
        assert_eq!(param(bad).as_deref(), Some("output_config.format"));
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let user = json!([{"role": "user", "content": "hi"}]);
        assert_eq!(param(json!({"messages": user})).as_deref(), Some("max_tokens"));
        assert_eq!(param(json!({"max_tokens": 0, "messages": user})).as_deref(), Some("max_tokens"));
        assert_eq!(
            param(json!({"max_tokens": 5, "messages": user, "temperature": 1.5})).as_deref(),
            Some("temperature")
        );
        assert_eq!(param(json!({"max_tokens": 5, "messages": []})).as_deref(), Some("messages"));
        assert_eq!(
            param(json!({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})).as_deref(),
            Some("messages[0].role")
        );
        let image = json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]);
        assert_eq!(param(json!({"max_tokens": 5, "messages": image})).as_deref(), Some("messages[0].content[0].type"));
        let server_tool = json!([{"type": "web_search_20250305", "name": "web_search"}]);
        assert_eq!(
            param(json!({"max_tokens": 5, "messages": user, "tools": server_tool})).as_deref(),
            Some("tools[0].type")
        );
        let no_schema = json!([{"name": "f"}]);
        assert_eq!(
            param(json!({"max_tokens": 5, "messages": user, "tools": no_schema})).as_deref(),
            Some("tools[0].input_schema")
        );
        assert_eq!(
            param(json!({"max_tokens": 5, "messages": user, "tool_choice": {"type": "maybe"}})).as_deref(),
            Some("tool_choice.type")
        );
        assert_eq!(
            param(json!({"max_tokens": 5, "messages": user, "mcp_servers": []})).as_deref(),
            Some("mcp_servers")
        );
        assert_eq!(
            param(json!({"max_tokens": 5, "messages": user, "stop_sequences": "x"})).as_deref(),
            Some("stop_sequences")
        );
    }
}
