//! Gateway overhead on a running stack: the same prompt (as token ids), greedy, a fixed
//! number of tokens (`ignore_eos`), sent alternately to the gateway's streamed
//! `/v1/completions` and straight to the engine's gRPC `Generate`. Prints p50/p99 of
//! time-to-first-token and of per-token decode time (per run: the time from the first to the
//! last token over the tokens after the first) for both paths, and their difference.
//!
//! Usage: `cargo run --release -p gateway --example overhead -- [GATEWAY_URL] [ENGINE_URL]
//! [RUNS] [MAX_TOKENS]` (defaults: http://127.0.0.1:8080, http://127.0.0.1:50051, 50, 32).

use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use proto::engine::v1::engine_client::EngineClient;
use proto::engine::v1::{GenerateRequest, InfoRequest, SamplingParams, generate_response::Kind};
use serde_json::{Value, json};

/// Ends mid-sentence so the first generated token is text (not an ignored EOS).
const PROMPT: &str = "The history of the lighthouse begins in the ancient world, where fires were lit on hills to guide ships home. The first lighthouses were";

const PAUSE: Duration = Duration::from_millis(20);

/// One run's timings.
struct Sample {
    ttft: Duration,
    per_token: Duration,
}

fn per_token(first: Instant, last: Instant, tokens: usize) -> Duration {
    if tokens > 1 { (last - first) / (tokens as u32 - 1) } else { Duration::ZERO }
}

async fn via_engine(
    client: &mut EngineClient<tonic::transport::Channel>,
    tokenizer: &tokenizers::Tokenizer,
    ids: &[u32],
    max_tokens: u32,
    run: usize,
) -> anyhow::Result<Sample> {
    let req = GenerateRequest {
        session_id: String::new(),
        request_id: format!("overhead-engine-{run}"),
        prompt_token_ids: ids.to_vec(),
        sampling: Some(SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            max_tokens,
            ignore_eos: true,
            ..SamplingParams::default()
        }),
        cache_salt: String::new(),
        ..GenerateRequest::default()
    };
    let start = Instant::now();
    let mut stream = client.generate(req).await?.into_inner();
    let (mut first, mut last, mut tokens) = (None, start, 0usize);
    while let Some(msg) = stream.message().await? {
        match msg.kind {
            Some(Kind::Tokens(chunk)) if !chunk.token_ids.is_empty() => {
                last = Instant::now();
                tokens += chunk.token_ids.len();
                // Like the gateway's first text event: the first token with visible text
                // (a special token such as an ignored EOS decodes to nothing).
                if first.is_none() && tokenizer.decode(&chunk.token_ids, true).is_ok_and(|t| !t.is_empty()) {
                    first = Some(last);
                }
            }
            Some(Kind::Finished(_)) => break,
            _ => {}
        }
    }
    let first = first.context("engine sent no tokens")?;
    Ok(Sample { ttft: first - start, per_token: per_token(first, last, tokens) })
}

async fn via_gateway(
    http: &reqwest::Client,
    url: &str,
    model: &str,
    ids: &[u32],
    max_tokens: u32,
) -> anyhow::Result<Sample> {
    let body = json!({"model": model, "prompt": ids, "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": true, "stream": true,
        "stream_options": {"include_usage": true}});
    let start = Instant::now();
    let mut resp = http.post(url).json(&body).send().await?;
    if !resp.status().is_success() {
        bail!("gateway answered {}: {}", resp.status(), resp.text().await?);
    }
    let (mut first, mut last, mut buf) = (None, start, String::new());
    let mut completion_tokens = 0usize;
    while let Some(chunk) = resp.chunk().await? {
        let now = Instant::now();
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let event: String = buf.drain(..end + 2).collect();
            let Some(data) = event.trim().strip_prefix("data: ") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                completion_tokens = n as usize;
            }
            if v["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty()) {
                last = now;
                first.get_or_insert(now);
            }
        }
    }
    let first = first.context("gateway sent no text")?;
    Ok(Sample { ttft: first - start, per_token: per_token(first, last, completion_tokens) })
}

fn pct(values: &mut [Duration], p: f64) -> Duration {
    values.sort();
    let idx = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[idx]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn report(name: &str, samples: &[Sample]) -> [f64; 4] {
    let mut ttft: Vec<Duration> = samples.iter().map(|s| s.ttft).collect();
    let mut tok: Vec<Duration> = samples.iter().map(|s| s.per_token).collect();
    let r = [ms(pct(&mut ttft, 0.5)), ms(pct(&mut ttft, 0.99)), ms(pct(&mut tok, 0.5)), ms(pct(&mut tok, 0.99))];
    println!(
        "{name:<8} TTFT p50 {:7.2} ms  p99 {:7.2} ms | per token p50 {:6.3} ms  p99 {:6.3} ms",
        r[0], r[1], r[2], r[3]
    );
    r
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let gateway = args.first().map_or("http://127.0.0.1:8080", String::as_str);
    let engine = args.get(1).map_or("http://127.0.0.1:50051", String::as_str);
    let runs: usize = args.get(2).map_or(Ok(50), |s| s.parse())?;
    let max_tokens: u32 = args.get(3).map_or(Ok(32), |s| s.parse())?;

    let mut client = EngineClient::connect(engine.to_owned()).await?;
    let info = client.info(InfoRequest {}).await?.into_inner();
    let tokenizer =
        tokenizers::Tokenizer::from_str(&info.tokenizer_json).map_err(|e| anyhow::anyhow!("tokenizer: {e}"))?;
    let ids = tokenizer.encode(PROMPT, false).map_err(|e| anyhow::anyhow!("encode: {e}"))?.get_ids().to_vec();
    let http = reqwest::Client::builder().tcp_nodelay(true).timeout(Duration::from_secs(300)).build()?;
    let url = format!("{gateway}/v1/completions");
    println!("prompt {} tokens, {max_tokens} tokens generated, {runs} runs per path (+3 warm-up each)", ids.len());
    for run in 0..3 {
        via_engine(&mut client, &tokenizer, &ids, max_tokens, run).await?;
        via_gateway(&http, &url, &info.model_id, &ids, max_tokens).await?;
    }
    let (mut direct, mut proxied) = (Vec::new(), Vec::new());
    // Alternate so drift (cache state, thermal, other load) hits both paths alike.
    for run in 0..runs {
        // A pause before each request so every run starts on an idle engine.
        tokio::time::sleep(PAUSE).await;
        direct.push(via_engine(&mut client, &tokenizer, &ids, max_tokens, run + 3).await?);
        tokio::time::sleep(PAUSE).await;
        proxied.push(via_gateway(&http, &url, &info.model_id, &ids, max_tokens).await?);
    }
    let e = report("engine", &direct);
    let g = report("gateway", &proxied);
    println!(
        "overhead TTFT p50 {:+7.2} ms  p99 {:+7.2} ms | per token p50 {:+6.3} ms  p99 {:+6.3} ms",
        g[0] - e[0],
        g[1] - e[1],
        g[2] - e[2],
        g[3] - e[3]
    );
    Ok(())
}
