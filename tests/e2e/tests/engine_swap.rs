//! Swapping the engine under load (deploy/swap-engine.sh): agent conversations keep going
//! while a new engine process takes the socket over and the old one drains; no request
//! fails, streams in flight on the old engine finish, and the new engine's first turns are
//! served from the cache the old one filled (same arena, same model fingerprint).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e::{Stack, client};
use serde_json::{Value, json};

/// One finished turn: when it started and ended, and its cached prompt tokens.
#[derive(Debug)]
struct Turn {
    started: Instant,
    ended: Instant,
    cached_tokens: u64,
}

/// One chat request; streamed ones ask for the usage chunk. Err holds what went wrong.
async fn turn(base: &str, messages: &[Value], stream: bool) -> Result<(String, u64), String> {
    let mut body = json!({"messages": messages, "temperature": 0, "max_tokens": if stream { 48 } else { 16 }});
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    let resp = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = resp.status().as_u16();
    let text = resp.text().await.map_err(|e| format!("body: {e}"))?;
    if status != 200 {
        return Err(format!("{status}: {text}"));
    }
    if !stream {
        let v: Value = serde_json::from_str(&text).map_err(|e| format!("json: {e}"))?;
        let content = v["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string();
        return Ok((content, e2e::cached_tokens(&v)));
    }
    let (mut content, mut cached, mut done) = (String::new(), 0, false);
    for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).map_err(|e| format!("chunk {data}: {e}"))?;
        if v.get("error").is_some() {
            return Err(format!("stream error: {data}"));
        }
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            content.push_str(c);
        }
        if !v["usage"].is_null() {
            cached = e2e::cached_tokens(&v);
        }
    }
    if !done {
        return Err("stream ended without [DONE]".into());
    }
    Ok((content, cached))
}

/// A conversation that keeps taking turns until `stop`; every other turn streams.
async fn conversation(base: String, topic: String, stop: Arc<AtomicBool>) -> (Vec<Turn>, Vec<String>) {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a precise assistant. ".repeat(12)}),
        json!({"role": "user", "content": format!("Explain {topic} in two sentences.")}),
    ];
    let (mut turns, mut errors) = (Vec::new(), Vec::new());
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        match turn(&base, &messages, i % 2 == 1).await {
            Ok((content, cached_tokens)) => {
                turns.push(Turn { started, ended: Instant::now(), cached_tokens });
                messages.push(json!({"role": "assistant", "content": content}));
                messages.push(json!({"role": "user", "content": "Go on."}));
                // Keep the history under the model's context.
                if messages.len() > 14 {
                    messages.drain(2..4);
                }
            }
            Err(e) => errors.push(e),
        }
        i += 1;
    }
    (turns, errors)
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit(") ").next().is_some_and(|rest| !rest.starts_with('Z')))
}

/// Stops the engine the swap started (not a child of the stack) when the test ends.
struct NewEngine(u32);

impl Drop for NewEngine {
    fn drop(&mut self) {
        // SAFETY: kill with a pid this test read from the engine's pid file.
        unsafe { libc::kill(self.0 as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while alive(self.0) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_engine_swap_under_load_fails_no_request_and_stays_warm() {
    let stack = Stack::start();
    let old_pid = stack.pid("engine-service").expect("engine pid");
    let pid_file = stack.runtime_dir().join("engine.sock.pid");
    assert_eq!(std::fs::read_to_string(&pid_file).unwrap().trim(), old_pid.to_string(), "the engine's pid file");

    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = ["caches", "sockets", "graphs", "queues"]
        .iter()
        .map(|topic| tokio::spawn(conversation(stack.base_url.clone(), topic.to_string(), stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;

    // The same binary: the swap a new build goes through (the engine is found by its pid file).
    let engine = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/engine-service");
    let swap_started = Instant::now();
    let out = tokio::process::Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/swap-engine.sh"))
        .arg(&engine)
        .env("EDGE_RUNTIME_DIR", stack.runtime_dir())
        .output()
        .await
        .unwrap();
    let swapped = Instant::now();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "swap-engine.sh failed:\n{stderr}\n{}", stack.log_tail());
    let new_pid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().expect("the new pid on stdout");
    let _new_engine = NewEngine(new_pid);
    assert_ne!(new_pid, old_pid);
    assert!(!alive(old_pid), "the old engine exited after draining");
    assert_eq!(std::fs::read_to_string(&pid_file).unwrap().trim(), new_pid.to_string());
    eprintln!("swap took {:?}:\n{stderr}", swapped - swap_started);

    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut turns, mut errors) = (Vec::new(), Vec::new());
    for task in tasks {
        let (t, e) = task.await.unwrap();
        turns.push(t);
        errors.extend(e);
    }
    assert!(errors.is_empty(), "requests failed across the swap: {errors:#?}\n{}", stack.log_tail());
    let total: usize = turns.iter().map(Vec::len).sum();
    let across = turns.iter().flatten().filter(|t| t.started < swapped && t.ended > swap_started).count();
    eprintln!("{total} turns, {across} of them in flight during the swap, 0 failed");
    assert!(across > 0, "some turns were in flight while the engines changed");
    // Each conversation's first turn on the new engine resumes its prefix from the cache.
    for (i, conv) in turns.iter().enumerate() {
        let first_after = conv
            .iter()
            .find(|t| t.started > swapped)
            .unwrap_or_else(|| panic!("conversation {i}: no turn after the swap"));
        assert!(first_after.cached_tokens > 0, "conversation {i}: the new engine's first turn hit nothing");
    }
}
