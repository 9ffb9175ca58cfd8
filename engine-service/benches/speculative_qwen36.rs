//! The cost of MTP speculation on Qwen3.6-style hybrid models (CPU backend, greedy, batch 1,
//! 64-token prompt): the tiny Qwen3.6 checkpoint (tests/fixtures/qwen36/tiny-vlm) or seeded
//! random weights at Qwen3.5-0.8B dimensions (architecture spec §1.2). Both heads are random,
//! so these runs measure what MTP trees cost, not what they win (tokens per pass stays ~1.0).
//! Three measurements, run in this order:
//!
//! - `mtp_speed`: decode tokens/s without speculation (best of a run before and after) and with
//!   MTP draft trees of each shape, through the `Backend` trait; tokens per verify pass, draft
//!   and verify ms per round. Checks every speculative run emits exactly the plain tokens.
//! - `verify_cost`: at 0.8B dimensions, a 1-token decode step, a chain pass of N tokens (all
//!   logits), a chain-shaped tree pass of N nodes and `accept_tree_path`, in ms, 3 repetitions.
//! - `step_loop`: at 0.8B dimensions, one request through the real step loop without
//!   speculation and with `mtp` 3/1/4 and 8/2/16 at the default probability floor (tok/s
//!   including the prefill, steps); checks the outputs are equal.
//!
//!   cargo bench -p engine-service --bench speculative_qwen36
//!
//! Env: EDGE_MTP_BENCH_RUN (which to run, a comma list of `mtp_speed,verify_cost,step_loop`;
//! default all), EDGE_MTP_BENCH_MODEL (`tiny` or `0.8b`, for `mtp_speed`; default tiny),
//! EDGE_MTP_BENCH_TOKENS (decoded tokens per run, for `mtp_speed` and `step_loop`; default 200),
//! EDGE_MTP_BENCH_SHAPES (trees for `mtp_speed` as `D/k/N,...`; default `8/2/16,3/1/4`),
//! EDGE_MTP_BENCH_MIN_PROB (draft-node probability floor for `mtp_speed`; default 0),
//! EDGE_MTP_BENCH_NODES (N for `verify_cost`; default 16), EDGE_TEST_THREADS (CPU threads;
//! default 2).

use std::path::PathBuf;
use std::time::Instant;

use engine_service::backend::cpu::{CpuBackend, RandomSpec};
use engine_service::backend::{Backend, ForwardBatch, LogitsWanted, SeqInput};
use engine_service::memory::{MappedPool, PageId};
use engine_service::sampling::{SamplingParams, argmax};
use engine_service::speculative::mtp::MtpDrafter;
use engine_service::speculative::{DrafterKind, DrafterSet, SpecConfig, TreeShape, accept};

#[path = "../tests/support/step_loop.rs"]
mod support;

const PT: usize = 16;
const RUNS: [&str; 3] = ["mtp_speed", "verify_cost", "step_loop"];

/// Qwen3.5-0.8B text dimensions (architecture spec §1.2; tied head, MTP), for random weights.
const QWEN35_08B: &str = include_str!("qwen35_0_8b.json");

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn threads() -> usize {
    env_or("EDGE_TEST_THREADS", 2)
}

/// The tiny Qwen3.6 checkpoint.
fn load_tiny() -> CpuBackend {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen36/tiny-vlm");
    CpuBackend::load(&dir, threads(), PT).expect("loading tiny-vlm").backend
}

/// Qwen3.5-0.8B dimensions with seeded random BF16 weights.
fn random_08b() -> CpuBackend {
    let path = std::env::temp_dir().join(format!("mtp_bench_08b_{}.json", std::process::id()));
    std::fs::write(&path, QWEN35_08B).expect("writing the 0.8B config");
    let b = CpuBackend::random_from_config(&path, &RandomSpec::default(), None, threads(), PT)
        .expect("random 0.8B")
        .backend;
    let _ = std::fs::remove_file(&path);
    b
}

fn pages(pool: &mut MappedPool, positions: usize) -> Vec<PageId> {
    pool.pages_for(positions).expect("pages")
}

fn pass(
    b: &mut dyn Backend,
    seq_id: u64,
    tokens: &[u32],
    start_pos: usize,
    pages: &[PageId],
    logits: LogitsWanted,
    tree: Option<&[Option<usize>]>,
) -> Vec<f32> {
    let batch = ForwardBatch { seqs: vec![SeqInput { seq_id, tokens, start_pos, pages, logits, tree }] };
    b.forward(&batch).expect("forward").logits.pop().unwrap_or_default()
}

/// Decode speed without speculation and with MTP trees, through the `Backend` trait (a table).
fn mtp_speed() {
    let model: String = env_or("EDGE_MTP_BENCH_MODEL", "tiny".to_string());
    let tokens: usize = env_or("EDGE_MTP_BENCH_TOKENS", 200);
    let min_prob: f32 = env_or("EDGE_MTP_BENCH_MIN_PROB", 0.0);
    let shapes: Vec<TreeShape> = env_or("EDGE_MTP_BENCH_SHAPES", "8/2/16,3/1/4".to_string())
        .split(',')
        .map(|s| {
            let v: Vec<usize> = s.split('/').map(|x| x.trim().parse().expect("D/k/N")).collect();
            TreeShape { max_depth: v[0], top_k: v[1], max_nodes: v[2] }
        })
        .collect();
    let mut b = if model == "0.8b" { random_08b() } else { load_tiny() };
    let vocab = b.hparams().vocab_size as u32;
    let prompt: Vec<u32> = (0..64u32).map(|i| (i * 7919 + 13) % vocab.min(256)).collect();
    let mut pool = MappedPool::new(&mut b, (prompt.len() + tokens + 80).div_ceil(PT) * 2).expect("mapping a pool");
    let p = pages(&mut pool, prompt.len() + tokens + 70);
    println!(
        "model {model}  threads {}  prompt {}  decode {tokens} tokens  min_prob {min_prob}",
        threads(),
        prompt.len()
    );

    // Plain decoding (MTP bookkeeping off), timed again at the end: the best run counts.
    let plain = |b: &mut CpuBackend| {
        let mut out = vec![argmax(&pass(b, 1, &prompt, 0, &p, LogitsWanted::Last, None))];
        let t = Instant::now();
        while out.len() < tokens {
            let pos = prompt.len() + out.len() - 1;
            out.push(argmax(&pass(b, 1, &out[out.len() - 1..], pos, &p, LogitsWanted::Last, None)));
        }
        b.release_seq(1);
        (out, t.elapsed().as_secs_f64())
    };
    let (out, first_s) = plain(&mut b);
    assert_eq!(b.mtp_draft(0, 0, 0, 0, 0.0).unwrap(), Some(Vec::new()), "the model has an MTP head");
    let mut rows = Vec::new();

    let min_score = min_prob.clamp(0.0, 1.0).ln();
    for (i, shape) in shapes.iter().enumerate() {
        let seq = 2 + i as u64;
        let mtp = MtpDrafter::new();
        let inbox = mtp.inbox();
        let mut drafters = DrafterSet::new(vec![Box::new(mtp)]);
        let mut ctx = prompt.clone();
        ctx.push(argmax(&pass(&mut b, seq, &prompt, 0, &p, LogitsWanted::Last, None)));
        let (mut passes, mut draft_s, mut verify_s) = (0usize, 0.0f64, 0.0f64);
        let t = Instant::now();
        while ctx.len() - prompt.len() < tokens {
            let start = ctx.len() - 1;
            let left = tokens - (ctx.len() - prompt.len());
            let sh = TreeShape { max_depth: shape.max_depth.min(left), ..*shape };
            let td = Instant::now();
            inbox.fetch(&mut b, seq, ctx[start], &sh, min_score);
            let tree = drafters.draft(seq, "", &ctx, &sh, min_score);
            draft_s += td.elapsed().as_secs_f64();
            let tv = Instant::now();
            passes += 1;
            if tree.len() == 1 {
                ctx.push(argmax(&pass(&mut b, seq, &[ctx[start]], start, &p, LogitsWanted::Last, None)));
            } else {
                let parents = tree.parents();
                let logits = pass(&mut b, seq, &tree.tokens(), start, &p, LogitsWanted::All, Some(&parents));
                let acc = accept(&tree, &logits, vocab as usize, argmax);
                let emit = acc.tokens.len().min(left);
                b.accept_tree_path(seq, &p, start, &acc.path[..emit]).expect("accept");
                ctx.extend_from_slice(&acc.tokens[..emit]);
            }
            verify_s += tv.elapsed().as_secs_f64();
        }
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(ctx[prompt.len()..], out[..], "speculative output equals plain output");
        rows.push((
            *shape,
            (tokens - 1) as f64 / passes as f64,
            secs,
            draft_s * 1e3 / passes as f64,
            verify_s * 1e3 / passes as f64,
        ));
        b.release_seq(seq);
    }
    b.set_mtp_drafting(false);
    let (again, last_s) = plain(&mut b);
    assert_eq!(again, out);
    let plain_s = first_s.min(last_s);
    let plain_tps = (tokens - 1) as f64 / plain_s;
    println!(
        "plain runs: {:.2} and {:.2} tok/s (the better one is the baseline)",
        (tokens - 1) as f64 / first_s,
        (tokens - 1) as f64 / last_s
    );
    println!("| speculation | tokens/pass | decode tok/s | vs plain | draft ms/round | verify ms/round |");
    println!("|---|---|---|---|---|---|");
    println!("| off | 1.000 | {plain_tps:.2} | 1.00x | - | {:.1} |", plain_s * 1e3 / (tokens - 1) as f64);
    for (shape, tpp, secs, draft_ms, verify_ms) in rows {
        let tps = (tokens - 1) as f64 / secs;
        println!(
            "| MTP D{} k{} N{} | {tpp:.3} | {tps:.2} | {:.2}x | {draft_ms:.1} | {verify_ms:.1} |",
            shape.max_depth,
            shape.top_k,
            shape.max_nodes,
            tps / plain_tps
        );
    }
}

/// Verify cost at 0.8B dimensions: a chain-shaped tree pass of N nodes against a chain pass
/// of N tokens (all logits) and a 1-token decode step, in ms.
fn verify_cost() {
    let n: usize = env_or("EDGE_MTP_BENCH_NODES", 16);
    let mut b = random_08b();
    let mut pool = MappedPool::new(&mut b, 64).expect("mapping a pool");
    let p = pages(&mut pool, 64 + n + 1);
    let prompt: Vec<u32> = (0..64u32).map(|i| i * 31 + 5).collect();
    let toks: Vec<u32> = (0..n as u32).map(|i| 1000 + i).collect();
    let parents: Vec<Option<usize>> = (0..n).map(|j| j.checked_sub(1)).collect();
    println!("verify cost: 0.8B dims, threads {}, context 64, N {n}", threads());
    pass(&mut b, 1, &prompt, 0, &p, LogitsWanted::None, None);
    let mut state = vec![0u8; b.state_bytes()];
    b.save_state(1, &mut state).unwrap();
    for rep in 0..3 {
        let t = Instant::now();
        pass(&mut b, 1, &toks[..1], 64, &p, LogitsWanted::Last, None);
        let one = t.elapsed().as_secs_f64() * 1e3;
        b.load_state(1, &state).unwrap();
        let t = Instant::now();
        pass(&mut b, 1, &toks, 64, &p, LogitsWanted::All, None);
        let chain = t.elapsed().as_secs_f64() * 1e3;
        b.load_state(1, &state).unwrap();
        let t = Instant::now();
        pass(&mut b, 1, &toks, 64, &p, LogitsWanted::All, Some(&parents));
        let tree = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        b.accept_tree_path(1, &p, 64, &[0]).unwrap();
        let acc = t.elapsed().as_secs_f64() * 1e3;
        b.load_state(1, &state).unwrap();
        println!(
            "rep {rep}: decode 1 token {one:.1} ms, chain of {n} (all logits) {chain:.1} ms, tree of {n} {tree:.1} ms, accept {acc:.1} ms"
        );
    }
}

/// Runs one greedy request (EOS ignored, `tokens` long) through a real step loop on local
/// pages; returns its tokens and the number of token events (steps that emitted).
fn run_loop(b: Box<dyn Backend>, spec: Option<SpecConfig>, prompt: &[u32], tokens: usize) -> (Vec<u32>, usize) {
    support::run_requests(b, spec, &[prompt.to_vec()], SamplingParams::greedy(), tokens, PT).remove(0)
}

/// The serving path at 0.8B dimensions: one request through the step loop without speculation
/// and with MTP drafting at the default probability floor (tok/s including the 64-token prefill).
fn step_loop() {
    let tokens: usize = env_or("EDGE_MTP_BENCH_TOKENS", 200);
    let prompt: Vec<u32> = (0..64u32).map(|i| (i * 7919 + 13) % 256).collect();
    println!("step loop: 0.8B dims, threads {}, prompt {}, {tokens} tokens", threads(), prompt.len());
    let mut base = None;
    for (name, drafter, shape) in [
        ("off", None, TreeShape::SEED),
        ("mtp 3/1/4", Some(DrafterKind::Mtp), TreeShape { max_depth: 3, top_k: 1, max_nodes: 4 }),
        ("mtp 8/2/16", Some(DrafterKind::Mtp), TreeShape::SEED),
    ] {
        let b = random_08b();
        let spec = drafter.map(|d| SpecConfig { enabled: true, drafter: d, shape, ..SpecConfig::default() });
        let t = Instant::now();
        let (out, steps) = run_loop(Box::new(b), spec, &prompt, tokens);
        let secs = t.elapsed().as_secs_f64();
        let base = base.get_or_insert_with(|| out.clone());
        assert_eq!(&out, base, "{name}: output equals the plain output");
        println!("{name}: {tokens} tokens in {secs:.1} s ({:.2} tok/s, {steps} steps)", tokens as f64 / secs);
    }
}

fn main() {
    let wanted: Vec<String> = match std::env::var("EDGE_MTP_BENCH_RUN") {
        Ok(v) if !v.trim().is_empty() => v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
        _ => RUNS.iter().map(|s| s.to_string()).collect(),
    };
    if let Some(bad) = wanted.iter().find(|w| !RUNS.contains(&w.as_str())) {
        eprintln!("EDGE_MTP_BENCH_RUN: unknown measurement `{bad}` (known: {})", RUNS.join(","));
        std::process::exit(2);
    }
    for name in RUNS.iter().filter(|r| wanted.iter().any(|w| w == *r)) {
        println!("== {name}");
        let t = Instant::now();
        match *name {
            "mtp_speed" => mtp_speed(),
            "verify_cost" => verify_cost(),
            _ => step_loop(),
        }
        println!("({name}: {:.1} s)\n", t.elapsed().as_secs_f64());
    }
}
