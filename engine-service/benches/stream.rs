//! The machine's memory bandwidth, measured the way STREAM does (the roofline that decode at an
//! empty context is held against: bytes of weights read per token over this bandwidth).
//!
//!   cargo bench -p engine-service --bench stream
//!
//! Triad `a[i] = b[i] + s * c[i]` over f64 arrays far larger than the caches, counted as STREAM
//! counts it (24 bytes per element: two reads and one write, no write-allocate traffic), and a
//! read-only sum (8 bytes per element), the access pattern of a GEMV streaming weights. Best of
//! `EDGE_BENCH_ROUNDS` (default 10) for each thread count in `EDGE_BENCH_THREADS` (default 1,2);
//! arrays of `EDGE_STREAM_MB` MiB each (default 512).

use std::time::Instant;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Runs `f(thread, range)` on `threads` scoped threads over `0..n` split evenly.
fn split<F: Fn(std::ops::Range<usize>) -> f64 + Sync>(threads: usize, n: usize, f: F) -> f64 {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let f = &f;
                s.spawn(move || f(n * t / threads..n * (t + 1) / threads))
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("stream thread")).sum()
    })
}

#[derive(Clone, Copy)]
struct Ptr(*mut f64);
// SAFETY: threads write disjoint ranges.
unsafe impl Send for Ptr {}
unsafe impl Sync for Ptr {}

impl Ptr {
    fn at(self, i: usize) -> *mut f64 {
        self.0.wrapping_add(i)
    }
}

fn main() {
    let threads: Vec<usize> = std::env::var("EDGE_BENCH_THREADS")
        .unwrap_or_else(|_| "1,2".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let rounds = env_usize("EDGE_BENCH_ROUNDS", 10);
    let n = env_usize("EDGE_STREAM_MB", 512) * (1 << 20) / 8;
    let mut a = vec![0.0f64; n];
    let b: Vec<f64> = (0..n).map(|i| (i % 7) as f64).collect();
    let c: Vec<f64> = (0..n).map(|i| (i % 5) as f64).collect();
    let scalar = 3.0;
    println!("STREAM-like bandwidth, {} MiB per array, best of {rounds}", (n * 8) >> 20);
    for &t in &threads {
        let (mut triad, mut read) = (0.0f64, 0.0f64);
        let ap = Ptr(a.as_mut_ptr());
        for _ in 0..rounds {
            let start = Instant::now();
            split(t, n, |r| {
                // SAFETY: each thread writes its own range of `a`.
                let dst = unsafe { std::slice::from_raw_parts_mut(ap.at(r.start), r.len()) };
                for ((x, &y), &z) in dst.iter_mut().zip(&b[r.clone()]).zip(&c[r]) {
                    *x = y + scalar * z;
                }
                0.0
            });
            triad = triad.max(24.0 * n as f64 / start.elapsed().as_secs_f64());
            let start = Instant::now();
            let sum = split(t, n, |r| {
                // Eight partial sums: the loop vectorizes and is bound by loads, not adds.
                let mut acc = [0.0f64; 8];
                for chunk in b[r].chunks_exact(8) {
                    for (s, &v) in acc.iter_mut().zip(chunk) {
                        *s += v;
                    }
                }
                acc.iter().sum()
            });
            read = read.max(8.0 * n as f64 / start.elapsed().as_secs_f64());
            std::hint::black_box(sum);
        }
        std::hint::black_box(&a);
        println!("threads {t}: triad {:.1} GB/s, read-only {:.1} GB/s", triad / 1e9, read / 1e9);
    }
}
