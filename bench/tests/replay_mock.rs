//! End-to-end replay against a minimal in-process SSE server: the request wire format, the
//! streamed reply merge, the figures, and abort-on-error.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bench::client::ChatClient;
use bench::dataset::Dataset;
use bench::replay::{self, ReplayOptions, TurnStatus};
use bench::tokens::TokenCounter;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const DATA: &str = bench::DEFAULT_DATASET;

/// (session header, body) of every request the server saw.
type Seen = Arc<Mutex<Vec<(Option<String>, Value)>>>;

async fn serve(fail_on: usize) -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let s2 = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else { return };
            let mut buf = Vec::new();
            let mut tmp = [0u8; 65536];
            let (head_end, len) = loop {
                let n = sock.read(&mut tmp).await.unwrap_or(0);
                if n == 0 {
                    break (0, 0);
                }
                buf.extend_from_slice(&tmp[..n]);
                if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..p]).to_lowercase();
                    let len = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0)))
                        .unwrap_or(0);
                    break (p + 4, len);
                }
            };
            while buf.len() < head_end + len {
                let n = sock.read(&mut tmp).await.unwrap_or(0);
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&tmp[..n]);
            }
            let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
            let session = head
                .lines()
                .find_map(|l| l.to_lowercase().starts_with("x-session-id:").then(|| l[13..].trim().to_string()));
            let body: Value = serde_json::from_slice(&buf[head_end..head_end + len]).unwrap_or(Value::Null);
            let n = {
                let mut g = s2.lock().unwrap();
                g.push((session, body));
                g.len()
            };
            let resp = if n == fail_on {
                "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\nconnection: close\r\n\r\nboom".to_string()
            } else {
                let events = [
                    r#"{"choices":[{"index":0,"delta":{"role":"assistant"}}]}"#,
                    r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"bash","arguments":"{\"command\": \"grep -rn x ."}}]}}]}"#,
                    r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":" | head\"}"}}]},"finish_reason":"tool_calls"}]}"#,
                    r#"{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":12,"prompt_tokens_details":{"cached_tokens":40}}}"#,
                    "[DONE]",
                ];
                let sse: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
                format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n{sse}")
            };
            let _ = sock.write_all(resp.as_bytes()).await;
            let _ = sock.shutdown().await;
        }
    });
    (format!("http://{addr}/v1"), seen)
}

fn opts(turns: usize) -> ReplayOptions {
    ReplayOptions {
        model: "mock".into(),
        max_completion_tokens: 64,
        send_max_tokens: true,
        temperature: 0.0,
        seed: 42,
        include_usage: true,
        conversations: Some(2),
        turns_per_conversation: Some(turns),
        max_prompt_tokens: None,
        empty_content_on_tool_calls: false,
        concurrency: 0,
        no_session_id: false,
    }
}

#[tokio::test]
async fn replay_end_to_end_against_a_mock_server() {
    let d = Dataset::load(std::path::Path::new(DATA), true).expect("dataset");
    let (url, seen) = serve(0).await;
    let client = ChatClient::new(&url, None, Duration::from_secs(10)).unwrap();
    let rep = replay::run(&d, &client, &url, &TokenCounter::none(), &opts(3)).await;
    let f = &rep.figures;
    assert!(f.valid);
    assert_eq!(f.turns_completed, 6);
    assert_eq!(f.output_tokens, 72);
    assert_eq!(f.prompt_tokens_total, 600);
    assert_eq!(f.cache_hit_pct, 40.0);
    assert!(f.tps > 0.0 && f.ttft_ms.p50.is_some());
    assert!(f.first_chunk_ms.p50.unwrap() <= f.ttft_ms.p50.unwrap());
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 6);
    assert_eq!(seen[0].0.as_deref(), Some("django__django-16899"));
    assert_eq!(seen[3].0.as_deref(), Some("sympy__sympy-12096"));
    let b = &seen[1].1;
    assert_eq!(b["max_completion_tokens"], 64);
    assert_eq!(b["max_tokens"], 64);
    assert_eq!(b["seed"], 42);
    assert_eq!(b["stream"], true);
    assert_eq!(b["messages"].as_array().unwrap().len(), 4);
    assert!(b["messages"][2].get("content").is_none());
    // The model's reply (grep | head) is never fed back: history is the recorded one.
    assert_eq!(b["messages"][2]["tool_calls"][0]["id"], "functions.bash:0");
    // Request 2 expects `grep` (recorded); the mock answers grep + head: IoU 1/2.
    assert_eq!(rep.turns[1].iou, Some(0.5));
    assert_eq!(rep.turns[0].reply.as_ref().unwrap().tool_calls[0].arguments, "{\"command\": \"grep -rn x . | head\"}");
}

#[tokio::test]
async fn an_error_aborts_the_conversation_and_invalidates_the_run() {
    let d = Dataset::load(std::path::Path::new(DATA), true).expect("dataset");
    let (url, seen) = serve(2).await;
    let client = ChatClient::new(&url, None, Duration::from_secs(10)).unwrap();
    let rep = replay::run(&d, &client, &url, &TokenCounter::none(), &opts(4)).await;
    let st: Vec<TurnStatus> = rep.turns.iter().map(|t| t.status).collect();
    use TurnStatus::{Aborted, Error, Ok as Done};
    assert_eq!(st, vec![Done, Error, Aborted, Aborted, Done, Done, Done, Done]);
    assert!(!rep.figures.valid);
    assert_eq!(rep.figures.turns_failed, 3);
    // The failed and aborted turns are scorable and score 0.
    assert_eq!(rep.figures.iou_missing, 3);
    assert_eq!(rep.turns[2].iou, Some(0.0));
    assert_eq!(rep.figures.iou_scorable, 8);
    // Aborted turns were never sent: 2 (first conversation) + 4 (second).
    assert_eq!(seen.lock().unwrap().len(), 6);
    assert!(rep.turns[1].error.as_deref().unwrap().contains("500"));
}

/// Against a real server when `EDGE_BENCH_ENDPOINT` is set (e.g. our stack from
/// `deploy/up.sh --port 8090`: `EDGE_BENCH_ENDPOINT=http://127.0.0.1:8090/v1`); skipped otherwise.
#[tokio::test]
async fn live_endpoint_small_subset_writes_a_report() {
    let Ok(url) = std::env::var("EDGE_BENCH_ENDPOINT") else { return };
    let d = Dataset::load(std::path::Path::new(DATA), true).expect("dataset");
    let client = ChatClient::new(&url, None, Duration::from_secs(600)).unwrap();
    let model = client.first_model().await.expect("GET /models").unwrap_or_else(|| "default".into());
    let mut o = opts(2);
    o.model = model;
    o.conversations = Some(1);
    o.max_completion_tokens = 16;
    let rep = replay::run(&d, &client, &url, &TokenCounter::none(), &o).await;
    assert!(rep.figures.valid, "{:?}", rep.turns.iter().map(|t| &t.error).collect::<Vec<_>>());
    assert_eq!(rep.figures.turns_completed, 2);
    assert!(rep.figures.output_tokens > 0 && rep.figures.output_tokens <= 32);
    assert!(rep.figures.prompt_tokens_total > 0);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("replay.json");
    std::fs::write(&path, serde_json::to_vec(&rep).unwrap()).unwrap();
    let back: replay::ReplayReport = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(back.turns.len(), 2);
}

#[tokio::test]
async fn conversations_run_at_once_with_concurrency_and_come_back_in_order() {
    let d = Dataset::load(std::path::Path::new(DATA), true).expect("dataset");
    let (url, seen) = serve(0).await;
    let client = ChatClient::new(&url, None, Duration::from_secs(10)).unwrap();
    let mut o = opts(3);
    o.concurrency = 2;
    o.no_session_id = true;
    let rep = replay::run(&d, &client, &url, &TokenCounter::none(), &o).await;
    assert!(rep.figures.valid);
    assert_eq!(rep.figures.turns_completed, 6);
    // Both conversations' first turns were sent before either's second.
    let seen = seen.lock().unwrap();
    let turns = |i: usize| seen[i].1["messages"].as_array().unwrap().len();
    assert_eq!((turns(0), turns(1)), (turns(1), turns(0)), "two first turns");
    assert_ne!(seen[0].1["messages"][1], seen[1].1["messages"][1], "of two conversations");
    assert!(seen.iter().all(|(session, _)| session.is_none()), "no X-Session-ID");
    // The records are in dataset order, whatever order the turns finished in.
    let ids: Vec<&str> = rep.turns.iter().map(|t| t.conversation_id.as_str()).collect();
    assert_eq!(ids[..3], ["django__django-16899"; 3]);
    assert_eq!(ids[3..], ["sympy__sympy-12096"; 3]);
    assert!(rep.subset.contains("2 conversations at once") && rep.subset.contains("no X-Session-ID"), "{}", rep.subset);
}
