//! Element-wise activations over whole activation matrices, split across the pool: at prefill
//! they touch `tokens x intermediate` values (458K per layer for 128 tokens of Qwen3.5-0.8B),
//! and on the calling thread alone `expf` was ~3% of a prefill while the other threads waited.
//! Each element's formula is the same on every thread and kernel set, so the split changes no
//! bits.

use super::threadpool::ThreadPool;

/// `gate[i] = silu(gate[i]) * up[i]` with `silu(x) = x / (1 + exp(-x))`.
pub fn silu_mul(pool: &ThreadPool, gate: &mut [f32], up: &[f32]) {
    assert!(up.len() >= gate.len(), "silu_mul: short up");
    pool.split_rows(gate, 1, 64, 1, |g, r| silu_mul_serial(g, &up[r]));
}

/// The per-element formula, on one thread.
pub fn silu_mul_serial(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_over_threads_gives_the_serial_bits() {
        let gate: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.037).collect();
        let up: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.11).sin()).collect();
        let mut want = gate.clone();
        silu_mul_serial(&mut want, &up);
        let silu = |x: f32| x / (1.0 + (-x).exp());
        assert_eq!(want[3], silu(gate[3]) * up[3]);
        for threads in [1, 2, 3] {
            let mut got = gate.clone();
            silu_mul(&ThreadPool::new(threads), &mut got, &up);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }
}
