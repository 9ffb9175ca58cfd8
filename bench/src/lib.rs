//! `bench`: the MLPerf Edge Agentic performance replay and the BFCL v4 accuracy check, run
//! against any OpenAI-compatible `/v1/chat/completions` endpoint over HTTP only.
//!
//! Contract: `dataset` + `replay` implement spec sections 4.1-4.5 (teacher-forced serial
//! replay, figures, inline IoU); `bfcl` implements 5.2-5.6 (the 995 gated samples, request
//! building, reply parsing, the AST checker port, aggregation and the 0.97x gate); `report`
//! renders tables and side-by-side ratios. Nothing here depends on the other workspace crates.

/// The MLPerf agentic trajectories shipped in this crate (`data/`, Apache-2.0, SHA-256 pinned).
pub const DEFAULT_DATASET: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/data/mlperf-edge-agentic/agentic_coding_2.5h.jsonl");
/// The BFCL v4 data shipped in this crate (`data/`, Apache-2.0).
pub const DEFAULT_BFCL_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/bfcl-v4");

pub mod bfcl;
pub mod client;
pub mod dataset;
pub mod iou;
pub mod plot;
pub mod png;
pub mod replay;
pub mod report;
pub mod sha256;
pub mod stats;
pub mod tokens;
