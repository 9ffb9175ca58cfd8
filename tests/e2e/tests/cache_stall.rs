//! Stalled peers. A stalled cache-service (SIGSTOP: what a swapping or starved box looks
//! like) costs requests their cache hits, never their progress: a chat completes uncached
//! within 2 s and `/health` says degraded, with the reason; once the cache-service runs again
//! (SIGCONT) prompts are cached again and `/health` says ok. A stalled engine is a quick 503
//! the client can retry.
//! Run: `cargo build --release --bins && cargo test --release -p e2e --test cache_stall -- --test-threads=1`.

use std::time::{Duration, Instant};

use e2e::{Stack, cached_tokens, chat, http_get};
use serde_json::Value;

fn prompt(topic: &str) -> Value {
    e2e::explain_request(topic, 8)
}

fn health(stack: &Stack) -> Value {
    let body = http_get(&format!("{}/health", stack.base_url)).expect("the gateway answers /health");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("/health body {body:?}: {e}"))
}

/// Repeats `body` until a response reports cached prompt tokens.
async fn chat_until_cached(stack: &Stack, body: &Value, what: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, v) = chat(stack, body).await;
        assert_eq!(status, 200, "{v}\n{}", stack.log_tail());
        if cached_tokens(&v) > 0 {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: never served from cache\n{}", stack.log_tail());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_cache_service_degrades_requests_instead_of_hanging_them() {
    let mut stack = Stack::start();
    let warm = prompt("ownership in Rust");
    let (status, first) = chat(&stack, &warm).await;
    assert_eq!(status, 200, "{first}");
    chat_until_cached(&stack, &warm, "before the stall").await;
    assert_eq!(health(&stack)["status"], "ok");

    stack.signal("cache-service", libc::SIGSTOP);
    for topic in ["lifetimes", "traits", "closures"] {
        let started = Instant::now();
        let (status, v) = chat(&stack, &prompt(topic)).await;
        let took = started.elapsed();
        assert_eq!(status, 200, "a request while the cache-service is stopped: {v}\n{}", stack.log_tail());
        assert!(took < Duration::from_secs(2), "a request while the cache-service is stopped took {took:?}");
        assert_eq!(cached_tokens(&v), 0, "{v}");
    }
    let h = health(&stack);
    assert_eq!(h["status"], "degraded", "{h}");
    assert_eq!(h["cache"], "degraded", "{h}");
    assert!(h["reason"].as_str().is_some_and(|r| r.contains("did not answer")), "{h}");

    stack.signal("cache-service", libc::SIGCONT);
    // The engine's probe sees it answer again; prompts cached before the stall hit again.
    let again = chat_until_cached(&stack, &warm, "after the stall").await;
    assert_eq!(again["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while health(&stack)["status"] != "ok" {
        assert!(Instant::now() < deadline, "/health stays {}", health(&stack));
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(stack.all_alive());
}

/// A stalled engine (SIGSTOP: its socket still takes connections, nothing answers) is a 503
/// `engine_unavailable` within the gateway's accept deadline, not a hang, and `/health` says
/// so; once it runs again it serves.
#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_engine_is_answered_503_within_the_accept_deadline() {
    let mut stack = Stack::start_with(e2e::StackOptions {
        gateway_args: vec!["--engine-accept-timeout-secs".into(), "1".into()],
        ..Default::default()
    });
    let body = prompt("ownership in Rust");
    let (status, first) = chat(&stack, &body).await;
    assert_eq!(status, 200, "{first}");

    stack.signal("engine-service", libc::SIGSTOP);
    let started = Instant::now();
    let (status, v) = chat(&stack, &body).await;
    let took = started.elapsed();
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "engine_unavailable", "{v}");
    assert!(took < Duration::from_secs(3), "the 503 took {took:?}");
    let health_status = e2e::http_status(&format!("{}/health", stack.base_url)).unwrap();
    assert_eq!(health_status, 503);

    stack.signal("engine-service", libc::SIGCONT);
    let again = e2e::chat_until_ok(&stack, &body).await;
    assert_eq!(again["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"]);
    assert!(stack.all_alive());
}
