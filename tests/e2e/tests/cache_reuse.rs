//! End-to-end prefix reuse with real processes: partial pages (token-granular reuse, copy
//! on write), a 10-turn conversation, tenant isolation by `cache_salt`, the hit/miss
//! metrics, and a tiny arena (allocation that cannot be satisfied queues or preempts).
//! Run: `cargo build --release --bins && cargo test --release -p e2e --test cache_reuse -- --test-threads=1`.

use std::time::Duration;

use e2e::{Stack, StackOptions, cached_tokens, chat, client, content, http_get, metric, prompt_tokens};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread")]
async fn ten_turns_reuse_partial_pages_and_match_uncached_output() {
    let stack = Stack::start();
    // Agents resend a long, stable system prompt (tools, instructions) every turn.
    let system = "You are a careful coding assistant working in a Linux shell. ".repeat(32);
    let mut messages = vec![json!({"role": "system", "content": system})];
    let (mut prompt_total, mut cached_total) = (0u64, 0u64);
    let mut first_turn = Value::Null;
    for turn in 0..10 {
        messages.push(
            json!({"role": "user", "content": format!("Step {turn}: name one shell command and say what it does.")}),
        );
        let body = json!({"messages": messages, "temperature": 0, "max_tokens": 24});
        let (status, v) = chat(&stack, &body).await;
        assert_eq!(status, 200, "turn {turn}: {v}");
        if turn == 0 {
            first_turn = v.clone();
        } else {
            prompt_total += prompt_tokens(&v);
            cached_total += cached_tokens(&v);
        }
        messages.push(json!({"role": "assistant", "content": content(&v)}));
    }
    let ratio = cached_total as f64 / prompt_total as f64;
    eprintln!("turns 2-10: {cached_total}/{prompt_total} prompt tokens from cache ({:.1}%)", ratio * 100.0);
    assert!(ratio >= 0.95, "turns 2-10 must get >= 95% of prompt tokens from cache, got {:.1}%", ratio * 100.0);

    // Partial pages were published and hit (a turn rarely ends on a page boundary).
    let page = http_get(&stack.cache_metrics_url).expect("cache metrics");
    assert!(metric(&page, "edge_cache_partial_pages_committed_total") > 0.0, "{page}");
    assert!(metric(&page, "edge_cache_tokens_hit_total{kind=\"partial_page\"}") > 0.0, "{page}");
    assert!(metric(&page, "edge_cache_tokens_hit_total{kind=\"full_page\"}") > 0.0, "{page}");
    let engine = http_get(&stack.engine_metrics_url).expect("engine metrics");
    assert!(metric(&engine, "edge_engine_cached_prompt_tokens_by_kind_total{kind=\"partial_page\"}") > 0.0, "{engine}");

    // The first turn again: served from full pages plus a page used in part (copied before
    // appending); greedy output equals the uncached run's.
    let body = json!({"messages": &messages[..2], "temperature": 0, "max_tokens": 24});
    let resp =
        client().post(format!("{}/v1/chat/completions", stack.base_url)).json(&body).send().await.expect("request");
    assert_eq!(resp.status().as_u16(), 200);
    let explain = resp.headers().get("x-edge-cache").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let again: Value = resp.json().await.expect("json");
    // full=<n>;partial=<n>;prefill=<n> adds up to the prompt, with one token prefilled.
    let parts: Vec<u64> = explain.split(';').filter_map(|kv| kv.split_once('=')?.1.parse().ok()).collect();
    assert_eq!(parts.len(), 3, "x-edge-cache header: {explain:?}");
    assert_eq!((parts[0] + parts[1], parts[2]), (cached_tokens(&again), 1), "{explain}");
    assert_eq!(parts[0] % 16, 0, "full-page tokens are whole pages: {explain}");
    assert_eq!(cached_tokens(&again), prompt_tokens(&again) - 1, "all but the last prompt token: {again}");
    assert_eq!(content(&again), content(&first_turn));
}

#[tokio::test(flavor = "multi_thread")]
async fn cache_salts_never_share_and_misses_are_explained() {
    let stack = Stack::start();
    let body = |salt: &str| {
        json!({
            "messages": [
                {"role": "system", "content": "Answer briefly. ".repeat(16)},
                {"role": "user", "content": "What is a prefix cache?"}
            ],
            "temperature": 0,
            "max_tokens": 8,
            "cache_salt": salt
        })
    };
    let (s1, a1) = chat(&stack, &body("tenant-a")).await;
    let (s2, b1) = chat(&stack, &body("tenant-b")).await;
    assert_eq!((s1, s2), (200, 200), "{a1} {b1}");
    assert_eq!(cached_tokens(&a1), 0);
    assert_eq!(cached_tokens(&b1), 0, "tenant b must not hit tenant a's pages: {b1}");
    let (_, a2) = chat(&stack, &body("tenant-a")).await;
    let (_, b2) = chat(&stack, &body("tenant-b")).await;
    assert!(cached_tokens(&a2) > 0 && cached_tokens(&b2) > 0, "each tenant hits its own: {a2} {b2}");
    let page = http_get(&stack.cache_metrics_url).expect("cache metrics");
    assert!(metric(&page, "edge_cache_tokens_missed_total{reason=\"salt_mismatch\"}") > 0.0, "{page}");
    assert!(metric(&page, "edge_cache_tokens_missed_total{reason=\"last_token\"}") >= 4.0, "{page}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tiny_arena_queues_and_preempts_and_leaks_nothing() {
    // 12 pages of 16 tokens: room for about two of these sequences at a time.
    let arena = 4096 + 12 * 368_640u64;
    let stack = Stack::start_with(StackOptions {
        cache_args: vec!["--arena-bytes".into(), arena.to_string()],
        ..Default::default()
    });
    let mut tasks = Vec::new();
    for i in 0..6 {
        let url = format!("{}/v1/chat/completions", stack.base_url);
        let body = json!({
            "messages": [{"role": "user", "content": format!("Request {i}: count from one to five in words, please.")}],
            "temperature": 0,
            "max_tokens": 24
        });
        tasks.push(tokio::spawn(async move {
            let r = client().post(url).json(&body).send().await.expect("request");
            r.status().as_u16()
        }));
    }
    // Sequences that do not fit wait (or are preempted and recomputed): all complete.
    for t in tasks {
        let status = t.await.expect("task");
        assert_eq!(status, 200, "every request completes under page pressure:\n{}", stack.log_tail());
    }
    let mut stack = stack;
    assert!(stack.all_alive(), "no service may crash:\n{}", stack.log_tail());
    std::thread::sleep(Duration::from_millis(500));
    let page = http_get(&stack.cache_metrics_url).expect("cache metrics");
    assert_eq!(metric(&page, "edge_cache_pages_pinned"), 0.0, "{page}");
    assert!(metric(&page, "edge_cache_evictions_total") > 0.0, "the arena was under pressure: {page}");
    assert_eq!(metric(&page, "edge_cache_pages_free") + metric(&page, "edge_cache_pages_cached"), 12.0, "{page}");
    let (status, v) = chat(&stack, &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})).await;
    assert_eq!(status, 200, "{v}");
}
