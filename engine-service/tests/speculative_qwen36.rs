//! MTP drafting on the tiny Qwen3.6 checkpoint (tests/fixtures/qwen36/tiny-vlm), through the
//! `Backend` trait only (`mtp_draft`, tree passes, `accept_tree_path`) and the speculative
//! module's drafters:
//!
//! - the backend's MTP drafts equal the NumPy MTP reference's greedy tokens (first round and
//!   the round after four plain decode steps);
//! - greedy decoding with MTP draft trees (several shapes) and with MTP + suffix branches in
//!   one tree emits exactly the tokens of plain decoding, 200 tokens on each of 5 prompts;
//!   so does the suffix drafter alone on every tiny checkpoint (tiny-vlm, the MTP-less
//!   tiny-text, tiny-vlm-nvfp4), with and without earlier outputs to draft from;
//! - after the last accepted round, the recurrent state and the KV pages equal plain
//!   decoding's bit for bit, and the MTP layer's KV of every committed position equals a
//!   from-scratch MTP catch-up over the same tokens (no stale draft entries);
//! - the real step loop with `mtp` / `mtp+suffix` drafting emits the plain tokens (greedy and
//!   seeded sampling), pauses a head that drafts nothing, and a restored recurrent state
//!   resynchronises the head.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use engine_service::backend::cpu::CpuBackend;
use engine_service::backend::{Backend, ForwardBatch, LogitsWanted, SeqInput};
use engine_service::memory::{HostPages, KvLayout, MappedPool, PageId};
use engine_service::sampling::SamplingParams;
use engine_service::sampling::argmax;
use engine_service::speculative::mtp::{MtpDrafter, MtpInbox};
use engine_service::speculative::{
    Branch, DraftRequest, Drafter, DrafterKind, DrafterSet, SpecConfig, SuffixDrafter, SuffixParams, TreeShape, accept,
};
use serde_json::Value;

#[path = "support/kv.rs"]
mod kv;
#[path = "support/step_loop.rs"]
mod support;
use kv::kv_bytes;

const PT: usize = 16;
const TOKENS: usize = 200;

fn fixture(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen36/tiny-vlm").join(file)
}

fn load() -> CpuBackend {
    let threads = std::env::var("EDGE_TEST_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    CpuBackend::load(&fixture(""), threads, PT).expect("loading tiny-vlm").backend
}

fn json(file: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(file)).expect("fixture json")).expect("json")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn pages(pool: &mut MappedPool, positions: usize) -> Vec<PageId> {
    pool.pages_for(positions).expect("pages")
}

fn mapped_pool(b: &mut CpuBackend, pages: usize) -> MappedPool {
    MappedPool::new(b, pages).expect("mapping a pool")
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

#[test]
fn mtp_drafts_equal_the_numpy_reference() {
    let g = json("goldens.json");
    let m = json("mtp_goldens.json");
    let x = ids(&g["token_ids"]);
    let drafts = ids(&m["drafts"]);
    let round2 = ids(&m["argmax"]["round2.logits"]);
    let mut b = load();
    assert_eq!(b.mtp_draft(1, 0, 0, 0, 0.0).unwrap(), Some(Vec::new()), "the probe turns MTP drafting on");
    let mut pool = mapped_pool(&mut b, 64);
    let p = pages(&mut pool, 200);
    let n = 137;
    assert_eq!(b.mtp_draft(1, x[n], 3, 2, f32::NEG_INFINITY).unwrap(), None, "nothing committed yet");
    pass(&mut b, 1, &x[..n], 0, &p, LogitsWanted::Last, None);
    // Catch-up (h[t], x[t+1]) for t < 137, then the chain from d1.
    let c = b.mtp_draft(1, x[n], 3, 2, f32::NEG_INFINITY).unwrap().expect("drafts");
    assert_eq!(c.len(), 3);
    assert!(c.iter().all(|l| l.len() == 2 && l[0].1 >= l[1].1 && l[0].1 <= 0.0));
    let greedy: Vec<u32> = c.iter().map(|l| l[0].0).collect();
    assert_eq!(greedy, drafts, "greedy chain = NumPy d1..d3");
    // Drafting again under the same root changes nothing (draft KV entries are scratch).
    assert_eq!(b.mtp_draft(1, x[n], 3, 2, f32::NEG_INFINITY).unwrap().unwrap(), c);
    // Four plain decode steps, then the catch-up overwrites the draft positions.
    for k in 0..4 {
        pass(&mut b, 1, &x[n + k..n + k + 1], n + k, &p, LogitsWanted::Last, None);
    }
    let c2 = b.mtp_draft(1, x[n + 4], 1, 1, f32::NEG_INFINITY).unwrap().expect("drafts");
    assert_eq!(c2[0][0].0, round2[3], "depth 1 after the catch-up = NumPy round2 argmax");
    // A min_score above the greedy path's log-probability drafts nothing.
    let top = c2[0][0].1;
    assert_eq!(b.mtp_draft(1, x[n + 4], 4, 2, top + 1e-3).unwrap().unwrap().len(), 0);
    b.release_seq(1);
    assert_eq!(b.mtp_draft(1, x[n + 4], 1, 1, f32::NEG_INFINITY).unwrap(), None, "released");
}

/// Prompts of random ids (seeded), of several lengths; one repeats itself so the suffix
/// drafter has something to propose from the start.
fn prompts() -> Vec<Vec<u32>> {
    let mut s = 0x1234_5678_9abc_def1u64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s % 256) as u32
    };
    let mut out: Vec<Vec<u32>> = [3usize, 17, 40, 64].iter().map(|&n| (0..n).map(|_| rnd()).collect()).collect();
    let unit: Vec<u32> = (0..12).map(|_| rnd()).collect();
    out.push(unit.iter().cycle().take(70).copied().collect());
    out
}

/// Plain greedy decoding: `TOKENS` tokens, one pass each; also the state and KV after it.
fn plain(b: &mut CpuBackend, seq_id: u64, prompt: &[u32], pool: &mut MappedPool) -> (Vec<u32>, Vec<u8>, Vec<u8>) {
    let p = pages(pool, prompt.len() + TOKENS + 1);
    let mut out = vec![argmax(&pass(b, seq_id, prompt, 0, &p, LogitsWanted::Last, None))];
    while out.len() < TOKENS {
        let pos = prompt.len() + out.len() - 1;
        out.push(argmax(&pass(b, seq_id, &out[out.len() - 1..], pos, &p, LogitsWanted::Last, None)));
    }
    let committed = prompt.len() + TOKENS - 1;
    let mut state = vec![0u8; b.state_bytes()];
    b.save_state(seq_id, &mut state).unwrap();
    let kv = kv_bytes(b.ops(), &b.kv_layout(), &p, 0..committed);
    b.release_seq(seq_id);
    (out, state, kv)
}

struct SpecRun {
    tokens: Vec<u32>,
    passes: usize,
    accepted: usize,
    /// Rounds whose accepted path had to move KV (a node index beyond its depth).
    compacted: usize,
    state: Vec<u8>,
    kv: Vec<u8>,
}

/// Greedy decoding with draft trees from `drafters` (the MTP's staged by `inbox`).
fn speculative(
    b: &mut CpuBackend,
    seq_id: u64,
    prompt: &[u32],
    pool: &mut MappedPool,
    drafters: &mut DrafterSet,
    inbox: Option<&MtpInbox>,
    shape: &TreeShape,
) -> SpecRun {
    let p = pages(pool, prompt.len() + TOKENS + shape.max_nodes + 1);
    let vocab = b.hparams().vocab_size;
    let mut context = prompt.to_vec();
    context.push(argmax(&pass(b, seq_id, prompt, 0, &p, LogitsWanted::Last, None)));
    let (mut passes, mut accepted, mut compacted) = (1, 0, 0);
    while context.len() - prompt.len() < TOKENS {
        let start = context.len() - 1;
        let root = context[start];
        let left = TOKENS - (context.len() - prompt.len());
        let shape = TreeShape { max_depth: shape.max_depth.min(left), ..*shape };
        if let Some(inbox) = inbox {
            inbox.fetch(b, seq_id, root, &shape, f32::NEG_INFINITY);
        }
        let tree = drafters.draft(seq_id, "", &context, &shape, f32::NEG_INFINITY);
        passes += 1;
        if tree.len() == 1 {
            context.push(argmax(&pass(b, seq_id, &[root], start, &p, LogitsWanted::Last, None)));
            continue;
        }
        let parents = tree.parents();
        let logits = pass(b, seq_id, &tree.tokens(), start, &p, LogitsWanted::All, Some(&parents));
        let acc = accept(&tree, &logits, vocab, argmax);
        // Emit up to the limit; only the emitted tokens' inputs are committed (as the step loop).
        let emit = acc.tokens.len().min(left);
        b.accept_tree_path(seq_id, &p, start, &acc.path[..emit]).expect("accept");
        accepted += emit - 1;
        compacted += usize::from(acc.path[..emit].iter().enumerate().any(|(d, &n)| n != d));
        context.extend_from_slice(&acc.tokens[..emit]);
    }
    let committed = context.len() - 1;
    let mut state = vec![0u8; b.state_bytes()];
    b.save_state(seq_id, &mut state).unwrap();
    let kv = kv_bytes(b.ops(), &b.kv_layout(), &p, 0..committed);
    SpecRun { tokens: context[prompt.len()..].to_vec(), passes, accepted, compacted, state, kv }
}

/// MTP KV bytes of positions `0..n` of a sequence.
fn mtp_kv(b: &CpuBackend, seq_id: u64, n: usize) -> Vec<u8> {
    let model = b.qwen36().expect("qwen");
    let (pages, committed) = b.mtp_kv(seq_id).expect("mtp state");
    assert!(committed >= n, "{committed} committed MTP positions, wanted {n}");
    kv_bytes(b.ops(), &model.mtp_kv_layout(PT), &pages, 0..n)
}

#[test]
fn greedy_decoding_with_mtp_trees_emits_exactly_the_plain_tokens() {
    let started = Instant::now();
    let mut b = load();
    let mut pool = mapped_pool(&mut b, 1024);
    let prompts = prompts();
    let plain_runs: Vec<_> = prompts.iter().map(|pr| plain(&mut b, 1, pr, &mut pool)).collect();
    assert_eq!(b.mtp_draft(0, 0, 0, 0, 0.0).unwrap(), Some(Vec::new()));
    let shapes = [
        ("mtp 8/2/16", TreeShape::SEED, Extra::None),
        ("mtp 3/1/4", TreeShape { max_depth: 3, top_k: 1, max_nodes: 4 }, Extra::None),
        ("mtp 4/3/12", TreeShape { max_depth: 4, top_k: 3, max_nodes: 12 }, Extra::None),
        ("mtp+suffix 8/2/16", TreeShape::SEED, Extra::Suffix),
        ("mtp+oracle 8/2/16", TreeShape::SEED, Extra::Oracle),
    ];
    let mut seq_id = 10;
    for (name, shape, extra) in shapes {
        let mtp = MtpDrafter::new();
        let inbox = mtp.inbox();
        let mut set: Vec<Box<dyn Drafter>> = vec![Box::new(mtp)];
        match extra {
            Extra::None => {}
            Extra::Suffix => set.push(Box::new(SuffixDrafter::new(SuffixParams::default()))),
            Extra::Oracle => {
                let answers = prompts.iter().zip(&plain_runs).map(|(p, r)| (p.clone(), r.0.clone())).collect();
                set.push(Box::new(Oracle { answers, round: 0 }));
            }
        }
        let mut drafters = DrafterSet::new(set);
        let (mut passes, mut accepted, mut compacted) = (0, 0, 0);
        for (i, (prompt, (want, state, kv))) in prompts.iter().zip(&plain_runs).enumerate() {
            seq_id += 1;
            let got = speculative(&mut b, seq_id, prompt, &mut pool, &mut drafters, Some(&inbox), &shape);
            if let Some(at) = (0..TOKENS).find(|&t| got.tokens.get(t) != want.get(t)) {
                panic!("{name} prompt {i}: token {at} differs: {:?} vs plain {:?}", got.tokens.get(at), want.get(at));
            }
            assert_eq!(got.tokens.len(), TOKENS);
            assert!(
                got.state == *state,
                "{name} prompt {i}: recurrent state after the last round differs from plain decoding's"
            );
            assert!(got.kv == *kv, "{name} prompt {i}: KV pages differ from plain decoding's");
            passes += got.passes;
            accepted += got.accepted;
            compacted += got.compacted;
            if i == 0 {
                check_mtp_kv_against_a_fresh_catch_up(&mut b, seq_id, prompt, &got.tokens, &mut pool);
            }
            b.release_seq(seq_id);
        }
        eprintln!(
            "{name}: {} tokens in {passes} passes ({:.3} tokens/pass, {accepted} accepted drafts, {compacted} compacted paths)",
            TOKENS * prompts.len(),
            (TOKENS * prompts.len()) as f64 / passes as f64
        );
        if extra == Extra::Oracle {
            assert!(
                accepted > 500 && compacted > 10,
                "{name}: long oracle paths were accepted ({accepted} drafts, {compacted} compacted)"
            );
        }
    }
    eprintln!("total {:.1}s", started.elapsed().as_secs_f64());
}

/// The suffix drafter alone (no MTP) on every tiny checkpoint, the MTP-less tiny-text
/// included: greedy output, recurrent state and KV equal plain decoding's.
#[test]
fn greedy_decoding_with_suffix_trees_emits_exactly_the_plain_tokens_on_every_tiny_checkpoint() {
    let threads = std::env::var("EDGE_TEST_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    let prompts = prompts();
    for checkpoint in ["tiny-vlm", "tiny-text", "tiny-vlm-nvfp4"] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen36").join(checkpoint);
        let mut b = CpuBackend::load(&dir, threads, PT).unwrap_or_else(|e| panic!("loading {checkpoint}: {e}")).backend;
        let mut pool = mapped_pool(&mut b, 1024);
        let plain_runs: Vec<_> = prompts.iter().map(|pr| plain(&mut b, 1, pr, &mut pool)).collect();
        let shapes = [TreeShape::SEED, TreeShape { max_depth: 3, top_k: 1, max_nodes: 4 }];
        // Without history the drafter copies the sequence's own text; with the plain outputs
        // remembered as earlier requests of the salt (a repeated request), it drafts long
        // correct runs, and other prompts' outputs add wrong branches.
        for (shape, history) in shapes.iter().flat_map(|s| [(s, false), (s, true)]) {
            let mut drafters = DrafterSet::new(vec![Box::new(SuffixDrafter::new(SuffixParams::default()))]);
            if history {
                for (prompt, (want, _, _)) in prompts.iter().zip(&plain_runs) {
                    drafters.finished("", &[prompt.as_slice(), want.as_slice()].concat(), prompt.len());
                }
            }
            let mut accepted = 0;
            for (i, (prompt, (want, state, kv))) in prompts.iter().zip(&plain_runs).enumerate() {
                let seq_id = 100 + i as u64;
                let got = speculative(&mut b, seq_id, prompt, &mut pool, &mut drafters, None, shape);
                let name = format!(
                    "{checkpoint} suffix {}/{}/{} history {history} prompt {i}",
                    shape.max_depth, shape.top_k, shape.max_nodes
                );
                if let Some(at) = (0..TOKENS).find(|&t| got.tokens.get(t) != want.get(t)) {
                    panic!("{name}: token {at} differs: {:?} vs plain {:?}", got.tokens.get(at), want.get(at));
                }
                assert!(got.state == *state, "{name}: recurrent state differs from plain decoding's");
                assert!(got.kv == *kv, "{name}: KV pages differ from plain decoding's");
                accepted += got.accepted;
                b.release_seq(seq_id);
            }
            eprintln!(
                "{checkpoint} suffix {}/{}/{} history {history}: {accepted} accepted drafts",
                shape.max_depth, shape.top_k, shape.max_nodes
            );
            // The last prompt repeats a 12-token unit, so even without history there is
            // something to copy; with it, most of the 1000 tokens come from drafts.
            let least = if history { 500 } else { 1 };
            assert!(accepted >= least, "{checkpoint}: {accepted} accepted suffix drafts, expected at least {least}");
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Extra {
    None,
    Suffix,
    Oracle,
}

/// Knows plain decoding's output: drafts the true continuation, 1 to 6 tokens deep, with a
/// wrong token at the end every third round and a wrong sibling at depth 1. Its first node
/// scores below the MTP's top depth-1 candidates (log-prob about -2.6 on this random model),
/// so accepted paths run through nodes placed after MTP nodes (KV compaction) and the MTP
/// catches up over multi-token accepted paths.
struct Oracle {
    answers: Vec<(Vec<u32>, Vec<u32>)>,
    round: usize,
}

impl Drafter for Oracle {
    fn name(&self) -> &'static str {
        "oracle"
    }

    fn propose(&mut self, req: &DraftRequest<'_>, out: &mut Vec<Branch>) {
        self.round += 1;
        let Some((prompt, answer)) = self.answers.iter().find(|(p, _)| req.context.starts_with(p)) else { return };
        let done = req.context.len() - prompt.len();
        let mut tokens: Vec<u32> = answer[done.min(answer.len())..].iter().take(1 + self.round % 6).copied().collect();
        if tokens.is_empty() {
            return;
        }
        if self.round.is_multiple_of(3) {
            let last = tokens.len() - 1;
            tokens[last] = (tokens[last] + 1) % 256;
        }
        out.push(Branch::uniform(vec![(tokens[0] + 7) % 256], -4.0));
        let mut log_probs = vec![0.0; tokens.len()];
        log_probs[0] = -3.5;
        out.push(Branch { tokens, log_probs });
    }
}

/// The MTP KV of every committed position after speculative rounds equals a fresh
/// sequence's after plain passes over the same tokens and one catch-up.
fn check_mtp_kv_against_a_fresh_catch_up(
    b: &mut CpuBackend,
    seq_id: u64,
    prompt: &[u32],
    out: &[u32],
    pool: &mut MappedPool,
) {
    let mut all = prompt.to_vec();
    all.extend_from_slice(out);
    let committed = all.len() - 1;
    // Both drafts consume every committed hidden (under the same root, the last token).
    let root = all[committed];
    let spec = b.mtp_draft(seq_id, root, 2, 2, f32::NEG_INFINITY).unwrap().expect("drafts");
    let fresh_id = seq_id + 1000;
    let p = pages(pool, all.len() + 4);
    pass(b, fresh_id, &all[..committed], 0, &p, LogitsWanted::Last, None);
    let fresh = b.mtp_draft(fresh_id, root, 2, 2, f32::NEG_INFINITY).unwrap().expect("drafts");
    assert_eq!(spec, fresh, "drafts after speculative rounds = drafts after plain passes");
    let n = committed - 1;
    assert!(mtp_kv(b, seq_id, n) == mtp_kv(b, fresh_id, n), "MTP KV of committed positions equals a fresh catch-up");
    b.release_seq(fresh_id);
}

/// Runs greedy requests (EOS ignored, `TOKENS` each) together through a real step loop on
/// local pages; returns each one's tokens and the number of token events (steps that emitted).
fn run_loop(spec: Option<SpecConfig>, prompts: &[Vec<u32>]) -> Vec<(Vec<u32>, usize)> {
    run_loop_on(Box::new(load()), spec, prompts, SamplingParams::greedy())
}

/// [`run_loop`] on backend `b` with `params` (a seed is offset by the request's index).
fn run_loop_on(
    b: Box<dyn Backend>,
    spec: Option<SpecConfig>,
    prompts: &[Vec<u32>],
    params: SamplingParams,
) -> Vec<(Vec<u32>, usize)> {
    support::run_requests(b, spec, prompts, params, TOKENS, PT)
}

#[test]
fn step_loop_with_mtp_drafting_emits_exactly_the_plain_tokens() {
    let prompts = prompts();
    let plain = run_loop(None, &prompts);
    for (kind, shape) in [
        (DrafterKind::Mtp, TreeShape::SEED),
        (DrafterKind::Mtp, TreeShape { max_depth: 3, top_k: 1, max_nodes: 4 }),
        (DrafterKind::MtpSuffix, TreeShape::SEED),
    ] {
        // Every node verified (min_node_prob 0): this random model's MTP is rarely right, and
        // the point is that verifying its trees never changes the output.
        let cfg = SpecConfig {
            enabled: true,
            drafter: kind,
            shape,
            max_batch: 16,
            min_node_prob: 0.0,
            ..SpecConfig::default()
        };
        let got = run_loop(Some(cfg), &prompts);
        let steps: usize = got.iter().map(|g| g.1).sum();
        for (i, (g, p)) in got.iter().zip(&plain).enumerate() {
            assert_eq!(g.0.len(), TOKENS, "{kind:?} {shape:?} prompt {i}");
            if let Some(at) = (0..TOKENS).find(|&t| g.0[t] != p.0[t]) {
                panic!("{kind:?} {shape:?} prompt {i}: token {at} differs: {} vs plain {}", g.0[at], p.0[at]);
            }
        }
        eprintln!("step loop {kind:?} {shape:?}: {} tokens in {steps} steps", TOKENS * prompts.len());
        assert!(steps < TOKENS * prompts.len(), "{kind:?} {shape:?}: some MTP draft was verified and accepted");
    }
}

/// The tiny backend, counting `mtp_draft` calls that ask for drafts.
struct Counting {
    inner: CpuBackend,
    drafts: Arc<AtomicUsize>,
}

impl Backend for Counting {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn hparams(&self) -> &engine_models::ModelHparams {
        self.inner.hparams()
    }
    fn kv_layout(&self) -> KvLayout {
        self.inner.kv_layout()
    }
    fn forward(
        &mut self,
        batch: &ForwardBatch<'_>,
    ) -> Result<engine_service::backend::ForwardOutput, engine_service::EngineError> {
        self.inner.forward(batch)
    }
    fn state_bytes(&self) -> usize {
        self.inner.state_bytes()
    }
    fn save_state(&self, seq_id: u64, dst: &mut [u8]) -> Result<(), engine_service::EngineError> {
        self.inner.save_state(seq_id, dst)
    }
    fn load_state(&mut self, seq_id: u64, src: &[u8]) -> Result<(), engine_service::EngineError> {
        self.inner.load_state(seq_id, src)
    }
    fn release_seq(&mut self, seq_id: u64) {
        self.inner.release_seq(seq_id)
    }
    fn run(&mut self, batch: &ForwardBatch<'_>) -> Result<(), engine_service::EngineError> {
        self.inner.run(batch)
    }
    fn kept_logits(&self, seq: usize) -> Result<&[f32], engine_service::EngineError> {
        self.inner.kept_logits(seq)
    }
    fn map_pages(&mut self, space: u32, memory: Arc<dyn HostPages>) -> Result<(), engine_service::EngineError> {
        self.inner.map_pages(space, memory)
    }
    fn unmap_pages(&mut self, space: u32) {
        self.inner.unmap_pages(space)
    }
    fn copy_page(&mut self, from: PageId, to: PageId) -> Result<(), engine_service::EngineError> {
        self.inner.copy_page(from, to)
    }
    fn accept_tree_path(
        &mut self,
        seq_id: u64,
        pages: &[PageId],
        start_pos: usize,
        accepted: &[usize],
    ) -> Result<(), engine_service::EngineError> {
        self.inner.accept_tree_path(seq_id, pages, start_pos, accepted)
    }
    fn mtp_draft(
        &mut self,
        seq_id: u64,
        root: u32,
        max_depth: usize,
        top_k: usize,
        min_score: f32,
    ) -> Result<Option<Vec<Vec<(u32, f32)>>>, engine_service::EngineError> {
        if max_depth > 0 {
            self.drafts.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.mtp_draft(seq_id, root, max_depth, top_k, min_score)
    }
}

#[test]
fn an_mtp_head_that_never_drafts_gets_paused() {
    // A floor no random-head node reaches: every MTP call drafts nothing, yet costs a head pass.
    let prompts = prompts();
    let drafts = Arc::new(AtomicUsize::new(0));
    let b = Counting { inner: load(), drafts: Arc::clone(&drafts) };
    let cfg = SpecConfig {
        enabled: true,
        drafter: DrafterKind::Mtp,
        max_batch: 16,
        min_node_prob: 0.99,
        ..SpecConfig::default()
    };
    let got = run_loop_on(Box::new(b), Some(cfg), &prompts[..2], SamplingParams::greedy());
    let plain = run_loop(None, &prompts[..2]);
    assert_eq!(got.iter().map(|g| &g.0).collect::<Vec<_>>(), plain.iter().map(|p| &p.0).collect::<Vec<_>>());
    let calls = drafts.load(Ordering::Relaxed);
    eprintln!("{calls} MTP draft calls for 2 x {TOKENS} tokens");
    assert!(calls > 0 && calls < TOKENS, "empty MTP rounds pause drafting ({calls} calls for {} steps)", 2 * TOKENS);
}

#[test]
fn seeded_sampling_with_mtp_trees_draws_exactly_the_plain_samples() {
    let prompts = prompts();
    let params = SamplingParams { temperature: 0.8, top_p: 0.95, top_k: 40, seed: Some(7) };
    let plain = run_loop_on(Box::new(load()), None, &prompts, params);
    let cfg = SpecConfig {
        enabled: true,
        drafter: DrafterKind::MtpSuffix,
        max_batch: 16,
        min_node_prob: 0.0,
        ..SpecConfig::default()
    };
    let got = run_loop_on(Box::new(load()), Some(cfg), &prompts, params);
    for (i, (g, p)) in got.iter().zip(&plain).enumerate() {
        assert_eq!(g.0, p.0, "prompt {i}: seeded sampling with MTP+suffix trees differs from plain");
    }
    let steps: usize = got.iter().map(|g| g.1).sum();
    eprintln!("seeded sampling: {} tokens in {steps} steps", TOKENS * prompts.len());
}

#[test]
fn a_restored_state_resynchronises_the_mtp_head() {
    let x = ids(&json("goldens.json")["token_ids"]);
    let mut b = load();
    assert!(b.set_mtp_drafting(true));
    let mut pool = mapped_pool(&mut b, 64);
    let p = pages(&mut pool, 100);
    pass(&mut b, 1, &x[..50], 0, &p, LogitsWanted::Last, None);
    let mut snap = vec![0u8; b.state_bytes()];
    b.save_state(1, &mut snap).unwrap();
    // A restored snapshot (the step loop's cache hit): the head missed positions 0..50.
    b.release_seq(1);
    b.load_state(1, &snap).unwrap();
    assert!(b.mtp_kv(1).is_none(), "loading a state drops the head's state");
    pass(&mut b, 1, &x[50..60], 50, &p, LogitsWanted::Last, None);
    let c = b.mtp_draft(1, x[60], 3, 2, f32::NEG_INFINITY).unwrap().expect("drafts after resync");
    assert_eq!(c.len(), 3);
    let (_, committed) = b.mtp_kv(1).unwrap();
    assert_eq!(committed, 59, "positions 0..50 zeroed, 50..59 caught up, 59 pending");
    assert!(b.set_mtp_drafting(false));
    assert!(b.mtp_kv(1).is_none(), "turning drafting off forgets every sequence");
    assert_eq!(b.mtp_draft(1, x[60], 3, 2, f32::NEG_INFINITY).unwrap(), None);
}
