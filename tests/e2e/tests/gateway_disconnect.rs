//! A client that hangs up mid-stream releases its cache pages: the cache-service's pinned
//! pages gauge returns to its baseline within a second of the disconnect.

use std::time::{Duration, Instant};

use e2e::Stack;
use serde_json::json;

const PINNED: &str = "edge_cache_pages_pinned";

fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(300)).build().expect("client")
}

/// The value of the unlabelled gauge `name` on a Prometheus page (0 when absent).
async fn gauge(url: &str, name: &str) -> f64 {
    let text = client().get(url).send().await.expect("metrics").text().await.expect("text");
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn disconnect_mid_stream_returns_pinned_pages_to_baseline_within_a_second() {
    let stack = Stack::start();
    let url = format!("{}/v1/chat/completions", stack.base_url);
    // A prompt of several pages, generated once so its pages are cached: the streamed
    // request below then pins them for as long as it runs.
    let prompt = "Here is a list of harbours: ".to_string()
        + &(1..=40).map(|i| format!("harbour number {i}")).collect::<Vec<_>>().join(", ")
        + ". Write a very long story about the sea.";
    let messages = json!([{"role": "user", "content": prompt}]);
    let idle = gauge(&stack.cache_metrics_url, PINNED).await;
    let warm = client()
        .post(&url)
        .json(&json!({"messages": messages, "max_tokens": 2, "temperature": 0}))
        .send()
        .await
        .expect("warm-up");
    assert_eq!(warm.status().as_u16(), 200, "{}", stack.log_tail());
    warm.bytes().await.expect("warm-up body");
    // The warm-up's own pins are released just after its last chunk; on a busy machine that
    // can take a moment, and a baseline read before it would include them.
    let settle = Instant::now();
    let mut baseline = gauge(&stack.cache_metrics_url, PINNED).await;
    while baseline > idle && settle.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        baseline = gauge(&stack.cache_metrics_url, PINNED).await;
    }

    let body = json!({"messages": messages, "max_tokens": 4000, "ignore_eos": true,
        "temperature": 0, "stream": true});
    let mut resp = client().post(&url).json(&body).send().await.expect("request");
    assert_eq!(resp.status().as_u16(), 200);
    let mut seen = String::new();
    while seen.matches("data: ").count() < 4 {
        let chunk = resp.chunk().await.expect("chunk").expect("stream ended early");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let during = gauge(&stack.cache_metrics_url, PINNED).await;
    assert!(
        during > baseline,
        "the running request pins no pages (baseline {baseline}, during {during}): the check below would prove nothing"
    );
    drop(resp);
    let hung_up = Instant::now();
    loop {
        let now = gauge(&stack.cache_metrics_url, PINNED).await;
        if now <= baseline {
            break;
        }
        assert!(
            hung_up.elapsed() < Duration::from_secs(1),
            "pinned pages still {now} (baseline {baseline}) {:?} after the disconnect; logs:\n{}",
            hung_up.elapsed(),
            stack.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("pinned pages {during} -> {baseline} {:?} after the disconnect", hung_up.elapsed());
    // The server still answers normally.
    let ok = client()
        .post(&url)
        .json(&json!({"messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 4}))
        .send()
        .await
        .expect("request");
    assert_eq!(ok.status().as_u16(), 200);
}
