//! Raw request JSON -> a valid `ChatRequest`, or a 400 naming the offending field.
//!
//! Parse, don't validate: handlers and the generation code only see `ChatRequest`, whose
//! messages are normalized for chat templates (content is a string; text parts are joined
//! with nothing for templates that walk parts themselves, else with "\n"; `developer` becomes `system`; tool-call `arguments` JSON strings become
//! objects, as HF templates iterate them with `|items`). Unknown fields are ignored; `null`
//! means absent. Accepted but ignored: presence/frequency penalties; `user` is only logged.
//! `tools`/`tool_choice` are parsed in `tools`. `logprobs: true` with `top_logprobs`
//! (0..=the engine's bound, 20; without `logprobs: true` it is a 400, as OpenAI does) asks for token
//! log-probabilities. `response_format` `json_object` / `json_schema` become a grammar the
//! engine enforces. Not supported, a 400 naming the field: `n` other than 1.
//! Bounds come from the engine ([`Limits`]); those that need the prompt's length (context)
//! are checked by `resolve_max_tokens`.

use serde_json::{Map, Value};

use crate::error::GatewayError;
pub use crate::limits::Limits;
#[cfg(test)]
pub(crate) use crate::limits::test_limits;

/// Sampling settings as the engine takes them.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub seed: Option<u64>,
    /// Requested completion length; `None` means the rest of the context (capped).
    pub max_tokens: Option<u32>,
    pub ignore_eos: bool,
    /// `Some(n)`: report each token's log-probability and the `n` most likely alternatives.
    pub logprobs: Option<u32>,
}

#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub model: Option<String>,
    /// Normalized messages (array of objects), ready for the chat template.
    pub messages: Value,
    pub tools: crate::tools::ToolRequest,
    /// `chat_template_kwargs`, passed to the template as variables.
    pub template_kwargs: Map<String, Value>,
    pub stream: bool,
    pub include_usage: bool,
    pub sampling: Sampling,
    pub stop: Vec<String>,
    pub cache_salt: String,
    pub response_format: ResponseFormat,
    pub user: Option<String>,
    /// See [`GenFields::speculation`].
    pub speculation: Option<proto::engine::v1::SpeculationParams>,
}

/// What the reply must be (`response_format`). Both JSON forms are enforced by the engine's
/// grammar-constrained decoding (and asked for in the system prompt, so the model means it).
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON matching `schema` (`json_schema.name` is kept for the instruction).
    JsonSchema {
        name: Option<String>,
        schema: Value,
    },
}

impl ResponseFormat {
    /// The grammar the engine enforces, if any.
    pub fn grammar(&self) -> Option<proto::engine::v1::Grammar> {
        use proto::engine::v1::grammar::Kind;
        let schema = match self {
            ResponseFormat::Text => return None,
            ResponseFormat::JsonObject => r#"{"type": "object"}"#.to_owned(),
            ResponseFormat::JsonSchema { schema, .. } => schema.to_string(),
        };
        Some(proto::engine::v1::Grammar { kind: Some(Kind::JsonSchema(schema)) })
    }
}

/// `{"type": "text" | "json_object"}` or `{"type": "json_schema", "json_schema": {"name",
/// "schema", "strict"}}` (`strict` is accepted either way: the schema is always enforced).
fn parse_response_format(format: &Value) -> Result<ResponseFormat, GatewayError> {
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => Ok(ResponseFormat::JsonObject),
        Some("json_schema") => {
            let Some(Value::Object(spec)) = format.get("json_schema") else {
                return Err(GatewayError::invalid(
                    "'response_format.json_schema' must be an object with a 'schema'",
                    "response_format.json_schema",
                ));
            };
            let name = match spec.get("name") {
                None | Some(Value::Null) => None,
                Some(Value::String(n)) => Some(n.clone()),
                Some(_) => {
                    return Err(GatewayError::invalid(
                        "'response_format.json_schema.name' must be a string",
                        "response_format.json_schema.name",
                    ));
                }
            };
            match spec.get("schema") {
                Some(schema @ Value::Object(_)) => Ok(ResponseFormat::JsonSchema { name, schema: schema.clone() }),
                _ => Err(GatewayError::invalid(
                    "'response_format.json_schema.schema' must be a JSON Schema object",
                    "response_format.json_schema.schema",
                )),
            }
        }
        _ => Err(GatewayError::invalid(
            "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"",
            "response_format",
        )),
    }
}

/// The fields chat and text completions share.
#[derive(Debug, Clone)]
pub struct GenFields {
    pub model: Option<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub sampling: Sampling,
    pub stop: Vec<String>,
    pub cache_salt: String,
    /// `response_format`: free text, any JSON object, or JSON matching a schema.
    pub response_format: ResponseFormat,
    /// A grammar that replaces `response_format`'s (the tool-call grammar of a request that
    /// must call a tool).
    pub grammar: Option<proto::engine::v1::Grammar>,
    /// `user`, for logs only.
    pub user: Option<String>,
    /// The `X-Session-ID` header (an agent's conversation), passed to the engine; may be empty.
    pub session_id: String,
    /// The `speculation` extension: per-request speculative decoding (see `parse_speculation`).
    pub speculation: Option<proto::engine::v1::SpeculationParams>,
}

/// The body as a JSON object, or a 400.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, GatewayError> {
    let root: Value = serde_json::from_slice(body)
        .map_err(|e| GatewayError::invalid(format!("The request body is not valid JSON: {e}"), None))?;
    match root {
        Value::Object(obj) => Ok(obj),
        _ => Err(GatewayError::invalid("The request body must be a JSON object", None)),
    }
}

/// Parses and validates a chat completion request body (text parts joined by "\n").
pub fn parse_chat_request(body: &[u8], limits: &Limits) -> Result<ChatRequest, GatewayError> {
    parse_chat_request_with(body, "\n", limits)
}

/// As [`parse_chat_request`], joining a message's text parts with `parts_joiner` (see
/// `ChatTemplate::content_parts_joiner`).
pub fn parse_chat_request_with(body: &[u8], parts_joiner: &str, limits: &Limits) -> Result<ChatRequest, GatewayError> {
    parse_chat_object(&parse_object(body)?, parts_joiner, limits)
}

/// As [`parse_chat_request_with`], from the body's JSON object (other APIs translate their
/// requests into this shape).
pub fn parse_chat_object(
    obj: &Map<String, Value>,
    parts_joiner: &str,
    limits: &Limits,
) -> Result<ChatRequest, GatewayError> {
    let messages = parse_messages(
        field(obj, "messages")
            .ok_or_else(|| GatewayError::invalid("Missing required parameter: 'messages'", "messages"))?,
        parts_joiner,
    )?;
    let tools = crate::tools::parse_tool_request(obj)?;
    let template_kwargs = match field(obj, "chat_template_kwargs") {
        None => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(_) => {
            return Err(GatewayError::invalid("'chat_template_kwargs' must be an object", "chat_template_kwargs"));
        }
    };
    let logprobs = opt_bool(obj, "logprobs")?.unwrap_or(false);
    let top_logprobs = match opt_int(obj, "top_logprobs")? {
        None => None,
        Some(k) if (0..=limits.max_top_logprobs as i64).contains(&k) => Some(k as u32),
        Some(_) => {
            return Err(GatewayError::invalid(
                format!("'top_logprobs' must be an integer in [0, {}]", limits.max_top_logprobs),
                "top_logprobs",
            ));
        }
    };
    if top_logprobs.is_some_and(|k| k > 0) && !logprobs {
        return Err(GatewayError::invalid("'logprobs' must be set to true when 'top_logprobs' is used", "logprobs"));
    }
    let mut common = parse_gen_fields(obj, limits)?;
    common.sampling.logprobs = logprobs.then(|| top_logprobs.unwrap_or(0));
    Ok(ChatRequest {
        model: common.model,
        messages,
        tools,
        template_kwargs,
        stream: common.stream,
        include_usage: common.include_usage,
        sampling: common.sampling,
        stop: common.stop,
        cache_salt: common.cache_salt,
        response_format: common.response_format,
        user: common.user,
        speculation: common.speculation,
    })
}

/// Sampling, limits, streaming and the other fields both endpoints take.
pub fn parse_gen_fields(obj: &Map<String, Value>, limits: &Limits) -> Result<GenFields, GatewayError> {
    let model = opt_string(obj, "model")?;
    let user = opt_string(obj, "user")?;
    if let Some(n) = opt_int(obj, "n")?
        && n != 1
    {
        return Err(GatewayError::invalid("Only n=1 is supported: send one request per completion", "n"));
    }
    let response_format = match field(obj, "response_format") {
        None => ResponseFormat::Text,
        Some(format) => parse_response_format(format)?,
    };
    for penalty in ["presence_penalty", "frequency_penalty"] {
        if let Some(v) = opt_number(obj, penalty)?
            && !(-2.0..=2.0).contains(&v)
        {
            return Err(GatewayError::invalid(format!("'{penalty}' must be in [-2, 2]"), Some(penalty)));
        }
    }

    let temperature = opt_number(obj, "temperature")?.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(GatewayError::invalid("'temperature' must be in [0, 2]", "temperature"));
    }
    let top_p = opt_number(obj, "top_p")?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(GatewayError::invalid("'top_p' must be in (0, 1]", "top_p"));
    }
    let top_k = match opt_int(obj, "top_k")? {
        None | Some(-1) => 0,
        Some(k) => {
            u32::try_from(k).map_err(|_| GatewayError::invalid("'top_k' must be >= 0 (or -1 for off)", "top_k"))?
        }
    };
    let seed = match field(obj, "seed") {
        None => None,
        // Negative seeds are valid in OpenAI's API; their bits seed the engine's RNG.
        Some(v) => Some(
            v.as_u64()
                .or_else(|| v.as_i64().map(|s| s as u64))
                .ok_or_else(|| GatewayError::invalid("'seed' must be an integer", "seed"))?,
        ),
    };
    let max_tokens = match (opt_int(obj, "max_completion_tokens")?, opt_int(obj, "max_tokens")?) {
        (Some(v), _) => Some(positive_u32(v, "max_completion_tokens")?),
        (None, Some(v)) => Some(positive_u32(v, "max_tokens")?),
        (None, None) => None,
    };
    let ignore_eos = opt_bool(obj, "ignore_eos")?.unwrap_or(false);

    let stop = match field(obj, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| GatewayError::invalid("'stop' must be a string or an array of strings", "stop"))?,
        Some(_) => {
            return Err(GatewayError::invalid("'stop' must be a string or an array of strings", "stop"));
        }
    };
    if stop.len() > limits.max_stop_sequences as usize {
        return Err(GatewayError::invalid(
            format!("At most {} stop strings are supported", limits.max_stop_sequences),
            "stop",
        ));
    }

    let stream = opt_bool(obj, "stream")?.unwrap_or(false);
    let include_usage = match field(obj, "stream_options") {
        None => false,
        Some(Value::Object(o)) => opt_bool(o, "include_usage")
            .map_err(|_| {
                GatewayError::invalid(
                    "'stream_options.include_usage' must be a boolean",
                    "stream_options.include_usage",
                )
            })?
            .unwrap_or(false),
        Some(_) => {
            return Err(GatewayError::invalid("'stream_options' must be an object", "stream_options"));
        }
    };
    let cache_salt = opt_string(obj, "cache_salt")?.unwrap_or_default();
    let speculation = parse_speculation(obj, limits)?;

    Ok(GenFields {
        model,
        stream,
        include_usage,
        sampling: Sampling {
            temperature: temperature as f32,
            top_p: top_p as f32,
            top_k,
            seed,
            max_tokens,
            ignore_eos,
            logprobs: None,
        },
        stop,
        cache_salt,
        response_format,
        grammar: None,
        user,
        session_id: String::new(),
        speculation,
    })
}

/// The `speculation` extension: `true`/`false` turns the server's speculative decoding on or
/// off for this request; an object `{"enabled", "max_depth" (D), "top_k" (k), "max_nodes"
/// (N)}` also shapes the draft tree. Output never depends on it (verification is lossless),
/// only speed does.
fn parse_speculation(
    obj: &Map<String, Value>,
    limits: &Limits,
) -> Result<Option<proto::engine::v1::SpeculationParams>, GatewayError> {
    use proto::engine::v1::{SpeculationMode, SpeculationParams};
    let mode = |on: bool| if on { SpeculationMode::On } else { SpeculationMode::Off } as i32;
    let bad = |msg: &str, param: &str| GatewayError::invalid_param(msg.to_owned(), param.to_owned());
    match field(obj, "speculation") {
        None => Ok(None),
        Some(Value::Bool(on)) => Ok(Some(SpeculationParams { mode: mode(*on), ..Default::default() })),
        Some(Value::Object(o)) => {
            let enabled = opt_bool(o, "enabled")
                .map_err(|_| bad("'speculation.enabled' must be a boolean", "speculation.enabled"))?;
            let limit = |key: &'static str, low: u32, high: u32| -> Result<u32, GatewayError> {
                let param = format!("speculation.{key}");
                match opt_int(o, key).map_err(|_| bad(&format!("'{param}' must be an integer"), &param))? {
                    None => Ok(0),
                    Some(v) if (low as i64..=high as i64).contains(&v) => Ok(v as u32),
                    Some(_) => Err(bad(&format!("'{param}' must be in [{low}, {high}]"), &param)),
                }
            };
            Ok(Some(SpeculationParams {
                mode: enabled.map_or(SpeculationMode::Unspecified as i32, mode),
                max_depth: limit("max_depth", 1, limits.max_speculation_depth)?,
                top_k: limit("top_k", 1, limits.max_speculation_top_k)?,
                max_nodes: limit("max_nodes", 2, limits.max_speculation_nodes)?,
            }))
        }
        Some(_) => Err(bad("'speculation' must be a boolean or an object", "speculation")),
    }
}

/// How a request's `model` relates to the served names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelMatch {
    /// Absent, or one of the served names.
    Served,
    /// Another name, served anyway (not strict): the caller logs it.
    Other(String),
}

/// `model` may be absent or any served name; another name is served unless `strict`, where
/// it is 404 `model_not_found`.
pub fn check_model(requested: Option<&str>, served: &[String], strict: bool) -> Result<ModelMatch, GatewayError> {
    match requested {
        Some(m) if !served.iter().any(|s| s == m) => {
            if strict {
                Err(GatewayError::ModelNotFound(m.to_owned()))
            } else {
                Ok(ModelMatch::Other(m.to_owned()))
            }
        }
        _ => Ok(ModelMatch::Served),
    }
}

/// The completion budget: the requested `max_tokens` if prompt + it fits the context (and
/// the engine's per-request bound), or by default the rest of the context capped at `cap`.
pub fn resolve_max_tokens(
    requested: Option<u32>,
    prompt_tokens: usize,
    limits: &Limits,
    cap: u32,
) -> Result<u32, GatewayError> {
    let context = limits.context_length as usize;
    if prompt_tokens >= context {
        return Err(GatewayError::ContextLengthExceeded {
            message: format!(
                "This model's maximum context length is {context} tokens, but the messages resulted in {prompt_tokens} tokens"
            ),
            param: "messages".into(),
        });
    }
    let room = (context - prompt_tokens) as u32;
    match requested {
        Some(n) if n > room => Err(GatewayError::ContextLengthExceeded {
            message: format!(
                "This model's maximum context length is {context} tokens. However, you requested {} tokens ({prompt_tokens} in the messages, {n} in the completion)",
                prompt_tokens + n as usize
            ),
            param: "max_tokens".into(),
        }),
        Some(n) if n > limits.max_completion_tokens => Err(GatewayError::invalid(
            format!("'max_tokens' must be at most {}", limits.max_completion_tokens),
            "max_tokens",
        )),
        Some(n) => Ok(n),
        None => Ok(room.min(cap).min(limits.max_completion_tokens)),
    }
}

pub(crate) fn field<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

pub(crate) fn opt_string(obj: &Map<String, Value>, key: &'static str) -> Result<Option<String>, GatewayError> {
    match field(obj, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(GatewayError::invalid(format!("'{key}' must be a string"), Some(key))),
    }
}

pub(crate) fn opt_bool(obj: &Map<String, Value>, key: &'static str) -> Result<Option<bool>, GatewayError> {
    match field(obj, key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(GatewayError::invalid(format!("'{key}' must be a boolean"), Some(key))),
    }
}

fn opt_number(obj: &Map<String, Value>, key: &'static str) -> Result<Option<f64>, GatewayError> {
    match field(obj, key) {
        None => Ok(None),
        Some(v) => {
            v.as_f64().map(Some).ok_or_else(|| GatewayError::invalid(format!("'{key}' must be a number"), Some(key)))
        }
    }
}

fn opt_int(obj: &Map<String, Value>, key: &'static str) -> Result<Option<i64>, GatewayError> {
    match field(obj, key) {
        None => Ok(None),
        Some(v) => {
            v.as_i64().map(Some).ok_or_else(|| GatewayError::invalid(format!("'{key}' must be an integer"), Some(key)))
        }
    }
}

fn positive_u32(v: i64, key: &'static str) -> Result<u32, GatewayError> {
    if v < 1 {
        return Err(GatewayError::invalid(format!("'{key}' must be >= 1"), Some(key)));
    }
    Ok(u32::try_from(v).unwrap_or(u32::MAX))
}

fn parse_messages(value: &Value, parts_joiner: &str) -> Result<Value, GatewayError> {
    let Value::Array(items) = value else {
        return Err(GatewayError::invalid("'messages' must be an array", "messages"));
    };
    if items.is_empty() {
        return Err(GatewayError::invalid("'messages' must contain at least one message", "messages"));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| parse_message(i, m, parts_joiner))
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

fn parse_message(i: usize, value: &Value, parts_joiner: &str) -> Result<Value, GatewayError> {
    let at = |f: &str| format!("messages[{i}].{f}");
    let Value::Object(msg) = value else {
        return Err(GatewayError::invalid_param("Each message must be an object", format!("messages[{i}]")));
    };
    let role = match field(msg, "role") {
        Some(Value::String(r)) => r.as_str(),
        Some(_) => {
            return Err(GatewayError::invalid_param("'role' must be a string", at("role")));
        }
        None => return Err(GatewayError::invalid_param("Missing 'role'", at("role"))),
    };
    let role = match role {
        "system" | "user" | "assistant" | "tool" => role,
        "developer" => "system",
        other => {
            return Err(GatewayError::invalid_param(
                format!("Unsupported role '{other}' (expected system, user, assistant or tool)"),
                at("role"),
            ));
        }
    };
    let mut out = Map::new();
    out.insert("role".into(), role.into());
    let content = match field(msg, "content") {
        None if role == "assistant" => String::new(),
        None => {
            return Err(GatewayError::invalid_param("Missing 'content'", at("content")));
        }
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let kind = part.get("type").and_then(Value::as_str);
                match (kind, part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => texts.push(t.as_str()),
                    (Some("text"), _) => {
                        return Err(GatewayError::invalid_param(
                            "A text part needs a string 'text'",
                            format!("messages[{i}].content[{j}].text"),
                        ));
                    }
                    _ => {
                        return Err(GatewayError::invalid_param(
                            "Only text content parts ({\"type\": \"text\", \"text\": ...}) are supported",
                            format!("messages[{i}].content[{j}].type"),
                        ));
                    }
                }
            }
            texts.join(parts_joiner)
        }
        Some(_) => {
            return Err(GatewayError::invalid_param(
                "'content' must be a string or an array of text parts",
                at("content"),
            ));
        }
    };
    out.insert("content".into(), content.into());
    // `reasoning` and `thinking` are other clients' names for `reasoning_content` (the name
    // templates read); transformers copies them over the same way.
    if field(msg, "reasoning_content").is_none() {
        for alias in ["reasoning", "thinking"] {
            match field(msg, alias) {
                None => continue,
                Some(Value::String(s)) => {
                    out.insert("reasoning_content".into(), s.clone().into());
                    break;
                }
                Some(_) => {
                    return Err(GatewayError::invalid_param(format!("'{alias}' must be a string"), at(alias)));
                }
            }
        }
    }
    for key in ["name", "tool_call_id", "reasoning_content"] {
        match field(msg, key) {
            None => {}
            Some(Value::String(s)) => {
                out.insert(key.into(), s.clone().into());
            }
            Some(_) => {
                return Err(GatewayError::invalid_param(format!("'{key}' must be a string"), at(key)));
            }
        }
    }
    if let Some(calls) = field(msg, "tool_calls") {
        if role != "assistant" {
            return Err(GatewayError::invalid_param("Only assistant messages have tool_calls", at("tool_calls")));
        }
        out.insert("tool_calls".into(), parse_tool_calls(i, calls)?);
    }
    Ok(Value::Object(out))
}

fn parse_tool_calls(i: usize, value: &Value) -> Result<Value, GatewayError> {
    let Value::Array(calls) = value else {
        return Err(GatewayError::invalid_param("'tool_calls' must be an array", format!("messages[{i}].tool_calls")));
    };
    let mut out = Vec::with_capacity(calls.len());
    for (j, call) in calls.iter().enumerate() {
        let at = |f: &str| format!("messages[{i}].tool_calls[{j}].{f}");
        let Some(Value::Object(function)) = call.get("function") else {
            return Err(GatewayError::invalid_param("A tool call needs a 'function' object", at("function")));
        };
        if !matches!(function.get("name"), Some(Value::String(_))) {
            return Err(GatewayError::invalid_param("'function.name' must be a string", at("function.name")));
        }
        let mut function = function.clone();
        match function.get("arguments") {
            None | Some(Value::Null) => {
                function.insert("arguments".into(), Value::Object(Map::new()));
            }
            Some(Value::String(s)) => {
                // Templates iterate arguments as a mapping; a string that is not a JSON object
                // stays a string (the template then decides what to do with it).
                if let Ok(parsed @ Value::Object(_)) = serde_json::from_str::<Value>(s) {
                    function.insert("arguments".into(), parsed);
                }
            }
            Some(Value::Object(_)) => {}
            Some(_) => {
                return Err(GatewayError::invalid_param(
                    "'function.arguments' must be a JSON string or an object",
                    at("function.arguments"),
                ));
            }
        }
        let mut call = call.as_object().cloned().unwrap_or_default();
        call.insert("function".into(), Value::Object(function));
        call.entry("type").or_insert_with(|| "function".into());
        out.push(Value::Object(call));
    }
    Ok(Value::Array(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<ChatRequest, GatewayError> {
        parse_chat_request(v.to_string().as_bytes(), &test_limits())
    }

    fn param_of(err: GatewayError) -> Option<String> {
        err.to_body().error.param
    }

    #[test]
    fn minimal_request_gets_openai_defaults() {
        let r = parse(json!({"messages": [{"role": "user", "content": "hi"}], "unknown_field": 1})).unwrap();
        assert_eq!(r.sampling.temperature, 1.0);
        assert_eq!(r.sampling.top_p, 1.0);
        assert_eq!(r.sampling.max_tokens, None);
        assert!(!r.stream && r.stop.is_empty() && r.model.is_none());
    }

    #[test]
    fn content_parts_are_joined_and_tool_arguments_parsed() {
        let r = parse(json!({"messages": [
            {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
            {"role": "tool", "tool_call_id": "1", "content": "r"}
        ]}))
        .unwrap();
        assert_eq!(r.messages[0], json!({"role": "system", "content": "a\nb"}));
        assert_eq!(r.messages[2]["content"], "");
        assert_eq!(r.messages[2]["tool_calls"][0]["function"]["arguments"], json!({"x": 1}));
        assert_eq!(r.messages[3]["tool_call_id"], "1");
        let body = json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]});
        let joined = parse_chat_request_with(body.to_string().as_bytes(), "", &test_limits()).unwrap();
        assert_eq!(joined.messages[0]["content"], "ab");
    }

    #[test]
    fn speculation_extension_turns_drafting_on_off_and_shapes_the_tree() {
        use proto::engine::v1::{SpeculationMode, SpeculationParams};
        let with = |v: Value| parse(json!({"messages": [{"role": "user", "content": "q"}], "speculation": v}));
        assert_eq!(with(json!(false)).unwrap().speculation.unwrap().mode, SpeculationMode::Off as i32);
        assert_eq!(
            with(json!({"max_depth": 4, "top_k": 1, "max_nodes": 5})).unwrap().speculation,
            Some(SpeculationParams { mode: 0, max_depth: 4, top_k: 1, max_nodes: 5 })
        );
        assert_eq!(with(json!({"enabled": true})).unwrap().speculation.unwrap().mode, SpeculationMode::On as i32);
        assert!(parse(json!({"messages": [{"role": "user", "content": "q"}]})).unwrap().speculation.is_none());
        for (bad, param) in [
            (json!("yes"), "speculation"),
            (json!({"max_nodes": 1}), "speculation.max_nodes"),
            (json!({"top_k": 99}), "speculation.top_k"),
            (json!({"enabled": 1}), "speculation.enabled"),
            (json!({"max_depth": "8"}), "speculation.max_depth"),
        ] {
            assert_eq!(with(bad.clone()).unwrap_err().to_body().error.param.as_deref(), Some(param), "{bad}");
        }
    }

    #[test]
    fn reasoning_aliases_become_reasoning_content() {
        let r = parse(json!({"messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "a", "reasoning": "r1"},
            {"role": "assistant", "content": "b", "thinking": "r2"},
            {"role": "assistant", "content": "c", "reasoning_content": "r3", "reasoning": "x"}
        ]}))
        .unwrap();
        let m = r.messages.as_array().unwrap();
        assert_eq!(m[1]["reasoning_content"], "r1");
        assert_eq!(m[2]["reasoning_content"], "r2");
        assert_eq!(m[3]["reasoning_content"], "r3");
        let bad = parse(json!({"messages": [{"role": "assistant", "content": "a", "reasoning": 3}]}));
        assert_eq!(bad.unwrap_err().to_body().error.param.as_deref(), Some("messages[0].reasoning"));
    }

    #[test]
    fn wrong_types_and_ranges_name_the_field() {
        let base = |extra: Value| {
            let mut v = json!({"messages": [{"role": "user", "content": "hi"}]});
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            v
        };
        let cases = [
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"temperature": 2.5}), "temperature"),
            (json!({"top_p": 0}), "top_p"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"max_completion_tokens": 1.5}), "max_completion_tokens"),
            (json!({"n": 2}), "n"),
            (json!({"stream": "yes"}), "stream"),
            (json!({"stop": [1]}), "stop"),
            (json!({"model": 5}), "model"),
            (json!({"seed": "x"}), "seed"),
            (json!({"tools": {}}), "tools"),
        ];
        for (extra, param) in cases {
            let err = parse(base(extra.clone())).unwrap_err();
            assert_eq!(param_of(err), Some(param.to_owned()), "{extra}");
        }
        let err = parse(json!({"messages": [{"role": "robot", "content": "x"}]})).unwrap_err();
        assert_eq!(param_of(err).as_deref(), Some("messages[0].role"));
        let err = parse(json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})).unwrap_err();
        assert_eq!(param_of(err).as_deref(), Some("messages[0].content[0].type"));
        let err = parse(json!({"messages": [{"role": "user", "content": 3}]})).unwrap_err();
        assert_eq!(param_of(err).as_deref(), Some("messages[0].content"));
        let err = parse(json!({"messages": []})).unwrap_err();
        assert_eq!(param_of(err).as_deref(), Some("messages"));
    }

    #[test]
    fn nulls_mean_absent_and_max_completion_tokens_wins() {
        let r = parse(json!({"messages": [{"role": "user", "content": "hi"}], "temperature": null,
            "max_tokens": 5, "max_completion_tokens": 7, "stop": "x", "seed": -1}))
        .unwrap();
        assert_eq!(r.sampling.temperature, 1.0);
        assert_eq!(r.sampling.max_tokens, Some(7));
        assert_eq!(r.stop, vec!["x".to_owned()]);
        assert_eq!(r.sampling.seed, Some(u64::MAX));
    }

    #[test]
    fn max_tokens_must_fit_the_context() {
        let big = test_limits();
        let small = Limits { context_length: 192, max_completion_tokens: 191, ..big };
        assert_eq!(resolve_max_tokens(None, 100, &big, 4096).unwrap(), 4096);
        assert_eq!(resolve_max_tokens(None, 8000, &big, 4096).unwrap(), 192);
        assert_eq!(resolve_max_tokens(Some(92), 100, &small, 4096).unwrap(), 92);
        let err = resolve_max_tokens(Some(93), 100, &small, 4096).unwrap_err();
        assert_eq!(err.to_body().error.code, Some("context_length_exceeded"));
        let err = resolve_max_tokens(None, 192, &small, 4096).unwrap_err();
        assert_eq!(err.to_body().error.param.as_deref(), Some("messages"));
        // An engine may bound a completion below the room its context leaves.
        let bounded = Limits { max_completion_tokens: 50, ..big };
        assert_eq!(resolve_max_tokens(None, 100, &bounded, 4096).unwrap(), 50);
        assert_eq!(resolve_max_tokens(Some(50), 100, &bounded, 4096).unwrap(), 50);
        let err = resolve_max_tokens(Some(51), 100, &bounded, 4096).unwrap_err();
        assert_eq!(err.to_body().error.param.as_deref(), Some("max_tokens"));
    }

    #[test]
    fn other_model_names_are_served_unless_strict() {
        let served = ["m".to_owned(), "alias".to_owned()];
        assert_eq!(check_model(None, &served, true).unwrap(), ModelMatch::Served);
        assert_eq!(check_model(Some("alias"), &served, true).unwrap(), ModelMatch::Served);
        assert_eq!(check_model(Some("gpt-4"), &served, true).unwrap_err().status().as_u16(), 404);
        assert_eq!(check_model(Some("gpt-4"), &served, false).unwrap(), ModelMatch::Other("gpt-4".into()));
    }
}
