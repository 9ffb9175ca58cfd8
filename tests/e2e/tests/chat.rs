//! End-to-end: the real three binaries, the real default model, HTTP like a user.
//! Run with the README's test command (it builds the release binaries first).

use e2e::{Stack, cached_tokens, chat, chat_streamed, client, content};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn capital_of_france_is_paris_and_streaming_matches() {
    let stack = Stack::start();
    // With the template's default system prompt, this 135M model answers the bare question
    // with French word salad, in llama.cpp too (checked with llama-cpp-python 0.3.36); a plain
    // system prompt gets the clear answer from both.
    let body = json!({
        "model": "SmolLM2-135M-Instruct.Q4_1",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
            {"role": "user", "content": "What is the capital of France?"}
        ],
        "temperature": 0,
        "max_tokens": 40
    });
    let (status, v) = chat(&stack, &body).await;
    assert_eq!(status, 200, "{v}");
    let answer = content(&v);
    assert!(answer.contains("Paris"), "answer: {answer:?}");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() > 0);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let (text, finish, usage, done) = chat_streamed(&stack, streamed).await;
    assert!(done, "stream must end with [DONE]");
    assert_eq!(text, answer, "greedy streamed text equals the non-streamed text");
    assert!(finish == "stop" || finish == "length", "finish_reason {finish:?}");
    assert_eq!(usage["completion_tokens"], v["usage"]["completion_tokens"]);
    // The streamed usage explains how the prompt was served, and the parts add up.
    let explain = &usage["edge_cache"];
    let parts: u64 = ["full_page_tokens", "partial_page_tokens", "prefill_tokens"]
        .iter()
        .map(|k| explain[*k].as_u64().unwrap_or_else(|| panic!("usage.edge_cache.{k} missing: {usage}")))
        .sum();
    assert_eq!(parts, usage["prompt_tokens"].as_u64().unwrap(), "{usage}");
    assert!(explain["full_page_tokens"].as_u64().unwrap() > 0, "the second request reuses the first's pages: {usage}");
}

#[tokio::test(flavor = "multi_thread")]
async fn same_prompt_twice_is_identical_and_second_is_cached() {
    let stack = Stack::start();
    let body = json!({
        "messages": [
            {"role": "system", "content": "You are a terse assistant that answers in one sentence."},
            {"role": "user", "content": "Name three primary colors and explain why they are called primary."}
        ],
        "temperature": 0,
        "max_tokens": 32
    });
    let (s1, first) = chat(&stack, &body).await;
    let (s2, second) = chat(&stack, &body).await;
    assert_eq!((s1, s2), (200, 200));
    assert_eq!(content(&first), content(&second));
    assert_eq!(cached_tokens(&first), 0, "{first}");
    assert!(cached_tokens(&second) > 0, "second request must hit the cache: {second}");
}

#[tokio::test(flavor = "multi_thread")]
async fn five_turn_conversation_is_mostly_served_from_cache() {
    let stack = Stack::start();
    // Agents send a long, stable system prompt; the history grows each turn.
    let system = "You are a careful coding assistant working in a Linux shell. ".repeat(24);
    let questions = [
        "List the files you would look at first in a Rust workspace.",
        "How do you run only one test with cargo?",
        "What does `cargo build --release` change compared to a debug build?",
        "How would you find which crate pulls in a given dependency?",
        "Summarize what we discussed in one sentence.",
    ];
    let mut messages = vec![json!({"role": "system", "content": system})];
    for (turn, q) in questions.iter().enumerate() {
        messages.push(json!({"role": "user", "content": q}));
        let (status, v) = chat(&stack, &json!({"messages": messages, "temperature": 0, "max_tokens": 48})).await;
        assert_eq!(status, 200, "{v}");
        let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap();
        let cached = cached_tokens(&v);
        if turn > 0 {
            let ratio = cached as f64 / prompt as f64;
            assert!(ratio >= 0.8, "turn {}: {cached}/{prompt} prompt tokens cached ({ratio:.2})", turn + 1);
        }
        messages.push(json!({"role": "assistant", "content": content(&v)}));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn four_concurrent_requests_all_complete() {
    let stack = Stack::start();
    let prompts = ["Count from one to five.", "Say hello in French.", "What is 2+2?", "Name a planet."];
    let stack = &stack;
    let futures = prompts.iter().map(|p| async move {
        let body = json!({"messages": [{"role": "user", "content": p}], "temperature": 0, "max_tokens": 24});
        chat(stack, &body).await
    });
    let results = futures::future::join_all(futures).await;
    for (status, v) in results {
        assert_eq!(status, 200, "{v}");
        assert!(!content(&v).is_empty(), "{v}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_get_400_and_the_server_keeps_serving() {
    let mut stack = Stack::start();
    let url = format!("{}/v1/chat/completions", stack.base_url);
    let resp = client()
        .post(&url)
        .header("content-type", "application/json")
        .body("{\"messages\": [")
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status().as_u16(), 400);
    let v: Value = resp.json().await.expect("OpenAI error body");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");

    let (status, v) = chat(&stack, &json!({"messages": []})).await;
    assert_eq!(status, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or_default().contains("messages"), "{v}");

    let (status, v) = chat(&stack, &json!({"messages": "hello"})).await;
    assert_eq!(status, 400, "{v}");

    let (status, v) = chat(
        &stack,
        &json!({"messages": [{"role": "user", "content": "Say yes."}], "temperature": 0, "max_tokens": 4}),
    )
    .await;
    assert_eq!(status, 200, "server must keep serving after bad input: {v}");
    assert!(stack.all_alive(), "{}", stack.log_tail());
}

#[tokio::test(flavor = "multi_thread")]
async fn models_health_and_metrics_endpoints() {
    let stack = Stack::start();
    let c = client();
    let models: Value = c.get(format!("{}/v1/models", stack.base_url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(models["object"], "list");
    assert!(models["data"][0]["id"].as_str().unwrap_or_default().contains("SmolLM2"), "{models}");
    let health = c.get(format!("{}/health", stack.base_url)).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
    // One request so counters exist, then each service's Prometheus endpoint shows it.
    let (status, _) = chat(&stack, &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})).await;
    assert_eq!(status, 200);
    let gw = c.get(format!("{}/metrics", stack.base_url)).send().await.unwrap().text().await.unwrap();
    assert!(gw.contains("edge_gateway_requests_total"), "{gw}");
    let engine = c.get(&stack.engine_metrics_url).send().await.unwrap().text().await.unwrap();
    assert!(engine.contains("edge_engine_generated_tokens_total"), "{engine}");
    let cache = c.get(&stack.cache_metrics_url).send().await.unwrap().text().await.unwrap();
    assert!(cache.contains("edge_cache_prompt_tokens_queried_total"), "{cache}");
}
