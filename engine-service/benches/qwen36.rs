//! Qwen3.5 / Qwen3.6 hybrid model speed with seeded random weights (no checkpoint needed):
//! prefill and decode tokens/s at Qwen3.5-0.8B dimensions (architecture spec §1.2) for each
//! weight format and thread count, the delta-rule form used for prefill, and the recurrent
//! state snapshot (bytes, save and restore time) at 0.8B and Qwen3.6-27B dimensions.
//!
//!   cargo bench -p engine-service --bench qwen36
//!
//! Environment: `EDGE_BENCH_THREADS=1,2`, `EDGE_BENCH_FORMATS=bf16,nvfp4` (also `f32`, and `q4_k_m`: Q4_K Linears, Q6_K
//! embedding and head, as llama.cpp's Q4_K_M mix),
//! `EDGE_BENCH_PREFILL=128` (tokens, one pass), `EDGE_BENCH_DECODE=16` (steps),
//! `EDGE_BENCH_CONFIG=path/config.json` (another architecture instead of 0.8B).

use std::path::PathBuf;
use std::time::Instant;

use engine_cpu::kernels::GgmlType;
use engine_cpu::ops::CpuOps;
use engine_models::format::hf_config::Qwen36Config;
use engine_models::qwen36::gdn::GdnDims;
use engine_models::qwen36::{GdnMode, Qwen36States, snapshot_bytes};
use engine_service::backend::cpu::{CpuBackend, RandomSpec};
use engine_service::backend::{Backend, ForwardBatch, LogitsWanted, SeqInput};
use engine_service::memory::{MappedPool, PageId};

const PAGE_TOKENS: usize = 16;

/// Qwen3.5-0.8B text config (spec §1.2; tied head, 18 GDN + 6 full-attention layers).
const QWEN35_08B: &str = include_str!("qwen35_0_8b.json");

/// Qwen3.6-27B text config (only its state shape is used here: the weights do not fit in RAM).
const QWEN36_27B: &str = r#"{"model_type": "qwen3_5_text", "hidden_size": 5120, "num_hidden_layers": 64,
  "intermediate_size": 17408, "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256,
  "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
  "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "vocab_size": 248320,
  "tie_word_embeddings": false, "full_attention_interval": 4, "mtp_num_hidden_layers": 1,
  "max_position_embeddings": 262144,
  "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}}"#;

fn env_list(name: &str, default: &str) -> Vec<String> {
    std::env::var(name).unwrap_or_else(|_| default.to_string()).split(',').map(|s| s.trim().to_string()).collect()
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn pass(b: &mut CpuBackend, pages: &[PageId], tokens: &[u32], start_pos: usize) {
    let batch = ForwardBatch {
        seqs: vec![SeqInput { seq_id: 1, tokens, start_pos, pages, logits: LogitsWanted::Last, tree: None }],
    };
    b.forward(&batch).expect("forward");
}

fn state_cost(name: &str, cfg_text: &str) {
    let cfg = Qwen36Config::parse(std::path::Path::new(name), cfg_text).expect("config");
    let d = GdnDims {
        hk: cfg.linear_num_key_heads,
        hv: cfg.linear_num_value_heads,
        dk: cfg.linear_key_head_dim,
        dv: cfg.linear_value_head_dim,
        kconv: cfg.linear_conv_kernel_dim,
        eps: cfg.rms_norm_eps,
    };
    let bytes = snapshot_bytes(&d, cfg.n_linear());
    let ops = CpuOps::new(1);
    // A valid snapshot: header + zeros (content does not change the cost).
    let mut states = Qwen36States::<Vec<f32>>::default();
    let mut buf = vec![0u8; bytes];
    buf[..4].copy_from_slice(b"Q36S");
    buf[4..8].copy_from_slice(&1u32.to_le_bytes());
    let reps = 5;
    let t = Instant::now();
    for _ in 0..reps {
        states.load(&ops, 1, &buf, &d, cfg.n_linear()).expect("load");
    }
    let load_ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
    let t = Instant::now();
    for _ in 0..reps {
        states.save(&ops, &d, 1, &mut buf).expect("save");
    }
    let save_ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
    println!(
        "state snapshot {name}: {} GDN layers, {:.2} MiB, save {save_ms:.2} ms, restore {load_ms:.2} ms",
        cfg.n_linear(),
        bytes as f64 / (1 << 20) as f64
    );
}

fn main() {
    let threads: Vec<usize> = env_list("EDGE_BENCH_THREADS", "1,2").iter().filter_map(|s| s.parse().ok()).collect();
    let formats = env_list("EDGE_BENCH_FORMATS", "bf16,nvfp4");
    let prefill = env_usize("EDGE_BENCH_PREFILL", 128);
    let decode = env_usize("EDGE_BENCH_DECODE", 16);
    let dir = tempfile_dir();
    let config_path = match std::env::var("EDGE_BENCH_CONFIG") {
        Ok(p) => PathBuf::from(p),
        Err(_) => {
            let p = dir.join("qwen3_5_0_8b.json");
            std::fs::write(&p, QWEN35_08B).expect("writing the config");
            p
        }
    };
    println!("config {}  prefill {prefill} tokens (one pass)  decode {decode} steps", config_path.display());
    println!(
        "{:>6} {:>7} {:>10} {:>14} {:>14} {:>14}",
        "format", "threads", "weights", "prefill tok/s", "(chunked)", "decode tok/s"
    );
    for format in &formats {
        let spec = match format.as_str() {
            "bf16" => RandomSpec { seed: 1, dtype: GgmlType::BF16, nvfp4: false },
            "f32" => RandomSpec { seed: 1, dtype: GgmlType::F32, nvfp4: false },
            "nvfp4" => RandomSpec { seed: 1, dtype: GgmlType::BF16, nvfp4: true },
            "q4_k_m" => RandomSpec { seed: 1, dtype: GgmlType::Q4_K, nvfp4: false },
            other => panic!("unknown format {other}"),
        };
        for &n in &threads {
            let t = Instant::now();
            let mut b =
                CpuBackend::random_from_config(&config_path, &spec, None, n, PAGE_TOKENS).expect("model").backend;
            let build_s = t.elapsed().as_secs_f64();
            let weights = b.qwen36().expect("qwen").weight_bytes();
            let vocab = b.hparams().vocab_size as u32;
            let total = prefill + decode + 1;
            let mut pool = MappedPool::new(&mut b, total.div_ceil(PAGE_TOKENS) + 1).expect("mapping a pool");
            let pages: Vec<PageId> = pool.allocate(total.div_ceil(PAGE_TOKENS) + 1).expect("pages");
            let tokens: Vec<u32> = (0..total as u32).map(|i| (i * 7919 + 13) % vocab).collect();
            pass(&mut b, &pages, &tokens[..8], 0); // warm-up

            let t = Instant::now();
            pass(&mut b, &pages, &tokens[..prefill], 0);
            let prefill_tps = prefill as f64 / t.elapsed().as_secs_f64();
            let t = Instant::now();
            for i in 0..decode {
                pass(&mut b, &pages, &tokens[prefill + i..prefill + i + 1], prefill + i);
            }
            let decode_tps = decode as f64 / t.elapsed().as_secs_f64();

            b.qwen36_mut().expect("qwen").0.set_gdn_mode(GdnMode::Chunked);
            let t = Instant::now();
            pass(&mut b, &pages, &tokens[..prefill], 0);
            let chunked_tps = prefill as f64 / t.elapsed().as_secs_f64();

            // Snapshot of this model's real state after the prefill.
            let mut snap = vec![0u8; b.state_bytes()];
            let t = Instant::now();
            b.save_state(1, &mut snap).expect("save");
            let save_ms = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            b.load_state(2, &snap).expect("load");
            let load_ms = t.elapsed().as_secs_f64() * 1e3;
            println!(
                "{format:>6} {n:>7} {:>8.0}MB {prefill_tps:>14.1} {chunked_tps:>14.1} {decode_tps:>14.2}   (build {build_s:.1} s, snapshot {:.1} MiB save {save_ms:.1} ms restore {load_ms:.1} ms)",
                weights as f64 / 1e6,
                snap.len() as f64 / (1 << 20) as f64
            );
        }
    }
    state_cost("qwen3.5-0.8B", QWEN35_08B);
    state_cost("qwen3.6-27B", QWEN36_27B);
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("qwen36-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}
