//! BF16 matmul (Qwen3.6's float weights) and the K-quant matmul (GGUF Q4_K / Q6_K) at
//! Qwen3.5-0.8B shapes: decode (1 activation row: weight GB/s, the memory roofline's unit)
//! and prefill (128 rows: GFLOP/s), per kernel set.
//!
//!   cargo bench -p engine-cpu --bench floatmm
//!
//! `EDGE_BENCH_THREADS=1,2`, `EDGE_BENCH_M=1,128`; `EDGE_KERNELS_ISA` caps the kernel set.
//! Best of 5 after a warm-up: wall time, and for one thread also the thread's CPU time (on a
//! shared VM wall time includes time slices lost to other processes; CPU time does not).

use std::time::Instant;

use engine_cpu::kernels::ThreadPool;
use engine_cpu::kernels::floatmm::{Bf16, FloatMatrix, matmul_float};
use engine_cpu::kernels::kquant::{KQuantMatrix, KQuantType, matmul_kquant};

const SHAPES: [(&str, usize, usize); 5] = [
    ("in_proj_qkv 6144x1024", 6144, 1024),
    ("gate 3584x1024", 3584, 1024),
    ("down 1024x3584", 1024, 3584),
    ("out_proj 1024x2048", 1024, 2048),
    ("head 248320x1024", 248320, 1024),
];

fn list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name).unwrap_or_else(|_| default.into()).split(',').filter_map(|s| s.trim().parse().ok()).collect()
}

fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer; CLOCK_THREAD_CPUTIME_ID is always available on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Times `f` (best of 5 after a warm-up; one thread: its CPU time) and prints a line.
fn report(name: &str, m: usize, t: usize, bytes: usize, macs: usize, mut f: impl FnMut()) {
    f();
    let (mut best, mut best_cpu) = (f64::MAX, f64::MAX);
    for _ in 0..5 {
        let (start, cpu) = (Instant::now(), thread_cpu_s());
        f();
        best = best.min(start.elapsed().as_secs_f64());
        best_cpu = best_cpu.min(thread_cpu_s() - cpu);
    }
    if t == 1 {
        best = best_cpu;
    }
    let gbs = bytes as f64 / best / 1e9;
    let gflops = 2.0 * macs as f64 / best / 1e9;
    let clock = if t == 1 { " cpu" } else { "    " };
    println!(
        "{name:>26} m {m:>4} t {t}: {:>9.3} ms{clock}  {gbs:>6.1} GB/s of weights  {gflops:>6.1} GFLOP/s",
        best * 1e3
    );
}

fn main() {
    let threads = list("EDGE_BENCH_THREADS", "1,2");
    let ms = list("EDGE_BENCH_M", "1,128");
    for (dtype, rows, cols) in [(KQuantType::Q4K, 3584, 1024), (KQuantType::Q6K, 248320, 1024)] {
        let nbytes = rows * cols / 256 * dtype.block_bytes();
        let mut data: Vec<u8> = (0..nbytes).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
        for blk in data.chunks_exact_mut(dtype.block_bytes()) {
            let d = half::f16::from_f32(0.01).to_bits().to_le_bytes();
            let at = if dtype == KQuantType::Q6K { 208 } else { 0 };
            blk[at..at + 2].copy_from_slice(&d);
        }
        let w = KQuantMatrix::new(dtype, rows, cols, &data).expect("shape");
        let name = format!("{} {rows}x{cols}", dtype.name());
        for &m in &ms {
            if rows > 100_000 && m > 1 {
                continue;
            }
            let x: Vec<f32> = (0..m * cols).map(|i| ((i * 31 % 61) as f32 - 30.0) / 17.0).collect();
            let mut out = vec![0f32; m * rows];
            for &t in &threads {
                let pool = ThreadPool::new(t);
                report(&name, m, t, nbytes, rows * cols * m, || matmul_kquant(&pool, &w, &x, m, &mut out));
            }
        }
    }
    for &(name, rows, cols) in &SHAPES {
        let w = FloatMatrix {
            rows,
            cols,
            data: (0..rows * cols)
                .map(|i| Bf16(half::bf16::from_f32(((i * 7919 % 997) as f32 - 498.0) / 4096.0).to_bits()))
                .collect(),
        };
        for &m in &ms {
            if rows > 100_000 && m > 1 {
                continue; // the head runs on one row per sequence
            }
            let x: Vec<f32> = (0..m * cols).map(|i| ((i * 31 % 61) as f32 - 30.0) / 17.0).collect();
            let mut out = vec![0f32; m * rows];
            for &t in &threads {
                let pool = ThreadPool::new(t);
                report(name, m, t, rows * cols * 2, rows * cols * m, || matmul_float(&pool, &w, &x, m, &mut out));
            }
        }
    }
}
