//! FP8 E4M3 KV pages (`kv_dtype = "fp8"`, spec 8.3) on the CPU backend:
//! - the tiny Qwen3.6 checkpoints match the float64 NumPy reference with an FP8 KV cache
//!   (`f64.fp8kv.full.logits`, tolerance 1e-2 per the fixture README), one pass and cached
//!   decode steps alike;
//! - the default GGUF model with FP8 KV stays close to f16 KV (the same argmax wherever f16's
//!   choice is decisive, over the fidelity fixture's chats; logits within [`TOL_FP8_VS_F16`]);
//! - the exactness properties of f16 pages hold for FP8 pages: chunked prefill, batching and
//!   prefix reuse (whole pages in place, a partial page copied) give bitwise the logits of
//!   one uncached pass;
//! - f16 and FP8 fingerprints differ and FP8 pages are half the bytes.
//!
//! Tree attention over FP8 pages is checked against its path oracle in the kernel's unit tests
//! (`attention_tree_tests.rs`).

mod common;

use std::path::{Path, PathBuf};

use engine_models::format::safetensors::SafeTensors;
use engine_service::backend::cpu::{CpuBackend, LoadedModel};
use engine_service::backend::{Backend, ForwardBatch, LogitsWanted, SeqInput};
use engine_service::memory::store::PageStore;
use engine_service::memory::store::{LeasedPage, SpaceChange};
use engine_service::memory::{KvDtype, MappedPool, PageId};
use serde_json::Value;

const PT: usize = 16;
/// Fixture README: an f32 engine with the reference's FP8 semantics lands within ~1e-6 unless
/// a K/V value rounds to the other E4M3 neighbour (f32 vs f64 arithmetic before rounding); such
/// flips give up to ~8e-3, so 1e-2.
const TOL_FP8_GOLDEN: f32 = 1e-2;
/// SmolLM2-135M: E4M3 keeps 3 mantissa bits (relative step 1/16 vs f16's 1/2048), and GGUF
/// files carry no KV scales (1.0). Measured max |fp8 - f16| over the fidelity fixture's 10
/// chats (442 positions, logits of 15..40): 6.11 (avx2), 5.76 (scalar), at the first positions
/// of the shared system prompt; one chat's 16 positions gave 2.18 (AVX-512), the bound this
/// replaced. See docs/engine.md "KV dtype".
const TOL_FP8_VS_F16: f32 = 8.0;

fn threads() -> usize {
    std::env::var("EDGE_TEST_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(2)
}

fn qwen_fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen36").join(name)
}

fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn argmax(r: &[f32]) -> usize {
    r.iter().enumerate().fold((0, f32::NEG_INFINITY), |a, (j, &x)| if x > a.1 { (j, x) } else { a }).0
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn pages(pool: &mut MappedPool, positions: usize) -> Vec<PageId> {
    pool.pages_for(positions).expect("pages")
}

fn mapped_pool(b: &mut CpuBackend, pages: usize) -> MappedPool {
    MappedPool::new(b, pages).expect("mapping a pool")
}

fn pass(
    b: &mut CpuBackend,
    id: u64,
    tokens: &[u32],
    start_pos: usize,
    pages: &[PageId],
    logits: LogitsWanted,
) -> Vec<f32> {
    let batch = ForwardBatch { seqs: vec![SeqInput { seq_id: id, tokens, start_pos, pages, logits, tree: None }] };
    b.forward(&batch).unwrap_or_else(|e| panic!("forward: {e}")).logits.remove(0)
}

fn load(path: &Path, dtype: KvDtype) -> LoadedModel {
    CpuBackend::load_kv(path, threads(), PT, dtype).expect("loading the model")
}

/// One pass over the golden prompt, and the same prompt as a 150-token prefill plus one-token
/// decode steps (reading cached FP8 pages), against the FP8-KV reference.
fn check_qwen_fp8(name: &str) -> (f32, f32) {
    let dir = qwen_fixture(name);
    let g: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("goldens.json")).unwrap()).unwrap();
    let ids: Vec<u32> = g["token_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let st = SafeTensors::open(&dir.join("goldens.safetensors")).expect("goldens");
    let want = st.tensor("f64.fp8kv.full.logits").expect("fp8kv goldens").to_f32().unwrap();
    let exact = st.tensor("f64.full.logits").expect("f64 goldens").to_f32().unwrap();
    let mut l = load(&dir, KvDtype::Fp8);
    assert_eq!(l.backend.kv_layout().dtype, KvDtype::Fp8);
    let n = 181;
    let vocab = want.len() / n;
    let mut pool = mapped_pool(&mut l.backend, 64);
    let p = pages(&mut pool, n);
    let one = pass(&mut l.backend, 1, &ids[..n], 0, &p, LogitsWanted::All);
    let e_one = max_abs(&one, &want);
    // The FP8 effect is real: the exact (f64, unquantized) logits are further away.
    let effect = max_abs(&one, &exact);
    assert!(
        effect > 10.0 * e_one.max(1e-4),
        "{name}: fp8 logits are no further from the exact ones ({effect}) than from the fp8 reference ({e_one})"
    );

    let q = pages(&mut pool, n);
    let mut steps = pass(&mut l.backend, 2, &ids[..150], 0, &q, LogitsWanted::All);
    for t in 150..n {
        steps.extend(pass(&mut l.backend, 2, &ids[t..t + 1], t, &q, LogitsWanted::Last));
    }
    assert_eq!(steps.len(), n * vocab);
    assert!(bits(&steps) == bits(&one), "{name}: prefill + decode steps differ from one pass (bitwise)");
    (e_one, effect)
}

#[test]
fn tiny_qwen36_checkpoints_match_the_fp8_kv_reference() {
    for name in ["tiny-vlm", "tiny-text"] {
        let (e, effect) = check_qwen_fp8(name);
        eprintln!("{name}: fp8 KV max abs error vs f64.fp8kv.full.logits {e:.3e} (fp8 effect vs exact {effect:.3})");
        assert!(e < TOL_FP8_GOLDEN, "{name}: max abs error {e} vs the FP8-KV reference");
    }
}

#[test]
fn nvfp4_checkpoint_reads_its_kv_scales_and_runs_with_fp8_pages() {
    // tiny-vlm-nvfp4 carries k_scale / v_scale = 1.0 (fixture README); FP8 pages must give the
    // f16-page logits up to the FP8 effect, and finite.
    let dir = qwen_fixture("tiny-vlm-nvfp4");
    let ids: Vec<u32> = (0..40u32).map(|i| 3 + (i * 7) % 200).collect();
    let mut out = Vec::new();
    for dtype in [KvDtype::F16, KvDtype::Fp8] {
        let mut l = load(&dir, dtype);
        let mut pool = mapped_pool(&mut l.backend, 8);
        let p = pages(&mut pool, ids.len());
        out.push(pass(&mut l.backend, 1, &ids, 0, &p, LogitsWanted::All));
    }
    assert!(out[1].iter().all(|x| x.is_finite()));
    let d = max_abs(&out[0], &out[1]);
    assert!(d > 0.0 && d < 0.5, "nvfp4 fp8 vs f16 KV: {d}");
}

#[test]
fn fingerprints_and_page_sizes_follow_the_kv_dtype() {
    let path = common::model_path();
    let f16 = load(&path, KvDtype::F16);
    let fp8 = load(&path, KvDtype::Fp8);
    assert_ne!(f16.fingerprint, fp8.fingerprint, "f16 and fp8 pages must never share a cache namespace");
    assert_eq!(f16.fingerprint, common::load_with_threads(PT, 1).fingerprint, "f16 is the default");
    let (a, b) = (f16.backend.kv_layout(), fp8.backend.kv_layout());
    assert_eq!(a.page_bytes(), 2 * b.page_bytes());
    // SmolLM2-135M: 30 layers x K,V x 3 KV heads x 64 dims.
    assert_eq!((a.bytes_per_token(), b.bytes_per_token()), (30 * 2 * 3 * 64 * 2, 30 * 2 * 3 * 64));
}

/// Top-2 gap of a logit row.
fn top2_gap(r: &[f32]) -> f32 {
    let best = argmax(r);
    let second = r.iter().enumerate().filter(|&(j, _)| j != best).map(|(_, &x)| x).fold(f32::NEG_INFINITY, f32::max);
    r[best] - second
}

/// Greedy decoding of `n` tokens; returns the tokens and the top-2 gap at each step.
fn greedy(l: &mut LoadedModel, id: u64, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<f32>) {
    let mut pool = mapped_pool(&mut l.backend, (prompt.len() + n).div_ceil(PT));
    let p = pages(&mut pool, prompt.len() + n);
    let mut logits = pass(&mut l.backend, id, prompt, 0, &p, LogitsWanted::Last);
    let (mut toks, mut gaps) = (Vec::new(), Vec::new());
    for step in 0..n {
        let next = argmax(&logits) as u32;
        toks.push(next);
        gaps.push(top2_gap(&logits));
        logits = pass(&mut l.backend, id, &[next], prompt.len() + step, &p, LogitsWanted::Last);
    }
    (toks, gaps)
}

/// The f16-KV top-2 gap at or above which a choice counts as decisive for FP8 KV (the fidelity
/// test's rule, with FP8's own noise): FP8 must then pick f16's token. Measured over the 442
/// prompt positions and 10 greedy runs below, flips happened at f16 gaps up to 1.29 (scalar)
/// and 0.72 (avx2), mostly inside the shared system prompt where the model predicts template
/// text; twice the largest keeps the rule independent of the kernel set.
const FP8_DECISIVE_GAP: f32 = 2.5;

/// The reference chats of the fidelity fixture: greedy decoding with FP8 KV gives the f16
/// tokens wherever f16 is decisive, prompt positions and generated steps alike, and the
/// logits stay within [`TOL_FP8_VS_F16`].
#[test]
fn gguf_model_with_fp8_kv_stays_close_to_f16() {
    let path = common::model_path();
    let mut f16 = load(&path, KvDtype::F16);
    let mut fp8 = load(&path, KvDtype::Fp8);
    let reference = common::reference();
    let prompts: Vec<Vec<u32>> =
        reference["prompts"].as_array().expect("prompts").iter().map(|p| common::ids(&p["prompt_ids"])).collect();
    let (mut worst, mut positions, mut decisive_positions, mut matched) = (0f32, 0, 0, 0);
    for (i, prompt) in prompts.iter().enumerate() {
        // Teacher-forced: every prompt position's logits.
        let mut all = Vec::new();
        for l in [&mut f16, &mut fp8] {
            let mut pool = mapped_pool(&mut l.backend, prompt.len().div_ceil(PT));
            let p = pages(&mut pool, prompt.len());
            all.push(pass(&mut l.backend, 1, prompt, 0, &p, LogitsWanted::All));
        }
        worst = worst.max(max_abs(&all[0], &all[1]));
        let vocab = all[0].len() / prompt.len();
        for pos in 0..prompt.len() {
            let (a, b) = (&all[0][pos * vocab..][..vocab], &all[1][pos * vocab..][..vocab]);
            let gap = top2_gap(a);
            positions += 1;
            if argmax(a) != argmax(b) {
                eprintln!("prompt {i} position {pos}: argmax differs at f16 top-2 gap {gap:.3}");
                assert!(gap < FP8_DECISIVE_GAP, "prompt {i} position {pos}: fp8 flips a decisive choice (gap {gap})");
            } else if gap >= FP8_DECISIVE_GAP {
                decisive_positions += 1;
            }
        }
        // Free-running: equal tokens until they diverge, and divergence only where f16 hesitates.
        let (want, gaps) = greedy(&mut f16, 2, prompt, 16);
        let (got, _) = greedy(&mut fp8, 2, prompt, 16);
        let same = want.iter().zip(&got).take_while(|(a, b)| a == b).count();
        if same < want.len() {
            eprintln!("prompt {i}: greedy diverges at step {same}, f16 top-2 gap {:.3}", gaps[same]);
            assert!(gaps[same] < FP8_DECISIVE_GAP, "prompt {i}: fp8 diverges at decisive step {same} ({})", gaps[same]);
        }
        matched += same;
    }
    eprintln!(
        "SmolLM2 f16 vs fp8 KV: max |logit diff| {worst:.4}; {decisive_positions} of {positions} prompt positions \
         decisive; {matched} greedy tokens equal before any divergence"
    );
    // Guards against a criterion that checks nothing.
    assert!(decisive_positions * 4 >= positions, "only {decisive_positions} of {positions} positions are decisive");
    assert!(matched >= 40, "only {matched} greedy tokens equal");
    assert!(worst > 0.0 && worst < TOL_FP8_VS_F16, "f16 vs fp8 KV logits: {worst}");
}

#[test]
fn fp8_chunked_and_batched_prefill_equal_one_pass_bitwise() {
    let mut l = load(&common::model_path(), KvDtype::Fp8);
    let b = &mut l.backend;
    let toks: Vec<u32> = (0..70u32).map(|i| 1000 + (i * 37) % 3000).collect();
    let mut pool = mapped_pool(b, 48);
    let base_pages = pages(&mut pool, toks.len());
    let base = pass(b, 1, &toks, 0, &base_pages, LogitsWanted::All);
    let row = base.len() / toks.len();
    for cuts in [vec![1usize; 70], vec![7, 9, 16, 1, 37], vec![33, 37]] {
        let p = pages(&mut pool, toks.len());
        let mut got = Vec::new();
        let mut at = 0;
        for len in cuts.iter().copied() {
            got.extend(pass(b, 2, &toks[at..at + len], at, &p, LogitsWanted::All));
            at += len;
        }
        assert!(bits(&got) == bits(&base), "chunking {cuts:?} changed the logits");
    }
    // Two sequences in one pass vs separately.
    let other: Vec<u32> = (0..30u32).map(|i| 2000 + i * 11).collect();
    let (pa, pb) = (pages(&mut pool, toks.len()), pages(&mut pool, other.len()));
    let batch = ForwardBatch {
        seqs: vec![
            SeqInput { seq_id: 3, tokens: &toks, start_pos: 0, pages: &pa, logits: LogitsWanted::All, tree: None },
            SeqInput { seq_id: 4, tokens: &other, start_pos: 0, pages: &pb, logits: LogitsWanted::Last, tree: None },
        ],
    };
    let out = b.forward(&batch).expect("batched forward").logits;
    let pc = pages(&mut pool, other.len());
    let alone = pass(b, 5, &other, 0, &pc, LogitsWanted::Last);
    assert!(bits(&out[0]) == bits(&base), "batched sequence 1 differs");
    assert!(bits(&out[1]) == bits(&alone), "batched sequence 2 differs");
    assert_eq!(alone.len(), row);
}

#[test]
fn fp8_prefix_reuse_gives_bitwise_uncached_logits() {
    let mut l = load(&common::model_path(), KvDtype::Fp8);
    let b = &mut l.backend;
    let layout = b.kv_layout();
    let bytes = layout.page_bytes();
    let mut store = PageStore::local(layout, 64);
    let fresh = |store: &mut PageStore, b: &mut CpuBackend, n: usize| {
        let pages = store.allocate(n).expect("local").expect("room");
        for change in store.take_space_changes() {
            if let SpaceChange::Map(space, memory) = change {
                b.map_pages(space, memory).expect("mapping the pool");
            }
        }
        for p in &pages {
            // 0xFF is an E4M3 NaN, so any read of an unwritten slot shows up as NaN logits.
            b.ops().write_page_bytes(&layout, p.page_id(), 0, &vec![0xFF; bytes]).expect("poisoning");
        }
        pages
    };
    let ids = |pages: &[LeasedPage]| -> Vec<PageId> { pages.iter().map(LeasedPage::page_id).collect() };
    let tokens: Vec<u32> = (0..44u32).map(|i| 1000 + (i * 37) % 3000).collect();
    let other: Vec<u32> = (0..16u32).map(|i| 2000 + i * 11).collect();
    for (n, continuation) in [(32usize, &other[..5]), (37, &other[..0]), (37, &other[..11])] {
        let ref_pages = fresh(&mut store, b, 3);
        let ref_ptrs = ids(&ref_pages);
        pass(b, 0, &tokens[..n], 0, &ref_ptrs, LogitsWanted::None);
        let expected = pass(b, 0, &tokens[n..], n, &ref_ptrs, LogitsWanted::Last);
        assert!(expected.iter().all(|x| x.is_finite()), "reference logits are finite");

        let producer = fresh(&mut store, b, 3);
        let prod_ptrs = ids(&producer);
        pass(b, 0, &tokens[..n], 0, &prod_ptrs, LogitsWanted::None);
        if !continuation.is_empty() {
            pass(b, 0, continuation, n, &prod_ptrs, LogitsWanted::None);
        }
        let whole = n / PT;
        let mut seq_pages: Vec<PageId> = prod_ptrs[..whole].to_vec();
        let own = fresh(&mut store, b, 3 - whole);
        if n % PT != 0 {
            b.copy_page(producer[whole].page_id(), own[0].page_id()).expect("copy on write");
        }
        seq_pages.extend(ids(&own));
        let got = pass(b, 0, &tokens[n..], n, &seq_pages, LogitsWanted::Last);
        let c = continuation.len();
        assert!(bits(&got) == bits(&expected), "fp8 reuse at {n} (continuation {c}) changed the logits");
        store.release(&ref_pages);
        store.release(&producer);
        store.release(&own);
    }
}
