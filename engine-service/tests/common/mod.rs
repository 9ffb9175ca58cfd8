//! Shared helpers of the engine's model-level tests: the real model file and the llama.cpp
//! reference fixture (made by scripts/reference/make_smollm2_reference.py).

#![allow(dead_code)]

use std::path::PathBuf;

use engine_service::backend::cpu::{CpuBackend, LoadedModel};
use serde_json::Value;

pub fn model_path() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "model file {} is missing: run deploy/fetch-model.sh from the repository root first",
        p.display()
    );
    p
}

pub fn load(page_tokens: usize) -> LoadedModel {
    // EDGE_TEST_THREADS pins the pool size (e.g. 1 to rule out threading when debugging).
    let threads = std::env::var("EDGE_TEST_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    load_with_threads(page_tokens, threads)
}

pub fn load_with_threads(page_tokens: usize, threads: usize) -> LoadedModel {
    CpuBackend::load(&model_path(), threads, page_tokens).expect("loading the model")
}

pub fn reference() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2_reference.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    serde_json::from_str(&text).expect("reference json")
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array().expect("float array").iter().map(|x| x.as_f64().expect("float") as f32).collect()
}
