//! Kernel microbenchmarks at SmolLM2-135M shapes (hidden 576, FFN 1536, vocab 49152, 9/3
//! heads of 64, 16-token KV pages), 1 and 2 threads:
//! - `gemv`/`gemm_m16`/`gemm_m64`: one packed matrix (Q4_1 layers, Q8_0 head), weight GB/s;
//! - `model_gemv`: every weight matrix of the 30 layers plus the head once (96.4 MB, the bytes
//!   of one decode token), so the time is the whole-model GEMV cost per token;
//! - `attn_decode`: one layer's decode attention at 1552 and 8192 context (x30 per token).
//!   (The summary also times 16- and 256-query prefill chunks ending at those contexts, and
//!   the same for the hybrid's attention layers: Qwen3.5-0.8B's 8/2 heads of 256.)
//!
//!   cargo bench -p engine-cpu --bench kernels [-- FILTER]
//!
//! Before criterion runs, a one-thread summary measured in *thread CPU time* is printed: on a
//! shared VM wall time includes time slices lost to other processes, CPU time does not.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use engine_cpu::kernels::{
    AttnParams, GgmlType, PackedMatrix, QMatrix, ThreadPool, attention, isa_name, matmul_packed, write_kv,
};
use engine_cpu::pages::LocalPagePool;
use engine_cpu::pages::PageAddr;
use engine_ops::kv::{KvDtype, KvLayout};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn random_packed(rng: &mut ChaCha8Rng, dtype: GgmlType, rows: usize, cols: usize) -> PackedMatrix {
    let rb = dtype.row_bytes(cols).expect("whole blocks");
    let mut data = vec![0u8; rows * rb];
    rng.fill(&mut data[..]);
    for blk in data.chunks_exact_mut(dtype.block_bytes()) {
        // small finite f16 scales (and Q4_1 mins) so results stay finite
        blk[0..2].copy_from_slice(&half::f16::from_f32(rng.random_range(0.001..0.02)).to_bits().to_le_bytes());
        if dtype == GgmlType::Q4_1 {
            blk[2..4].copy_from_slice(&half::f16::from_f32(-0.05).to_bits().to_le_bytes());
        }
    }
    PackedMatrix::pack(&QMatrix { dtype, rows, cols, data: &data }).expect("consistent shape")
}

const SHAPES: [(&str, GgmlType, usize, usize); 5] = [
    ("q_o_576x576", GgmlType::Q4_1, 576, 576),
    ("kv_192x576", GgmlType::Q4_1, 192, 576),
    ("gate_up_1536x576", GgmlType::Q4_1, 1536, 576),
    ("down_576x1536", GgmlType::Q4_1, 576, 1536),
    ("head_49152x576_q8", GgmlType::Q8_0, 49152, 576),
];

fn bench_matmul(c: &mut Criterion) {
    eprintln!("kernel isa: {}", isa_name());
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    for (group, m_rows) in [("gemv", 1usize), ("gemm_m16", 16), ("gemm_m64", 64)] {
        let mut g = c.benchmark_group(group);
        for &(name, dtype, rows, cols) in &SHAPES {
            let w = random_packed(&mut rng, dtype, rows, cols);
            let x: Vec<f32> = (0..m_rows * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut out = vec![0f32; m_rows * rows];
            g.throughput(Throughput::Bytes(w.bytes().len() as u64));
            for threads in [1, 2] {
                let pool = ThreadPool::new(threads);
                g.bench_with_input(BenchmarkId::new(name, format!("t{threads}")), &threads, |b, _| {
                    b.iter(|| matmul_packed(&pool, &w, &x, m_rows, &mut out))
                });
            }
        }
        g.finish();
    }
}

fn bench_model_gemv(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let mut mats = Vec::new();
    for _ in 0..30 {
        for &(_, dtype, rows, cols) in &SHAPES[..4] {
            let n = if rows == 576 && cols == 576 || rows == 192 || rows == 1536 { 2 } else { 1 };
            for _ in 0..n {
                mats.push(random_packed(&mut rng, dtype, rows, cols));
            }
        }
    }
    let (_, dtype, rows, cols) = SHAPES[4];
    mats.push(random_packed(&mut rng, dtype, rows, cols));
    let bytes: usize = mats.iter().map(|m| m.bytes().len()).sum();
    let x: Vec<f32> = (0..1536).map(|_| rng.random_range(-1.0..1.0)).collect();
    let mut out = vec![0f32; 49152];
    let mut g = c.benchmark_group("model_gemv");
    g.throughput(Throughput::Bytes(bytes as u64));
    for threads in [1, 2] {
        let pool = ThreadPool::new(threads);
        g.bench_function(BenchmarkId::new("all_weights", format!("t{threads}")), |b| {
            b.iter(|| {
                for m in &mats {
                    matmul_packed(&pool, m, &x[..m.cols], 1, &mut out[..m.rows]);
                }
            })
        });
    }
    g.finish();
}

fn bench_attention(c: &mut Criterion) {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut g = c.benchmark_group("attn_decode");
    for ctx in [1552usize, 8192] {
        // one layer is enough: every layer has the same shape and reads its own KV bytes
        let layout = KvLayout { n_layers: 1, n_kv_heads: 3, head_dim: 64, page_tokens: 16, dtype: KvDtype::F16 };
        let n_pages = (ctx + 1).div_ceil(16);
        let mut kv = LocalPagePool::new(layout, n_pages);
        let pages: Vec<PageAddr> =
            kv.allocate(n_pages).expect("pool sized above").into_iter().map(|(_, p)| p).collect();
        for pos in 0..=ctx {
            let k: Vec<f32> = (0..192).map(|_| rng.random_range(-1.0..1.0)).collect();
            write_kv(&layout, &pages, 0, pos, &k, &k);
        }
        let p = AttnParams { layer: 0, n_heads: 9, n_kv_heads: 3, head_dim: 64, scale: 0.125 };
        let q: Vec<f32> = (0..576).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut out = vec![0f32; 576];
        g.throughput(Throughput::Bytes(((ctx + 1) * layout.bytes_per_token()) as u64));
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            g.bench_function(BenchmarkId::new(format!("ctx{ctx}_1layer"), format!("t{threads}")), |b| {
                b.iter(|| attention(&pool, &layout, &pages, &p, ctx, &q, 1, &mut out))
            });
        }
    }
    g.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer; CLOCK_THREAD_CPUTIME_ID is always available on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Median thread-CPU time of `f` over `iters` runs, in microseconds.
fn cpu_us(iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut v: Vec<u64> = (0..iters)
        .map(|_| {
            let t0 = thread_cpu_ns();
            f();
            thread_cpu_ns() - t0
        })
        .collect();
    v.sort_unstable();
    v[iters / 2] as f64 / 1000.0
}

fn cpu_time_summary() {
    let pool = ThreadPool::new(1);
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    eprintln!("== one-thread CPU-time summary (isa {}) ==", isa_name());
    for &(name, dtype, rows, cols) in &SHAPES {
        let w = random_packed(&mut rng, dtype, rows, cols);
        for m_rows in [1usize, 16, 64] {
            let x: Vec<f32> = (0..m_rows * cols).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut out = vec![0f32; m_rows * rows];
            let iters = if rows > 10_000 { 15 } else { 200 };
            let us = cpu_us(iters, || matmul_packed(&pool, &w, &x, m_rows, &mut out));
            let gmac = (rows * cols * m_rows) as f64 / us / 1e3;
            eprintln!(
                "{name:>20} M={m_rows:<3} {us:9.1} us  {:6.1} GB/s  {gmac:6.1} GMAC/s",
                w.bytes().len() as f64 / us / 1e3
            );
        }
    }
    let mut mats = Vec::new();
    for _ in 0..30 {
        for &(_, dtype, rows, cols) in &SHAPES[..4] {
            let n = if rows == 576 && cols == 576 || rows == 192 || rows == 1536 { 2 } else { 1 };
            for _ in 0..n {
                mats.push(random_packed(&mut rng, dtype, rows, cols));
            }
        }
    }
    let (_, dtype, rows, cols) = SHAPES[4];
    mats.push(random_packed(&mut rng, dtype, rows, cols));
    let bytes: usize = mats.iter().map(|m| m.bytes().len()).sum();
    let x: Vec<f32> = (0..1536).map(|_| rng.random_range(-1.0..1.0)).collect();
    let mut out = vec![0f32; 49152];
    let us = cpu_us(15, || {
        for m in &mats {
            matmul_packed(&pool, m, &x[..m.cols], 1, &mut out[..m.rows]);
        }
    });
    eprintln!(
        "model GEMV (all {:.1} MB of weights, M=1): {:.2} ms/token, {:.1} GB/s",
        bytes as f64 / 1e6,
        us / 1e3,
        bytes as f64 / us / 1e3
    );
    for ctx in [1552usize, 8192] {
        time_attention(&pool, &mut rng, "SmolLM2 9/3x64", (9, 3, 64), 1, ctx);
    }
    // 255: the first 256-token chunk of a prompt (the causal triangle only).
    for ctx in [255usize, 1552, 8192] {
        time_attention(&pool, &mut rng, "Qwen3.5-0.8B 8/2x256", (8, 2, 256), 1, ctx);
    }
    // The same in pages of all 6 attention layers, as the engine lays them out: at 8K the
    // layer's K/V (16.8 MB) is spread over 100 MB and comes from memory, not the L3.
    for ctx in [1552usize, 8192] {
        time_attention(&pool, &mut rng, "Qwen3.5-0.8B 8/2x256, 6-layer pages", (8, 2, 256), 6, ctx);
    }
}

/// One layer's attention with `(n_heads, n_kv_heads, head_dim)` over `ctx` cached positions,
/// in pages of `n_layers` layers (layer 0 used): a decode step, a 16-query and a 256-query
/// chunk (the throughput bench's prefill chunk) ending there; one-thread CPU time.
fn time_attention(
    pool: &ThreadPool,
    rng: &mut ChaCha8Rng,
    name: &str,
    heads: (usize, usize, usize),
    n_layers: usize,
    ctx: usize,
) {
    let (n_heads, n_kv_heads, head_dim) = heads;
    let layout = KvLayout { n_layers, n_kv_heads, head_dim, page_tokens: 16, dtype: KvDtype::F16 };
    let n_pages = (ctx + 1).div_ceil(16);
    let mut kv = LocalPagePool::new(layout, n_pages);
    let pages: Vec<PageAddr> = kv.allocate(n_pages).expect("pool sized above").into_iter().map(|(_, p)| p).collect();
    for pos in 0..=ctx {
        let k: Vec<f32> = (0..n_kv_heads * head_dim).map(|_| rng.random_range(-1.0..1.0)).collect();
        write_kv(&layout, &pages, 0, pos, &k, &k);
    }
    let p = AttnParams { layer: 0, n_heads, n_kv_heads, head_dim, scale: 1.0 / (head_dim as f32).sqrt() };
    let q_row = n_heads * head_dim;
    for (n_q, iters) in [(1usize, 50usize), (16, 10), (256, 3)] {
        let q: Vec<f32> = (0..q_row * n_q).map(|_| rng.random_range(-1.0..1.0)).collect();
        let mut o = vec![0f32; q_row * n_q];
        let us = cpu_us(iters, || attention(pool, &layout, &pages, &p, ctx + 1 - n_q, &q, n_q, &mut o));
        eprintln!("attention {name} {n_q:>3} queries ctx {ctx}: {us:9.1} us/layer (1 thread)");
    }
}

criterion_group! { name = benches; config = config(); targets = bench_matmul, bench_model_gemv, bench_attention }

fn main() {
    cpu_time_summary();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
