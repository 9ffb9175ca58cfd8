//! The gated delta rule's recurrent form for one head (Qwen3.5/3.6 Gated DeltaNet, spec §3.4):
//! per token, with state `S` (`d_k x d_v`, row-major), gate `gamma`, strength `beta`:
//!
//! ```text
//! S_i *= gamma;  e += k_i * S_i          (rows i in order)
//! e = beta * (v - e)
//! S_i += k_i * e; o += q_i * S_i         (rows i in order)
//! ```
//!
//! Every operation is element-wise along `d_v` with rows summed in order, so a kernel that
//! vectorizes across columns (plain multiplies and adds, never FMA) gives the scalar form's
//! bits. The SIMD kernels take a few vectors of columns at a time through all tokens, so the
//! state's slice stays in L1 and the running sums in registers; four vectors keep four add
//! chains in flight, eight where one token's second pass runs with the next one's first.

use std::sync::OnceLock;

/// One token's inputs for a head: `q`, `k` (`d_k`), `v` (`d_v`), `gamma = exp(g)`, `beta`.
#[derive(Clone, Copy, Debug)]
pub struct DeltaToken<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub gamma: f32,
    pub beta: f32,
}

/// Runs `tokens` in order through `state` (`dk * dv`), writing token t's output to `out[t]`
/// (`dv` values each). Panics on inconsistent lengths.
pub fn delta_rule(state: &mut [f32], dk: usize, dv: usize, tokens: &[DeltaToken], out: &mut [&mut [f32]]) {
    assert!(state.len() == dk * dv && out.len() == tokens.len(), "delta_rule: shapes");
    for (t, o) in tokens.iter().zip(out.iter()) {
        assert!(t.q.len() == dk && t.k.len() == dk && t.v.len() == dv && o.len() == dv, "delta_rule: token shapes");
    }
    kernel()(state, dk, dv, tokens, out);
}

type Kernel = fn(&mut [f32], usize, usize, &[DeltaToken], &mut [&mut [f32]]);

fn kernel() -> Kernel {
    static CHOSEN: OnceLock<Kernel> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use super::{SimdCeiling, simd_ceiling};
            if simd_ceiling() >= SimdCeiling::Detected && std::arch::is_x86_feature_detected!("avx512f") {
                return x86::avx512;
            }
            if simd_ceiling() >= SimdCeiling::Avx2 && std::arch::is_x86_feature_detected!("avx2") {
                return x86::avx2;
            }
        }
        #[cfg(target_arch = "aarch64")]
        if super::simd_ceiling() == super::SimdCeiling::Detected && std::arch::is_aarch64_feature_detected!("neon") {
            return arm::neon;
        }
        scalar
    })
}

/// The reference: columns `cols` of the state, token by token (the whole width for the scalar
/// kernel; the SIMD kernels' tail columns).
fn columns_scalar(
    state: &mut [f32],
    dk: usize,
    dv: usize,
    cols: std::ops::Range<usize>,
    tokens: &[DeltaToken],
    out: &mut [&mut [f32]],
) {
    let mut e = vec![0.0f32; cols.len()];
    for (t, o) in tokens.iter().zip(out.iter_mut()) {
        e.fill(0.0);
        for i in 0..dk {
            let srow = &mut state[i * dv + cols.start..i * dv + cols.end];
            let ki = t.k[i];
            for (ev, sv) in e.iter_mut().zip(srow.iter_mut()) {
                *sv *= t.gamma;
                *ev += ki * *sv;
            }
        }
        for (ev, &vv) in e.iter_mut().zip(&t.v[cols.clone()]) {
            *ev = t.beta * (vv - *ev);
        }
        let o = &mut o[cols.clone()];
        o.fill(0.0);
        for i in 0..dk {
            let srow = &mut state[i * dv + cols.start..i * dv + cols.end];
            let (ki, qi) = (t.k[i], t.q[i]);
            for ((sv, &dl), ov) in srow.iter_mut().zip(e.iter()).zip(o.iter_mut()) {
                *sv += ki * dl;
                *ov += qi * *sv;
            }
        }
    }
}

fn scalar(state: &mut [f32], dk: usize, dv: usize, tokens: &[DeltaToken], out: &mut [&mut [f32]]) {
    columns_scalar(state, dk, dv, 0..dv, tokens, out);
}

/// The few vector operations the kernel needs, for one register width.
trait Simd {
    type V: Copy;
    const LANES: usize;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
}

/// Vectors per column block (independent add chains).
const VECS: usize = 4;

/// Column blocks of `VECS * S::LANES`, each through every token; the rest by the scalar form.
///
/// # Safety
/// `S`'s CPU features are present; shapes checked by [`delta_rule`].
#[inline(always)]
unsafe fn columns_simd<S: Simd>(
    state: &mut [f32],
    dk: usize,
    dv: usize,
    tokens: &[DeltaToken],
    out: &mut [&mut [f32]],
) {
    let width = VECS * S::LANES;
    let blocks = dv / width;
    let st = state.as_mut_ptr();
    // SAFETY (all loads and stores below): columns c0..c0 + width < dv of rows < dk of the
    // state, of `v` and of `out[t]`, whose lengths `delta_rule` checked.
    unsafe {
        for b in 0..blocks {
            let c0 = b * width;
            // Token t's update-and-read pass and token t + 1's decay-and-sum pass meet in one
            // sweep over the rows: each state element sees the same operations in the same
            // order, with one load and one store per token instead of two, and twice the
            // independent add chains.
            let mut e = [S::zero(); VECS];
            if let Some(first) = tokens.first() {
                let gamma = S::splat(first.gamma);
                for i in 0..dk {
                    let ki = S::splat(first.k[i]);
                    let row = st.add(i * dv + c0);
                    for (u, ev) in e.iter_mut().enumerate() {
                        let s = S::mul(S::load(row.add(u * S::LANES)), gamma);
                        S::store(row.add(u * S::LANES), s);
                        *ev = S::add(*ev, S::mul(ki, s));
                    }
                }
            }
            for (t, (tok, o)) in tokens.iter().zip(out.iter_mut()).enumerate() {
                let beta = S::splat(tok.beta);
                for (u, ev) in e.iter_mut().enumerate() {
                    *ev = S::mul(beta, S::sub(S::load(tok.v.as_ptr().add(c0 + u * S::LANES)), *ev));
                }
                let mut acc = [S::zero(); VECS];
                match tokens.get(t + 1) {
                    Some(next) => {
                        let gamma = S::splat(next.gamma);
                        let mut e_next = [S::zero(); VECS];
                        for i in 0..dk {
                            let (ki, qi, k_next) = (S::splat(tok.k[i]), S::splat(tok.q[i]), S::splat(next.k[i]));
                            let row = st.add(i * dv + c0);
                            for u in 0..VECS {
                                let s = S::add(S::load(row.add(u * S::LANES)), S::mul(ki, e[u]));
                                acc[u] = S::add(acc[u], S::mul(qi, s));
                                let s = S::mul(s, gamma);
                                S::store(row.add(u * S::LANES), s);
                                e_next[u] = S::add(e_next[u], S::mul(k_next, s));
                            }
                        }
                        e = e_next;
                    }
                    None => {
                        for i in 0..dk {
                            let (ki, qi) = (S::splat(tok.k[i]), S::splat(tok.q[i]));
                            let row = st.add(i * dv + c0);
                            for u in 0..VECS {
                                let s = S::add(S::load(row.add(u * S::LANES)), S::mul(ki, e[u]));
                                S::store(row.add(u * S::LANES), s);
                                acc[u] = S::add(acc[u], S::mul(qi, s));
                            }
                        }
                    }
                }
                for (u, a) in acc.iter().enumerate() {
                    S::store(o.as_mut_ptr().add(c0 + u * S::LANES), *a);
                }
            }
        }
    }
    if blocks * width < dv {
        columns_scalar(state, dk, dv, blocks * width..dv, tokens, out);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    #![allow(unsafe_op_in_unsafe_fn)]
    use std::arch::x86_64::*;

    use super::{DeltaToken, Simd, columns_simd};

    struct Avx2;
    impl Simd for Avx2 {
        type V = __m256;
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> __m256 {
            _mm256_setzero_ps()
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m256 {
            _mm256_set1_ps(x)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            _mm256_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m256) {
            _mm256_storeu_ps(p, v)
        }
        #[inline(always)]
        unsafe fn add(a: __m256, b: __m256) -> __m256 {
            _mm256_add_ps(a, b)
        }
        #[inline(always)]
        unsafe fn sub(a: __m256, b: __m256) -> __m256 {
            _mm256_sub_ps(a, b)
        }
        #[inline(always)]
        unsafe fn mul(a: __m256, b: __m256) -> __m256 {
            _mm256_mul_ps(a, b)
        }
    }

    struct Avx512;
    impl Simd for Avx512 {
        type V = __m512;
        const LANES: usize = 16;
        #[inline(always)]
        unsafe fn zero() -> __m512 {
            _mm512_setzero_ps()
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m512 {
            _mm512_set1_ps(x)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m512 {
            _mm512_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: __m512) {
            _mm512_storeu_ps(p, v)
        }
        #[inline(always)]
        unsafe fn add(a: __m512, b: __m512) -> __m512 {
            _mm512_add_ps(a, b)
        }
        #[inline(always)]
        unsafe fn sub(a: __m512, b: __m512) -> __m512 {
            _mm512_sub_ps(a, b)
        }
        #[inline(always)]
        unsafe fn mul(a: __m512, b: __m512) -> __m512 {
            _mm512_mul_ps(a, b)
        }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn avx2_impl(state: &mut [f32], dk: usize, dv: usize, tokens: &[DeltaToken], out: &mut [&mut [f32]]) {
        columns_simd::<Avx2>(state, dk, dv, tokens, out)
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn avx512_impl(state: &mut [f32], dk: usize, dv: usize, tokens: &[DeltaToken], out: &mut [&mut [f32]]) {
        columns_simd::<Avx512>(state, dk, dv, tokens, out)
    }

    pub(super) fn avx2(state: &mut [f32], dk: usize, dv: usize, tokens: &[DeltaToken], out: &mut [&mut [f32]]) {
        // SAFETY: chosen only where AVX2 was detected.
        unsafe { avx2_impl(state, dk, dv, tokens, out) }
    }

    pub(super) fn avx512(state: &mut [f32], dk: usize, dv: usize, tokens: &[DeltaToken], out: &mut [&mut [f32]]) {
        // SAFETY: chosen only where AVX-512F was detected.
        unsafe { avx512_impl(state, dk, dv, tokens, out) }
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    #![allow(unsafe_op_in_unsafe_fn)]
    use std::arch::aarch64::*;

    use super::{DeltaToken, Simd, columns_simd};

    struct Neon;
    impl Simd for Neon {
        type V = float32x4_t;
        const LANES: usize = 4;
        #[inline(always)]
        unsafe fn zero() -> float32x4_t {
            vdupq_n_f32(0.0)
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> float32x4_t {
            vdupq_n_f32(x)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> float32x4_t {
            vld1q_f32(p)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: float32x4_t) {
            vst1q_f32(p, v)
        }
        #[inline(always)]
        unsafe fn add(a: float32x4_t, b: float32x4_t) -> float32x4_t {
            vaddq_f32(a, b)
        }
        #[inline(always)]
        unsafe fn sub(a: float32x4_t, b: float32x4_t) -> float32x4_t {
            vsubq_f32(a, b)
        }
        #[inline(always)]
        unsafe fn mul(a: float32x4_t, b: float32x4_t) -> float32x4_t {
            vmulq_f32(a, b)
        }
    }

    #[target_feature(enable = "neon")]
    unsafe fn neon_impl(state: &mut [f32], dk: usize, dv: usize, tokens: &[DeltaToken], out: &mut [&mut [f32]]) {
        columns_simd::<Neon>(state, dk, dv, tokens, out)
    }

    pub(super) fn neon(state: &mut [f32], dk: usize, dv: usize, tokens: &[DeltaToken], out: &mut [&mut [f32]]) {
        // SAFETY: chosen only where NEON was detected.
        unsafe { neon_impl(state, dk, dv, tokens, out) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n).map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.0 - 1.0) * 0.7).collect()
    }

    /// Every kernel this CPU has, with the scalar reference first.
    fn kernels() -> Vec<(&'static str, Kernel)> {
        let mut v: Vec<(&'static str, Kernel)> = vec![("scalar", scalar)];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                v.push(("avx2", x86::avx2));
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                v.push(("avx512", x86::avx512));
            }
        }
        #[cfg(target_arch = "aarch64")]
        if std::arch::is_aarch64_feature_detected!("neon") {
            v.push(("neon", arm::neon));
        }
        v
    }

    fn run(kernel: Kernel, dk: usize, dv: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
        let (q, k, v) = (values(n * dk, 1), values(n * dk, 2), values(n * dv, 3));
        let tokens: Vec<DeltaToken> = (0..n)
            .map(|t| DeltaToken {
                q: &q[t * dk..(t + 1) * dk],
                k: &k[t * dk..(t + 1) * dk],
                v: &v[t * dv..(t + 1) * dv],
                gamma: 0.9 - 0.01 * t as f32,
                beta: 0.3 + 0.02 * t as f32,
            })
            .collect();
        let mut state = values(dk * dv, 4);
        let mut out = vec![f32::NAN; n * dv];
        let mut rows: Vec<&mut [f32]> = out.chunks_mut(dv).collect();
        kernel(&mut state, dk, dv, &tokens, &mut rows);
        (state, out)
    }

    #[test]
    fn scalar_form_matches_the_math_in_f64() {
        let (dk, dv, n) = (6, 5, 3);
        let (q, k, v) = (values(n * dk, 1), values(n * dk, 2), values(n * dv, 3));
        let mut s: Vec<f64> = values(dk * dv, 4).iter().map(|&x| x as f64).collect();
        let (_, got) = run(scalar, dk, dv, n);
        for t in 0..n {
            let (gamma, beta) = ((0.9 - 0.01 * t as f32) as f64, (0.3 + 0.02 * t as f32) as f64);
            s.iter_mut().for_each(|x| *x *= gamma);
            for c in 0..dv {
                let pred: f64 = (0..dk).map(|i| k[t * dk + i] as f64 * s[i * dv + c]).sum();
                let delta = beta * (v[t * dv + c] as f64 - pred);
                for i in 0..dk {
                    s[i * dv + c] += k[t * dk + i] as f64 * delta;
                }
                let want: f64 = (0..dk).map(|i| q[t * dk + i] as f64 * s[i * dv + c]).sum();
                assert!((got[t * dv + c] as f64 - want).abs() < 1e-5, "t {t} c {c}: {} vs {want}", got[t * dv + c]);
            }
        }
    }

    #[test]
    fn every_kernel_set_gives_the_scalar_bits() {
        // Widths with and without whole column blocks, and a scalar tail.
        // Token counts: none, one (decode), two and five (passes run together).
        for (dk, dv) in [(128, 128), (16, 64), (24, 40), (8, 7), (32, 200)] {
            for n in [0, 1, 2, 5] {
                let want = run(scalar, dk, dv, n);
                for (name, kernel) in kernels() {
                    let got = run(kernel, dk, dv, n);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got.0), bits(&want.0), "{name} state dk {dk} dv {dv} tokens {n}");
                    assert_eq!(bits(&got.1), bits(&want.1), "{name} output dk {dk} dv {dv} tokens {n}");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "delta_rule: token shapes")]
    fn short_inputs_are_refused() {
        let mut state = vec![0.0; 4];
        let (q, v) = (vec![0.0; 2], vec![0.0; 1]);
        let tokens = [DeltaToken { q: &q, k: &q, v: &v, gamma: 1.0, beta: 1.0 }];
        let mut o = [0.0; 2];
        delta_rule(&mut state, 2, 2, &tokens, &mut [&mut o[..]]);
    }
}
