//! Engine throughput on a real model file: prefill and decode tokens/s at an empty context
//! and at a long context, for 1 and 2 threads (or `EDGE_BENCH_THREADS=1,2,4`).
//!
//!   cargo bench -p engine-service --bench throughput [-- MODEL.gguf | config.json]
//!
//! Decode is measured as single-sequence steps (one token per forward pass) after the
//! context has been prefilled; prefill as chunks of `EDGE_BENCH_CHUNK` (default 256) tokens.
//! The context is prefilled once per depth; every probe starts from its end: attention KV
//! before it is never overwritten, and a recurrent model (Qwen3.5/3.6) restores the state
//! snapshot taken there, so hybrid models are measured at depth too.
//! `EDGE_BENCH_KV_DTYPE=fp8` runs with FP8 E4M3 KV pages (default f16).
//! A `config.json` runs that architecture with seeded random weights, stored as
//! `EDGE_BENCH_RANDOM_DTYPE` says (bf16, f32, nvfp4, q4_k_m).
//! `EDGE_BENCH_BATCH=8` decodes 8 sequences (each with the context) together: the decode
//! column is then the batch's tokens/s. `EDGE_BENCH_PEAK_GBS=3350` also prints the decode
//! roofline at that memory bandwidth (the model file's bytes read once per step).
//! `EDGE_BENCH_DEVICE=cuda` runs on CUDA device 0 (a build with `--features cuda`; the thread
//! count then only labels the row: run it with `EDGE_BENCH_THREADS=1`).

use std::path::PathBuf;
use std::time::Instant;

use engine_cpu::kernels::GgmlType;
use engine_service::backend::cpu::{CpuBackend, RandomSpec};
use engine_service::backend::{Backend, ForwardBatch, LogitsWanted, SeqInput};
use engine_service::memory::{KvDtype, MappedPool, PageId};

const PAGE_TOKENS: usize = 16;

fn env_list(name: &str, default: &[usize]) -> Vec<usize> {
    std::env::var(name)
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| default.to_vec())
}

/// Runs `tokens` of sequence `seq_id` through the backend in chunks, starting at `start_pos`.
fn run_chunks(
    backend: &mut dyn Backend,
    seq_id: u64,
    pages: &[PageId],
    tokens: &[u32],
    start_pos: usize,
    chunk: usize,
) {
    let mut pos = start_pos;
    for piece in tokens.chunks(chunk) {
        let batch = ForwardBatch {
            seqs: vec![SeqInput {
                seq_id,
                tree: None,
                tokens: piece,
                start_pos: pos,
                pages,
                logits: LogitsWanted::Last,
            }],
        };
        backend.forward(&batch).expect("forward");
        pos += piece.len();
    }
}

/// Puts sequence `seq` back at the end of its context before a probe: its KV before the
/// context is never overwritten, and a recurrent model's state is restored from the snapshot
/// taken after the context (through the state save/restore the cache uses), or started afresh
/// at context 0.
fn rewind(backend: &mut dyn Backend, seq: u64, context: usize, snapshot: &[u8]) {
    if backend.state_bytes() == 0 {
        return;
    }
    if context == 0 {
        backend.release_seq(seq);
    } else {
        backend.load_state(seq, snapshot).expect("restoring the state after the context");
    }
}

/// How a `config.json` model's random weights are stored: `EDGE_BENCH_RANDOM_DTYPE` = bf16
/// (default), f32, nvfp4 or q4_k_m (llama.cpp's Q4_K_M mix).
fn random_spec() -> RandomSpec {
    let name = std::env::var("EDGE_BENCH_RANDOM_DTYPE").unwrap_or_else(|_| "bf16".into());
    let (dtype, nvfp4) = match name.as_str() {
        "bf16" => (GgmlType::BF16, false),
        "f32" => (GgmlType::F32, false),
        "nvfp4" => (GgmlType::BF16, true),
        "q4_k_m" => (GgmlType::Q4_K, false),
        other => panic!("EDGE_BENCH_RANDOM_DTYPE={other}: bf16, f32, nvfp4 or q4_k_m"),
    };
    RandomSpec { seed: 0, dtype, nvfp4 }
}

/// The model on the device `EDGE_BENCH_DEVICE` names (`cpu`, the default, or `cuda`).
fn load(model: &std::path::Path, n_threads: usize, kv_dtype: KvDtype) -> Box<dyn Backend> {
    match std::env::var("EDGE_BENCH_DEVICE").as_deref() {
        Ok("cuda") => load_cuda(model, kv_dtype),
        Ok("cpu") | Err(_) => {
            let loaded = CpuBackend::load_with(model, n_threads, PAGE_TOKENS, kv_dtype, &random_spec());
            Box::new(loaded.expect("load model").backend)
        }
        Ok(other) => panic!("EDGE_BENCH_DEVICE={other}: cpu or cuda"),
    }
}

#[cfg(feature = "cuda")]
fn load_cuda(model: &std::path::Path, kv_dtype: KvDtype) -> Box<dyn Backend> {
    let loaded = engine_service::backend::cuda::CudaBackend::load(model, 0, PAGE_TOKENS, kv_dtype);
    Box::new(loaded.unwrap_or_else(|e| panic!("loading onto the GPU: {e}")).backend)
}

#[cfg(not(feature = "cuda"))]
fn load_cuda(_: &std::path::Path, _: KvDtype) -> Box<dyn Backend> {
    panic!("EDGE_BENCH_DEVICE=cuda needs a build with --features cuda")
}

fn main() {
    let model = std::env::args()
        .skip(1)
        .find(|a| a.ends_with(".gguf") || a.ends_with(".json"))
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/SmolLM2-135M-Instruct.Q4_1.gguf"))
        });
    let threads = env_list("EDGE_BENCH_THREADS", &[1, 2]);
    let contexts = env_list("EDGE_BENCH_CONTEXTS", &[0, 1536]);
    let chunk = env_list("EDGE_BENCH_CHUNK", &[256])[0];
    let prefill_tokens = env_list("EDGE_BENCH_PREFILL", &[512])[0];
    let decode_steps = env_list("EDGE_BENCH_DECODE", &[64])[0];
    let rounds = env_list("EDGE_BENCH_ROUNDS", &[3])[0];
    let batch = env_list("EDGE_BENCH_BATCH", &[1])[0].max(1);
    let peak_gbs = env_list("EDGE_BENCH_PEAK_GBS", &[0])[0];
    let file_bytes = std::fs::metadata(&model).map(|m| m.len()).unwrap_or(0);

    let kv_name = std::env::var("EDGE_BENCH_KV_DTYPE").unwrap_or_else(|_| "f16".into());
    let kv_dtype: KvDtype = kv_name.parse().unwrap_or_else(|e| panic!("EDGE_BENCH_KV_DTYPE: {e}"));
    println!("model {}  page_tokens {PAGE_TOKENS}  prefill chunk {chunk}  best of {rounds} rounds", model.display());
    println!("file {:.3} GB  decode batch {batch}", file_bytes as f64 / 1e9);
    if peak_gbs > 0 {
        // Weights are read once per decode step (the KV is small next to them at these contexts).
        let steps = peak_gbs as f64 * 1e9 / file_bytes.max(1) as f64;
        println!("roofline at {peak_gbs} GB/s: {:.1} steps/s = {:.1} decode tok/s", steps, steps * batch as f64);
    }
    println!("{:>7} {:>8} {:>16} {:>16}", "threads", "context", "prefill tok/s", "decode tok/s");
    for &n_threads in &threads {
        let mut backend = load(&model, n_threads, kv_dtype);
        let backend = backend.as_mut();
        if n_threads == threads[0] {
            let layout = backend.kv_layout();
            println!(
                "backend {}  kv dtype {}  KV bytes/token {}",
                backend.name(),
                kv_dtype.name(),
                layout.bytes_per_token()
            );
        }
        let vocab = backend.hparams().vocab_size as u32;
        let max_ctx = contexts.iter().copied().max().unwrap_or(0) + prefill_tokens + decode_steps + 1;
        let per_seq = max_ctx.div_ceil(PAGE_TOKENS) + 1;
        let mut pool = MappedPool::new(backend, per_seq * batch).expect("mapping a pool");
        let pages: Vec<Vec<PageId>> = (0..batch).map(|_| pool.allocate(per_seq).expect("pages")).collect();
        // Deterministic, valid, varied token ids (speed does not depend on the values).
        let tokens: Vec<u32> = (0..max_ctx as u32).map(|i| (i * 7919 + 13) % vocab).collect();
        // Warm up: page in the weights, spin up the pool.
        run_chunks(backend, 0, &pages[0], &tokens[..chunk.min(64)], 0, chunk);
        backend.release_seq(0);
        let mut snapshots = vec![vec![0u8; backend.state_bytes()]; batch];

        for &context in &contexts {
            for (s, p) in pages.iter().enumerate() {
                backend.release_seq(s as u64);
                if context > 0 {
                    run_chunks(backend, s as u64, p, &tokens[..context], 0, chunk);
                    if backend.state_bytes() > 0 {
                        backend.save_state(s as u64, &mut snapshots[s]).expect("snapshotting the state");
                    }
                }
            }
            let (mut best_prefill, mut best_decode) = (0f64, 0f64);
            for _ in 0..rounds {
                rewind(backend, 0, context, &snapshots[0]);
                let t = Instant::now();
                run_chunks(backend, 0, &pages[0], &tokens[context..context + prefill_tokens], context, chunk);
                best_prefill = best_prefill.max(prefill_tokens as f64 / t.elapsed().as_secs_f64());
                // Decode right after the context (not after the prefill probe): positions
                // context.. are overwritten, which is what a real sequence would do.
                for (s, snapshot) in snapshots.iter().enumerate() {
                    rewind(backend, s as u64, context, snapshot);
                }
                let t = Instant::now();
                for i in 0..decode_steps {
                    let pos = context + i;
                    let batch = ForwardBatch {
                        seqs: pages
                            .iter()
                            .enumerate()
                            .map(|(s, p)| SeqInput {
                                seq_id: s as u64,
                                tree: None,
                                tokens: &tokens[pos..pos + 1],
                                start_pos: pos,
                                pages: p,
                                logits: LogitsWanted::Last,
                            })
                            .collect(),
                    };
                    backend.forward(&batch).expect("forward");
                }
                best_decode = best_decode.max((decode_steps * batch) as f64 / t.elapsed().as_secs_f64());
            }
            println!("{n_threads:>7} {context:>8} {best_prefill:>16.1} {best_decode:>16.1}");
        }
    }
}
