//! Distribution tests of speculative sampling on a synthetic model (vocabulary 6, logits a
//! fixed function of the last two tokens): the first three emitted tokens of many seeded runs
//! with deliberately poor draft trees follow the exact joint distribution of plain sampling
//! (chi-squared), and each seeded run equals the plain run with the same seed.

use super::accept::accept;
use super::tree::{Branch, DraftTree};
use crate::sampling::{Sampler, SamplingParams};

const V: usize = 6;

fn logits_after(ctx: &[u32]) -> Vec<f32> {
    let a = ctx.last().copied().unwrap_or(0) as usize;
    let b = if ctx.len() >= 2 { ctx[ctx.len() - 2] as usize } else { 0 };
    (0..V).map(|t| (((a * 7 + b * 3 + t * 5) % 11) as f32) * 0.35 - (t as f32) * 0.1).collect()
}

/// A poor drafter: always proposes the same two branches, whatever the context.
fn draft(root: u32, round: usize) -> DraftTree {
    let mut t = DraftTree::new(root);
    t.insert(&Branch::uniform(vec![(round % V) as u32, 1, 2], -0.1), 0, 8);
    t.insert(&Branch::uniform(vec![3, 4], -0.3), 0, 8);
    t.insert(&Branch::uniform(vec![(round % V) as u32, 5], -0.2), 0, 8);
    t
}

/// Emits `n` tokens after `prompt` with speculation: each round verifies a tree (the target
/// rows are computed from each node's own prefix, as the tree pass does).
fn speculative(prompt: &[u32], n: usize, sampler: &mut Sampler) -> Vec<u32> {
    let mut ctx = prompt.to_vec();
    let mut round = 0;
    while ctx.len() < prompt.len() + n {
        let tree = draft(*ctx.last().unwrap(), round);
        let mut rows = Vec::with_capacity(tree.len() * V);
        for i in 0..tree.len() {
            let mut c = ctx.clone();
            c.extend(tree.path_to(i).iter().skip(1).map(|&j| tree.node(j).token));
            rows.extend(logits_after(&c));
        }
        let a = accept(&tree, &rows, V, |r| sampler.sample(r));
        ctx.extend(a.tokens);
        round += 1;
    }
    ctx[prompt.len()..prompt.len() + n].to_vec()
}

fn plain(prompt: &[u32], n: usize, sampler: &mut Sampler) -> Vec<u32> {
    let mut ctx = prompt.to_vec();
    for _ in 0..n {
        let t = sampler.sample(&logits_after(&ctx));
        ctx.push(t);
    }
    ctx[prompt.len()..].to_vec()
}

fn softmax(l: &[f32]) -> Vec<f64> {
    let m = l.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = l.iter().map(|&x| (x as f64 - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

/// Chi-squared statistic and degrees of freedom of `counts` against `probs` (cells with an
/// expected count under 5 pooled).
fn chi_squared(counts: &[u64], probs: &[f64]) -> (f64, usize) {
    let n: u64 = counts.iter().sum();
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut pooled_obs, mut pooled_exp) = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(probs) {
        let e = p * n as f64;
        if e < 5.0 {
            pooled_obs += c as f64;
            pooled_exp += e;
            continue;
        }
        stat += (c as f64 - e).powi(2) / e;
        cells += 1;
    }
    if pooled_exp > 0.0 {
        stat += (pooled_obs - pooled_exp).powi(2) / pooled_exp.max(1e-9);
        cells += 1;
    }
    (stat, cells.saturating_sub(1))
}

/// Upper-tail z-score of a chi-squared value (Wilson-Hilferty).
fn chi_squared_z(stat: f64, df: usize) -> f64 {
    let k = df as f64;
    ((stat / k).powf(1.0 / 3.0) - (1.0 - 2.0 / (9.0 * k))) / (2.0 / (9.0 * k)).sqrt()
}

#[test]
fn speculative_sampling_matches_the_exact_joint_distribution() {
    let prompt = [2u32, 4];
    // Exact joint distribution of the first three tokens.
    let mut probs = vec![0.0f64; V * V * V];
    let p1 = softmax(&logits_after(&prompt));
    for a in 0..V {
        let p2 = softmax(&logits_after(&[2, 4, a as u32]));
        for b in 0..V {
            let p3 = softmax(&logits_after(&[2, 4, a as u32, b as u32]));
            for c in 0..V {
                probs[(a * V + b) * V + c] = p1[a] * p2[b] * p3[c];
            }
        }
    }
    let runs = 30_000u64;
    let mut counts = vec![0u64; V * V * V];
    for seed in 0..runs {
        let params = SamplingParams { temperature: 1.0, top_p: 1.0, top_k: 0, seed: Some(1_000_000 + seed) };
        let t = speculative(&prompt, 3, &mut Sampler::new(params));
        counts[((t[0] as usize) * V + t[1] as usize) * V + t[2] as usize] += 1;
    }
    let (stat, df) = chi_squared(&counts, &probs);
    let z = chi_squared_z(stat, df);
    // z < 3.09 <=> p > 1e-3.
    assert!(z < 3.09, "chi-squared {stat:.1} with {df} df (z {z:.2}): speculative sampling is biased");
    // The test has power: a sampler forcing token 3 first in one run of ten fails it.
    let mut biased = vec![0u64; V * V * V];
    for seed in 0..runs {
        let params = SamplingParams { temperature: 1.0, top_p: 1.0, top_k: 0, seed: Some(seed) };
        let mut s = Sampler::new(params);
        let mut ctx = prompt.to_vec();
        while ctx.len() < 5 {
            let l = logits_after(&ctx);
            let t = if ctx.len() == 2 && seed % 10 == 0 { 3 } else { s.sample(&l) };
            ctx.push(t);
        }
        biased[((ctx[2] as usize) * V + ctx[3] as usize) * V + ctx[4] as usize] += 1;
    }
    let (stat, df) = chi_squared(&biased, &probs);
    assert!(chi_squared_z(stat, df) > 3.09, "the chi-squared check detects a biased sampler");
}

#[test]
fn seeded_speculative_runs_equal_plain_runs_under_every_sampler_setting() {
    let prompt = [1u32, 5, 0];
    for (temperature, top_p, top_k) in [(1.0, 1.0, 0), (0.7, 0.9, 0), (1.5, 1.0, 3), (0.0, 1.0, 0)] {
        for seed in 0..300 {
            let params = SamplingParams { temperature, top_p, top_k, seed: Some(seed) };
            let spec = speculative(&prompt, 12, &mut Sampler::new(params));
            let base = plain(&prompt, 12, &mut Sampler::new(params));
            assert_eq!(spec, base, "t={temperature} top_p={top_p} top_k={top_k} seed={seed}");
        }
    }
}
