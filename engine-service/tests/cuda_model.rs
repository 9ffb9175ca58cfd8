//! The default model on the GPU against the CPU backend, and the engine's bitwise contracts on
//! the GPU itself: tree node == chain, speculative == plain, cached == uncached. They need a
//! CUDA GPU: without one they are listed as ignored (skipped, by name); `deploy/gpu-check.sh`
//! runs them. `EDGE_GPU_MODEL` names another Llama-family GGUF (the GPU machine gets a
//! shortened copy of the default model: the whole file is larger than what travels there).
//!
//! Tolerance against the CPU: the CPU multiplies quantized weights by 8-bit quantized
//! activations, the GPU by the f32 activations, so logits differ; each row's largest
//! difference must stay under 3% of the row's logit range (the test prints what it measured),
//! and greedy tokens must agree wherever the CPU's top-2 gap is decisive (larger than four
//! times the row's largest GPU-CPU difference, or than 0.5).
#![cfg(feature = "cuda")]

mod common;
#[path = "support/step_loop.rs"]
mod step_loop;

use std::path::PathBuf;
use std::sync::Arc;

use engine_cpu::CpuOps;
use engine_service::backend::cpu::CpuBackend;
use engine_service::backend::cuda::CudaBackend;
use engine_service::backend::{Backend, ForwardBatch, LogitsWanted, SeqInput};
use engine_service::memory::store::{PageStore, SpaceChange};
use engine_service::memory::{KvDtype, MappedPool, PageId};
use engine_service::sampling::SamplingParams;
use engine_service::speculative::{SpecConfig, TreeShape};

const PT: usize = 16;

fn model() -> PathBuf {
    std::env::var_os("EDGE_GPU_MODEL").map(PathBuf::from).unwrap_or_else(common::model_path)
}

fn gpu(kv: KvDtype) -> CudaBackend {
    CudaBackend::load(&model(), 0, PT, kv).unwrap_or_else(|e| panic!("loading onto the GPU: {e}")).backend
}

fn cpu() -> CpuBackend {
    CpuBackend::load(&model(), 2, PT).expect("loading on the CPU").backend
}

fn forward(
    b: &mut dyn Backend,
    tokens: &[u32],
    start_pos: usize,
    pages: &[PageId],
    tree: Option<&[Option<usize>]>,
) -> Vec<f32> {
    let logits = LogitsWanted::All;
    let batch = ForwardBatch { seqs: vec![SeqInput { seq_id: 0, tokens, start_pos, pages, logits, tree }] };
    b.forward(&batch).expect("forward").logits.pop().unwrap_or_default()
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        (0..40u32).map(|i| 1000 + (i * 37) % 3000).collect(),
        (0..24u32).map(|i| 300 + (i % 6) * 11).collect(),
        (0..57u32).map(|i| 5000 + (i * 101) % 7000).collect(),
    ]
}

#[test]
#[ignore = "needs a CUDA GPU (deploy/gpu-check.sh runs it)"]
fn gpu_logits_follow_the_cpu() {
    let (mut g, mut c) = (gpu(KvDtype::F16), cpu());
    let vocab = g.hparams().vocab_size;
    let (mut gpool, mut cpool) = (MappedPool::new(&mut g, 64).unwrap(), MappedPool::new(&mut c, 64).unwrap());
    let mut worst = 0.0f32;
    for p in prompts() {
        let (gp, cp) = (gpool.pages_for(p.len()).unwrap(), cpool.pages_for(p.len()).unwrap());
        let (gl, cl) = (forward(&mut g, &p, 0, &gp, None), forward(&mut c, &p, 0, &cp, None));
        assert_eq!(gl.len(), p.len() * vocab);
        for (r, (gr, cr)) in gl.chunks(vocab).zip(cl.chunks(vocab)).enumerate() {
            assert!(gr.iter().all(|x| x.is_finite()), "row {r}: GPU logits are finite");
            let range = cr.iter().cloned().fold(f32::MIN, f32::max) - cr.iter().cloned().fold(f32::MAX, f32::min);
            let diff = gr.iter().zip(cr).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            worst = worst.max(diff / range);
            assert!(diff <= 0.03 * range, "row {r}: largest difference {diff} of a logit range {range}");
        }
        gpool.release(&gp);
        cpool.release(&cp);
    }
    eprintln!("largest GPU-CPU logit difference: {:.3}% of the row's range", worst * 100.0);
}

#[test]
#[ignore = "needs a CUDA GPU (deploy/gpu-check.sh runs it)"]
fn greedy_tokens_equal_the_cpus_where_the_choice_is_decisive() {
    let (mut g, mut c) = (gpu(KvDtype::F16), cpu());
    let vocab = g.hparams().vocab_size;
    let (mut gpool, mut cpool) = (MappedPool::new(&mut g, 64).unwrap(), MappedPool::new(&mut c, 64).unwrap());
    let (mut compared, mut close) = (0, 0);
    for p in prompts() {
        let (gp, cp) = (gpool.pages_for(p.len() + 48).unwrap(), cpool.pages_for(p.len() + 48).unwrap());
        let (mut gl, mut cl) = (forward(&mut g, &p, 0, &gp, None), forward(&mut c, &p, 0, &cp, None));
        for pos in p.len()..p.len() + 48 {
            let (grow, crow) = (&gl[gl.len() - vocab..], &cl[cl.len() - vocab..]);
            let mut order: Vec<usize> = (0..vocab).collect();
            order.sort_by(|&a, &b| crow[b].total_cmp(&crow[a]));
            let (best, gap) = (order[0], crow[order[0]] - crow[order[1]]);
            let gbest = (0..vocab).max_by(|&a, &b| grow[a].total_cmp(&grow[b]).then(b.cmp(&a))).unwrap();
            // Decisive: the top-2 gap is larger than twice what the two backends can move
            // any logit apart in this row, with a margin of 2 (and above 0.5 absolutely for a
            // real model's peaked rows).
            let diff = grow.iter().zip(crow).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            if gap > 4.0 * diff || gap > 0.5 {
                assert_eq!(gbest, best, "greedy token at position {pos} (CPU gap {gap}, largest difference {diff})");
                compared += 1;
            } else {
                close += 1;
            }
            // Both continue with the CPU's token, so one close call does not end the comparison.
            let t = [best as u32];
            gl = forward(&mut g, &t, pos, &gp, None);
            cl = forward(&mut c, &t, pos, &cp, None);
        }
        gpool.release(&gp);
        cpool.release(&cp);
    }
    eprintln!("{compared} decisive greedy tokens equal, {close} steps too close to call");
    assert!(compared >= 20, "too few decisive steps compared ({compared})");
}

#[test]
#[ignore = "needs a CUDA GPU (deploy/gpu-check.sh runs it)"]
fn tree_nodes_get_their_chains_logits_bitwise_on_the_gpu() {
    let mut g = gpu(KvDtype::F16);
    let vocab = g.hparams().vocab_size;
    let mut pool = MappedPool::new(&mut g, 64).unwrap();
    let prefix: Vec<u32> = (0..35u32).map(|i| 1000 + (i * 37) % 3000).collect();
    let parents = [None, Some(0), Some(0), Some(1), Some(1), Some(3)];
    let tokens = [4000u32, 4001, 4002, 4003, 4004, 4005];
    let pages = pool.pages_for(prefix.len() + tokens.len() + 1).unwrap();
    forward(&mut g, &prefix, 0, &pages, None);
    let tree = forward(&mut g, &tokens, prefix.len(), &pages, Some(&parents));
    for j in 0..tokens.len() {
        let mut path = vec![j];
        while let Some(p) = parents[*path.last().unwrap()] {
            path.push(p);
        }
        path.reverse();
        let chain_pages = pool.pages_for(prefix.len() + path.len()).unwrap();
        forward(&mut g, &prefix, 0, &chain_pages, None);
        let chain: Vec<u32> = path.iter().map(|&n| tokens[n]).collect();
        let logits = forward(&mut g, &chain, prefix.len(), &chain_pages, None);
        let (want, got) = (&logits[logits.len() - vocab..], &tree[j * vocab..(j + 1) * vocab]);
        assert!(want.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()), "node {j}: not its chain's logits");
        pool.release(&chain_pages);
    }
}

#[test]
#[ignore = "needs a CUDA GPU (deploy/gpu-check.sh runs it)"]
fn speculative_decoding_emits_the_plain_tokens_on_the_gpu() {
    let prompts = prompts();
    for kv in [KvDtype::F16, KvDtype::Fp8] {
        let plain = step_loop::run_requests(Box::new(gpu(kv)), None, &prompts, SamplingParams::greedy(), 96, PT);
        let spec = SpecConfig { enabled: true, shape: TreeShape::SEED, max_batch: 16, ..SpecConfig::default() };
        let fast = step_loop::run_requests(Box::new(gpu(kv)), Some(spec), &prompts, SamplingParams::greedy(), 96, PT);
        for (i, (p, s)) in plain.iter().zip(&fast).enumerate() {
            assert_eq!(p.0, s.0, "{kv:?} prompt {i}: speculative tokens differ from plain");
        }
        let (steps_plain, steps_spec): (usize, usize) =
            (plain.iter().map(|x| x.1).sum(), fast.iter().map(|x| x.1).sum());
        eprintln!("{kv:?}: {steps_plain} plain steps, {steps_spec} speculative steps");
    }
}

#[test]
#[ignore = "needs a CUDA GPU (deploy/gpu-check.sh runs it)"]
fn cached_pages_give_the_uncached_logits_bitwise_on_the_gpu() {
    let mut g = gpu(KvDtype::F16);
    let layout = g.kv_layout();
    let reader = CpuOps::new(1);
    let mut store = PageStore::local(layout, 64);
    let fresh = |store: &mut PageStore, g: &mut CudaBackend, n: usize| {
        let pages = store.allocate(n).expect("local").expect("room");
        for change in store.take_space_changes() {
            if let SpaceChange::Map(space, memory) = change {
                reader.map_pages(space, Arc::clone(&memory)).unwrap();
                g.map_pages(space, memory).expect("mapping the pool");
            }
        }
        pages
    };
    let tokens: Vec<u32> = (0..44u32).map(|i| 1000 + (i * 37) % 3000).collect();
    let other: Vec<u32> = (0..16u32).map(|i| 2000 + i * 11).collect();
    for (n, continuation) in [(32usize, &other[..5]), (37, &other[..0]), (37, &other[..11])] {
        let reference = fresh(&mut store, &mut g, 3);
        let ref_ids: Vec<PageId> = reference.iter().map(|p| p.page_id()).collect();
        forward(&mut g, &tokens[..n], 0, &ref_ids, None);
        let expected = forward(&mut g, &tokens[n..], n, &ref_ids, None);
        let producer = fresh(&mut store, &mut g, 3);
        let prod_ids: Vec<PageId> = producer.iter().map(|p| p.page_id()).collect();
        forward(&mut g, &tokens[..n], 0, &prod_ids, None);
        if !continuation.is_empty() {
            forward(&mut g, continuation, n, &prod_ids, None);
        }
        g.flush_pages(&prod_ids).unwrap();
        let snapshot: Vec<Vec<u8>> =
            prod_ids.iter().map(|&p| reader.read_page_bytes(&layout, p, 0, layout.page_bytes()).unwrap()).collect();
        let whole = n / PT;
        let mut pages = prod_ids[..whole].to_vec();
        let own = fresh(&mut store, &mut g, 3 - whole);
        if n % PT != 0 {
            g.copy_page(prod_ids[whole], own[0].page_id()).expect("copy on write");
        }
        pages.extend(own.iter().map(|p| p.page_id()));
        let got = forward(&mut g, &tokens[n..], n, &pages, None);
        assert!(got.iter().zip(&expected).all(|(a, b)| a.to_bits() == b.to_bits()), "reuse at {n} changed the logits");
        g.flush_pages(&prod_ids).unwrap();
        for (i, &p) in prod_ids.iter().enumerate() {
            let now = reader.read_page_bytes(&layout, p, 0, layout.page_bytes()).unwrap();
            assert!(now == snapshot[i], "cached page {i} was written by the consumer");
        }
        store.release(&reference);
        store.release(&producer);
        store.release(&own);
    }
}
