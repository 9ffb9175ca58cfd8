//! End-to-end: speculative decoding through the real stack changes speed, never output.
//! The same greedy requests, with the `speculation: false` request extension, with the
//! server default (suffix drafting, seed tree shape; first under a fresh cache salt, so only
//! the prompt can be drafted from, then where the plain reply is remembered) and with a
//! linear 3/1/4 tree, give the same text, finish reason, token count and logprobs, streamed
//! or not; the engine's metrics show drafts were verified, accepted and also rejected, so the
//! comparison is not vacuous.

use e2e::{Stack, chat, chat_streamed, content, http_get, metric};
use serde_json::{Value, json};

/// Prompts whose answers copy text from the prompt (what agents' replies do with tool
/// output), so the suffix drafter has runs to propose.
fn prompts() -> Vec<String> {
    let listing: Vec<String> = (1..=30).map(|i| format!("./src/service_{i}/handler_{}.rs", i * 7)).collect();
    let config = "[server]\nlisten = \"0.0.0.0:8080\"\nworkers = 4\n\n[cache]\nsize_mb = 512\nevict = \"lru\"\n";
    vec![
        format!("Here is the output of `find . -name '*.rs'`:\n{}\n\nRepeat the list exactly.", listing.join("\n")),
        format!("Copy this configuration file verbatim, then say which port it uses:\n\n{config}"),
        "Fix the spelling mistakes and print the whole function again:\n\n```python\ndef total_price(items):\n    totl = 0\n    for item in items:\n        totl += item.price * item.quantity\n    return totl\n```".to_string(),
    ]
}

fn body(prompt: &str) -> Value {
    json!({
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": 160,
        "logprobs": true,
        "top_logprobs": 2
    })
}

/// (content, finish reason, completion tokens, [(token, logprob)]) of a non-streamed reply.
fn outcome(v: &Value) -> (String, String, u64, Vec<(String, f64)>) {
    let choice = &v["choices"][0];
    let lp = choice["logprobs"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("logprobs missing: {v}"))
        .iter()
        .map(|e| (e["token"].as_str().unwrap_or_default().to_string(), e["logprob"].as_f64().unwrap_or(f64::NAN)))
        .collect();
    (
        content(v),
        choice["finish_reason"].as_str().unwrap_or_default().to_string(),
        v["usage"]["completion_tokens"].as_u64().unwrap_or(0),
        lp,
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn speculation_changes_speed_not_output() {
    let stack = Stack::start();
    for (i, prompt) in prompts().iter().enumerate() {
        let mut off = body(prompt);
        off["speculation"] = json!(false);
        let (status, plain) = chat(&stack, &off).await;
        assert_eq!(status, 200, "{plain}");
        let want = outcome(&plain);
        assert!(want.2 > 20, "prompt {i}: a reply long enough to draft in: {plain}");

        let on = body(prompt);
        let mut linear = body(prompt);
        linear["speculation"] = json!({"enabled": true, "max_depth": 3, "top_k": 1, "max_nodes": 4});
        // Its own cache salt: no earlier output of this prompt to draft from, only the prompt.
        let mut fresh = body(prompt);
        fresh["cache_salt"] = json!(format!("speculation-e2e-{i}"));
        for (name, request) in [("default, fresh salt", &fresh), ("default", &on), ("linear 3/1/4", &linear)] {
            let (status, got) = chat(&stack, request).await;
            assert_eq!(status, 200, "{got}");
            let got = outcome(&got);
            assert_eq!(got.0, want.0, "prompt {i}, {name}: text differs from speculation off");
            assert_eq!((&got.1, got.2), (&want.1, want.2), "prompt {i}, {name}: finish reason / token count");
            assert!(got.3 == want.3, "prompt {i}, {name}: logprobs differ from speculation off");
        }

        let mut streamed = on.clone();
        streamed["stream"] = json!(true);
        streamed["stream_options"] = json!({"include_usage": true});
        let (text, finish, usage, done) = chat_streamed(&stack, streamed).await;
        assert!(done, "stream must end with [DONE]");
        assert_eq!(text, want.0, "prompt {i}: streamed text with speculation differs");
        assert_eq!(finish, want.1);
        assert_eq!(usage["completion_tokens"].as_u64(), Some(want.2));
    }
    let page = http_get(&stack.engine_metrics_url).expect("engine metrics");
    let drafted = metric(&page, "edge_engine_spec_draft_tokens_total{drafter=\"suffix\"}");
    let accepted = metric(&page, "edge_engine_spec_accepted_tokens_total{drafter=\"suffix\"}");
    eprintln!("suffix drafts: {drafted} verified, {accepted} accepted");
    assert!(
        accepted >= 50.0 && drafted > accepted,
        "suffix drafts verified ({drafted}), accepted ({accepted}) and rejected"
    );
}
