//! End to end on the Qwen3.5/3.6 hybrid architecture (Gated DeltaNet + gated attention):
//! the whole stack serves the tiny random-weight checkpoint committed under
//! `engine-service/tests/fixtures/qwen36/tiny-vlm` (HF directory: config.json with
//! `text_config`, sharded safetensors, tokenizer.json, chat template). A multi-turn
//! conversation must resume from recurrent-state snapshots (the gateway hints where the
//! generation prompt begins; the engine snapshots there) and every turn's greedy output
//! must equal an uncached run's (a fresh `cache_salt` never hits).
//! The same model as a llama.cpp `qwen35` GGUF must be served identically.
//! Run: `cargo build --release --bins && cargo test --release -p e2e --test qwen36_stack`.

use e2e::{Stack, StackOptions, cached_tokens, chat, chat_streamed, content, http_get, metric, prompt_tokens};
use serde_json::json;

fn tiny_checkpoint() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../engine-service/tests/fixtures/qwen36/tiny-vlm")
}

#[tokio::test(flavor = "multi_thread")]
async fn multi_turn_conversation_resumes_from_state_snapshots_and_matches_uncached() {
    let stack = Stack::start_with(StackOptions { model: Some(tiny_checkpoint()), ..StackOptions::default() });
    let system = "You are a terse assistant. Answer in a few words. ".repeat(6);
    let mut messages = vec![json!({"role": "system", "content": system})];
    let (mut prompt_total, mut cached_total) = (0u64, 0u64);
    for turn in 0..5 {
        messages
            .push(json!({"role": "user", "content": format!("Turn {turn}: describe item {} of the list.", turn * 7)}));
        let body = |salt: &str| {
            json!({"messages": messages, "temperature": 0, "max_tokens": 16, "cache_salt": salt,
                   "chat_template_kwargs": {"enable_thinking": false}})
        };
        let (status, cached) = chat(&stack, &body("conversation")).await;
        assert_eq!(status, 200, "turn {turn}: {cached}");
        let (status, uncached) = chat(&stack, &body(&format!("fresh-{turn}"))).await;
        assert_eq!(status, 200, "turn {turn}: {uncached}");
        assert_eq!(cached_tokens(&uncached), 0, "a fresh salt never hits");
        assert_eq!(content(&cached), content(&uncached), "turn {turn}: cached and uncached outputs differ");
        if turn == 4 {
            // Streamed, the same text arrives in deltas, with usage and [DONE].
            let mut streamed = body("conversation");
            streamed["stream"] = json!(true);
            streamed["stream_options"] = json!({"include_usage": true});
            let (text, finish, usage, done) = chat_streamed(&stack, streamed).await;
            assert!(done && !finish.is_empty(), "finish {finish:?}");
            assert_eq!(text, content(&cached));
            assert_eq!(usage["prompt_tokens"], cached["usage"]["prompt_tokens"]);
        }
        if turn > 0 {
            assert!(cached_tokens(&cached) > 0, "turn {turn} resumed nothing: {cached}");
            prompt_total += prompt_tokens(&cached);
            cached_total += cached_tokens(&cached);
        }
        messages.push(json!({"role": "assistant", "content": content(&cached)}));
    }
    let ratio = cached_total as f64 / prompt_total as f64;
    eprintln!("turns 2-5: {cached_total}/{prompt_total} prompt tokens resumed from snapshots ({:.1}%)", ratio * 100.0);
    assert!(ratio >= 0.6, "turns 2-5 should resume most of their prompt, got {:.1}%", ratio * 100.0);

    let cache = http_get(&stack.cache_metrics_url).expect("cache metrics");
    assert!(metric(&cache, "edge_cache_state_snapshots_stored_total") > 0.0, "{cache}");
    assert!(metric(&cache, "edge_cache_state_restores_total") >= 4.0, "{cache}");
}

/// The same tiny model as a llama.cpp `qwen35` GGUF (converted by llama.cpp's
/// convert_hf_to_gguf.py; its logits equal the directory's bit for bit).
fn tiny_gguf() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../engine-service/tests/fixtures/qwen36/tiny-vlm-f32.gguf")
}

#[tokio::test(flavor = "multi_thread")]
async fn gguf_file_is_served_like_its_hf_checkpoint() {
    // Same template (rendered by the gateway from the engine's Info), same tokenizer, same
    // logits: the greedy replies, finish reasons and prompt token counts must be identical.
    let bodies = [
        json!({"messages": [{"role": "user", "content": "Name three colours."}], "temperature": 0,
               "max_tokens": 24, "chat_template_kwargs": {"enable_thinking": false}}),
        json!({"messages": [{"role": "system", "content": "Be brief."},
                            {"role": "user", "content": "What is 2 + 2? Explain."}],
               "temperature": 0, "max_tokens": 24}),
    ];
    let mut replies = Vec::new();
    for model in [tiny_checkpoint(), tiny_gguf()] {
        let stack = Stack::start_with(StackOptions { model: Some(model.clone()), ..StackOptions::default() });
        let mut got = Vec::new();
        for body in &bodies {
            let (status, v) = chat(&stack, body).await;
            assert_eq!(status, 200, "{}: {v}", model.display());
            got.push((content(&v), v["choices"][0]["finish_reason"].clone(), prompt_tokens(&v)));
        }
        replies.push(got);
    }
    assert!(replies[0].iter().all(|(_, _, p)| *p > 5), "{:?}", replies[0]);
    assert_eq!(replies[0], replies[1], "HF directory vs GGUF");
}

/// `tool_choice: "required"` on the hybrid model: the Qwen XML call grammar makes even random
/// weights write a call the gateway parses, naming an offered tool with arguments that match
/// its schema (enum and boolean values, so the call has a bounded length). Thinking is off: a
/// random model would never end its reasoning (the grammar for that case is checked in
/// `gateway::tools::grammar`).
#[tokio::test(flavor = "multi_thread")]
async fn a_required_call_on_the_hybrid_model_is_a_valid_xml_call() {
    let stack = Stack::start_with(StackOptions { model: Some(tiny_checkpoint()), ..StackOptions::default() });
    let tools = json!([
        {"type": "function", "function": {"name": "get_time", "description": "Time in a zone", "parameters": {
            "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}, "hourly": {"type": "boolean"}},
            "required": ["zone", "hourly"]}}},
        {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
    ]);
    for seed in 0..4 {
        let body = json!({"messages": [{"role": "user", "content": "What time is it?"}], "tools": tools,
            "tool_choice": "required", "parallel_tool_calls": false, "temperature": 1, "seed": seed,
            "max_tokens": 200, "chat_template_kwargs": {"enable_thinking": false}});
        let (status, v) = chat(&stack, &body).await;
        assert_eq!(status, 200, "{v}");
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
        let calls = choice["message"]["tool_calls"].as_array().expect("tool calls");
        assert_eq!(calls.len(), 1, "{v}");
        let args: serde_json::Value =
            serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).expect("arguments JSON");
        match calls[0]["function"]["name"].as_str() {
            Some("get_time") => {
                assert!(["UTC", "CET"].contains(&args["zone"].as_str().unwrap_or_default()), "{v}");
                assert!(args["hourly"].is_boolean(), "{v}");
            }
            Some("ping") => assert_eq!(args, json!({}), "{v}"),
            other => panic!("not an offered tool: {other:?} in {v}"),
        }
    }
}
