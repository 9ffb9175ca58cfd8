//! What a grammar costs per generated token (structured outputs): one draw over a logits row of
//! Qwen3.5's vocabulary (248,320), plain vs under a JSON schema (mask, masked draw, advance),
//! greedy and at temperature 1; plus the one-time costs (the vocabulary's token trie, on the
//! first constrained request; compiling a schema).
//!
//!   cargo bench -p engine-service --bench grammar
//!
//! A row's draw is timed inside a whole reply (the grammar's state changes with every token), so
//! the per-token figure is a reply's time over its tokens, best of 5.

use std::time::Instant;

use engine_models::tokenizer::ModelTokenizer;
use engine_service::grammar::{GrammarCompiler, GrammarSpec};
use engine_service::sampling::{Sampler, SamplingParams};

const VOCAB: usize = 248_320;
const SCHEMA: &str = r#"{"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "kind": {"enum": ["cat", "dog", "fish"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 4},
    "owner": {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}},
    "required": ["name", "kind", "owner"]}"#;

/// Pseudo-random logits for step `step` (a fixed pattern: the model is not what is timed).
fn fill(logits: &mut [f32], step: u64) {
    for (i, l) in logits.iter_mut().enumerate() {
        let h = (i as u64 ^ (step << 20)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        *l = (h >> 40) as f32 / (1u64 << 24) as f32 * 4.0;
    }
}

/// Draws a reply of at most `cap` tokens (until an end-of-sequence id); returns (tokens, s).
fn reply(sampler: &mut Sampler, eos: &[u32], rows: &[Vec<f32>], cap: usize) -> (usize, f64) {
    let t = Instant::now();
    for (n, row) in rows.iter().enumerate().take(cap) {
        if eos.contains(&sampler.sample(row)) {
            return (n + 1, t.elapsed().as_secs_f64());
        }
    }
    (cap, t.elapsed().as_secs_f64())
}

fn main() {
    let tok = ModelTokenizer::byte_level_fallback(VOCAB, "").expect("tokenizer");
    let eos = tok.eos_token_ids.clone();
    let rows: Vec<Vec<f32>> = (0..200)
        .map(|s| {
            let mut r = vec![0f32; VOCAB];
            fill(&mut r, s);
            r
        })
        .collect();
    let compiler = GrammarCompiler::new(tok.json.clone(), eos.clone(), VOCAB);
    let spec = GrammarSpec::JsonSchema(SCHEMA.into());
    let t = Instant::now();
    compiler.compile(&spec).expect("schema");
    let first = t.elapsed().as_secs_f64();
    let t = Instant::now();
    compiler.compile(&spec).expect("schema");
    let again = t.elapsed().as_secs_f64();
    println!(
        "vocabulary {VOCAB}: first constrained request (token trie + schema) {:.0} ms; a schema {:.2} ms",
        first * 1e3,
        again * 1e3
    );
    println!("{:<26} {:>8} {:>14}", "sampler", "tokens", "us per token");
    for (name, params) in [
        ("greedy", SamplingParams::greedy()),
        ("temperature 1", SamplingParams { temperature: 1.0, top_p: 1.0, top_k: 0, seed: Some(7) }),
    ] {
        for constrained in [false, true] {
            let mut best = f64::MAX;
            let mut tokens = 0;
            for _ in 0..5 {
                let mut sampler = Sampler::new(params);
                if constrained {
                    sampler = sampler.with_constraint(compiler.compile(&spec).expect("schema"));
                }
                // The same number of draws either way: the unconstrained reply never ends early.
                let (n, s) = reply(&mut sampler, if constrained { &eos } else { &[] }, &rows, 120);
                tokens = n;
                best = best.min(s / n as f64);
            }
            let label = format!("{name}{}", if constrained { " + JSON schema" } else { "" });
            println!("{label:<26} {tokens:>8} {:>14.1}", best * 1e6);
        }
    }
}
