//! Element-wise activations over whole activation matrices, split across the pool: at prefill
//! they touch `tokens x intermediate` values (458K per layer for 128 tokens of Qwen3.5-0.8B),
//! and on the calling thread alone `expf` was ~3% of a prefill while the other threads waited.
//! Each element's formula depends on the kernel set only (the x86 SIMD sets and NEON: a
//! vectorized `exp`, relative error ~1e-7; scalar: libm's), never on the element's position or the thread
//! that computes it, so the split and the chunking change no bits.

use super::threadpool::ThreadPool;

/// `gate[i] = silu(gate[i]) * up[i]` with `silu(x) = x / (1 + exp(-x))`.
pub fn silu_mul(pool: &ThreadPool, gate: &mut [f32], up: &[f32]) {
    assert!(up.len() >= gate.len(), "silu_mul: short up");
    pool.split_rows(gate, 1, 64, 1, |g, r| silu_mul_serial(g, &up[r]));
}

/// Whether this kernel set computes SiLU on vectors (AVX2 on both x86 SIMD sets).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn vector_silu() -> bool {
    matches!(super::dispatch().name, "avx2" | "avx512-vnni" | "neon")
}

/// The per-element formula, on one thread.
pub fn silu_mul_serial(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if vector_silu() {
        // SAFETY: both x86 SIMD kernel sets require AVX2 and FMA.
        return unsafe { super::x86_avx2::silu_mul_avx2(gate, up) };
    }
    #[cfg(target_arch = "aarch64")]
    if vector_silu() {
        return super::neon::silu_mul_neon(gate, up);
    }
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu_scalar(*g) * u;
    }
}

/// `xs[i] = silu(xs[i])`, on one thread.
pub fn silu_in_place(xs: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if vector_silu() {
        // SAFETY: as in `silu_mul_serial`.
        return unsafe { super::x86_avx2::silu_avx2(xs) };
    }
    #[cfg(target_arch = "aarch64")]
    if vector_silu() {
        return super::neon::silu_neon(xs);
    }
    xs.iter_mut().for_each(|v| *v = silu_scalar(*v));
}

/// The scalar formula (libm's `exp`).
pub fn silu_scalar(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
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
        for threads in [1, 2, 3] {
            let mut got = gate.clone();
            silu_mul(&ThreadPool::new(threads), &mut got, &up);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn every_value_gets_the_same_bits_wherever_it_sits() {
        // Any offset and length (vector body or padded tail) gives a value the same result.
        let xs: Vec<f32> = (0..61).map(|i| (i as f32 - 30.0) * 0.71).collect();
        let ups: Vec<f32> = (0..61).map(|i| 1.0 + i as f32 * 0.01).collect();
        let mut whole = xs.clone();
        silu_in_place(&mut whole);
        let mut whole_mul = xs.clone();
        silu_mul_serial(&mut whole_mul, &ups);
        for start in 0..9 {
            for len in [1, 7, 8, 9, 17, 61 - start] {
                let end = (start + len).min(xs.len());
                let mut part = xs[start..end].to_vec();
                silu_in_place(&mut part);
                assert_eq!(bits(&part), bits(&whole[start..end]), "silu {start}..{end}");
                let mut part = xs[start..end].to_vec();
                silu_mul_serial(&mut part, &ups[start..end]);
                assert_eq!(bits(&part), bits(&whole_mul[start..end]), "silu_mul {start}..{end}");
            }
        }
    }

    #[test]
    fn silu_is_close_to_the_libm_formula_over_the_whole_range() {
        let mut xs: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.05).collect();
        xs.extend([-1e4, -500.0, -89.0, -88.5, 88.5, 500.0, 1e4, 0.0, -0.0, 1e-30, -1e-30]);
        let mut got = xs.clone();
        silu_in_place(&mut got);
        for (&x, &g) in xs.iter().zip(&got) {
            let want = silu_scalar(x);
            let tol = 4e-7 * want.abs() + 1e-36;
            assert!((g - want).abs() <= tol, "silu({x}) = {g}, libm formula {want}");
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }
}
