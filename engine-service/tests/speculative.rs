//! Speculative decoding on the real default model.
//!
//! - A draft-tree pass gives every node bitwise the logits plain decoding computes for its
//!   root path, and after `accept_tree_path` the KV of the committed positions is byte for
//!   byte the KV plain decoding writes.
//! - Through the real step loop (local pages, several sequences batched), greedy decoding
//!   with suffix speculation under several tree shapes emits exactly the tokens of plain
//!   decoding (200 tokens on each of 5 prompts, repetitive and ordinary), with the same finish
//!   reasons; seeded sampling too; and the drafts really were accepted.

mod common;
#[path = "support/kv.rs"]
mod kv;
use kv::kv_bytes;

use std::sync::mpsc;
use std::time::Instant;

use engine_service::backend::{Backend, ForwardBatch, LogitsWanted, SeqInput};
use engine_service::memory::store::PageStore;
use engine_service::memory::{MappedPool, PageId};
use engine_service::sampling::{Sampler, SamplingParams};
use engine_service::scheduler::{Command, FinishReason, NewSequence, SeqEvent, StopRules};
use engine_service::speculative::{SpecConfig, TreeShape};
use engine_service::step::{StepLimits, StepLoop};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const PT: usize = 16;

fn forward(
    b: &mut dyn Backend,
    tokens: &[u32],
    start_pos: usize,
    pages: &[PageId],
    logits: LogitsWanted,
    tree: Option<&[Option<usize>]>,
) -> Vec<f32> {
    let batch = ForwardBatch { seqs: vec![SeqInput { seq_id: 0, tokens, start_pos, pages, logits, tree }] };
    b.forward(&batch).expect("forward").logits.pop().unwrap_or_default()
}

fn path_to(parents: &[Option<usize>], j: usize) -> Vec<usize> {
    let mut path = vec![j];
    while let Some(p) = parents[*path.last().unwrap()] {
        path.push(p);
    }
    path.reverse();
    path
}

#[test]
fn tree_pass_logits_and_committed_kv_equal_plain_decoding_of_each_path() {
    let mut m = common::load(PT);
    let b = &mut m.backend;
    let layout = b.kv_layout();
    let vocab = b.hparams().vocab_size;
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    // Context lengths: short, and one whose tree crosses the 512-key attention segment.
    for (ctx_len, n_nodes) in [(37usize, 16usize), (505, 24)] {
        let prompt: Vec<u32> = (0..ctx_len).map(|_| rng.random_range(200..20_000)).collect();
        let mut parents = vec![None];
        for j in 1..n_nodes {
            parents.push(Some(if rng.random_range(0..3) > 0 { j - 1 } else { rng.random_range(0..j) }));
        }
        let tokens: Vec<u32> = (0..n_nodes).map(|_| rng.random_range(200..20_000)).collect();
        let n_pages = (ctx_len + n_nodes + 1).div_ceil(PT);
        let mut pool = MappedPool::new(b, 2 * n_pages).expect("mapping a pool");
        let tree_pages: Vec<PageId> = pool.allocate(n_pages).unwrap();
        let chain_pages: Vec<PageId> = pool.allocate(n_pages).unwrap();
        forward(b, &prompt, 0, &tree_pages, LogitsWanted::None, None);
        forward(b, &prompt, 0, &chain_pages, LogitsWanted::None, None);
        let tree_logits = forward(b, &tokens, ctx_len, &tree_pages, LogitsWanted::All, Some(&parents));
        assert_eq!(tree_logits.len(), n_nodes * vocab);
        for j in 0..n_nodes {
            let path: Vec<u32> = path_to(&parents, j).iter().map(|&i| tokens[i]).collect();
            let chain = forward(b, &path, ctx_len, &chain_pages, LogitsWanted::Last, None);
            let row = &tree_logits[j * vocab..(j + 1) * vocab];
            let same = row.iter().zip(&chain).all(|(a, c)| a.to_bits() == c.to_bits());
            assert!(same, "context {ctx_len}: node {j} (path {path:?}) logits differ from plain decoding of its path");
        }
        // Commit the deepest node's path: the committed KV equals plain decoding's.
        let deepest = (0..n_nodes).max_by_key(|&j| (path_to(&parents, j).len(), j)).unwrap();
        let path = path_to(&parents, deepest);
        b.accept_tree_path(0, &tree_pages, ctx_len, &path).expect("accept");
        let path_tokens: Vec<u32> = path.iter().map(|&i| tokens[i]).collect();
        forward(b, &path_tokens, ctx_len, &chain_pages, LogitsWanted::None, None);
        for pos in 0..ctx_len + path.len() {
            assert!(
                kv_bytes(b.ops(), &layout, &tree_pages, pos..pos + 1)
                    == kv_bytes(b.ops(), &layout, &chain_pages, pos..pos + 1),
                "context {ctx_len}: KV at {pos} differs"
            );
        }
        // And the next step from the committed state matches too.
        let next = rng.random_range(200..20_000);
        let a = forward(b, &[next], ctx_len + path.len(), &tree_pages, LogitsWanted::Last, None);
        let c = forward(b, &[next], ctx_len + path.len(), &chain_pages, LogitsWanted::Last, None);
        assert!(a.iter().zip(&c).all(|(x, y)| x.to_bits() == y.to_bits()), "context {ctx_len}: next step differs");
    }
}

#[test]
fn malformed_trees_are_errors_not_panics() {
    let mut m = common::load(PT);
    let b: &mut dyn Backend = &mut m.backend;
    let mut pool = MappedPool::new(b, 4).expect("mapping a pool");
    let pages: Vec<PageId> = pool.allocate(4).unwrap();
    let tokens = [300u32, 301, 302];
    for bad in
        [vec![None, Some(0)], vec![Some(0), Some(0), Some(1)], vec![None, Some(2), Some(0)], vec![None, None, Some(0)]]
    {
        let batch = ForwardBatch {
            seqs: vec![SeqInput {
                seq_id: 0,
                tokens: &tokens,
                start_pos: 0,
                pages: &pages,
                logits: LogitsWanted::All,
                tree: Some(&bad),
            }],
        };
        assert!(b.forward(&batch).is_err(), "{bad:?}");
    }
}

struct Outcome {
    tokens: Vec<u32>,
    reason: Option<FinishReason>,
    /// Token events received (one per step that emitted tokens).
    chunks: usize,
}

struct Req {
    prompt: Vec<u32>,
    params: SamplingParams,
    stop: StopRules,
}

/// Runs the requests together through a real step loop on local pages.
fn run_loop(spec: Option<SpecConfig>, reqs: &[Req]) -> Vec<Outcome> {
    let m = common::load(PT);
    let layout = m.backend.kv_layout();
    let limits = StepLimits {
        max_batch_tokens: 512,
        max_running: 16,
        context_length: m.backend.hparams().context_length,
        page_tokens: PT,
        eos_token_ids: m.tokenizer.eos_token_ids.clone(),
    };
    let (tx, rx) = mpsc::channel();
    let mut lp = StepLoop::new(Box::new(m.backend), PageStore::local(layout, 1024), limits, rx);
    if let Some(cfg) = spec {
        lp = lp.with_speculation(cfg);
    }
    let thread = std::thread::spawn(move || lp.run());
    let mut streams = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        let (etx, erx) = tokio::sync::mpsc::unbounded_channel();
        let new = NewSequence::new(format!("r{i}"), r.prompt.clone(), Sampler::new(r.params), r.stop.clone(), etx);
        tx.send(Command::Admit(Box::new(new))).unwrap();
        streams.push(erx);
    }
    let outcomes = streams
        .iter_mut()
        .map(|rx| {
            let mut o = Outcome { tokens: Vec::new(), reason: None, chunks: 0 };
            while let Some(ev) = rx.blocking_recv() {
                match ev {
                    SeqEvent::Tokens { ids, .. } => {
                        o.tokens.extend(ids);
                        o.chunks += 1;
                    }
                    SeqEvent::Finished { reason, usage, .. } => {
                        assert_eq!(usage.completion_tokens, o.tokens.len());
                        o.reason = Some(reason);
                        break;
                    }
                    SeqEvent::Failed(s) => panic!("sequence failed: {s}"),
                }
            }
            o
        })
        .collect();
    drop(tx);
    thread.join().unwrap();
    outcomes
}

fn chat(tok: &engine_models::tokenizer::ModelTokenizer, user: &str) -> Vec<u32> {
    let text = format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n");
    tok.encode(&text, false).expect("encode")
}

const CODE: &str = "def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n            out.append(a[i])\n            i += 1\n        else:\n            out.append(b[j])\n            j += 1\n    out.extend(a[i:])\n    out.extend(b[j:])\n    return out\n";

fn prompts() -> Vec<Vec<u32>> {
    let tok = common::load(PT).tokenizer;
    vec![
        chat(&tok, &format!("Repeat this code block exactly, then explain it:\n```python\n{CODE}```")),
        chat(
            &tok,
            &format!("Rename the function `merge` to `merge_sorted` in this file and show the whole file:\n{CODE}"),
        ),
        chat(
            &tok,
            "The tool returned {\"files\": [\"src/main.rs\", \"src/lib.rs\", \"src/step.rs\"], \"status\": \"ok\"}. List the files again as JSON.",
        ),
        chat(&tok, "Tell me about the history of the Roman Empire."),
        chat(&tok, "What is the capital of France? Explain why it became the capital."),
    ]
}

fn greedy_req(prompt: &[u32], max_tokens: usize, ignore_eos: bool) -> Req {
    Req {
        prompt: prompt.to_vec(),
        params: SamplingParams::greedy(),
        stop: StopRules { max_tokens, stop_token_ids: Vec::new(), ignore_eos },
    }
}

fn spec(shape: TreeShape) -> SpecConfig {
    // Every prompt of the test speculates (5 run together).
    SpecConfig { enabled: true, shape, max_batch: 16, ..SpecConfig::default() }
}

/// Tokens generated per prompt (long enough for many accepted runs and a few rejections each,
/// short enough for the scalar kernel set's pass of CI).
const GENERATED: usize = 128;

#[test]
fn greedy_decoding_with_speculation_emits_exactly_the_plain_tokens() {
    let prompts = prompts();
    let reqs: Vec<Req> = prompts.iter().map(|p| greedy_req(p, GENERATED, true)).collect();
    let plain = run_loop(None, &reqs);
    for o in &plain {
        assert_eq!(o.tokens.len(), GENERATED);
        assert_eq!(o.chunks, GENERATED, "plain decoding emits one token per step");
    }
    for shape in [
        TreeShape::SEED,
        TreeShape { max_depth: 3, top_k: 1, max_nodes: 4 },
        TreeShape { max_depth: 12, top_k: 3, max_nodes: 32 },
    ] {
        let started = Instant::now();
        let got = run_loop(Some(spec(shape)), &reqs);
        let steps: usize = got.iter().map(|o| o.chunks).sum();
        for (i, (g, p)) in got.iter().zip(&plain).enumerate() {
            if let Some(at) = (0..GENERATED).find(|&t| g.tokens.get(t) != p.tokens.get(t)) {
                panic!(
                    "{shape:?} prompt {i}: token {at} differs: {:?} vs plain {:?}",
                    g.tokens.get(at),
                    p.tokens.get(at)
                );
            }
            assert_eq!(g.tokens.len(), GENERATED);
            assert_eq!(g.reason, p.reason);
        }
        let total = GENERATED * reqs.len();
        eprintln!(
            "{shape:?}: {total} tokens in {steps} steps ({:.2} tokens/step), {:.1}s",
            total as f64 / steps as f64,
            started.elapsed().as_secs_f64()
        );
        // Drafts are accepted: at least 5% fewer steps than tokens (how many depends on the
        // text; the seed shape gets ~1.1 tokens per step on these prompts).
        assert!(steps * 20 < total * 19, "{shape:?}: drafts were accepted ({steps} steps for {total} tokens)");
    }
}

#[test]
fn stops_and_limits_inside_an_accepted_run_match_plain_decoding() {
    let prompts = prompts();
    // EOS honoured, and odd max_tokens values that land inside accepted runs; a stop token
    // taken from the plain output's middle.
    let plain_full = run_loop(None, &[greedy_req(&prompts[0], 60, true)]);
    let stop_tok = plain_full[0].tokens[41];
    let mut reqs: Vec<Req> = vec![
        greedy_req(&prompts[0], 37, true),
        greedy_req(&prompts[1], 53, true),
        greedy_req(&prompts[2], 120, false),
        greedy_req(&prompts[4], 120, false),
    ];
    reqs.push(Req {
        stop: StopRules { max_tokens: 60, stop_token_ids: vec![stop_tok], ignore_eos: true },
        ..greedy_req(&prompts[0], 60, true)
    });
    // Seeded sampling: draw for draw the plain samples.
    for seed in [1u64, 2] {
        reqs.push(Req {
            prompt: prompts[1].clone(),
            params: SamplingParams { temperature: 0.7, top_p: 0.95, top_k: 40, seed: Some(seed) },
            stop: StopRules { max_tokens: 80, stop_token_ids: Vec::new(), ignore_eos: true },
        });
    }
    let plain = run_loop(None, &reqs);
    let got = run_loop(Some(spec(TreeShape::SEED)), &reqs);
    for (i, (g, p)) in got.iter().zip(&plain).enumerate() {
        assert_eq!(g.tokens, p.tokens, "request {i}");
        assert_eq!(g.reason, p.reason, "request {i}");
    }
    assert_eq!(plain[0].tokens.len(), 37);
    let stopped = &plain[4];
    assert_eq!(stopped.reason, Some(FinishReason::Stop));
    assert_eq!(stopped.tokens.last(), Some(&stop_tok));
}
