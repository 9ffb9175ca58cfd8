//! Decode speed with and without suffix speculation, through the real step loop, on
//! agentic-style prompts: conversations of the Edge Agentic replay dataset (system prompt,
//! task, tool outputs; rendered as ChatML, cut to a token budget), one request at a time.
//!
//!   cargo bench -p engine-service --bench speculative [-- MODEL.gguf]
//!
//! Env: EDGE_SPEC_BENCH_DATA (JSONL; default the shared replay file), EDGE_SPEC_BENCH_CONVS
//! (conversations, default 6), EDGE_SPEC_BENCH_TOKENS (generated per request, default 128),
//! EDGE_SPEC_BENCH_CTX (prompt token cap, default 1536), EDGE_SPEC_BENCH_THREADS (default all
//! cores), EDGE_SPEC_BENCH_BATCH (requests run together, default 1).
//! Greedy, EOS ignored (every request generates the same count). Reports decode tokens/s
//! (first token excluded: it comes from prefill), mean tokens emitted per verify pass, and
//! checks every speculative run emits exactly the plain tokens.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Instant;

use engine_service::backend::cpu::CpuBackend;
use engine_service::backend::Backend;
use engine_service::memory::store::PageStore;
use engine_service::sampling::{Sampler, SamplingParams};
use engine_service::scheduler::{Command, NewSequence, SeqEvent, StopRules};
use engine_service::speculative::{SpecConfig, TreeShape};
use engine_service::step::{StepLimits, StepLoop};
use engine_service::tokenizer::ModelTokenizer;

const PAGE_TOKENS: usize = 16;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// ChatML renderings of the first client turns of `n` conversations, each cut to `cap`
/// tokens (the start of the conversation is kept whole; the last message is cut).
fn agentic_prompts(tok: &ModelTokenizer, path: &PathBuf, n: usize, cap: usize) -> Vec<Vec<u32>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{}: {e}; using built-in agentic-style prompts", path.display());
            return builtin_prompts(tok);
        }
    };
    let mut convs: BTreeMap<String, Vec<(u64, String, String)>> = BTreeMap::new();
    let mut order = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let id = v["conversation_id"].as_str().unwrap_or_default().to_string();
        let role = v["role"].as_str().unwrap_or("user").to_string();
        let content = match &v["content"] {
            serde_json::Value::String(s) => s.clone(),
            other if !other.is_null() => other.to_string(),
            _ => v.get("tool_calls").map(|t| t.to_string()).unwrap_or_default(),
        };
        if !convs.contains_key(&id) {
            order.push(id.clone());
        }
        convs.entry(id).or_default().push((v["turn"].as_u64().unwrap_or(0), role, content));
    }
    let mut out = Vec::new();
    for id in order.iter().take(n) {
        let mut rows = convs[id].clone();
        rows.sort_by_key(|r| r.0);
        // Up to the fourth client row: task, then tool outputs the agent reads.
        let mut text = String::new();
        let mut clients = 0;
        for (_, role, content) in &rows {
            let role = if role == "tool" { "user" } else { role.as_str() };
            text.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
            if role != "assistant" {
                clients += 1;
                if clients == 4 {
                    break;
                }
            }
        }
        let mut ids = tok.encode(&text, false).expect("encode");
        let tail = tok.encode("<|im_end|>\n<|im_start|>assistant\n", false).expect("encode");
        ids.truncate(cap.saturating_sub(tail.len()));
        ids.extend(tail);
        out.push(ids);
    }
    out
}

fn builtin_prompts(tok: &ModelTokenizer) -> Vec<Vec<u32>> {
    let code = "fn parse(line: &str) -> Option<(String, u32)> {\n    let mut it = line.split(':');\n    let name = it.next()?.trim().to_string();\n    let n = it.next()?.trim().parse().ok()?;\n    Some((name, n))\n}\n";
    [
        format!("Here is src/parse.rs:\n```rust\n{code}```\nRename `parse` to `parse_entry` and print the whole file."),
        format!("The command `cat src/parse.rs` printed:\n{code}\nShow the file again with a doc comment added."),
        "The tool returned {\"files\": [\"a.rs\", \"b.rs\"], \"ok\": true}. Repeat the JSON.".to_string(),
    ]
    .iter()
    .map(|u| tok.encode(&format!("<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n"), false).expect("encode"))
    .collect()
}

struct Run {
    tokens: Vec<Vec<u32>>,
    decode_tokens: usize,
    decode_s: f64,
    /// Steps after the first token (each verifies one tree or decodes one token).
    decode_steps: usize,
}

fn run(model: &PathBuf, threads: usize, spec: Option<SpecConfig>, prompts: &[Vec<u32>], n_tokens: usize, batch: usize) -> Run {
    let loaded = CpuBackend::load(model, threads, PAGE_TOKENS).expect("load model");
    let layout = loaded.backend.kv_layout();
    let limits = StepLimits {
        max_batch_tokens: 512,
        max_running: batch.max(1),
        context_length: loaded.backend.hparams().context_length,
        page_tokens: PAGE_TOKENS,
        eos_token_ids: loaded.tokenizer.eos_token_ids.clone(),
    };
    let (tx, rx) = mpsc::channel();
    let mut lp = StepLoop::new(Box::new(loaded.backend), PageStore::local(layout, 4096), limits, rx);
    if let Some(cfg) = spec {
        lp = lp.with_speculation(cfg);
    }
    let thread = std::thread::spawn(move || lp.run());
    let mut out = Run { tokens: Vec::new(), decode_tokens: 0, decode_s: 0.0, decode_steps: 0 };
    for group in prompts.chunks(batch.max(1)) {
        let mut streams = Vec::new();
        for (i, p) in group.iter().enumerate() {
            let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
            let new = NewSequence {
                request_id: format!("bench-{i}"),
                prompt: p.clone(),
                sampler: Sampler::new(SamplingParams::greedy()),
                stop: StopRules { max_tokens: n_tokens, stop_token_ids: Vec::new(), ignore_eos: true },
                cache_salt: String::new(),
                logprobs: None,
                cached_pages: Vec::new(),
                cached_tokens: 0,
                cached_partial_tokens: 0,
                events: etx,
                arrived: Instant::now(),
            };
            tx.send(Command::Admit(Box::new(new))).expect("step loop alive");
            streams.push(erx);
        }
        for mut erx in streams {
            let (mut toks, mut chunks) = (Vec::new(), 0usize);
            while let Some(ev) = erx.blocking_recv() {
                match ev {
                    SeqEvent::Tokens { ids, .. } => {
                        toks.extend(ids);
                        chunks += 1;
                    }
                    SeqEvent::Finished { timings, .. } => {
                        out.decode_s += timings.decode_ns as f64 / 1e9;
                        break;
                    }
                    SeqEvent::Failed(s) => panic!("request failed: {s}"),
                }
            }
            out.decode_tokens += toks.len().saturating_sub(1);
            out.decode_steps += chunks.saturating_sub(1);
            out.tokens.push(toks);
        }
    }
    drop(tx);
    thread.join().expect("step loop");
    out
}

fn main() {
    let model = std::env::args()
        .skip(1)
        .find(|a| a.ends_with(".gguf"))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/SmolLM2-135M-Instruct.Q4_1.gguf")));
    let data = PathBuf::from(
        std::env::var("EDGE_SPEC_BENCH_DATA")
            .unwrap_or_else(|_| "/work/shared/data/mlperf-edge-agentic/agentic_coding_2.5h.jsonl".to_string()),
    );
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let threads = env_usize("EDGE_SPEC_BENCH_THREADS", cores);
    let n_convs = env_usize("EDGE_SPEC_BENCH_CONVS", 6);
    let n_tokens = env_usize("EDGE_SPEC_BENCH_TOKENS", 128);
    let cap = env_usize("EDGE_SPEC_BENCH_CTX", 1536);
    let batch = env_usize("EDGE_SPEC_BENCH_BATCH", 1);
    let tok = CpuBackend::load(&model, 1, PAGE_TOKENS).expect("load model").tokenizer;
    let prompts = agentic_prompts(&tok, &data, n_convs, cap);
    let prompt_tokens: usize = prompts.iter().map(|p| p.len()).sum();
    println!(
        "model {}  threads {threads}  {} prompts ({} tokens avg)  {n_tokens} tokens each  batch {batch}",
        model.display(),
        prompts.len(),
        prompt_tokens / prompts.len().max(1)
    );
    let configs: Vec<(&str, Option<SpecConfig>)> = vec![
        ("off", None),
        ("suffix D8 k2 N16 (seed)", Some(TreeShape::SEED)),
        ("suffix D3 k1 N4 (linear)", Some(TreeShape { max_depth: 3, top_k: 1, max_nodes: 4 })),
        ("suffix D16 k2 N32", Some(TreeShape { max_depth: 16, top_k: 2, max_nodes: 32 })),
    ]
    .into_iter()
    .map(|(name, shape)| (name, shape.map(|s| SpecConfig { enabled: true, shape: s, max_batch: batch.max(4), ..SpecConfig::default() })))
    .collect();
    println!("{:<26} {:>12} {:>14} {:>9}", "speculation", "decode tok/s", "tokens/pass", "speedup");
    let mut base: Option<(f64, Vec<Vec<u32>>)> = None;
    for (name, cfg) in configs {
        let r = run(&model, threads, cfg, &prompts, n_tokens, batch);
        let tps = r.decode_tokens as f64 / r.decode_s.max(1e-9);
        let per_pass = r.decode_tokens as f64 / r.decode_steps.max(1) as f64;
        let speedup = base.as_ref().map_or(1.0, |b| tps / b.0);
        println!("{name:<26} {tps:>12.1} {per_pass:>14.2} {speedup:>8.2}x");
        match &base {
            None => base = Some((tps, r.tokens)),
            Some((_, want)) => {
                let same = r.tokens == *want;
                assert!(same, "{name}: speculative output differs from plain decoding");
            }
        }
    }
}
