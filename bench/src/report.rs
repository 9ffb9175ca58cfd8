//! Human output: Markdown tables of the figures and the side-by-side ratio table.
//!
//! Contract: every phase exposes its figures as named rows (`Row`); `table` renders one run,
//! `side_by_side` renders two runs with the ratio B/A of every figure (blank when A is 0 or a
//! value is missing).

use crate::replay::ReplayReport;

/// A named figure; `None` when the run could not measure it.
pub type Row = (String, Option<f64>);

fn fmt(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(x) if x.abs() >= 1000.0 || x == x.trunc() => format!("{x:.0}"),
        Some(x) => format!("{x:.4}"),
    }
}

pub fn replay_rows(r: &ReplayReport) -> Vec<Row> {
    let f = &r.figures;
    let mut rows: Vec<Row> = vec![
        ("turns completed".into(), Some(f.turns_completed as f64)),
        ("turns failed".into(), Some(f.turns_failed as f64)),
        ("turns skipped (budget)".into(), Some(f.turns_skipped_budget as f64)),
        ("wall time (s)".into(), Some(f.wall_s)),
        ("window (s)".into(), Some(f.window_s)),
        ("output tokens".into(), Some(f.output_tokens as f64)),
        ("output tokens (server usage)".into(), Some(f.output_tokens_server as f64)),
        ("TPS".into(), Some(f.tps)),
        ("TPS (server usage)".into(), Some(f.tps_server_usage)),
        ("QPS".into(), Some(f.qps)),
    ];
    for (name, q) in [
        ("TTFT ms", f.ttft_ms),
        ("first chunk ms", f.first_chunk_ms),
        // Official definition: replies that arrived in one chunk are left out.
        ("TPOT ms", f.tpot_ms),
        // The earlier one: (done - first chunk) / (OSL - 1) over every turn.
        ("TPOT (OSL-1, all turns) ms", f.tpot_all_ms),
        ("latency ms", f.latency_ms),
    ] {
        rows.push((format!("{name} p50"), q.p50));
        rows.push((format!("{name} p90"), q.p90));
        rows.push((format!("{name} p99"), q.p99));
        if name == "TPOT ms" {
            rows.push(("TPOT ms mean".into(), q.mean));
            rows.push(("decode tok/s".into(), Some(f.decode_tps)));
        }
    }
    rows.extend([
        ("prompt tokens".into(), Some(f.prompt_tokens_total as f64)),
        ("prompt tokens from cache".into(), Some(f.prompt_tokens_cached as f64)),
        ("cache hit %".into(), Some(f.cache_hit_pct)),
        ("IoU".into(), Some(f.iou_score)),
        ("IoU scorable turns".into(), Some(f.iou_scorable as f64)),
    ]);
    rows
}

pub fn table(title: &str, rows: &[Row]) -> String {
    let mut s = format!("| {title} | value |\n| --- | ---: |\n");
    for (name, v) in rows {
        s.push_str(&format!("| {name} | {} |\n", fmt(*v)));
    }
    s
}

pub fn side_by_side(title: &str, a_name: &str, a: &[Row], b_name: &str, b: &[Row]) -> String {
    let mut s = format!("| {title} | {a_name} | {b_name} | B/A |\n| --- | ---: | ---: | ---: |\n");
    for ((name, va), (_, vb)) in a.iter().zip(b) {
        let ratio = match (va, vb) {
            (Some(x), Some(y)) if *x != 0.0 => Some(y / x),
            _ => None,
        };
        s.push_str(&format!("| {name} | {} | {} | {} |\n", fmt(*va), fmt(*vb), fmt(ratio)));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_table() {
        let a = vec![("TPS".to_string(), Some(10.0)), ("IoU".to_string(), Some(0.0))];
        let b = vec![("TPS".to_string(), Some(25.0)), ("IoU".to_string(), Some(0.5))];
        let t = side_by_side("replay", "ours", &a, "peer", &b);
        assert!(t.contains("| TPS | 10 | 25 | 2.5000 |"), "{t}");
        assert!(t.contains("| IoU | 0 | 0.5000 | - |"), "{t}");
        assert!(table("x", &a).contains("| TPS | 10 |"));
    }
}
