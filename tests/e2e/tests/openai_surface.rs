//! End-to-end checks of the gateway's wider OpenAI surface with the real binaries: client
//! disconnect aborts in the engine, the bounded queue's 429s, API keys, `/v1/completions`,
//! and the tool-call protocol (generic fallback, since the default template has no tools).

use std::time::{Duration, Instant};

use e2e::{Stack, StackOptions};
use serde_json::{Value, json};

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(300)).build().expect("client")
}

async fn post(stack: &Stack, path: &str, body: Value) -> (u16, Value) {
    let resp = client().post(format!("{}{path}", stack.base_url)).json(&body).send().await.expect("request");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("json body"))
}

/// The value of a Prometheus sample whose line starts with `prefix` (0 when absent).
async fn metric(url: &str, prefix: &str) -> f64 {
    let text = client().get(url).send().await.expect("metrics").text().await.expect("text");
    text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

/// SSE payloads of a whole streamed response.
async fn stream_payloads(resp: reqwest::Response) -> Vec<String> {
    let text = resp.text().await.expect("body");
    text.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_owned).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn client_disconnect_mid_stream_aborts_the_engine_sequence() {
    let stack = Stack::start();
    let aborted = r#"edge_engine_requests_total{reason="aborted"}"#;
    let before = metric(&stack.engine_metrics_url, aborted).await;
    let body = json!({"messages": [{"role": "user", "content": "Write a very long story about the sea."}],
        "max_tokens": 4000, "ignore_eos": true, "stream": true});
    let mut resp =
        client().post(format!("{}/v1/chat/completions", stack.base_url)).json(&body).send().await.expect("request");
    assert_eq!(resp.status().as_u16(), 200);
    // Wait for generated text (not just the role chunk), then hang up.
    let mut seen = String::new();
    while seen.matches("data: ").count() < 4 {
        let chunk = resp.chunk().await.expect("chunk").expect("stream ended early");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(resp);
    let hung_up = Instant::now();
    let running = "edge_engine_running_sequences";
    loop {
        let now = metric(&stack.engine_metrics_url, aborted).await;
        if now > before && metric(&stack.engine_metrics_url, running).await == 0.0 {
            break;
        }
        assert!(
            hung_up.elapsed() < Duration::from_secs(5),
            "no abort in the engine after the client left (aborted {before} -> {now}); logs:\n{}",
            stack.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("engine aborted {:?} after the disconnect", hung_up.elapsed());
    let (status, v) = post(
        &stack,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sixty_four_streams_with_a_queue_of_sixteen_get_429s_and_the_rest_complete() {
    let opts = StackOptions {
        gateway_args: ["--max-concurrent-requests", "4", "--max-queued-requests", "16"].map(String::from).to_vec(),
        ..StackOptions::default()
    };
    let mut stack = Stack::start_with(opts);
    let url = format!("{}/v1/chat/completions", stack.base_url);
    let runs = (0..64).map(|i| {
        let url = url.clone();
        async move {
            let body = json!({"messages": [{"role": "user", "content": format!("Count to {i}.")}],
                "max_tokens": 16, "temperature": 0, "stream": true});
            let resp = client().post(&url).json(&body).send().await.expect("request");
            let status = resp.status().as_u16();
            let payloads = stream_payloads(resp).await;
            (status, payloads)
        }
    });
    let results = futures::future::join_all(runs).await;
    let (mut ok, mut rejected) = (0, 0);
    for (status, payloads) in &results {
        match status {
            200 => {
                ok += 1;
                assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
                assert!(!payloads.iter().any(|p| p.contains("\"error\"")), "{payloads:?}");
            }
            429 => {
                rejected += 1;
                let v: Value = serde_json::from_str(&payloads.join("")).unwrap_or(Value::Null);
                assert!(v.is_null() || v["error"]["type"] == "rate_limit_error");
            }
            other => panic!("unexpected status {other}: {payloads:?}"),
        }
    }
    eprintln!("{ok} accepted, {rejected} rejected");
    assert!(rejected > 0, "64 streams against 4 slots + 16 queued must see 429s");
    assert!(ok >= 20, "at least the slots plus the queue are served, got {ok}");
    let (status, v) = post(
        &stack,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert!(stack.all_alive(), "{}", stack.log_tail());
}

#[tokio::test(flavor = "multi_thread")]
async fn api_keys_are_enforced_with_openai_401s() {
    let opts = StackOptions {
        gateway_args: ["--api-keys", "sk-e2e-one,sk-e2e-two"].map(String::from).to_vec(),
        ..StackOptions::default()
    };
    let stack = Stack::start_with(opts);
    let models = format!("{}/v1/models", stack.base_url);
    let resp = client().get(&models).send().await.expect("request");
    assert_eq!(resp.status().as_u16(), 401);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["error"]["code"], "invalid_api_key");
    let resp = client().get(&models).bearer_auth("sk-nope").send().await.expect("request");
    assert_eq!(resp.status().as_u16(), 401);
    let resp = client().get(&models).bearer_auth("sk-e2e-two").send().await.expect("request");
    assert_eq!(resp.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn text_completions_from_text_and_token_ids_agree_and_stream() {
    let stack = Stack::start();
    let base = json!({"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0});
    let (status, text_prompt) = post(&stack, "/v1/completions", base.clone()).await;
    assert_eq!(status, 200, "{text_prompt}");
    assert_eq!(text_prompt["object"], "text_completion");
    let answer = text_prompt["choices"][0]["text"].as_str().expect("text").to_owned();
    assert!(!answer.is_empty());
    // Greedy decoding: streaming gives the same text.
    let mut streamed = base.clone();
    streamed["stream"] = json!(true);
    let resp =
        client().post(format!("{}/v1/completions", stack.base_url)).json(&streamed).send().await.expect("request");
    assert_eq!(resp.status().as_u16(), 200);
    let payloads = stream_payloads(resp).await;
    assert_eq!(payloads.last().map(String::as_str), Some("[DONE]"));
    let joined: String = payloads
        .iter()
        .filter_map(|p| serde_json::from_str::<Value>(p).ok())
        .filter_map(|v| v["choices"][0]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(joined, answer);
    // Token ids pass through untouched: the usage counts exactly them.
    let (status, v) = post(&stack, "/v1/completions", json!({"prompt": [[1000, 2000, 3000]], "max_tokens": 3})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 3, "{v}");
    let (status, v) = post(&stack, "/v1/completions", json!({"prompt": "x", "n": 2})).await;
    assert_eq!((status, v["error"]["param"].clone()), (400, json!("n")));
}

#[tokio::test(flavor = "multi_thread")]
async fn tool_call_protocol_round_trips_through_the_generic_fallback() {
    let stack = Stack::start();
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let (status, v) = post(
        &stack,
        "/v1/chat/completions",
        json!({
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools, "tool_choice": "required", "parallel_tool_calls": false, "temperature": 0,
        "max_tokens": 64}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    eprintln!("model answered: {}", choice["message"]);
    if let Some(calls) = choice["message"]["tool_calls"].as_array() {
        assert_eq!(choice["finish_reason"], "tool_calls");
        for call in calls {
            assert_eq!(call["function"]["name"], "get_weather");
            let args: Value =
                serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).expect("arguments are JSON");
            assert!(args.is_object());
        }
    } else {
        assert!(choice["message"]["content"].is_string(), "{v}");
    }
    // The round trip: the assistant's call and the tool's result go back as history.
    let (status, v) = post(
        &stack,
        "/v1/chat/completions",
        json!({
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}
        ],
        "tools": tools, "temperature": 0, "max_tokens": 24}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0);
}
