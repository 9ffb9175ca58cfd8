//! Golden transcripts of the gateway's OpenAI and Anthropic output, driven by the scripted
//! engine.
//!
//! Each test sends a fixed list of requests and compares the whole exchange (request,
//! status, content type, body) with a committed file under `gateway/tests/golden/`. Bodies
//! are normalized so the files are stable: every `"id"`, `"item_id"` and `"call_id"` string
//! becomes `"<id>"` and every `"created"` / `"created_at"` number `0`; JSON is re-serialized (pretty for plain bodies, one line per SSE
//! event). Run with `EDGE_UPDATE_GOLDEN=1` to rewrite the files after an intended change.

use super::*;

/// A streamed SSE body or a plain one, normalized for comparison.
fn normalize_value(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (key, val) in map.iter_mut() {
                match (key.as_str(), &*val) {
                    ("id" | "item_id" | "call_id", Value::String(_)) => *val = Value::String("<id>".into()),
                    ("created" | "created_at", Value::Number(_)) => *val = json!(0),
                    _ => normalize_value(val),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(normalize_value),
        _ => {}
    }
}

fn normalize_json(text: &str, pretty: bool) -> String {
    match serde_json::from_str::<Value>(text) {
        Ok(mut v) => {
            normalize_value(&mut v);
            if pretty { serde_json::to_string_pretty(&v).unwrap() } else { v.to_string() }
        }
        // Not JSON (`[DONE]`, a plain-text body): verbatim.
        Err(_) => text.to_owned(),
    }
}

/// One exchange as transcript text.
async fn exchange(state: &AppState, method: &str, path: &str, body: Option<&str>) -> String {
    exchange_with(state, method, path, body, &[]).await
}

async fn exchange_with(
    state: &AppState,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> String {
    let mut req = Request::builder().method(method).uri(path);
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(body.map_or_else(Body::empty, |b| Body::from(b.to_owned()))).unwrap();
    let resp = app(state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let content_type = resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 24).await.unwrap();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let rendered = if content_type.starts_with("text/event-stream") {
        // Keep the framing: a line per `event:` / `data:` line, anything not `data:` verbatim.
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .flat_map(|e| e.lines())
            .map(|line| match line.strip_prefix("data: ") {
                Some(data) => format!("data: {}", normalize_json(data, false)),
                None => line.to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        normalize_json(&text, true)
    };
    let mut out = format!("> {method} {path}\n");
    for (k, v) in headers {
        out.push_str(&format!("> {k}: {v}\n"));
    }
    if let Some(b) = body {
        out.push_str(&format!("> {b}\n"));
    }
    out.push_str(&format!("< {}\n< content-type: {content_type}\n{rendered}\n\n", status.as_u16()));
    out
}

/// Compares `actual` with `gateway/tests/golden/<name>.txt`, or rewrites it under
/// `EDGE_UPDATE_GOLDEN=1`.
fn check_golden(name: &str, actual: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(format!("{name}.txt"));
    if std::env::var("EDGE_UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run with EDGE_UPDATE_GOLDEN=1 to create it", path.display()));
    if expected != actual {
        let first_diff = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(expected.lines().count().min(actual.lines().count()));
        panic!(
            "{} differs from the output (first at line {}; EDGE_UPDATE_GOLDEN=1 rewrites it)\n--- actual ---\n{actual}",
            path.display(),
            first_diff + 1
        );
    }
}

/// A scripted engine answering `answer` then finishing with `reason`, through `template`.
async fn golden_engine(
    answer: &str,
    reason: WireFinish,
    cached: u32,
    hold_open: bool,
    template: &str,
    tweak: impl FnOnce(&mut Config),
) -> (AppState, Arc<Record>) {
    let (mut script, n) = answer_script(answer);
    script.push(finished(reason, n, cached));
    let (state, record) = start_engine(script, hold_open).await;
    let mut config = state.config().clone();
    tweak(&mut config);
    let engine = EngineClient::new(&config.engine_endpoints[0]).unwrap();
    let mut model = info(8192);
    model.chat_template = template.into();
    (AppState::from_info(config, engine, model).unwrap(), record)
}

const CHAT: &str = "/v1/chat/completions";

#[tokio::test]
async fn golden_plain_chat() {
    let (state, _) = golden_engine(ANSWER, WireFinish::Stop, 5, false, CHATML, |_| {}).await;
    let body = chat_body(json!({"seed": 7, "temperature": 0.5, "user": "u-1"}));
    check_golden("plain_chat", &exchange(&state, "POST", CHAT, Some(&body)).await);
}

#[tokio::test]
async fn golden_streamed_chat_with_usage() {
    let (state, _) = golden_engine(ANSWER, WireFinish::Length, 3, false, CHATML, |_| {}).await;
    let body = chat_body(json!({"stream": true, "stream_options": {"include_usage": true}}));
    let mut t = exchange(&state, "POST", CHAT, Some(&body)).await;
    // Without include_usage there is no usage chunk.
    let body = chat_body(json!({"stream": true}));
    t += &exchange(&state, "POST", CHAT, Some(&body)).await;
    check_golden("streamed_chat_usage", &t);
}

async fn tool_transcript(answer: &str, template: &str, extra: Value, stream: bool) -> String {
    let (state, _) = golden_engine(answer, WireFinish::Stop, 0, false, template, |_| {}).await;
    let mut fields = json!({"tools": [weather()], "stream": stream});
    fields.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    let body = chat_body(fields);
    exchange(&state, "POST", CHAT, Some(&body)).await
}

const JSON_CALL: &str =
    "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
const XML_CALL: &str = "I'll check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";
const BARE_CALL: &str = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}";
const NO_THINKING: &str = r#"{"chat_template_kwargs": {"enable_thinking": false}}"#;

#[tokio::test]
async fn golden_tool_call_json() {
    let t = tool_transcript(JSON_CALL, HERMES, json!({}), false).await;
    check_golden("tool_call_json", &t);
}

#[tokio::test]
async fn golden_tool_call_qwen_xml() {
    let extra: Value = serde_json::from_str(NO_THINKING).unwrap();
    let t = tool_transcript(XML_CALL, QWEN, extra, false).await;
    check_golden("tool_call_qwen_xml", &t);
}

#[tokio::test]
async fn golden_tool_call_generic_fallback() {
    let t = tool_transcript(BARE_CALL, CHATML, json!({"tool_choice": "required"}), false).await;
    check_golden("tool_call_generic", &t);
}

#[tokio::test]
async fn golden_streamed_tool_calls() {
    let extra: Value = serde_json::from_str(NO_THINKING).unwrap();
    let mut t = tool_transcript(JSON_CALL, HERMES, json!({}), true).await;
    t += &tool_transcript(XML_CALL, QWEN, extra, true).await;
    t += &tool_transcript(BARE_CALL, CHATML, json!({"tool_choice": "required"}), true).await;
    check_golden("streamed_tool_calls", &t);
}

#[tokio::test]
async fn golden_stop_string_split_across_chunks() {
    // "wörld" spans several 1-3 token chunks (and a split multi-byte character).
    let mut t = String::new();
    for stream in [false, true] {
        let (state, _) = golden_engine(ANSWER, WireFinish::Stop, 0, true, CHATML, |_| {}).await;
        let body = chat_body(json!({"stop": ["wörld", "zzz"], "stream": stream}));
        t += &exchange(&state, "POST", CHAT, Some(&body)).await;
    }
    check_golden("stop_split_across_chunks", &t);
}

#[tokio::test]
async fn golden_n_and_logprobs() {
    let (state, _) = golden_engine("ok", WireFinish::Stop, 0, false, CHATML, |_| {}).await;
    let mut t = String::new();
    // Accepted: the values that ask for nothing unsupported.
    let body = chat_body(json!({"n": 1, "logprobs": false, "top_logprobs": 0}));
    t += &exchange(&state, "POST", CHAT, Some(&body)).await;
    for extra in [
        json!({"n": 2}),
        json!({"n": 0}),
        json!({"n": "two"}),
        json!({"logprobs": "yes"}),
        json!({"top_logprobs": 2}),
        json!({"logprobs": true, "top_logprobs": 21}),
        json!({"logprobs": true, "top_logprobs": -1}),
    ] {
        t += &exchange(&state, "POST", CHAT, Some(&chat_body(extra))).await;
    }
    check_golden("n_and_logprobs", &t);
}

/// Log-probabilities in both endpoints, whole and streamed: the engine's values with the
/// token text and bytes (the answer splits multi-byte characters across tokens).
#[tokio::test]
async fn golden_logprobs() {
    let mut t = String::new();
    for stream in [false, true] {
        let (mut script, n) = answer_script_with_logprobs(ANSWER);
        script.push(finished(WireFinish::Stop, n, 0));
        let (state, record) = start_engine(script, false).await;
        let body = chat_body(json!({"logprobs": true, "top_logprobs": 2, "stream": stream}));
        t += &exchange(&state, "POST", CHAT, Some(&body)).await;
        let sent = &record.requests.lock().unwrap()[0];
        let sampling = sent.sampling.clone().unwrap();
        assert!(sampling.logprobs && sampling.top_logprobs == 2, "{sampling:?}");
    }
    for stream in [false, true] {
        let (mut script, n) = answer_script_with_logprobs(ANSWER);
        script.push(finished(WireFinish::Stop, n, 0));
        let (state, _) = start_engine(script, false).await;
        let body = json!({"model": MODEL, "prompt": "Hi", "logprobs": 1, "stream": stream}).to_string();
        t += &exchange(&state, "POST", "/v1/completions", Some(&body)).await;
    }
    check_golden("logprobs", &t);
}

#[tokio::test]
async fn golden_error_statuses() {
    let mut t = String::new();
    // 400: bad JSON, a wrong type, a prompt past the context.
    let state = offline_state(Config::default(), 8192);
    t += &exchange(&state, "POST", CHAT, Some("{\"messages\": [")).await;
    let body = chat_body(json!({"temperature": "warm"}));
    t += &exchange(&state, "POST", CHAT, Some(&body)).await;
    let small = offline_state(Config::default(), 32);
    t += &exchange(&small, "POST", CHAT, Some(&chat_body(json!({})))).await;
    // 401: missing and wrong keys.
    let keyed = offline_state(Config { api_keys: vec!["sk-test-1".into()], ..Config::default() }, 8192);
    t += &exchange(&keyed, "GET", "/v1/models", None).await;
    let wrong = [("authorization", "Bearer sk-wrong")];
    t += &exchange_with(&keyed, "GET", "/v1/models", None, &wrong).await;
    // 404: unknown model (strict mode), unknown route.
    let strict = offline_state(Config { strict_model_names: true, ..Config::default() }, 8192);
    let body = chat_body(json!({"model": "gpt-4o"}));
    t += &exchange(&strict, "POST", CHAT, Some(&body)).await;
    t += &exchange(&state, "GET", "/v1/nope", None).await;
    // 413: body over the limit.
    let tiny = offline_state(Config { max_body_bytes: 64, ..Config::default() }, 8192);
    let big = chat_body(json!({"padding": "x".repeat(100)}));
    t += &exchange(&tiny, "POST", CHAT, Some(&big)).await;
    // 429: the engine's queue is full; then the gateway's own limit while a stream is open.
    let (busy, _) = start_engine(vec![Err(Status::resource_exhausted("queue full"))], false).await;
    t += &exchange(&busy, "POST", CHAT, Some(&chat_body(json!({})))).await;
    let (script, _) = answer_script("hello");
    let (limited, _) = start_engine_with(script, true, |c| {
        c.max_concurrent_requests = 1;
        c.max_queued_requests = 0;
    })
    .await;
    let open = app(limited.clone()).oneshot(post_chat(chat_body(json!({"stream": true})))).await.unwrap();
    assert_eq!(open.status(), StatusCode::OK);
    t += &exchange(&limited, "POST", CHAT, Some(&chat_body(json!({})))).await;
    drop(open);
    // 503: no engine reachable, streamed or not.
    t += &exchange(&state, "POST", CHAT, Some(&chat_body(json!({})))).await;
    let body = chat_body(json!({"stream": true}));
    t += &exchange(&state, "POST", CHAT, Some(&body)).await;
    // 504: the request deadline passes before the engine answers.
    let (slow, _) = start_engine_with(Vec::new(), true, |c| c.request_timeout = Duration::from_millis(300)).await;
    t += &exchange(&slow, "POST", CHAT, Some(&chat_body(json!({})))).await;
    // After streaming began: an error event, then [DONE].
    let (mut script, _) = answer_script("hello");
    script.truncate(2);
    script.push(Err(Status::internal("kv arena exploded")));
    let (failing, _) = start_engine(script, false).await;
    let body = chat_body(json!({"stream": true}));
    t += &exchange(&failing, "POST", CHAT, Some(&body)).await;
    check_golden("error_statuses", &t);
}

/// The Responses API: a function call whole and streamed (Qwen XML), a streamed answer cut by
/// the token limit (`response.incomplete`), and a 400.
#[tokio::test]
async fn golden_responses() {
    const PATH: &str = "/v1/responses";
    let tools = json!([{"type": "function", "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]);
    let (state, _) = golden_engine(XML_CALL, WireFinish::Stop, 4, false, QWEN, |_| {}).await;
    let mut t = String::new();
    for stream in [false, true] {
        let body = json!({"model": MODEL, "instructions": "Be brief.", "input": "Weather in Paris?", "tools": tools,
            "reasoning": {"effort": "none"}, "stream": stream});
        t += &exchange(&state, "POST", PATH, Some(&body.to_string())).await;
    }
    let (cut, _) = golden_engine("héllo wörld", WireFinish::Length, 0, false, CHATML, |_| {}).await;
    let body = json!({"input": [{"role": "user", "content": "Hi"}], "max_output_tokens": 5, "stream": true});
    t += &exchange(&cut, "POST", PATH, Some(&body.to_string())).await;
    let body = json!({"input": "Hi", "previous_response_id": "resp_1"});
    t += &exchange(&cut, "POST", PATH, Some(&body.to_string())).await;
    check_golden("responses", &t);
}

/// Anthropic Messages: a tool_use whole and streamed (Qwen XML), a streamed stop sequence, and
/// a 400 with Anthropic's error body.
#[tokio::test]
async fn golden_messages() {
    const PATH: &str = "/v1/messages";
    let tools = json!([{"name": "get_weather", "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]);
    let (state, _) = golden_engine(XML_CALL, WireFinish::Stop, 4, false, QWEN, |_| {}).await;
    let mut t = String::new();
    for stream in [false, true] {
        let body = json!({"model": MODEL, "max_tokens": 64, "system": "Be brief.", "tools": tools,
            "thinking": {"type": "disabled"}, "stream": stream,
            "messages": [{"role": "user", "content": "Weather in Paris?"}]});
        t += &exchange(&state, "POST", PATH, Some(&body.to_string())).await;
    }
    let (stop, _) = golden_engine(ANSWER, WireFinish::Stop, 0, false, CHATML, |_| {}).await;
    let body = json!({"max_tokens": 32, "stop_sequences": ["wörld"], "stream": true,
        "messages": [{"role": "user", "content": "Hi"}]});
    t += &exchange(&stop, "POST", PATH, Some(&body.to_string())).await;
    let body = json!({"messages": [{"role": "user", "content": "Hi"}]});
    t += &exchange(&stop, "POST", PATH, Some(&body.to_string())).await;
    check_golden("messages", &t);
}
