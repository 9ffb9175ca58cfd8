//! AVX2 + FMA + F16C attention for x86-64 CPUs without AVX-512 (AMD Zen 2-4, older Intel).
//! One chunk kernel, no wide kernel: every query row of every call goes through
//! [`attn_chunk_avx2`], whose arithmetic per row depends only on that row and the chunk's keys,
//! so the attention exactness contract (bits independent of chunking, batching, threads and
//! prefix reuse; tree rows equal their chains) holds by construction.

#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use super::attention::{CHUNK, Chunk, State};

/// Online-softmax attention over one chunk of <= 16 keys for the chunk's `g` stacked rows. K
/// and V are widened to f32 once (shared by every row); per row: scores as 8-lane FMA dot
/// products over head_dim (two accumulators, then a fixed horizontal sum), a vectorized exp,
/// the probability sum in key order, and PV as broadcast FMAs over head_dim.
pub(super) unsafe fn attn_chunk_avx2(c: &Chunk, st: &mut State) {
    if !c.head_dim.is_multiple_of(16) {
        return super::attention::chunk_scalar(c, st);
    }
    attn_chunk_avx2_body(c, st)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attn_chunk_avx2_body(c: &Chunk, st: &mut State) {
    let hd = c.head_dim;
    let n = c.n;
    let (kf, vf) = st.scratch.split_at_mut(CHUNK * hd);
    let (kf, vf) = (kf.as_mut_ptr(), vf.as_mut_ptr());
    let mut i = 0;
    while i < n * hd {
        _mm256_storeu_ps(kf.add(i), _mm256_cvtph_ps(_mm_loadu_si128(c.k.add(i) as *const __m128i)));
        _mm256_storeu_ps(vf.add(i), _mm256_cvtph_ps(_mm_loadu_si128(c.v.add(i) as *const __m128i)));
        i += 8;
    }
    let mut s = [0f32; CHUNK];
    let mut p = [0f32; CHUNK];
    for h in 0..c.g {
        let q = c.q.as_ptr().add(h * hd);
        for (t, st_t) in s.iter_mut().enumerate().take(n) {
            let k = kf.add(t * hd);
            let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut d = 0;
            while d < hd {
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(d)), _mm256_loadu_ps(k.add(d)), a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(d + 8)), _mm256_loadu_ps(k.add(d + 8)), a1);
                d += 16;
            }
            *st_t = hsum8(_mm256_add_ps(a0, a1));
        }
        let mx = s[..n].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let m_old = st.m[h];
        let m_new = m_old.max(mx);
        let mv = _mm256_set1_ps(m_new);
        _mm256_storeu_ps(p.as_mut_ptr(), exp8(_mm256_sub_ps(_mm256_loadu_ps(s.as_ptr()), mv)));
        _mm256_storeu_ps(p.as_mut_ptr().add(8), exp8(_mm256_sub_ps(_mm256_loadu_ps(s.as_ptr().add(8)), mv)));
        p[n..].fill(0.0);
        let psum = p.iter().sum::<f32>();
        let acc = st.acc.as_mut_ptr().add(h * hd);
        if m_new == m_old {
            // the running max did not move: alpha would be exactly 1
            st.l[h] += psum;
        } else {
            let alpha = if m_old == f32::NEG_INFINITY { 0.0 } else { (m_old - m_new).exp() };
            st.l[h] = st.l[h] * alpha + psum;
            st.m[h] = m_new;
            let av = _mm256_set1_ps(alpha);
            let mut d = 0;
            while d < hd {
                _mm256_storeu_ps(acc.add(d), _mm256_mul_ps(_mm256_loadu_ps(acc.add(d)), av));
                d += 8;
            }
        }
        // PV: 16 dims at a time in registers, keys in order.
        let mut d = 0;
        while d < hd {
            let (mut o0, mut o1) = (_mm256_loadu_ps(acc.add(d)), _mm256_loadu_ps(acc.add(d + 8)));
            for (t, &pt) in p.iter().enumerate().take(n) {
                let pb = _mm256_set1_ps(pt);
                let v = vf.add(t * hd + d);
                o0 = _mm256_fmadd_ps(pb, _mm256_loadu_ps(v), o0);
                o1 = _mm256_fmadd_ps(pb, _mm256_loadu_ps(v.add(8)), o1);
            }
            _mm256_storeu_ps(acc.add(d), o0);
            _mm256_storeu_ps(acc.add(d + 8), o1);
            d += 16;
        }
    }
}

/// Horizontal sum of 8 lanes, in a fixed order: ((0+4) + (2+6)) + ((1+5) + (3+7)).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hsum8(v: __m256) -> f32 {
    let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    let x = _mm_add_ss(x, _mm_shuffle_ps::<0b01>(x, x));
    _mm_cvtss_f32(x)
}

/// e^x for x <= 0 (softmax arguments), relative error ~1e-7: x = n ln2 + r with |r| <= ln2/2,
/// a degree-6 Taylor polynomial in r, times 2^n built in the exponent bits. Arguments below
/// -87 are clamped there (e^-87 ~ 1.6e-38, still a normal f32).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp8(x: __m256) -> __m256 {
    let x = _mm256_max_ps(x, _mm256_set1_ps(-87.0));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm256_set1_ps(1.0 / 720.0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0 / 120.0));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0 / 24.0));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0 / 6.0));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0));
    let scale =
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127))));
    _mm256_mul_ps(p, scale)
}
