//! Running the accuracy phase against an endpoint: one sample at a time, in dataset order.
//!
//! Contract: `run(samples, client, opts)` issues every sample once; a failed request is a
//! missing reply (scores 0, noted in the record) and does not stop the phase.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::{Aggregate, BfclOptions, Sample, aggregate, request_body, score_sample};
use crate::client::{ChatClient, Reply};
use crate::report::Row;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SampleRecord {
    pub id: String,
    pub subset: String,
    pub score: Option<f64>,
    pub reason: Option<String>,
    pub error: Option<String>,
    pub latency_ms: Option<f64>,
    pub reply: Option<Reply>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BfclReport {
    pub endpoint: String,
    pub options: BfclOptions,
    pub subsets: Vec<String>,
    pub wall_s: f64,
    pub aggregate: Aggregate,
    pub samples: Vec<SampleRecord>,
}

pub async fn run(samples: &[Sample], client: &ChatClient, endpoint: &str, opts: &BfclOptions) -> BfclReport {
    let t0 = Instant::now();
    let mut records = Vec::with_capacity(samples.len());
    let mut passed = 0usize;
    for (i, s) in samples.iter().enumerate() {
        let body = request_body(s, opts);
        let rec = match client.stream_chat(&body, None, t0).await {
            Ok((reply, times)) => {
                let (score, reason) = score_sample(s, &reply);
                passed += (score > 0.0) as usize;
                SampleRecord {
                    id: s.id.clone(),
                    subset: s.subset.clone(),
                    score: Some(score),
                    reason,
                    error: None,
                    latency_ms: Some((times.done_s - times.issue_s) * 1e3),
                    reply: Some(reply),
                }
            }
            Err(e) => {
                tracing::warn!(id = %s.id, error = %e, "bfcl sample failed; scored 0");
                SampleRecord {
                    id: s.id.clone(),
                    subset: s.subset.clone(),
                    score: None,
                    reason: None,
                    error: Some(e.to_string()),
                    latency_ms: None,
                    reply: None,
                }
            }
        };
        eprintln!(
            "[{}/{}] {} {} (passed so far {passed})",
            i + 1,
            samples.len(),
            s.id,
            rec.score.map_or_else(|| "error".to_string(), |v| format!("{v:.0}")),
        );
        records.push(rec);
    }
    let results: Vec<(String, Option<f64>)> = records.iter().map(|r| (r.subset.clone(), r.score)).collect();
    let mut subsets: Vec<String> = samples.iter().map(|s| s.subset.clone()).collect();
    subsets.dedup();
    BfclReport {
        endpoint: endpoint.to_string(),
        options: opts.clone(),
        subsets,
        wall_s: t0.elapsed().as_secs_f64(),
        aggregate: aggregate(&results),
        samples: records,
    }
}

pub fn rows(r: &BfclReport) -> Vec<Row> {
    let a = &r.aggregate;
    let mut rows: Vec<Row> = vec![
        ("overall accuracy".into(), Some(a.overall_accuracy)),
        ("normalized single-turn score".into(), Some(a.normalized_single_turn_score)),
        ("gate passed (1/0)".into(), Some(f64::from(u8::from(a.gate_passed)))),
        ("samples".into(), Some(a.total_samples as f64)),
        ("issued (answered)".into(), Some(a.issued_samples as f64)),
        ("wall time (s)".into(), Some(r.wall_s)),
    ];
    for (k, v) in &a.category_scores {
        rows.push((format!("category {k}"), Some(*v)));
    }
    for (k, v) in &a.subset_scores {
        rows.push((format!("subset {k}"), Some(*v)));
    }
    rows
}
