//! Throughput of concurrent multi-turn conversations against the real stack (cache-service,
//! engine-service, gateway release binaries, started here by `e2e::Stack`). Each conversation
//! has its own ~300-token system prompt and `--turns` turns; every turn resends the whole
//! history plus a new user message (greedy, `--max-tokens`), streamed, as agents do.
//! Reports completion tok/s, requests/s, TTFT p50/p99 and the share of prompt tokens served
//! from the cache (from `usage`, cross-checked with the cache-service's counters).
//! Run: `cargo build --release --bins && cargo run --release -p e2e --example conversations -- --conversations 32 --turns 4`.

use std::time::{Duration, Instant};

use e2e::{Stack, StackOptions, http_get, metric};
use futures::StreamExt;
use serde_json::{Value, json};

struct Options {
    conversations: usize,
    turns: usize,
    max_tokens: u64,
    arena_mib: u64,
    max_running: usize,
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options { conversations: 32, turns: 4, max_tokens: 16, arena_mib: 1024, max_running: 32 };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let n: u64 = value.parse().map_err(|_| format!("{flag}: not a number: {value}"))?;
        match flag.as_str() {
            "--conversations" => o.conversations = n as usize,
            "--turns" => o.turns = n as usize,
            "--max-tokens" => o.max_tokens = n,
            "--arena-mib" => o.arena_mib = n,
            "--max-running" => o.max_running = n as usize,
            _ => {
                return Err(format!(
                    "unknown flag {flag} (--conversations --turns --max-tokens --arena-mib --max-running)"
                ));
            }
        }
    }
    if o.conversations == 0 || o.turns == 0 || o.max_tokens == 0 {
        return Err("--conversations, --turns and --max-tokens must be positive".into());
    }
    Ok(o)
}

/// One streamed turn as the client saw it.
struct Turn {
    index: usize,
    ttft: Duration,
    answer: String,
    prompt_tokens: u64,
    cached_tokens: u64,
    completion_tokens: u64,
}

/// A ~300-token system prompt, distinct per conversation (its first words differ), so no
/// conversation is served from another's pages: the hits measured are the turn-over-turn ones.
fn system_prompt(conversation: usize) -> String {
    format!(
        "Session {conversation}. You are a coding agent working in a Rust repository. {}",
        "Read the files you are given, explain what you change and why, keep every test green, \
         prefer small focused edits, never invent APIs that do not exist, and answer briefly. "
            .repeat(7)
    )
}

fn user_message(conversation: usize, turn: usize) -> String {
    format!("Conversation {conversation}, step {turn}: what should we check next in module m{turn}?")
}

async fn stream_turn(
    client: &reqwest::Client,
    base: &str,
    messages: &[Value],
    max_tokens: u64,
    index: usize,
) -> Result<Turn, String> {
    let body = json!({
        "messages": messages,
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true}
    });
    let start = Instant::now();
    let resp =
        client.post(format!("{base}/v1/chat/completions")).json(&body).send().await.map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        let status = resp.status();
        return Err(format!("HTTP {status}: {}", resp.text().await.unwrap_or_default()));
    }
    let mut stream = resp.bytes_stream();
    let (mut buf, mut answer, mut ttft, mut usage) = (String::new(), String::new(), None, Value::Null);
    while let Some(chunk) = stream.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk.map_err(|e| e.to_string())?));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            for data in event.lines().filter_map(|l| l.strip_prefix("data: ")) {
                if data.trim() == "[DONE]" {
                    continue;
                }
                let v: Value = serde_json::from_str(data).map_err(|e| format!("bad SSE data {data}: {e}"))?;
                if let Some(text) = v["choices"][0]["delta"]["content"].as_str() {
                    if !text.is_empty() && ttft.is_none() {
                        ttft = Some(start.elapsed());
                    }
                    answer.push_str(text);
                }
                if !v["usage"].is_null() {
                    usage = v["usage"].clone();
                }
            }
        }
    }
    let u = |k: &str| usage[k].as_u64().unwrap_or(0);
    Ok(Turn {
        index,
        ttft: ttft.unwrap_or_else(|| start.elapsed()),
        answer,
        prompt_tokens: u("prompt_tokens"),
        cached_tokens: usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0),
        completion_tokens: u("completion_tokens"),
    })
}

async fn conversation(
    client: reqwest::Client,
    base: String,
    id: usize,
    turns: usize,
    max_tokens: u64,
) -> Result<Vec<Turn>, String> {
    let mut messages = vec![json!({"role": "system", "content": system_prompt(id)})];
    let mut out = Vec::with_capacity(turns);
    for t in 0..turns {
        messages.push(json!({"role": "user", "content": user_message(id, t)}));
        let turn = stream_turn(&client, &base, &messages, max_tokens, t).await?;
        messages.push(json!({"role": "assistant", "content": turn.answer}));
        out.push(turn);
    }
    Ok(out)
}

fn percentile(sorted: &[Duration], q: f64) -> f64 {
    sorted.get(((sorted.len().saturating_sub(1)) as f64 * q).round() as usize).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

#[tokio::main]
async fn main() {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("conversations: {e}");
            std::process::exit(2);
        }
    };
    let stack = Stack::start_with(StackOptions {
        cache_args: vec!["--arena-bytes".into(), (o.arena_mib << 20).to_string()],
        engine_args: vec!["--max-running".into(), o.max_running.to_string()],
        ..StackOptions::default()
    });
    let client = reqwest::Client::builder().timeout(Duration::from_secs(600)).build().expect("http client");
    let cache_page = |s: &Stack| http_get(&s.cache_metrics_url).unwrap_or_default();
    let before = cache_page(&stack);

    let start = Instant::now();
    let tasks: Vec<_> = (0..o.conversations)
        .map(|id| tokio::spawn(conversation(client.clone(), stack.base_url.clone(), id, o.turns, o.max_tokens)))
        .collect();
    let mut turns = Vec::new();
    let mut failed = 0usize;
    for task in tasks {
        match task.await {
            Ok(Ok(t)) => turns.extend(t),
            Ok(Err(e)) => {
                failed += 1;
                eprintln!("conversation failed: {e}");
            }
            Err(e) => {
                failed += 1;
                eprintln!("conversation task failed: {e}");
            }
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let after = cache_page(&stack);

    let completion: u64 = turns.iter().map(|t| t.completion_tokens).sum();
    let prompt: u64 = turns.iter().map(|t| t.prompt_tokens).sum();
    let cached: u64 = turns.iter().map(|t| t.cached_tokens).sum();
    let later = turns.iter().filter(|t| t.index > 0);
    let (later_prompt, later_cached) = later.fold((0u64, 0u64), |(p, c), t| (p + t.prompt_tokens, c + t.cached_tokens));
    let mut ttft: Vec<Duration> = turns.iter().map(|t| t.ttft).collect();
    ttft.sort();
    let mut later_ttft: Vec<Duration> = turns.iter().filter(|t| t.index > 0).map(|t| t.ttft).collect();
    later_ttft.sort();
    let delta = |name: &str| metric(&after, name) - metric(&before, name);
    let queried = delta("edge_cache_prompt_tokens_queried_total");
    let hit = delta("edge_cache_tokens_hit_total{kind=\"full_page\"}")
        + delta("edge_cache_tokens_hit_total{kind=\"partial_page\"}");
    let pct = |a: u64, b: u64| if b == 0 { 0.0 } else { 100.0 * a as f64 / b as f64 };

    println!("conversations {} x turns {} (max_tokens {}, greedy, streamed)", o.conversations, o.turns, o.max_tokens);
    println!("requests ok {}  failed conversations {failed}  wall {wall:.2} s", turns.len());
    println!("completion tokens {completion}  -> {:.1} tok/s", completion as f64 / wall);
    println!("requests/s {:.2}", turns.len() as f64 / wall);
    println!("TTFT all turns  p50 {:.0} ms  p99 {:.0} ms", percentile(&ttft, 0.5), percentile(&ttft, 0.99));
    println!("TTFT turns 2..  p50 {:.0} ms  p99 {:.0} ms", percentile(&later_ttft, 0.5), percentile(&later_ttft, 0.99));
    println!("prompt tokens {prompt}  from cache {cached} ({:.1}%)", pct(cached, prompt));
    println!(
        "turns 2..: prompt tokens {later_prompt}  from cache {later_cached} ({:.1}%)",
        pct(later_cached, later_prompt)
    );
    println!(
        "cache-service counters: queried {queried:.0}  hit {hit:.0} ({:.1}%)",
        if queried > 0.0 { 100.0 * hit / queried } else { 0.0 }
    );
    if failed > 0 {
        std::process::exit(1);
    }
}
