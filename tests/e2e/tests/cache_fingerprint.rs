//! End-to-end tenancy by model fingerprint with real processes: an engine whose model
//! fingerprint differs (here: the same GGUF plus one trailing byte, which the reader ignores
//! but the fingerprint hashes) attaches to the same cache-service and never hits the prompts
//! of the first; the miss is counted as `salt_mismatch`; the original engine still hits.
//! Run: `cargo build --release --bins && cargo test --release -p e2e --test cache_fingerprint -- --test-threads=1`.

use std::path::PathBuf;

use e2e::{Stack, cached_tokens, chat_until_ok, default_model, http_get, metric, prompt_tokens};
use serde_json::json;

const SALT_MISSES: &str = "edge_cache_tokens_missed_total{reason=\"salt_mismatch\"}";

/// The cache-service's count of prompt tokens missed for a salt/fingerprint mismatch.
fn salt_misses(stack: &Stack) -> f64 {
    metric(&http_get(&stack.cache_metrics_url).unwrap_or_default(), SALT_MISSES)
}

/// A byte-different copy of the default model: same weights, one extra trailing byte.
struct ModelCopy(PathBuf);

impl ModelCopy {
    fn new() -> ModelCopy {
        let path = std::env::temp_dir().join(format!("edge-e2e-fingerprint-{}.gguf", std::process::id()));
        let mut bytes = std::fs::read(default_model()).expect("read model");
        bytes.push(0);
        std::fs::write(&path, bytes).expect("write model copy");
        ModelCopy(path)
    }
}

impl Drop for ModelCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn set_model(args: &mut [String], model: &str) {
    let i = args.iter().position(|a| a == "--model").expect("--model flag");
    args[i + 1] = model.to_string();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_engine_with_another_fingerprint_never_hits_the_first_ones_prompts() {
    let copy = ModelCopy::new();
    let mut stack = Stack::start();
    let body = json!({
        "messages": [
            {"role": "system", "content": "You are a careful reviewer of systems code. ".repeat(10)},
            {"role": "user", "content": "List three causes of memory leaks."}
        ],
        "temperature": 0,
        "max_tokens": 8
    });
    let first = chat_until_ok(&stack, &body).await;
    let warm = chat_until_ok(&stack, &body).await;
    assert!(cached_tokens(&warm) > 0, "the same engine must hit its own prompt: {warm}");
    let misses_before = salt_misses(&stack);

    stack.kill("engine-service", libc::SIGKILL);
    stack.respawn_with("engine-service", |a| set_model(a, &copy.0.display().to_string()));
    let other = chat_until_ok(&stack, &body).await;
    assert_eq!(cached_tokens(&other), 0, "another fingerprint hit the first engine's pages: {other}");
    // Same weights, so the same greedy answer: only the cache key differs.
    assert_eq!(other["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"]);
    let misses = salt_misses(&stack) - misses_before;
    assert!(
        misses > 0.0 && misses < prompt_tokens(&other) as f64,
        "the miss must be counted as salt_mismatch (got {misses} of {} prompt tokens)",
        prompt_tokens(&other)
    );

    // The original model again: its pages were never shadowed by the other engine's.
    stack.kill("engine-service", libc::SIGKILL);
    stack.respawn_with("engine-service", |a| set_model(a, &default_model().display().to_string()));
    let back = chat_until_ok(&stack, &body).await;
    assert!(cached_tokens(&back) > 0, "the original fingerprint must hit again: {back}");
    assert_eq!(back["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"]);
    assert!(stack.all_alive());
}
