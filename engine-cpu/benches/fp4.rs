//! NVFP4 matmul vs the existing Q4_0 / Q8_0 packed kernels and BF16 (rows converted to f32),
//! on the Linear layers of Qwen3.5-0.8B and Qwen3.6-27B with random weights.
//!
//! - `0.8b`: every Linear of the 24 layers (18 GDN + 6 full attention; no lm_head), built
//!   once and run back to back, so the time is the whole-model matmul cost of one forward
//!   (NVFP4: 280 MB, more than any cache).
//! - `27b`: one GDN and one full-attention layer (215 / 209 MB in NVFP4; a whole model would
//!   not fit in RAM), scaled to 48 + 16 layers.
//!
//! For each format, activation rows m in {1, 4, 16} and 1 and 2 threads it prints the median
//! wall time of one pass, the tokens/s it implies for the Linear layers alone (m / time), and
//! the weight bytes streamed per second.
//!
//!   cargo bench -p engine-cpu --bench fp4 [-- 0.8b|27b] [--quick]
//!   cargo bench -p engine-cpu --bench fp4 -- micro   (one matrix, 1 thread, CPU time)

use std::time::{Duration, Instant};

use engine_cpu::kernels::fp4::{Fp4Isa, Nvfp4Matrix, matmul_nvfp4};
use engine_cpu::kernels::{GgmlType, PackedMatrix, QMatrix, ThreadPool, isa_name, matmul_packed};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// (name, rows = out features, cols = in features, copies per layer).
type Shape = (&'static str, usize, usize, usize);

const GDN_08B: &[Shape] = &[
    ("in_proj_qkv", 6144, 1024, 1),
    ("in_proj_z", 2048, 1024, 1),
    ("out_proj", 1024, 2048, 1),
    ("gate_up", 3584, 1024, 2),
    ("down", 1024, 3584, 1),
];
const FULL_08B: &[Shape] = &[
    ("q_proj", 4096, 1024, 1),
    ("k_v", 512, 1024, 2),
    ("o_proj", 1024, 2048, 1),
    ("gate_up", 3584, 1024, 2),
    ("down", 1024, 3584, 1),
];
const GDN_27B: &[Shape] = &[
    ("in_proj_qkv", 10240, 5120, 1),
    ("in_proj_z", 6144, 5120, 1),
    ("out_proj", 5120, 6144, 1),
    ("gate_up", 17408, 5120, 2),
    ("down", 5120, 17408, 1),
];
const FULL_27B: &[Shape] = &[
    ("q_proj", 12288, 5120, 1),
    ("k_v", 1024, 5120, 2),
    ("o_proj", 5120, 6144, 1),
    ("gate_up", 17408, 5120, 2),
    ("down", 5120, 17408, 1),
];

#[derive(Clone, Copy, PartialEq)]
enum Format {
    Nvfp4,
    Packed(GgmlType),
}

impl Format {
    fn name(self) -> String {
        match self {
            Format::Nvfp4 => "nvfp4".into(),
            Format::Packed(t) => format!("{t:?}").to_lowercase(),
        }
    }
}

enum Mat {
    Fp4(Nvfp4Matrix),
    Packed(PackedMatrix),
}

impl Mat {
    fn random(rng: &mut ChaCha8Rng, format: Format, rows: usize, cols: usize) -> Mat {
        match format {
            Format::Nvfp4 => {
                let mut packed = vec![0u8; rows * cols / 2];
                rng.fill(&mut packed[..]);
                // scales 2^-3..2^1 (E4M3 0x20..0x40): typical magnitudes, never NaN
                let scales: Vec<u8> = (0..rows * cols / 16).map(|_| rng.random_range(0x20..0x40u8)).collect();
                Mat::Fp4(Nvfp4Matrix::new(rows, cols, &packed, &scales, 1e-3, None).expect("consistent shape"))
            }
            Format::Packed(dtype) => {
                let rb = dtype.row_bytes(cols).expect("whole blocks");
                let mut data = vec![0u8; rows * rb];
                rng.fill(&mut data[..]);
                if dtype == GgmlType::BF16 {
                    // finite values of magnitude 2^-8..2^0
                    for v in data.chunks_exact_mut(2) {
                        let b = u16::from_le_bytes([v[0], v[1]]);
                        v.copy_from_slice(&((b & 0x807f) | 0x3b80 | (b & 0x0380)).to_le_bytes());
                    }
                } else {
                    for blk in data.chunks_exact_mut(dtype.block_bytes()) {
                        blk[0..2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
                    }
                }
                Mat::Packed(PackedMatrix::pack(&QMatrix { dtype, rows, cols, data: &data }).expect("consistent shape"))
            }
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Mat::Fp4(w) => w.weight_bytes(),
            Mat::Packed(w) => w.bytes().len(),
        }
    }

    fn dims(&self) -> (usize, usize) {
        match self {
            Mat::Fp4(w) => (w.rows(), w.cols()),
            Mat::Packed(w) => (w.rows, w.cols),
        }
    }

    fn run(&self, pool: &ThreadPool, x: &[f32], m: usize, out: &mut [f32]) {
        let (rows, cols) = self.dims();
        match self {
            Mat::Fp4(w) => matmul_nvfp4(pool, w, &x[..m * cols], m, &mut out[..m * rows]),
            Mat::Packed(w) => matmul_packed(pool, w, &x[..m * cols], m, &mut out[..m * rows]),
        }
    }
}

/// One set of layers: the matrices and how many times the set occurs in the model.
struct Group {
    mats: Vec<Mat>,
    repeat: usize,
}

fn build(rng: &mut ChaCha8Rng, format: Format, layers: &[(&[Shape], usize, usize)]) -> Vec<Group> {
    // (shapes, layers built, layers in the model)
    layers
        .iter()
        .map(|&(shapes, built, in_model)| {
            let mut mats = Vec::new();
            for _ in 0..built {
                for &(_, rows, cols, copies) in shapes {
                    for _ in 0..copies {
                        mats.push(Mat::random(rng, format, rows, cols));
                    }
                }
            }
            Group { mats, repeat: in_model / built }
        })
        .collect()
}

/// Median wall time of `f` over at least `min_iters` runs and `min_time`.
fn median_time(min_iters: usize, min_time: Duration, mut f: impl FnMut()) -> Duration {
    f();
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < min_iters || start.elapsed() < min_time {
        let t = Instant::now();
        f();
        times.push(t.elapsed());
    }
    times.sort();
    times[times.len() / 2]
}

fn bench_model(name: &str, layers: &[(&[Shape], usize, usize)], quick: bool) {
    let formats =
        [Format::Nvfp4, Format::Packed(GgmlType::Q4_0), Format::Packed(GgmlType::Q8_0), Format::Packed(GgmlType::BF16)];
    let max_dim = 17408 * 16;
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    let x: Vec<f32> = (0..max_dim).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let mut out = vec![0f32; max_dim];
    println!("\n## {name}: Linear layers only (no lm_head), per forward pass");
    println!("| format | m | threads | ms/pass | tok/s (linears) | weight GB/s | weight MB/token-pass |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for format in formats {
        let groups = build(&mut rng, format, layers);
        let bytes: usize = groups.iter().map(|g| g.repeat * g.mats.iter().map(Mat::bytes).sum::<usize>()).sum();
        for m in [1usize, 4, 16] {
            if quick && m == 4 {
                continue;
            }
            for threads in [1usize, 2] {
                let pool = ThreadPool::new(threads);
                let mut total = Duration::ZERO;
                for g in &groups {
                    let (iters, min) =
                        if quick { (3, Duration::from_millis(200)) } else { (5, Duration::from_millis(800)) };
                    let t = median_time(iters, min, || {
                        for w in &g.mats {
                            w.run(&pool, &x, m, &mut out);
                        }
                    });
                    total += t * g.repeat as u32;
                }
                let s = total.as_secs_f64();
                println!(
                    "| {} | {m} | {threads} | {:.2} | {:.1} | {:.1} | {:.0} |",
                    format.name(),
                    s * 1e3,
                    m as f64 / s,
                    bytes as f64 / s / 1e9,
                    bytes as f64 / 1e6
                );
            }
        }
    }
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer; CLOCK_THREAD_CPUTIME_ID is always available on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One thread, thread-CPU time (immune to time slices lost on a shared VM): a cache-resident
/// 1024 x 2048 matrix (kernel compute speed) and a 16384 x 4096 one (streamed from DRAM).
fn bench_micro() {
    println!("\n## one matrix, 1 thread, median thread-CPU time");
    println!("| format | shape | m | us/call | weight GB/s | ns per 16-weight block x row |");
    println!("|---|---|---:|---:|---:|---:|");
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let pool = ThreadPool::new(1);
    let x: Vec<f32> = (0..16 * 4096).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let mut out = vec![0f32; 16 * 16384];
    for (rows, cols) in [(1024usize, 2048usize), (16384, 4096)] {
        for format in [Format::Nvfp4, Format::Packed(GgmlType::Q4_0), Format::Packed(GgmlType::Q8_0)] {
            let w = Mat::random(&mut rng, format, rows, cols);
            for m in [1usize, 4, 16] {
                w.run(&pool, &x, m, &mut out);
                let mut v: Vec<u64> = (0..15)
                    .map(|_| {
                        let t = thread_cpu_ns();
                        w.run(&pool, &x, m, &mut out);
                        thread_cpu_ns() - t
                    })
                    .collect();
                v.sort();
                let ns = v[v.len() / 2] as f64;
                let blocks = (rows * cols / 16 * m) as f64;
                println!(
                    "| {} | {rows}x{cols} | {m} | {:.0} | {:.1} | {:.2} |",
                    format.name(),
                    ns / 1e3,
                    w.bytes() as f64 / ns,
                    ns / blocks
                );
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let want = |m: &str| !args.iter().any(|a| a == "0.8b" || a == "27b") || args.iter().any(|a| a == m);
    println!("packed kernels: {}; nvfp4 kernels: {}", isa_name(), Fp4Isa::selected().name());
    if args.iter().any(|a| a == "micro") {
        bench_micro();
        return;
    }
    if want("0.8b") {
        bench_model("Qwen3.5-0.8B (18 GDN + 6 full-attention layers)", &[(GDN_08B, 18, 18), (FULL_08B, 6, 6)], quick);
    }
    if want("27b") {
        bench_model(
            "Qwen3.6-27B (48 GDN + 16 full-attention layers, one of each timed)",
            &[(GDN_27B, 1, 48), (FULL_27B, 1, 16)],
            quick,
        );
    }
}
