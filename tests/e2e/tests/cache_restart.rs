//! End-to-end cache survival with real processes: an engine killed with SIGKILL leaks no
//! lease and its successor hits the earlier prompts; a cache-service restart costs only
//! cache hits (requests keep succeeding, uncached, until the engine re-attaches).
//! Run: `cargo build --release --bins && cargo test --release -p e2e --test cache_restart -- --test-threads=1`.

use std::time::{Duration, Instant};

use e2e::{Stack, cached_tokens, chat, chat_until_ok, client, http_get, metric};
use serde_json::{Value, json};

fn prompt(topic: &str) -> Value {
    e2e::explain_request(topic, 12)
}

/// Polls the cache-service's Prometheus page until `pred` holds.
fn wait_cache_metrics(stack: &Stack, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let page = http_get(&stack.cache_metrics_url).unwrap_or_default();
        if pred(&page) {
            return page;
        }
        assert!(Instant::now() < deadline, "{what} never held; metrics:\n{page}\nlogs:\n{}", stack.log_tail());
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts a 400-token generation in the background; resolves to its HTTP status.
fn spawn_long_generation(stack: &Stack) -> tokio::task::JoinHandle<Result<u16, reqwest::Error>> {
    let mut long = prompt("how a CPU cache works");
    long["max_tokens"] = json!(400);
    long["ignore_eos"] = json!(true);
    let url = format!("{}/v1/chat/completions", stack.base_url);
    tokio::spawn(async move { client().post(url).json(&long).send().await.map(|r| r.status().as_u16()) })
}

#[tokio::test(flavor = "multi_thread")]
async fn engine_killed_mid_stream_leaks_nothing_and_its_successor_hits() {
    let mut stack = Stack::start();
    let body = prompt("the borrow checker");
    let (status, first) = chat(&stack, &body).await;
    assert_eq!(status, 200, "{first}");

    // A long generation in flight when the engine dies.
    let in_flight = spawn_long_generation(&stack);
    wait_cache_metrics(&stack, "the long request pins pages", |p| metric(p, "edge_cache_pages_pinned") > 0.0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    stack.kill("engine-service", libc::SIGKILL);
    // The killed engine's session closes: every lease is released.
    wait_cache_metrics(&stack, "pins back to 0 after SIGKILL", |p| {
        metric(p, "edge_cache_pages_pinned") == 0.0 && metric(p, "edge_cache_sessions") == 0.0
    });
    // The request in flight on the dead engine ends (with an error status), never hangs.
    let outcome = tokio::time::timeout(Duration::from_secs(30), in_flight).await.expect("in-flight request hung");
    if let Ok(Ok(status)) = outcome {
        assert_ne!(status, 200, "a request whose engine died cannot report success");
    }

    stack.respawn("engine-service");
    let again = chat_until_ok(&stack, &body).await;
    assert!(cached_tokens(&again) > 0, "a new engine process must hit the earlier prompt: {again}");
    assert_eq!(again["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"]);
    assert!(stack.all_alive());
}

#[tokio::test(flavor = "multi_thread")]
async fn cache_service_restart_keeps_requests_succeeding() {
    let mut stack = Stack::start();
    let body = prompt("ownership in Rust");
    let (status, first) = chat(&stack, &body).await;
    assert_eq!(status, 200, "{first}");
    // A long generation whose KV pages are in the arena when the cache-service dies.
    let in_flight = spawn_long_generation(&stack);
    wait_cache_metrics(&stack, "the long request pins pages", |p| metric(p, "edge_cache_pages_pinned") > 0.0);
    stack.kill("cache-service", libc::SIGKILL);
    // It ends promptly: with a clear error (its KV pages were in the dead arena), never a hang.
    let outcome = tokio::time::timeout(Duration::from_secs(60), in_flight).await.expect("in-flight request hung");
    let status = outcome.expect("task").expect("the gateway answers");
    eprintln!("in-flight request when the cache-service died: HTTP {status}");
    assert!(status == 503 || status == 200, "in-flight request on the cache path: status {status}");
    // While the cache is gone the engine serves uncached: every request still succeeds.
    for topic in ["lifetimes", "traits", "closures"] {
        let (status, v) = chat(&stack, &prompt(topic)).await;
        assert_eq!(status, 200, "request without a cache-service: {v}\n{}", stack.log_tail());
        assert_eq!(cached_tokens(&v), 0);
    }
    let (status, uncached_again) = chat(&stack, &body).await;
    assert_eq!(status, 200);
    assert_eq!(uncached_again["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"]);

    stack.respawn("cache-service");
    // The engine re-attaches in the background; then prompts are cached again.
    let deadline = Instant::now() + Duration::from_secs(60);
    let probe = prompt("pattern matching");
    loop {
        let (status, v) = chat(&stack, &probe).await;
        assert_eq!(status, 200, "{v}\n{}", stack.log_tail());
        if cached_tokens(&v) > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the engine never re-attached:\n{}", stack.log_tail());
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(stack.all_alive());
}
