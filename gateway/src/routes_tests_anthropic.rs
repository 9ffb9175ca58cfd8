//! `/v1/messages` against the scripted engine: a tool call whole and streamed (Qwen XML),
//! stop sequences, usage with cached tokens, Anthropic errors, `x-api-key`, count_tokens.

use super::*;

fn post_messages(body: Value) -> Request<Body> {
    Request::post("/v1/messages")
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn weather_tool() -> Value {
    json!({"name": "get_weather", "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})
}

const XML_CALL: &str = "I'll check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>";

#[tokio::test]
async fn a_tool_call_comes_back_as_a_tool_use_block_with_usage() {
    let (mut script, n) = answer_script(XML_CALL);
    script.push(finished(WireFinish::Stop, n, 3));
    let (state, record) = start_engine_templated(script, QWEN_TEMPLATE).await;
    let body = json!({"model": MODEL, "max_tokens": 100, "system": "Be brief.", "tools": [weather_tool()],
        "thinking": {"type": "disabled"},
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]}]});
    let (status, resp) = call(&state, post_messages(body.clone())).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let v: Value = serde_json::from_str(&resp).unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert!(v["id"].as_str().unwrap().starts_with("msg_"), "{v}");
    assert_eq!(v["content"][0], json!({"type": "text", "text": "I'll check."}));
    let tool_use = &v["content"][1];
    assert_eq!(tool_use["type"], "tool_use");
    assert!(tool_use["id"].as_str().unwrap().starts_with("toolu_"));
    assert_eq!(tool_use["name"], "get_weather");
    assert_eq!(tool_use["input"], json!({"city": "Paris"}));
    assert_eq!(v["content"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["stop_reason"], "tool_use");
    assert!(v["stop_sequence"].is_null());
    let sent = record.requests.lock().unwrap()[0].clone();
    let prompt_tokens = sent.prompt_token_ids.len() as u64;
    assert_eq!(v["usage"]["cache_read_input_tokens"], 3);
    assert_eq!(v["usage"]["input_tokens"], prompt_tokens - 3);
    assert_eq!(v["usage"]["output_tokens"], n);
    assert_eq!(v["usage"]["cache_creation_input_tokens"], 0);
    let prompt = test_tokenizer::tokenizer().decode(&sent.prompt_token_ids).unwrap();
    assert!(prompt.contains("Be brief.") && prompt.contains("\"name\": \"get_weather\""), "{prompt}");
    assert_eq!(sent.sampling.unwrap().max_tokens, 100);

    // count_tokens renders the same prompt.
    let mut count_body = body;
    count_body.as_object_mut().unwrap().remove("max_tokens");
    let req = Request::post("/v1/messages/count_tokens")
        .header("content-type", "application/json")
        .body(Body::from(count_body.to_string()))
        .unwrap();
    let (status, resp) = call(&state, req).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    assert_eq!(serde_json::from_str::<Value>(&resp).unwrap(), json!({"input_tokens": prompt_tokens}));
}

#[tokio::test]
async fn a_streamed_tool_call_follows_anthropics_event_sequence() {
    let (mut script, n) = answer_script(XML_CALL);
    script.push(finished(WireFinish::Stop, n, 2));
    let (state, _) = start_engine_templated(script, QWEN_TEMPLATE).await;
    let body = json!({"max_tokens": 100, "stream": true, "tools": [weather_tool()],
        "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    let (status, resp) = call(&state, post_messages(body)).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let events = named_events(&resp);
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str());
    }
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).filter(|n| *n != "ping").collect();
    let mut expected = vec!["message_start", "content_block_start"];
    let text_deltas = names.iter().skip(2).take_while(|n| **n == "content_block_delta").count();
    expected.extend(std::iter::repeat_n("content_block_delta", text_deltas));
    expected.extend(["content_block_stop", "content_block_start", "content_block_delta", "content_block_delta"]);
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected, "{resp}");
    let start = &events[0].1["message"];
    assert_eq!(start["content"], json!([]));
    assert!(start["stop_reason"].is_null());
    let text: String = events
        .iter()
        .filter(|(_, d)| d["delta"]["type"] == "text_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "I'll check.");
    let args: String = events
        .iter()
        .filter(|(_, d)| d["delta"]["type"] == "input_json_delta")
        .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap())
        .collect();
    assert_eq!(serde_json::from_str::<Value>(&args).unwrap(), json!({"city": "Paris"}));
    let tool_start = events.iter().find(|(_, d)| d["content_block"]["type"] == "tool_use").unwrap();
    assert_eq!(tool_start.1["index"], 1);
    assert_eq!(tool_start.1["content_block"]["name"], "get_weather");
    let delta = &events.iter().find(|(n, _)| n == "message_delta").unwrap().1;
    assert_eq!(delta["delta"], json!({"stop_reason": "tool_use", "stop_sequence": null}));
    assert_eq!(delta["usage"]["output_tokens"], n);
    assert_eq!(delta["usage"]["cache_read_input_tokens"], 2);
}

#[tokio::test]
async fn stop_sequences_and_length_set_the_stop_reason() {
    let (mut script, n) = answer_script("The answer is 4. END and more");
    script.push(finished(WireFinish::Stop, n, 0));
    let (state, _) = start_engine(script, false).await;
    let body = json!({"max_tokens": 50, "stop_sequences": ["nope", "END"],
        "messages": [{"role": "user", "content": "2+2?"}]});
    let (status, resp) = call(&state, post_messages(body)).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let v: Value = serde_json::from_str(&resp).unwrap();
    assert_eq!(v["content"], json!([{"type": "text", "text": "The answer is 4. "}]));
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], "END");

    let (mut script, n) = answer_script("cut");
    script.push(finished(WireFinish::Length, n, 0));
    let (state, _) = start_engine(script, false).await;
    let body = json!({"max_tokens": 2, "stream": true, "messages": [{"role": "user", "content": "x"}]});
    let (_, resp) = call(&state, post_messages(body)).await;
    let delta = named_events(&resp).into_iter().find(|(n, _)| n == "message_delta").unwrap().1;
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
}

#[tokio::test]
async fn errors_have_anthropic_bodies_and_x_api_key_is_accepted() {
    let (mut script, n) = answer_script("ok");
    script.push(finished(WireFinish::Stop, n, 0));
    let (state, _) = start_engine(script, false).await;
    let mut config = state.config().clone();
    config.api_keys = vec!["sk-ant-1".into()];
    let state = AppState::connect(config).await.unwrap();
    let with_key = |key: Option<&str>, body: Value| {
        let mut r = Request::post("/v1/messages").header("content-type", "application/json");
        if let Some(k) = key {
            r = r.header("x-api-key", k);
        }
        r.body(Body::from(body.to_string())).unwrap()
    };
    let good = json!({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    for key in [None, Some("sk-wrong")] {
        let (status, body) = call(&state, with_key(key, good.clone())).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "authentication_error", "{body}");
    }
    let (status, body) = call(&state, with_key(Some("sk-ant-1"), good)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The OpenAI routes take the same header.
    let models = Request::get("/v1/models").header("x-api-key", "sk-ant-1").body(Body::empty()).unwrap();
    assert_eq!(call(&state, models).await.0, StatusCode::OK);

    for (bad, needle) in [
        (json!({"messages": [{"role": "user", "content": "hi"}]}), "max_tokens"),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}),
            "messages[0].content[0].type",
        ),
        (json!({"max_tokens": 5, "temperature": 3, "messages": [{"role": "user", "content": "x"}]}), "temperature"),
    ] {
        let (status, body) = call(&state, with_key(Some("sk-ant-1"), bad)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{body}");
        assert!(v["error"]["message"].as_str().unwrap().contains(needle), "{body}");
    }
    let bad_json = Request::post("/v1/messages").header("x-api-key", "sk-ant-1").body(Body::from("{")).unwrap();
    let (status, body) = call(&state, bad_json).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["type"], "error");
}
