//! Decode speed with and without suffix speculation, through the real step loop, on
//! agentic replay requests: conversations of the Edge Agentic replay dataset, one request
//! per client turn with the recorded history so far (ChatML, cut to a token budget), in
//! order, one request at a time (the same cache salt, so outputs of earlier turns feed the
//! drafter as they would in a replay).
//!
//!   cargo bench -p engine-service --bench speculative [-- MODEL.gguf]
//!
//! Env: EDGE_SPEC_BENCH_DATA (JSONL; default the shared replay file), EDGE_SPEC_BENCH_CONVS
//! (conversations, default 4), EDGE_SPEC_BENCH_TURNS (requests per conversation, default
//! 3), EDGE_SPEC_BENCH_TOKENS (generated per request, default 128),
//! EDGE_SPEC_BENCH_CTX (prompt token cap, default 1536), EDGE_SPEC_BENCH_THREADS (default all
//! cores), EDGE_SPEC_BENCH_BATCH (requests run together, default 1), EDGE_SPEC_BENCH_SHAPES
//! (trees to try as `D/k/N,...`, default `8/2/16,3/1/4,16/2/32`), EDGE_SPEC_BENCH_METRICS=1
//! (print the `edge_engine_spec_*` metrics of every run), EDGE_SPEC_BENCH_MIN_PROB (the
//! draft-node probability floor, default the server default), EDGE_SPEC_BENCH_MIN_MATCH (the
//! suffix drafter's shortest match, default 2).
//! First it prints the verify cost: time of one tree pass of N nodes (a chain-shaped tree,
//! all logits, at the prompt cap's context) over one plain decode step, best of 15;
//! EDGE_SPEC_BENCH_VERIFY_NODES (e.g. `2,3,5,6,9,16,17`) and EDGE_SPEC_BENCH_VERIFY_CTX
//! choose the sizes and the context.
//! Greedy, EOS ignored (every request generates the same count). Reports decode tokens/s
//! (first token excluded: it comes from prefill) by wall time and by process CPU time (decode
//! CPU = a run's CPU minus a prefill-only run's; robust on a busy machine, exact with one
//! thread), mean tokens emitted per verify pass, and checks every speculative run emits
//! exactly the plain tokens.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use engine_models::tokenizer::ModelTokenizer;
use engine_service::backend::cpu::CpuBackend;
use engine_service::backend::{Backend, ForwardBatch, LogitsWanted, SeqInput};
use engine_service::memory::store::PageStore;
use engine_service::memory::{MappedPool, PageId};
use engine_service::sampling::{Sampler, SamplingParams};
use engine_service::scheduler::{Command, NewSequence, SeqEvent, StopRules};
use engine_service::speculative::{SpecConfig, TreeShape};
use engine_service::step::{StepLimits, StepLoop};

const PAGE_TOKENS: usize = 16;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Replay-style requests: for each of `n` conversations, one request per client turn
/// (`turns` of them, from the second on: the task, then each tool output), each carrying the
/// recorded history up to that turn as ChatML, its last `cap` tokens kept.
fn agentic_prompts(tok: &ModelTokenizer, path: &Path, n: usize, turns: usize, cap: usize) -> Vec<Vec<u32>> {
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
        let mut text = String::new();
        let mut clients = 0;
        let tail = tok.encode("<|im_start|>assistant\n", false).expect("encode");
        for (_, role, content) in &rows {
            let role = if role == "tool" { "user" } else { role.as_str() };
            text.push_str(&format!("<|im_start|>{role}\n{content}<|im_end|>\n"));
            if role != "assistant" {
                clients += 1;
                if clients >= 2 {
                    let mut ids = tok.encode(&text, false).expect("encode");
                    let keep = cap.saturating_sub(tail.len());
                    ids.drain(..ids.len().saturating_sub(keep));
                    ids.extend(&tail);
                    out.push(ids);
                }
                if clients > turns {
                    break;
                }
            }
        }
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

/// CPU seconds used by this process so far (all threads).
fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// `T_verify(N) / T_decode(1)` for a few N (best of 15 passes each, CPU time); returns the
/// cost of one extra verified node in decode steps, `(T(16) / T(1) - 1) / 15`.
fn verify_cost(model: &Path, threads: usize, context: usize) -> f64 {
    let mut b = CpuBackend::load(model, threads, PAGE_TOKENS).expect("load model").backend;
    let n_pages = (context + 65).div_ceil(PAGE_TOKENS);
    let mut pool = MappedPool::new(&mut b, n_pages).expect("mapping a pool");
    let pages: Vec<PageId> = pool.allocate(n_pages).expect("pages");
    let prompt: Vec<u32> = (0..context as u32).map(|i| 1000 + (i * 7919) % 30_000).collect();
    for chunk in prompt.chunks(256).enumerate() {
        let seqs = vec![SeqInput {
            seq_id: 0,
            tokens: chunk.1,
            start_pos: chunk.0 * 256,
            pages: &pages,
            logits: LogitsWanted::None,
            tree: None,
        }];
        b.forward(&ForwardBatch { seqs }).expect("prefill");
    }
    let (mut base, mut per_node) = (0.0, 0.0);
    print!("verify cost at context {context}: ");
    let sizes: Vec<usize> = std::env::var("EDGE_SPEC_BENCH_VERIFY_NODES")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).filter(|&n| (1..=64).contains(&n)).collect())
        .unwrap_or_else(|| vec![2, 4, 8, 16, 32]);
    for n in
        std::iter::once(1).chain(sizes.iter().copied().filter(|&n| n > 1)).chain((!sizes.contains(&16)).then_some(16))
    {
        let tokens: Vec<u32> = (0..n as u32).map(|i| 500 + i).collect();
        let parents: Vec<Option<usize>> = (0..n).map(|j| j.checked_sub(1)).collect();
        let mut best = f64::INFINITY;
        for _ in 0..15 {
            let tree = (n > 1).then_some(&parents[..]);
            let logits = if n > 1 { LogitsWanted::All } else { LogitsWanted::Last };
            let seqs = vec![SeqInput { seq_id: 0, tokens: &tokens, start_pos: context, pages: &pages, logits, tree }];
            let t = cpu_seconds();
            b.forward(&ForwardBatch { seqs }).expect("verify");
            best = best.min(cpu_seconds() - t);
        }
        if n == 1 {
            base = best;
            print!("decode {:.1} ms", best * 1e3);
        } else {
            print!(", N={n} {:.2}x ({:.2} ms CPU)", best / base, best * 1e3);
        }
        if n == 16 {
            per_node = (best / base - 1.0) / 15.0;
        }
    }
    println!();
    per_node
}

/// Sum of a counter over its label sets in a Prometheus text rendering.
fn counter(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

struct Run {
    tokens: Vec<Vec<u32>>,
    decode_tokens: usize,
    decode_s: f64,
    /// Steps after the first token (each verifies one tree or decodes one token).
    decode_steps: usize,
    cpu_s: f64,
}

fn run(
    model: &Path,
    threads: usize,
    spec: Option<SpecConfig>,
    prompts: &[Vec<u32>],
    n_tokens: usize,
    batch: usize,
) -> Run {
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
    let cpu0 = cpu_seconds();
    let thread = std::thread::spawn(move || lp.run());
    let mut out = Run { tokens: Vec::new(), decode_tokens: 0, decode_s: 0.0, decode_steps: 0, cpu_s: 0.0 };
    for group in prompts.chunks(batch.max(1)) {
        let mut streams = Vec::new();
        for (i, p) in group.iter().enumerate() {
            let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
            let new = NewSequence::new(
                format!("bench-{i}"),
                p.clone(),
                Sampler::new(SamplingParams::greedy()),
                StopRules { max_tokens: n_tokens, stop_token_ids: Vec::new(), ignore_eos: true },
                etx,
            );
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
    out.cpu_s = cpu_seconds() - cpu0;
    out
}

fn main() {
    let model = std::env::args().skip(1).find(|a| a.ends_with(".gguf")).map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    });
    let data = PathBuf::from(std::env::var("EDGE_SPEC_BENCH_DATA").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/data/mlperf-edge-agentic/agentic_coding_2.5h.jsonl").to_string()
    }));
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let threads = env_usize("EDGE_SPEC_BENCH_THREADS", cores);
    let n_convs = env_usize("EDGE_SPEC_BENCH_CONVS", 4);
    let n_turns = env_usize("EDGE_SPEC_BENCH_TURNS", 3);
    let n_tokens = env_usize("EDGE_SPEC_BENCH_TOKENS", 128);
    let cap = env_usize("EDGE_SPEC_BENCH_CTX", 1536);
    let batch = env_usize("EDGE_SPEC_BENCH_BATCH", 1);
    let tok = CpuBackend::load(&model, 1, PAGE_TOKENS).expect("load model").tokenizer;
    let prompts = agentic_prompts(&tok, &data, n_convs, n_turns, cap);
    let prompt_tokens: usize = prompts.iter().map(|p| p.len()).sum();
    println!(
        "model {}  threads {threads}  {} prompts ({} tokens avg)  {n_tokens} tokens each  batch {batch}",
        model.display(),
        prompts.len(),
        prompt_tokens / prompts.len().max(1)
    );
    let shapes = std::env::var("EDGE_SPEC_BENCH_SHAPES").unwrap_or_else(|_| "8/2/16,3/1/4,16/2/32".to_string());
    let mut configs: Vec<(String, Option<SpecConfig>)> = vec![("off".to_string(), None)];
    for spec in shapes.split(',') {
        let v: Vec<usize> = spec.split('/').filter_map(|x| x.trim().parse().ok()).collect();
        let [d, k, n] = v[..] else { panic!("EDGE_SPEC_BENCH_SHAPES: {spec:?} is not D/k/N") };
        let shape = TreeShape { max_depth: d, top_k: k, max_nodes: n };
        shape.validate().expect("tree shape");
        let mut cfg = SpecConfig { enabled: true, shape, max_batch: batch.max(4), ..SpecConfig::default() };
        if let Some(p) = std::env::var("EDGE_SPEC_BENCH_MIN_PROB").ok().and_then(|v| v.parse().ok()) {
            cfg.min_node_prob = p;
        }
        if let Some(m) = std::env::var("EDGE_SPEC_BENCH_MIN_MATCH").ok().and_then(|v| v.parse().ok()) {
            cfg.suffix.min_match = m;
        }
        configs.push((format!("suffix D{d} k{k} N{n}"), Some(cfg)));
    }
    let show_metrics = std::env::var("EDGE_SPEC_BENCH_METRICS").is_ok_and(|v| v == "1");
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let prom = recorder.handle();
    metrics::set_global_recorder(recorder).expect("first recorder");
    let per_node = verify_cost(&model, threads, env_usize("EDGE_SPEC_BENCH_VERIFY_CTX", cap));
    println!("(modeled speedup: decode steps saved, a verified draft node costing {per_node:.2} decode steps)");
    // Same prompts, one token each: the prefill's CPU time, subtracted from every run.
    let prefill_cpu = run(&model, threads, None, &prompts, 1, batch).cpu_s;
    println!(
        "{:<22} {:>12} {:>9} {:>12} {:>9} {:>12} {:>9}",
        "speculation", "wall tok/s", "speedup", "cpu tok/s", "speedup", "tokens/pass", "modeled"
    );
    let mut drafted_before = 0.0;
    let mut base_cpu = 0.0;
    let mut base: Option<(f64, Vec<Vec<u32>>)> = None;
    for (name, cfg) in configs {
        let r = run(&model, threads, cfg, &prompts, n_tokens, batch);
        let tps = r.decode_tokens as f64 / r.decode_s.max(1e-9);
        let per_pass = r.decode_tokens as f64 / r.decode_steps.max(1) as f64;
        let speedup = base.as_ref().map_or(1.0, |b| tps / b.0);
        let cpu_tps = r.decode_tokens as f64 / (r.cpu_s - prefill_cpu).max(1e-9);
        if base.is_none() {
            base_cpu = cpu_tps;
        }
        let text = prom.render();
        let drafted = counter(&text, "edge_engine_spec_draft_tokens_total");
        let cost = r.decode_steps as f64 + per_node * (drafted - drafted_before);
        drafted_before = drafted;
        let modeled = r.decode_tokens as f64 / cost.max(1.0);
        println!(
            "{name:<22} {tps:>12.1} {speedup:>8.2}x {cpu_tps:>12.1} {:>8.2}x {per_pass:>12.2} {modeled:>8.2}x",
            cpu_tps / base_cpu
        );
        if show_metrics {
            for line in text.lines().filter(|l| l.starts_with("edge_engine_spec_") && !l.contains("_seconds")) {
                println!("    {line}");
            }
        }
        match &base {
            None => base = Some((tps, r.tokens)),
            Some((_, want)) => {
                let same = r.tokens == *want;
                assert!(same, "{name}: speculative output differs from plain decoding");
            }
        }
    }
}
