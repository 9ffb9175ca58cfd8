//! Sampling: logits -> next token id.
//!
//! Contract: `temperature <= 0` is greedy (argmax, lowest id on ties; NaN logits never win).
//! Otherwise logits are scaled by `1/temperature`, cut to the `top_k` highest (0 = no cut),
//! then to the smallest set whose probability mass reaches `top_p` (a value outside (0, 1),
//! e.g. an unset proto field's 0, means no cut; the most likely token always stays), and one token is drawn with a ChaCha20 RNG. A given seed gives
//! the same tokens for the same logits on every machine; without a seed the RNG is seeded
//! from the OS. Candidates are ordered by (logit desc, id asc), so ties are deterministic.
//!
//! Cost: greedy is one pass; sampling is O(V) with a partial sort when `top_k` is set,
//! a full sort of the candidates otherwise. Buffers are reused between calls.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::grammar::TokenConstraint;

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_p: f32,
    /// 0 disables the top-k cut.
    pub top_k: usize,
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 1.0, top_p: 1.0, top_k: 0, seed: None }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams { temperature: 0.0, ..Default::default() }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature <= 0.0
    }
}

pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha20Rng,
    /// (logit, id) candidates, reused.
    cand: Vec<(f32, u32)>,
    probs: Vec<f32>,
    /// The request's grammar: forbidden tokens are masked before every draw.
    constraint: Option<TokenConstraint>,
    /// The masked copy of a logits row, reused.
    masked: Vec<f32>,
    /// Draft tokens checked against the grammar, and those it forbade (see
    /// [`Sampler::note_drafts`]).
    draft_stats: (u64, u64),
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = match params.seed {
            Some(s) => ChaCha20Rng::seed_from_u64(s),
            None => ChaCha20Rng::from_os_rng(),
        };
        Sampler {
            params,
            rng,
            cand: Vec::new(),
            probs: Vec::new(),
            constraint: None,
            masked: Vec::new(),
            draft_stats: (0, 0),
        }
    }

    /// This sampler drawing only what `constraint` allows (structured outputs).
    pub fn with_constraint(mut self, constraint: TokenConstraint) -> Sampler {
        self.constraint = Some(constraint);
        self
    }

    pub fn constraint_mut(&mut self) -> Option<&mut TokenConstraint> {
        self.constraint.as_mut()
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token from one row of logits (`logits` must be non-empty); under a
    /// grammar, from the tokens it allows, and the grammar advances past the token drawn.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let Some(constraint) = self.constraint.as_mut() else {
            return self.draw(logits);
        };
        let mut masked = std::mem::take(&mut self.masked);
        masked.clear();
        masked.extend_from_slice(logits);
        constraint.mask(&mut masked);
        let token = self.draw(&masked);
        self.masked = masked;
        if let Some(constraint) = self.constraint.as_mut() {
            constraint.commit(token);
        }
        token
    }

    /// Under a grammar, right after [`Sampler::sample`] at a draft-tree node: counts the
    /// node's draft children and those the grammar's last mask forbade (drafts that could
    /// never be accepted).
    pub fn note_drafts(&mut self, children: impl IntoIterator<Item = u32>) {
        if let Some(constraint) = &self.constraint {
            for token in children {
                self.draft_stats.0 += 1;
                self.draft_stats.1 += u64::from(!constraint.last_mask_allows(token));
            }
        }
    }

    /// (draft tokens checked, forbidden) since the last call.
    pub fn take_draft_stats(&mut self) -> (u64, u64) {
        std::mem::take(&mut self.draft_stats)
    }

    fn draw(&mut self, logits: &[f32]) -> u32 {
        if self.params.is_greedy() {
            return argmax(logits);
        }
        let inv_t = 1.0 / self.params.temperature;
        self.cand.clear();
        // NaN never wins; -inf (a token a grammar forbids) has no mass, and leaving it out keeps
        // a constrained draw from sorting the whole vocabulary.
        self.cand.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, l)| !l.is_nan() && **l != f32::NEG_INFINITY)
                .map(|(i, &l)| (l * inv_t, i as u32)),
        );
        if self.cand.is_empty() {
            return 0;
        }
        let order = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        let k = self.params.top_k;
        if k > 0 && k < self.cand.len() {
            self.cand.select_nth_unstable_by(k - 1, order);
            self.cand.truncate(k);
        }
        self.cand.sort_unstable_by(order);

        // Softmax over the candidates (max first after sorting).
        let max = self.cand[0].0;
        self.probs.clear();
        self.probs.extend(self.cand.iter().map(|&(l, _)| (l - max).exp()));
        let total: f32 = self.probs.iter().sum();

        let top_p = self.params.top_p;
        let mut keep = self.probs.len();
        if top_p > 0.0 && top_p < 1.0 {
            let target = top_p * total;
            let mut acc = 0.0;
            for (i, &p) in self.probs.iter().enumerate() {
                acc += p;
                if acc >= target {
                    keep = i + 1;
                    break;
                }
            }
        }
        let mass: f32 = self.probs[..keep].iter().sum();
        let mut r = self.rng.random::<f32>() * mass;
        for i in 0..keep {
            r -= self.probs[i];
            if r < 0.0 {
                return self.cand[i].1;
            }
        }
        // Rounding left a sliver of mass: the last kept candidate takes it.
        self.cand[keep - 1].1
    }
}

/// Log-probabilities of one step: the chosen token's and the `top` most likely alternatives.
#[derive(Clone, Debug, PartialEq)]
pub struct StepLogprobs {
    pub logprob: f32,
    /// (token id, log-probability), most likely first; ties by lower id.
    pub top: Vec<(u32, f32)>,
}

/// The model's raw log-probabilities (log-softmax of `logits`, before temperature, top-k
/// and top-p, as OpenAI and vLLM report them) of `token` and of the `top_n` best tokens.
/// NaN logits count as impossible (-inf). The sum runs in f64 so a 150K vocabulary does
/// not lose the small terms.
pub fn step_logprobs(logits: &[f32], token: u32, top_n: usize) -> StepLogprobs {
    let max = logits.iter().copied().filter(|l| !l.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        return StepLogprobs { logprob: f32::NEG_INFINITY, top: Vec::new() };
    }
    let sum: f64 = logits.iter().filter(|l| !l.is_nan()).map(|&l| ((l - max) as f64).exp()).sum();
    let log_z = max as f64 + sum.ln();
    let lp = |l: f32| if l.is_nan() { f32::NEG_INFINITY } else { (l as f64 - log_z) as f32 };
    let logprob = logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| lp(l));
    let top_n = top_n.min(crate::limits::MAX_TOP_LOGPROBS).min(logits.len());
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(top_n + 1);
    if top_n > 0 {
        // One pass keeping a small sorted list: top_n is at most 20.
        let better = |a: (u32, f32), b: (u32, f32)| a.1 > b.1 || (a.1 == b.1 && a.0 < b.0);
        for (i, &l) in logits.iter().enumerate() {
            if l.is_nan() {
                continue;
            }
            let cand = (i as u32, l);
            if top.len() == top_n && !better(cand, top[top_n - 1]) {
                continue;
            }
            let at = top.iter().position(|&t| better(cand, t)).unwrap_or(top.len());
            top.insert(at, cand);
            top.truncate(top_n);
        }
        for t in &mut top {
            t.1 = lp(t.1);
        }
    }
    StepLogprobs { logprob, top }
}

/// Index of the largest logit; the lowest index among equals; NaN never wins (0 if all NaN).
pub fn argmax(logits: &[f32]) -> u32 {
    // Two passes the compiler vectorizes (a greedy step reads every logit of a 49K-152K vocab,
    // once per emitted token): the largest non-NaN value (`f32::max` skips NaN), then its
    // first index. All NaN gives 0.
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = m.max(v);
        }
    }
    let max = lanes.iter().chain(tail).fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    logits.iter().position(|&v| v == max).unwrap_or(0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32, top_p: f32, top_k: usize, seed: u64) -> SamplingParams {
        SamplingParams { temperature, top_p, top_k, seed: Some(seed) }
    }

    #[test]
    fn argmax_equals_the_first_index_of_the_largest_non_nan_value() {
        let reference = |v: &[f32]| -> u32 {
            let mut best: Option<(usize, f32)> = None;
            for (i, &x) in v.iter().enumerate() {
                if !x.is_nan() && best.is_none_or(|(_, b)| x > b) {
                    best = Some((i, x));
                }
            }
            best.map_or(0, |(i, _)| i as u32)
        };
        let mut seed = 7u64;
        let mut next = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 40) as u32
        };
        for len in [0usize, 1, 15, 16, 17, 100, 4099] {
            for _ in 0..50 {
                let v: Vec<f32> = (0..len)
                    .map(|_| match next() % 10 {
                        0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        2 => 3.0, // frequent ties at the top
                        _ => (next() % 1000) as f32 / 400.0 - 1.0,
                    })
                    .collect();
                assert_eq!(argmax(&v), reference(&v), "{v:?}");
            }
        }
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY, f32::NEG_INFINITY]), 1);
        assert_eq!(argmax(&[-0.0, 0.0]), 0);
    }

    #[test]
    fn greedy_picks_argmax_lowest_index_on_ties() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0]), 1);
        assert_eq!(s.sample(&[f32::NAN, -5.0, -4.0]), 2);
        assert_eq!(s.sample(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
    }

    #[test]
    fn same_seed_same_tokens_different_seed_differs() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let run = |seed| {
            let mut s = Sampler::new(params(1.0, 1.0, 0, seed));
            (0..64).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_one_is_greedy() {
        let logits = [0.5, 2.0, 1.9, -3.0];
        let mut s = Sampler::new(params(2.0, 1.0, 1, 3));
        for _ in 0..50 {
            assert_eq!(s.sample(&logits), 1);
        }
    }

    #[test]
    fn top_k_never_returns_tokens_outside_the_k_best() {
        let logits: Vec<f32> = (0..50).map(|i| i as f32 * 0.01).collect();
        let mut s = Sampler::new(params(5.0, 1.0, 3, 11));
        for _ in 0..500 {
            assert!(s.sample(&logits) >= 47);
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_the_mass() {
        // probs ~ [0.6, 0.3, 0.1] at t=1: top_p 0.5 keeps only the first, 0.85 the first two.
        let logits = [0.6f32.ln(), 0.3f32.ln(), 0.1f32.ln()];
        let mut s = Sampler::new(params(1.0, 0.5, 0, 5));
        for _ in 0..200 {
            assert_eq!(s.sample(&logits), 0);
        }
        let mut s = Sampler::new(params(1.0, 0.85, 0, 5));
        let mut seen = [0usize; 3];
        for _ in 0..2000 {
            seen[s.sample(&logits) as usize] += 1;
        }
        assert_eq!(seen[2], 0);
        assert!(seen[1] > 400 && seen[0] > 1000, "{seen:?}");
    }

    #[test]
    fn top_p_zero_means_no_cut() {
        let logits = [0.0f32, 0.0];
        let mut s = Sampler::new(params(1.0, 0.0, 0, 5));
        let picks: Vec<u32> = (0..100).map(|_| s.sample(&logits)).collect();
        assert!(picks.contains(&0) && picks.contains(&1));
    }

    #[test]
    fn frequencies_follow_the_softmax() {
        let logits = [0.0f32, 1.0f32.ln() + 1.0, 0.5];
        let total: f32 = logits.iter().map(|l| l.exp()).sum();
        let mut s = Sampler::new(params(1.0, 1.0, 0, 42));
        let n = 20_000;
        let mut seen = [0usize; 3];
        for _ in 0..n {
            seen[s.sample(&logits) as usize] += 1;
        }
        for i in 0..3 {
            let want = logits[i].exp() / total;
            let got = seen[i] as f32 / n as f32;
            assert!((want - got).abs() < 0.02, "token {i}: want {want}, got {got}");
        }
    }

    #[test]
    fn low_temperature_concentrates_on_the_best() {
        let logits = [1.0, 1.2, 0.9];
        let mut s = Sampler::new(params(0.01, 1.0, 0, 1));
        for _ in 0..100 {
            assert_eq!(s.sample(&logits), 1);
        }
    }

    #[test]
    fn logprobs_are_a_log_softmax_with_sorted_alternatives() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, f32::NAN];
        let z: f64 = [1.0f64, 3.0, 2.0, 3.0].iter().map(|l| l.exp()).sum();
        let got = step_logprobs(&logits, 2, 3);
        assert!((got.logprob as f64 - (2.0 - z.ln())).abs() < 1e-6);
        let ids: Vec<u32> = got.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, vec![1, 3, 2]);
        assert!((got.top[0].1 as f64 - (3.0 - z.ln())).abs() < 1e-6);
        let total: f64 =
            [0usize, 1, 2, 3].iter().map(|&i| (step_logprobs(&logits, i as u32, 0).logprob as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert_eq!(step_logprobs(&logits, 4, 0).logprob, f32::NEG_INFINITY);
        assert_eq!(step_logprobs(&logits, 99, 50).top.len(), 4);
    }

    #[test]
    fn nan_logits_are_never_sampled() {
        let logits = [f32::NAN, 0.0, f32::NAN, 0.0];
        let mut s = Sampler::new(params(1.0, 1.0, 0, 9));
        for _ in 0..200 {
            let t = s.sample(&logits);
            assert!(t == 1 || t == 3);
        }
    }
}
