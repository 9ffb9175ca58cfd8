//! `POST /v1/completions` (legacy text completions): a raw prompt, no chat template.
//!
//! `prompt` is a string, or token ids (an array of integers), or a one-element array of
//! either; several prompts in one request are a 400 (send one request each), like `n` > 1.
//! Text prompts are tokenized without special tokens (no BOS is added). Not supported, a
//! 400 naming the field: `echo: true`, a non-empty `suffix`, `best_of` > 1. `logprobs: n`
//! (0..=5, OpenAI's limit for this endpoint) returns each token's log-probability and the
//! `n` most likely alternatives in the legacy `tokens`/`token_logprobs`/`top_logprobs`/
//! `text_offset` form.
//! Sampling, `stop`, `stream`, `stream_options`, limits and errors are as for chat.

use std::convert::Infallible;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::error::GatewayError;
use crate::generation::{GenEvent, Generation};
use crate::openai::{CompletionMeta, FinishReason, TokenLogprob, Usage, sse};
use crate::routes::{Deadline, body_bytes, new_meta, start_generation, with_request_id};
use crate::state::AppState;
use crate::validate::{self, GenFields, field, opt_bool};

/// The prompt as sent: text to tokenize or ids to pass through.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    pub fields: GenFields,
}

/// The legacy completions form of log-probabilities: parallel arrays, one entry per
/// token; `top_logprobs` maps token text to log-probability; `text_offset` is where each
/// token's text starts in the completion (in characters; a token that starts inside a
/// multi-byte character points at that character).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LegacyLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<Map<String, Value>>,
    pub text_offset: Vec<usize>,
}

impl LegacyLogprobs {
    /// Appends entries; `seen` holds the bytes of every token so far (for the offsets).
    fn extend(&mut self, entries: Vec<TokenLogprob>, seen: &mut Vec<u8>) {
        for e in entries {
            let complete = match std::str::from_utf8(seen) {
                Ok(text) => text,
                Err(err) => std::str::from_utf8(&seen[..err.valid_up_to()]).unwrap_or_default(),
            };
            self.text_offset.push(complete.chars().count());
            seen.extend_from_slice(&e.bytes);
            self.token_logprobs.push(e.logprob);
            self.top_logprobs.push(e.top_logprobs.into_iter().map(|t| (t.token, Value::from(t.logprob))).collect());
            self.tokens.push(e.token);
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct TextChoice {
    pub text: String,
    pub index: u32,
    pub logprobs: Option<LegacyLogprobs>,
    pub finish_reason: Option<FinishReason>,
}

/// A `text_completion` object, whole or as one stream chunk.
#[derive(Debug, Clone, Serialize)]
pub struct TextCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<TextChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

fn text_completion(meta: &CompletionMeta, choices: Vec<TextChoice>, usage: Option<Usage>) -> TextCompletion {
    TextCompletion {
        id: meta.id.clone(),
        object: "text_completion",
        created: meta.created,
        model: meta.model.clone(),
        choices,
        usage,
    }
}

fn choice(text: String, finish_reason: Option<FinishReason>) -> TextChoice {
    TextChoice { text, index: 0, logprobs: None, finish_reason }
}

pub fn parse_completion_request(body: &[u8], limits: &validate::Limits) -> Result<CompletionRequest, GatewayError> {
    let obj = validate::parse_object(body)?;
    let prompt = parse_prompt(
        field(&obj, "prompt").ok_or_else(|| GatewayError::invalid("Missing required parameter: 'prompt'", "prompt"))?,
    )?;
    reject_unsupported(&obj)?;
    let mut fields = validate::parse_gen_fields(&obj, limits)?;
    fields.sampling.logprobs = parse_logprobs(&obj, limits)?;
    Ok(CompletionRequest { prompt, fields })
}

fn reject_unsupported(obj: &Map<String, Value>) -> Result<(), GatewayError> {
    if opt_bool(obj, "echo")? == Some(true) {
        return Err(GatewayError::invalid("echo is not supported", "echo"));
    }
    match field(obj, "suffix") {
        None => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(_) => return Err(GatewayError::invalid("suffix is not supported", "suffix")),
    }
    if let Some(v) = field(obj, "best_of")
        && v.as_i64() != Some(1)
    {
        return Err(GatewayError::invalid("Only best_of=1 is supported", "best_of"));
    }
    Ok(())
}

/// This API's own bound on `logprobs` (OpenAI's), below the engine's.
const MAX_COMPLETION_LOGPROBS: u32 = 5;

/// In this API `logprobs` is an integer: how many alternatives besides the sampled token
/// (0 gives the sampled token's log-probability only).
fn parse_logprobs(obj: &Map<String, Value>, limits: &validate::Limits) -> Result<Option<u32>, GatewayError> {
    let most = MAX_COMPLETION_LOGPROBS.min(limits.max_top_logprobs);
    match field(obj, "logprobs") {
        None | Some(Value::Bool(false)) => Ok(None),
        Some(v) => match v.as_i64() {
            Some(n) if (0..=most as i64).contains(&n) => Ok(Some(n as u32)),
            _ => Err(GatewayError::invalid(format!("'logprobs' must be an integer in [0, {most}]"), "logprobs")),
        },
    }
}

fn parse_prompt(value: &Value) -> Result<Prompt, GatewayError> {
    let bad = || {
        GatewayError::invalid(
            "'prompt' must be a string, an array of token ids, or a one-element array of either",
            "prompt",
        )
    };
    let prompt = match value {
        Value::String(s) => Prompt::Text(s.clone()),
        Value::Array(items) => match items.first() {
            None => {
                return Err(GatewayError::invalid("'prompt' must not be empty", "prompt"));
            }
            Some(Value::Number(_)) => Prompt::Tokens(token_ids(items).ok_or_else(bad)?),
            Some(inner @ (Value::String(_) | Value::Array(_))) => {
                if items.len() > 1 {
                    return Err(GatewayError::invalid(
                        "Only one prompt per request is supported: send one request per prompt",
                        "prompt",
                    ));
                }
                match inner {
                    Value::String(s) => Prompt::Text(s.clone()),
                    Value::Array(ids) => Prompt::Tokens(token_ids(ids).ok_or_else(bad)?),
                    _ => return Err(bad()),
                }
            }
            Some(_) => return Err(bad()),
        },
        _ => return Err(bad()),
    };
    match &prompt {
        Prompt::Text(s) if s.is_empty() => Err(GatewayError::invalid("'prompt' must not be empty", "prompt")),
        Prompt::Tokens(ids) if ids.is_empty() => Err(GatewayError::invalid("'prompt' must not be empty", "prompt")),
        _ => Ok(prompt),
    }
}

fn token_ids(items: &[Value]) -> Option<Vec<u32>> {
    items.iter().map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok())).collect()
}

pub(crate) async fn completions(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let clock = Deadline::from_now(&state);
    let (deadline, timeout_secs) = (clock.at, clock.secs);
    let (generation, request, meta) = match clock.run(start(&state, &headers, body, clock.arrival)).await {
        Ok(started) => started,
        Err(e) => return e.into_response(),
    };
    let resp = if request.fields.stream {
        stream(
            generation,
            meta.clone(),
            request.fields.include_usage,
            request.fields.sampling.logprobs.is_some(),
            deadline,
            timeout_secs,
        )
        .into_response()
    } else {
        match tokio::time::timeout_at(deadline, collect(generation, &meta, request.fields.sampling.logprobs.is_some()))
            .await
        {
            Ok(Ok(completion)) => Json(completion).into_response(),
            Ok(Err(e)) => e.into_response(),
            Err(_) => GatewayError::Timeout(timeout_secs).into_response(),
        }
    };
    with_request_id(resp, &meta.id)
}

async fn start(
    state: &AppState,
    headers: &axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
    arrival: Instant,
) -> Result<(Generation, CompletionRequest, CompletionMeta), GatewayError> {
    let permit = state.admit().await?;
    let body = body_bytes(state, body)?;
    let request = parse_completion_request(&body, &state.model().limits)?;
    let model = state.model();
    state.check_model(request.fields.model.as_deref())?;
    let prompt_ids = match &request.prompt {
        Prompt::Tokens(ids) => ids.clone(),
        Prompt::Text(text) => {
            let tokenizer = state.inner.text.tokenizer.clone();
            let text = text.clone();
            tokio::task::spawn_blocking(move || tokenizer.encode(&text))
                .await
                .map_err(|e| GatewayError::Internal(format!("tokenize task failed: {e}")))?
                .map_err(|e| GatewayError::Internal(e.to_string()))?
        }
    };
    let meta = new_meta("cmpl", &model.id);
    let fields = GenFields { session_id: crate::routes::session_id(headers), ..request.fields.clone() };
    let generation = start_generation(
        state,
        &meta,
        crate::text::Prompt { ids: prompt_ids, snapshot_hints: Vec::new() },
        &fields,
        arrival,
        permit,
    )
    .await
    .map_err(|e| match e {
        // The shared context check speaks of messages; here the input is `prompt`.
        GatewayError::ContextLengthExceeded { message, param } => GatewayError::ContextLengthExceeded {
            message: message.replace("the messages", "the prompt"),
            param: if param == "messages" { "prompt".into() } else { param },
        },
        e => e,
    })?;
    Ok((generation, request, meta))
}

async fn collect(
    mut generation: Generation,
    meta: &CompletionMeta,
    wants_logprobs: bool,
) -> Result<TextCompletion, GatewayError> {
    let mut text = String::new();
    let (mut logprobs, mut seen) = (LegacyLogprobs::default(), Vec::new());
    while let Some(event) = generation.next().await? {
        match event {
            GenEvent::Logprobs(entries) => logprobs.extend(entries, &mut seen),
            GenEvent::Text(t) => text.push_str(&t),
            GenEvent::Finished { reason, usage, .. } => {
                let mut choice = choice(text, Some(reason));
                choice.logprobs = wants_logprobs.then_some(logprobs);
                return Ok(text_completion(meta, vec![choice], Some(usage)));
            }
        }
    }
    Err(GatewayError::EngineProtocol("generation ended without a finish".into()))
}

fn stream(
    mut generation: Generation,
    meta: CompletionMeta,
    include_usage: bool,
    wants_logprobs: bool,
    deadline: Instant,
    timeout_secs: u64,
) -> Sse<impl futures::Stream<Item = Result<Event, Infallible>>> {
    // Entries not sent yet ride on the next chunk (text or finish).
    let (mut unsent, mut seen) = (LegacyLogprobs::default(), Vec::new());
    let take_unsent = move |unsent: &mut LegacyLogprobs| {
        wants_logprobs.then(|| std::mem::take(unsent)).filter(|l| !l.tokens.is_empty())
    };
    let events = async_stream::stream! {
        loop {
            match generation.next_before(deadline, timeout_secs).await {
                Err(e) => {
                    yield Ok(sse::error_event(&e));
                    break;
                }
                Ok(None) => break,
                Ok(Some(GenEvent::Logprobs(entries))) => unsent.extend(entries, &mut seen),
                Ok(Some(GenEvent::Text(text))) => {
                    let mut c = choice(text, None);
                    c.logprobs = take_unsent(&mut unsent);
                    yield Ok(sse::json_event(&text_completion(&meta, vec![c], None)));
                }
                Ok(Some(GenEvent::Finished { reason, usage, .. })) => {
                    let mut c = choice(String::new(), Some(reason));
                    c.logprobs = take_unsent(&mut unsent);
                    yield Ok(sse::json_event(&text_completion(&meta, vec![c], None)));
                    if include_usage {
                        yield Ok(sse::json_event(&text_completion(&meta, Vec::new(), Some(usage))));
                    }
                }
            }
        }
        yield Ok(sse::done_event());
    };
    Sse::new(events).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<CompletionRequest, GatewayError> {
        parse_completion_request(v.to_string().as_bytes(), &validate::test_limits())
    }

    fn param(v: Value) -> Option<String> {
        parse(v).unwrap_err().to_body().error.param
    }

    #[test]
    fn prompt_forms() {
        assert_eq!(parse(json!({"prompt": "Once"})).unwrap().prompt, Prompt::Text("Once".into()));
        assert_eq!(parse(json!({"prompt": ["Once"]})).unwrap().prompt, Prompt::Text("Once".into()));
        assert_eq!(parse(json!({"prompt": [1, 2, 3]})).unwrap().prompt, Prompt::Tokens(vec![1, 2, 3]));
        assert_eq!(parse(json!({"prompt": [[4, 5]]})).unwrap().prompt, Prompt::Tokens(vec![4, 5]));
        for bad in [
            json!({}),
            json!({"prompt": ""}),
            json!({"prompt": []}),
            json!({"prompt": ["a", "b"]}),
            json!({"prompt": [1, -2]}),
            json!({"prompt": [1, "x"]}),
            json!({"prompt": [5_000_000_000u64]}),
            json!({"prompt": {"text": "x"}}),
        ] {
            assert_eq!(param(bad.clone()).as_deref(), Some("prompt"), "{bad}");
        }
    }

    #[test]
    fn unsupported_options_are_400s_naming_the_field() {
        let base = |extra: Value| {
            let mut v = json!({"prompt": "x"});
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            v
        };
        for (extra, name) in [
            (json!({"echo": true}), "echo"),
            (json!({"suffix": "end"}), "suffix"),
            (json!({"best_of": 3}), "best_of"),
            (json!({"logprobs": 6}), "logprobs"),
            (json!({"logprobs": -1}), "logprobs"),
            (json!({"logprobs": "3"}), "logprobs"),
            (json!({"n": 2}), "n"),
            (json!({"stop": 3}), "stop"),
        ] {
            assert_eq!(param(base(extra.clone())).as_deref(), Some(name), "{extra}");
        }
        let ok = parse(base(json!({"echo": false, "logprobs": null, "stop": ["a", "b"],
            "max_completion_tokens": 9, "seed": 3, "user": "u1"})))
        .unwrap();
        assert_eq!(ok.fields.stop, ["a", "b"]);
        assert_eq!(ok.fields.sampling.max_tokens, Some(9));
        assert_eq!(ok.fields.user.as_deref(), Some("u1"));
        assert_eq!(ok.fields.sampling.logprobs, None);
        let lp = parse(base(json!({"logprobs": 3}))).unwrap();
        assert_eq!(lp.fields.sampling.logprobs, Some(3));
        let lp0 = parse(base(json!({"logprobs": 0}))).unwrap();
        assert_eq!(lp0.fields.sampling.logprobs, Some(0));
    }
}
