//! End-to-end: the `edge-bench` release binary replays 1 conversation x 3 turns of the MLPerf
//! Edge Agentic dataset against the real stack, and writes a valid report.
//! Run: `cargo build --release --bins && cargo test --release -p e2e --test bench_replay -- --test-threads=1`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use e2e::Stack;
use serde_json::Value;

fn edge_bench() -> PathBuf {
    let bins = std::env::var_os("EDGE_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release"));
    let p = bins.join("edge-bench");
    assert!(p.exists(), "{} not found: run cargo build --release --bins", p.display());
    p
}

#[test]
fn edge_bench_replays_three_turns_against_the_stack() {
    let dataset = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bench/data/mlperf-edge-agentic/agentic_coding_2.5h.jsonl"
    ));
    assert!(dataset.exists(), "dataset missing at {}", dataset.display());
    let stack = Stack::start();
    let out = std::env::temp_dir().join(format!("edge-bench-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);

    let started = Instant::now();
    let run = Command::new(edge_bench())
        .args(["replay", "--endpoint"])
        .arg(format!("{}/v1", stack.base_url))
        .args(["--conversations", "1", "--turns", "3", "--max-completion-tokens", "16", "--quiet"])
        .args(["--turn-timeout-s", "120", "--out"])
        .arg(&out)
        .arg("--dataset")
        .arg(dataset)
        .output()
        .expect("spawn edge-bench");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "edge-bench failed ({}): {stderr}", run.status);
    eprintln!("edge-bench took {:.1} s", started.elapsed().as_secs_f64());

    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(stdout.contains("valid: true"), "summary: {stdout}");
    let report: Value = serde_json::from_slice(&std::fs::read(out.join("replay-A.json")).expect("report written"))
        .expect("report JSON");
    let fig = &report["figures"];
    assert_eq!(fig["valid"], true, "{fig}");
    assert_eq!(fig["turns_completed"], 3, "{fig}");
    assert_eq!(fig["turns_failed"], 0, "{fig}");
    let turns = report["turns"].as_array().expect("turns");
    assert_eq!(turns.len(), 3);
    for (i, t) in turns.iter().enumerate() {
        assert_eq!(t["status"], "ok", "turn {i}: {t}");
        let usage = &t["reply"]["usage"];
        assert!(usage["prompt_tokens"].as_u64().unwrap_or(0) > 0, "turn {i}: {usage}");
        assert!(usage["completion_tokens"].as_u64().unwrap_or(0) > 0, "turn {i}: {usage}");
        assert!(t["latency_ms"].as_f64().unwrap_or(0.0) > 0.0, "turn {i}");
        // Turns 2 and 3 share the recorded history of turn 1, so the prefix cache must serve part.
        if i > 0 {
            assert!(usage["cached_tokens"].as_u64().unwrap_or(0) > 0, "turn {i} had no cache hit: {usage}");
        }
    }
    assert!(fig["prompt_tokens_cached"].as_u64().unwrap_or(0) > 0, "{fig}");
    assert!(out.join("replay-summary.md").exists());
    for chart in ["latency-vs-prompt", "cache-hit", "cumulative-time"] {
        let png = std::fs::read(out.join(format!("replay-A-{chart}.png"))).expect("PNG chart written");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{chart}.png is a PNG");
        assert!(out.join(format!("replay-A-{chart}.svg")).exists(), "{chart}.svg written");
    }
    let _ = std::fs::remove_dir_all(&out);
}
