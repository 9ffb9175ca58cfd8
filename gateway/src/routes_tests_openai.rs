//! The wider OpenAI surface against the scripted engine: tool calls in each format (whole
//! and streamed), `/v1/completions`, API keys, the messages limit, the bounded queue.

use super::*;

const WEATHER_TOOL: &str = r#"{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}"#;

/// A ChatML template that renders tools and calls in the Hermes JSON form.
const HERMES: &str = "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\nCall as <tool_call>{\"name\": .., \"arguments\": ..}</tool_call><|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n";

const QWEN: &str = include_str!("text/testdata/qwen3_5.jinja");

fn weather() -> Value {
    serde_json::from_str(WEATHER_TOOL).unwrap()
}

/// A scripted engine answering `answer`, served through `template`.
async fn engine_with_template(
    answer: &str,
    hold_open: bool,
    template: &str,
    tweak: impl FnOnce(&mut Config),
) -> (AppState, Arc<Record>) {
    let (mut script, n) = answer_script(answer);
    script.push(finished(WireFinish::Stop, n, 0));
    let (state, record) = start_engine(script, hold_open).await;
    let mut config = state.config().clone();
    tweak(&mut config);
    let engine = EngineClient::new(&config.engine_endpoints[0]).unwrap();
    let mut model = info(8192);
    model.chat_template = template.into();
    (AppState::from_info(config, engine, model).unwrap(), record)
}

/// The prompt sent to the engine, decoded (special tokens such as `<|im_start|>` dropped).
fn sent_prompt(record: &Record) -> String {
    let ids = record.requests.lock().unwrap()[0].prompt_token_ids.clone();
    test_tokenizer::tokenizer().decode(&ids).unwrap()
}

async fn streamed(state: &AppState, path: &str, body: String) -> Vec<Value> {
    let req = Request::post(path).header("content-type", "application/json").body(Body::from(body)).unwrap();
    let (status, text) = call(state, req).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    sse_payloads(&text)
}

#[tokio::test]
async fn hermes_json_tool_call_is_returned_with_the_models_arguments_text() {
    let answer = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let (state, record) = engine_with_template(answer, false, HERMES, |_| {}).await;
    let body = chat_body(json!({"tools": [weather()]}));
    let (status, resp) = call(&state, post_chat(body)).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let v: Value = serde_json::from_str(&resp).unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert!(choice["message"]["content"].is_null(), "{resp}");
    let call0 = &choice["message"]["tool_calls"][0];
    assert!(call0["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(call0["type"], "function");
    assert_eq!(call0["function"]["name"], "get_weather");
    // The arguments are the model's own text (streamable as it arrives), not re-serialized.
    assert_eq!(call0["function"]["arguments"], r#"{"city": "Paris"}"#);
    // The template rendered the tool definitions itself.
    assert!(sent_prompt(&record).contains(r#"<tools>{"type": "function", "function": {"name": "get_weather""#));
}

#[tokio::test]
async fn qwen_xml_tool_call_streams_name_then_arguments() {
    let answer = "I'll check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";
    let (state, record) = engine_with_template(answer, false, QWEN, |_| {}).await;
    let body = chat_body(json!({"tools": [weather()], "stream": true,
        "chat_template_kwargs": {"enable_thinking": false}}));
    let events = streamed(&state, "/v1/chat/completions", body).await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    let deltas: Vec<&Value> = events.iter().filter_map(|e| e.get("choices")).map(|c| &c[0]).collect();
    assert_eq!(deltas[0]["delta"]["role"], "assistant");
    let content: String = deltas.iter().filter_map(|d| d["delta"]["content"].as_str()).collect();
    assert_eq!(content, "I'll check.");
    let calls: Vec<&Value> = deltas.iter().filter_map(|d| d["delta"].get("tool_calls")).collect();
    // Start, one fragment per parameter, the closing brace.
    assert_eq!(calls.len(), 3, "{events:?}");
    let head = &calls[0][0];
    assert_eq!(head["index"], 0);
    assert!(head["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(head["type"], "function");
    assert_eq!(head["function"], json!({"name": "get_weather", "arguments": ""}));
    assert_eq!(calls[1][0], json!({"index": 0, "function": {"arguments": "{\"city\":\"Paris\""}}));
    assert_eq!(calls[2][0], json!({"index": 0, "function": {"arguments": "}"}}));
    assert_eq!(deltas.last().unwrap()["finish_reason"], "tool_calls");
    let prompt = sent_prompt(&record);
    assert!(prompt.contains("<function=example_function_name>"), "{prompt}");
    assert!(prompt.contains("\"name\": \"get_weather\""));
}

#[tokio::test]
async fn generic_fallback_injects_tools_and_parses_a_bare_json_call() {
    let answer = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}";
    let (state, record) = engine_with_template(answer, false, CHATML, |_| {}).await;
    let body = chat_body(json!({"tools": [weather()], "tool_choice": "required"}));
    let (status, resp) = call(&state, post_chat(body)).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let v: Value = serde_json::from_str(&resp).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], r#"{"city":"Oslo"}"#);
    let prompt = sent_prompt(&record);
    assert!(prompt.starts_with("system\nYou can call the following functions."), "{prompt}");
    assert!(prompt.contains("You must call at least one of the functions."));
}

#[tokio::test]
async fn tool_choice_none_keeps_call_text_as_content_and_history_round_trips() {
    let answer = "<tool_call>{\"name\": \"get_weather\"}</tool_call>";
    let (state, record) = engine_with_template(answer, false, HERMES, |_| {}).await;
    let body = json!({"model": MODEL, "tools": [weather()], "tool_choice": "none", "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}
    ]});
    let (status, resp) = call(&state, post_chat(body.to_string())).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let v: Value = serde_json::from_str(&resp).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], answer);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["choices"][0]["message"].get("tool_calls").is_none());
    let prompt = sent_prompt(&record);
    assert!(!prompt.contains("<tools>"), "tool_choice none hides the tools: {prompt}");
    assert!(prompt.contains("assistant\n\ntool\nSunny\n"), "{prompt}");
}

#[tokio::test]
async fn logprobs_and_json_mode_are_handled_as_documented() {
    let (state, record) = engine_with_template("{\"a\": 1}", false, CHATML, |_| {}).await;
    for (extra, param) in [
        (json!({"top_logprobs": 2}), "logprobs"),
        (json!({"logprobs": true, "top_logprobs": 99}), "top_logprobs"),
        (json!({"response_format": {"type": "json_schema"}}), "response_format.json_schema"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format.json_schema.schema",
        ),
        (json!({"response_format": {"type": "yaml"}}), "response_format"),
    ] {
        let (status, body) = call(&state, post_chat(chat_body(extra.clone()))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra}");
        assert_eq!(error_of(&body)["param"], param, "{body}");
    }
    let body = chat_body(json!({"response_format": {"type": "json_object"}, "user": "u-1"}));
    let (status, resp) = call(&state, post_chat(body)).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    assert!(sent_prompt(&record).contains("Respond with a single valid JSON object"));
    // Enforced by the engine: a grammar for any JSON object, then for the schema.
    let grammar = |i: usize| match record.requests.lock().unwrap()[i].grammar.clone().and_then(|g| g.kind) {
        Some(proto::engine::v1::grammar::Kind::JsonSchema(s)) => serde_json::from_str::<Value>(&s).unwrap(),
        other => panic!("no JSON-schema grammar: {other:?}"),
    };
    assert_eq!(grammar(0), json!({"type": "object"}));
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
    let body = chat_body(json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "thing", "strict": true, "schema": schema}}}));
    let (status, resp) = call(&state, post_chat(body)).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    assert_eq!(grammar(1), schema);
    let prompt = {
        let ids = record.requests.lock().unwrap()[1].prompt_token_ids.clone();
        test_tokenizer::tokenizer().decode(&ids).unwrap()
    };
    assert!(prompt.contains("matches this JSON schema: {"), "{prompt}");
    // With tools offered the format is asked for but not enforced (it would forbid calls).
    let body = chat_body(json!({"response_format": {"type": "json_object"}, "tools": [weather()]}));
    assert_eq!(call(&state, post_chat(body)).await.0, StatusCode::OK);
    assert!(record.requests.lock().unwrap()[2].grammar.is_none());
    // Asked for: forwarded to the engine (which reports nothing here: an empty list).
    let body = chat_body(json!({"logprobs": true, "top_logprobs": 4}));
    let (status, resp) = call(&state, post_chat(body)).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let v: Value = serde_json::from_str(&resp).unwrap();
    assert_eq!(v["choices"][0]["logprobs"]["content"], json!([]));
    let sent = record.requests.lock().unwrap().last().unwrap().sampling.clone().unwrap();
    assert!(sent.logprobs && sent.top_logprobs == 4, "{sent:?}");
}

#[tokio::test]
async fn text_completions_take_text_or_token_ids_and_stream() {
    let (state, record) = engine_with_template(ANSWER, false, CHATML, |_| {}).await;
    let post = |body: Value| {
        Request::post("/v1/completions")
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let (status, resp) = call(&state, post(json!({"prompt": "Once upon", "max_tokens": 50, "seed": 1}))).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let v: Value = serde_json::from_str(&resp).unwrap();
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["choices"][0]["text"], ANSWER);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert!(v["choices"][0]["logprobs"].is_null());
    assert_eq!(sent_prompt(&record), "Once upon");
    let (status, _) = call(&state, post(json!({"prompt": [104, 105]}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(record.requests.lock().unwrap()[1].prompt_token_ids, [104, 105]);
    let events = streamed(
        &state,
        "/v1/completions",
        json!({"prompt": "x", "stream": true, "stream_options": {"include_usage": true}}).to_string(),
    )
    .await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    let text: String = events.iter().filter_map(|e| e["choices"][0]["text"].as_str()).collect();
    assert_eq!(text, ANSWER);
    assert!(events.iter().all(|e| e == "[DONE]" || e["object"] == "text_completion"));
    let usage = &events[events.len() - 2];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["prompt_tokens"], 1);
    let long: Vec<u32> = vec![104; 8192];
    let (status, body) = call(&state, post(json!({"prompt": long}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error_of(&body)["param"], "prompt");
    assert_eq!(error_of(&body)["code"], "context_length_exceeded");
    let (status, body) = call(&state, post(json!({"prompt": "x", "n": 3}))).await;
    assert_eq!((status, error_of(&body)["param"].clone()), (StatusCode::BAD_REQUEST, json!("n")));
}

#[tokio::test]
async fn api_keys_gate_v1_routes_with_openai_401s() {
    let (state, _) = engine_with_template("ok", false, CHATML, |c| {
        c.api_keys = vec!["sk-test-1".into()];
    })
    .await;
    let models = |auth: Option<&str>| {
        let mut r = Request::get("/v1/models");
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        r.body(Body::empty()).unwrap()
    };
    for auth in [None, Some("Bearer sk-wrong"), Some("sk-test-1"), Some("Bearer sk-test-")] {
        let (status, body) = call(&state, models(auth)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{auth:?}");
        assert_eq!(error_of(&body)["code"], "invalid_api_key");
        assert_eq!(error_of(&body)["type"], "invalid_request_error");
    }
    let (status, _) = call(&state, models(Some("Bearer sk-test-1"))).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call(&state, post_chat(chat_body(json!({})))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = call(&state, Request::get("/health").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK, "health stays open");
}

#[tokio::test]
async fn too_many_messages_is_a_400() {
    let (state, _) = engine_with_template("ok", false, CHATML, |c| c.max_messages = 2).await;
    let msgs: Vec<Value> = (0..3).map(|i| json!({"role": "user", "content": format!("m{i}")})).collect();
    let (status, body) = call(&state, post_chat(json!({"messages": msgs}).to_string())).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error_of(&body)["param"], "messages");
    assert!(error_of(&body)["message"].as_str().unwrap().contains("Too many messages"));
}

#[tokio::test]
async fn a_full_queue_is_429_and_queued_requests_run_when_a_slot_frees() {
    let (state, _) = engine_with_template("hello", true, CHATML, |c| {
        c.max_concurrent_requests = 1;
        c.max_queued_requests = 1;
    })
    .await;
    let first = app(state.clone()).oneshot(post_chat(chat_body(json!({"stream": true})))).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let waiting = tokio::spawn(app(state.clone()).oneshot(post_chat(chat_body(json!({"stream": true})))));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while state.queue_depth() < 1 {
        assert!(tokio::time::Instant::now() < deadline, "second request never queued");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (status, body) = call(&state, post_chat(chat_body(json!({})))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(error_of(&body)["type"], "rate_limit_error");
    drop(first);
    let second =
        tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("queued request admitted").unwrap().unwrap();
    assert_eq!(second.status(), StatusCode::OK);
    assert_eq!(state.queue_depth(), 0);
}

/// Hostile or malformed bodies: wrong types, huge numbers, deep nesting, invalid UTF-8, huge
/// strings, on both endpoints. None may be a 5xx (a valid one reaches the scripted engine).
#[tokio::test]
async fn two_hundred_hostile_bodies_get_no_5xx() {
    let (state, _) = engine_with_template("ok", false, CHATML, |c| c.max_body_bytes = 1 << 20).await;
    let fields = [
        "model",
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "n",
        "logprobs",
        "top_logprobs",
        "response_format",
        "user",
        "cache_salt",
        "chat_template_kwargs",
        "prompt",
        "echo",
        "suffix",
    ];
    let deep = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
    let values = [
        json!("x"),
        json!(1e308),
        json!(-1),
        json!(u64::MAX),
        json!(-9.5e18),
        json!([[[]]]),
        json!({"a": {"b": null}}),
        json!(true),
        json!(""),
        json!("y".repeat(100_000)),
    ];
    let mut bodies: Vec<(&str, Vec<u8>)> = Vec::new();
    for (i, f) in fields.iter().enumerate() {
        for v in &values {
            let path = if i % 2 == 0 { "/v1/chat/completions" } else { "/v1/completions" };
            let mut body = json!({"messages": [{"role": "user", "content": "hi"}], "prompt": "hi", "max_tokens": 2});
            body[*f] = v.clone();
            bodies.push((path, body.to_string().into_bytes()));
        }
    }
    let raw: [&[u8]; 8] = [
        b"\xff\xfe{\"messages\": 1}",
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xc3\x28\"}]}",
        b"{\"messages\": [{\"role\": \"user\", \"content\": \"\\ud800\"}]}",
        b"{",
        b"",
        b"null",
        b"[1, 2]",
        deep.as_bytes(),
    ];
    for r in raw {
        bodies.push(("/v1/chat/completions", r.to_vec()));
        bodies.push(("/v1/completions", r.to_vec()));
    }
    let odd_messages = [
        json!([{"role": "tool"}]),
        json!([{"role": "assistant", "tool_calls": [{"function": 1}]}]),
        json!([{"role": "user", "content": [{"type": "text"}]}]),
        json!([1, 2]),
        json!([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": [1]}}]}]),
    ];
    for m in odd_messages {
        bodies.push(("/v1/chat/completions", json!({"messages": m}).to_string().into_bytes()));
    }
    assert!(bodies.len() >= 200, "{}", bodies.len());
    for (path, body) in bodies {
        let req =
            Request::post(path).header("content-type", "application/json").body(Body::from(body.clone())).unwrap();
        let (status, resp) = call(&state, req).await;
        let shown = String::from_utf8_lossy(&body[..body.len().min(120)]).into_owned();
        assert!(!status.is_server_error(), "{path} {shown}: {status} {resp}");
        if !status.is_success() {
            assert!(error_of(&resp)["message"].is_string(), "{shown}: {resp}");
        }
    }
}

#[tokio::test]
async fn xml_call_whole_and_json_call_streamed_assemble_equal_arguments() {
    let xml = "<tool_call>\n<function=get_weather>\n<parameter=city>\nRio de Janeiro\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
    let (state, _) = engine_with_template(xml, false, QWEN, |_| {}).await;
    let (status, resp) = call(&state, post_chat(chat_body(json!({"tools": [weather()]})))).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let v: Value = serde_json::from_str(&resp).unwrap();
    let args = v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].clone();
    assert_eq!(args, r#"{"city":"Rio de Janeiro","days":3}"#);

    let json_form = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rio de Janeiro\", \"days\": 3}}\n</tool_call>";
    let (state, _) = engine_with_template(json_form, false, HERMES, |_| {}).await;
    let events =
        streamed(&state, "/v1/chat/completions", chat_body(json!({"tools": [weather()], "stream": true}))).await;
    let fragments: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    let parsed = |s: &str| serde_json::from_str::<Value>(s).unwrap();
    assert_eq!(parsed(&fragments), parsed(args.as_str().unwrap()));
    // Streamed piece by piece as the model wrote them, not as one fragment.
    let pieces = events
        .iter()
        .filter(|e| e["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].is_string())
        .count();
    assert!(pieces > 3, "{pieces} argument fragments");
    let finish = events.iter().rev().find_map(|e| e["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("tool_calls"));
    assert!(events.iter().all(|e| { e["choices"][0]["delta"].get("content").is_none_or(|c| c == "") }));
}

#[path = "routes_tests_golden.rs"]
mod golden;

#[tokio::test]
async fn chat_requests_hint_where_the_generation_prompt_begins() {
    // Attention-only models (the scripted engine's Info) get no hints: no second render.
    let (state, record) = engine_with_template("ok", false, CHATML, |_| {}).await;
    let (status, resp) = call(&state, post_chat(chat_body(json!({})))).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    assert!(record.requests.lock().unwrap()[0].snapshot_hints.is_empty());
    // A model with recurrent state: the hint marks where the generation prompt begins.
    let (mut script, n) = answer_script("ok");
    script.push(finished(WireFinish::Stop, n, 0));
    let (state, record) = start_engine(script, false).await;
    let config = state.config().clone();
    let engine = EngineClient::new(&config.engine_endpoints[0]).unwrap();
    let mut model = info(8192);
    model.chat_template = CHATML.into();
    model.recurrent_state = true;
    let state = AppState::from_info(config, engine, model).unwrap();
    let (status, resp) = call(&state, post_chat(chat_body(json!({})))).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let sent = record.requests.lock().unwrap()[0].clone();
    let tok = test_tokenizer::tokenizer();
    let opening = tok.encode("<|im_start|>assistant\n").unwrap();
    let at = sent.prompt_token_ids.len() - opening.len();
    assert_eq!(sent.snapshot_hints, vec![at as u32]);
    assert!(tok.decode(&sent.prompt_token_ids[..at]).unwrap().ends_with("user\nHi\n"));
}

/// A request that must call gets the calls' grammar (JSON and XML forms); one that may answer
/// in text gets none.
#[tokio::test]
async fn a_required_call_is_enforced_by_a_tool_call_grammar() {
    let (state, record) = engine_with_template("ok", false, CHATML, |_| {}).await;
    for choice in [json!("required"), json!({"type": "function", "function": {"name": "get_weather"}}), json!("auto")] {
        let body = chat_body(json!({"tools": [weather()], "tool_choice": choice, "parallel_tool_calls": false}));
        assert_eq!(call(&state, post_chat(body)).await.0, StatusCode::OK);
    }
    let grammars: Vec<Option<String>> = record
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|r| match r.grammar.clone().and_then(|g| g.kind) {
            Some(proto::engine::v1::grammar::Kind::Lark(l)) => Some(l),
            None => None,
            other => panic!("not a Lark grammar: {other:?}"),
        })
        .collect();
    let required = grammars[0].as_deref().expect("a grammar for tool_choice required");
    assert!(
        required
            .starts_with("start: tool_call \"\\n\"?\ntool_call: \"<tool_call>\" call_body\ncall_body: \"\\n\" %json {"),
        "{required}"
    );
    assert!(required.contains(r#""name":{"const":"get_weather"}"#), "{required}");
    assert!(required.contains(r#""arguments":{"#), "{required}");
    assert!(grammars[1].is_some());
    assert_eq!(grammars[2], None);
    // The Qwen XML form; with thinking on the prompt leaves `<think>` open, so the grammar
    // lets the reasoning finish first.
    let (state, record) = engine_with_template("ok", false, QWEN, |_| {}).await;
    for thinking in [true, false] {
        let body = chat_body(json!({"tools": [weather()], "tool_choice": "required",
            "chat_template_kwargs": {"enable_thinking": thinking}}));
        assert_eq!(call(&state, post_chat(body)).await.0, StatusCode::OK);
    }
    let lark = |i: usize| match record.requests.lock().unwrap()[i].grammar.clone().and_then(|g| g.kind) {
        Some(proto::engine::v1::grammar::Kind::Lark(l)) => l,
        other => panic!("not a Lark grammar: {other:?}"),
    };
    assert!(lark(0).starts_with("start: thinking /\\s+/ tool_call"), "{}", lark(0));
    assert!(lark(1).starts_with("start: tool_call (\"\\n\" tool_call)* \"\\n\"?"), "{}", lark(1));
    assert!(lark(1).contains("\"<function=get_weather>\\n\""), "{}", lark(1));
}
