//! The official MLPerf harness's request bodies against the real stack. The bodies in
//! `fixtures/official_harness_requests.jsonl` were built with the harness's own code path
//! (`scripts/bench/bfcl_official.py`: its message builder and bfcl-eval's `convert_to_tool`)
//! with the reference config's model parameters, model name `Qwen3.6-27B-Q4_K_M` included:
//! the default (not strict) gateway serves them with the default model, and says so.

use e2e::{Stack, StackOptions, chat};
use serde_json::{Value, json};

/// The recorded bodies, with the output cap lowered so the test stays cheap on a CPU.
fn recorded() -> Vec<(String, Value)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/official_harness_requests.jsonl");
    let text = std::fs::read_to_string(&path).expect("fixture");
    text.lines()
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).expect("json line");
            v["body"]["max_completion_tokens"] = json!(8);
            (v["sample"].as_str().unwrap_or_default().to_string(), v["body"].take())
        })
        .collect()
}

async fn post_streamed(stack: &Stack, body: &Value) -> (u16, String) {
    let resp =
        e2e::client().post(format!("{}/v1/chat/completions", stack.base_url)).json(body).send().await.expect("request");
    (resp.status().as_u16(), resp.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reference_model_name_is_served_by_default_and_refused_when_strict() {
    let stack = Stack::start();
    let bodies = recorded();
    assert_eq!(bodies.len(), 4);
    for (sample, body) in &bodies {
        assert_eq!(body["model"], "Qwen3.6-27B-Q4_K_M");
        let (status, text) = post_streamed(&stack, body).await;
        assert_eq!(status, 200, "{sample}: {text}\n{}", stack.log_tail());
        assert!(text.contains("data: [DONE]"), "{sample}: {text}");
        let first: Value = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .find_map(|d| serde_json::from_str(d).ok())
            .expect("a chunk");
        // The reply names the model actually served, not the requested name.
        assert_ne!(first["model"], "Qwen3.6-27B-Q4_K_M", "{sample}");
    }
    let (status, v) = chat(
        &stack,
        &json!({"model": "Qwen3.6-27B-Q4_K_M", "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    drop(stack);

    let strict =
        StackOptions { gateway_args: vec!["--strict-model-names".into(), "true".into()], ..Default::default() };
    let stack = Stack::start_with(strict);
    let (status, v) = chat(&stack, &bodies[0].1).await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["error"]["code"], "model_not_found");
}

#[tokio::test(flavor = "multi_thread")]
async fn served_model_name_aliases_are_listed_and_reported() {
    let opts = StackOptions {
        gateway_args: vec![
            "--served-model-name".into(),
            "Qwen3.6-27B-Q4_K_M,smol".into(),
            "--strict-model-names".into(),
            "true".into(),
        ],
        ..Default::default()
    };
    let stack = Stack::start_with(opts);
    let models: Value =
        serde_json::from_str(&e2e::http_get(&format!("{}/v1/models", stack.base_url)).expect("models")).expect("json");
    let ids: Vec<&str> = models["data"].as_array().expect("data").iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(ids, ["Qwen3.6-27B-Q4_K_M", "smol"]);
    for name in ["Qwen3.6-27B-Q4_K_M", "smol"] {
        let (status, v) =
            chat(&stack, &json!({"model": name, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}))
                .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["model"], "Qwen3.6-27B-Q4_K_M");
    }
}
