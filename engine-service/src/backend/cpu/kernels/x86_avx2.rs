//! AVX2 + FMA + F16C attention for x86-64 CPUs without AVX-512 (AMD Zen 2-4, older Intel).
//! The chunk kernel [`attn_chunk_avx2`] does each query row's arithmetic from that row and the
//! chunk's keys only, so the attention exactness contract (bits independent of chunking,
//! batching, threads and prefix reuse; tree rows equal their chains) holds by construction.
//! The wide kernel [`attn_wide_avx2`] (prefill and verification at depth: many stacked rows
//! over the same keys) puts 8 rows in the lanes and repeats, lane by lane, exactly the chunk
//! kernel's operations (the same dot-product partials and tree, `exp8`, the probability sum
//! in key order, libm's `exp` for the rescale, PV in key order), so a row gets the same bits
//! from either kernel (`wide_kernel_gives_each_row_the_chunk_kernels_bits`).

#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use super::attention::{CHUNK, Chunk, ChunkRef, State, WideState};

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

/// Rows-in-lanes attention for AVX2 (see the module docs). `qt`/`ws` hold 16 rows per lane
/// block (`[lane block][d][16]`); each block runs as two halves of 8 lanes.
///
/// # Safety
/// AVX2, FMA and F16C present (the dispatcher checks); chunks valid for `n * hd` reads of K
/// and V; `qt` and `ws` sized for `nlb` lane blocks.
pub(super) unsafe fn attn_wide_avx2(chunks: &[ChunkRef], qt: &[f32], nlb: usize, hd: usize, ws: &mut WideState) {
    assert!(
        qt.len() >= nlb * hd * 16 && ws.acc.len() >= nlb * hd * 16 && ws.m.len() >= nlb * 16,
        "attn_wide: short buffers"
    );
    match hd {
        16 => attn_wide_nv::<1>(chunks, qt, nlb, ws),
        32 => attn_wide_nv::<2>(chunks, qt, nlb, ws),
        64 => attn_wide_nv::<4>(chunks, qt, nlb, ws),
        128 => attn_wide_nv::<8>(chunks, qt, nlb, ws),
        _ => unreachable!("attention only selects the wide kernel for these head sizes"),
    }
}

/// Score partial `l` (0..16) of 2 keys for 8 rows: dims `l, l + 16, ...` as one product then
/// FMAs in order, the chunk kernel's lane `l % 8` of accumulator `l / 8`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn partial2<const NV: usize>(qp: *const f32, kp: *const f32, l: usize) -> [__m256; 2] {
    let hd = NV * 16;
    let q0 = _mm256_loadu_ps(qp.add(l * 16));
    let mut x = [_mm256_mul_ps(q0, _mm256_set1_ps(*kp.add(l))), _mm256_mul_ps(q0, _mm256_set1_ps(*kp.add(hd + l)))];
    for j in 1..NV {
        let qj = _mm256_loadu_ps(qp.add((16 * j + l) * 16));
        x[0] = _mm256_fmadd_ps(qj, _mm256_set1_ps(*kp.add(16 * j + l)), x[0]);
        x[1] = _mm256_fmadd_ps(qj, _mm256_set1_ps(*kp.add(hd + 16 * j + l)), x[1]);
    }
    x
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn add2(a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
    [_mm256_add_ps(a[0], b[0]), _mm256_add_ps(a[1], b[1])]
}

/// Scores of 2 keys for 8 rows in the chunk kernel's order: lane i of the two accumulators
/// added (`v_i = p_i + p_(i+8)`), then `hsum8`'s tree `((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7))`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores2<const NV: usize>(qp: *const f32, kp: *const f32) -> [__m256; 2] {
    let v = |i: usize| add2(partial2::<NV>(qp, kp, i), partial2::<NV>(qp, kp, i + 8));
    let z0 = add2(add2(v(0), v(4)), add2(v(2), v(6)));
    let z1 = add2(add2(v(1), v(5)), add2(v(3), v(7)));
    add2(z0, z1)
}

#[allow(clippy::needless_range_loop)] // register arrays indexed by key/dim read clearer
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attn_wide_nv<const NV: usize>(chunks: &[ChunkRef], qt: &[f32], nlb: usize, ws: &mut WideState) {
    let hd = NV * 16;
    let (mv, lv, acct) = (&mut ws.m, &mut ws.l, &mut ws.acc);
    // K rows padded by one so key pairs past `n` read finite stale values (ignored).
    let mut kf = [0f32; (CHUNK + 1) * 128];
    let mut vf = [0f32; CHUNK * 128];
    for (ci, c) in chunks.iter().enumerate() {
        let n = c.n;
        // Chunks live in scattered pages: fetch the next one's K/V while this one computes.
        if let Some(next) = chunks.get(ci + 1) {
            let bytes = next.n * hd * 2;
            let mut off = 0;
            while off < bytes {
                _mm_prefetch::<_MM_HINT_T0>((next.k as *const i8).wrapping_add(off));
                _mm_prefetch::<_MM_HINT_T0>((next.v as *const i8).wrapping_add(off));
                off += 64;
            }
        }
        let mut i = 0;
        while i < n * hd {
            _mm256_storeu_ps(kf.as_mut_ptr().add(i), _mm256_cvtph_ps(_mm_loadu_si128(c.k.add(i) as *const __m128i)));
            _mm256_storeu_ps(vf.as_mut_ptr().add(i), _mm256_cvtph_ps(_mm_loadu_si128(c.v.add(i) as *const __m128i)));
            i += 8;
        }
        for half_block in 0..2 * nlb {
            let (lb, half) = (half_block / 2, half_block % 2);
            let qp = qt.as_ptr().add(lb * hd * 16 + 8 * half);
            let ap = acct.as_mut_ptr().add(lb * hd * 16 + 8 * half);
            let lane0 = lb * 16 + 8 * half;
            let mut s = [_mm256_setzero_ps(); CHUNK];
            let mut t0 = 0;
            while t0 < n {
                let sc = scores2::<NV>(qp, kf.as_ptr().add(t0 * hd));
                s[t0] = sc[0];
                if t0 + 1 < n {
                    s[t0 + 1] = sc[1];
                }
                t0 += 2;
            }
            let mut mx = s[0];
            for t in 1..n {
                mx = _mm256_max_ps(mx, s[t]);
            }
            let m_old = _mm256_loadu_ps(mv.as_ptr().add(lane0));
            let m_new = _mm256_max_ps(m_old, mx);
            let mut p = [_mm256_setzero_ps(); CHUNK];
            for t in 0..n {
                p[t] = exp8(_mm256_sub_ps(s[t], m_new));
            }
            // The chunk kernel's sum over all 16 slots in key order (slots past n are zero).
            let mut psum = p[0];
            for t in 1..CHUNK {
                psum = _mm256_add_ps(psum, p[t]);
            }
            let mut l = _mm256_loadu_ps(lv.as_ptr().add(lane0));
            if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NEQ_UQ>(m_new, m_old)) != 0 {
                // Lanes whose max moved rescale by libm's exp, as the chunk kernel does; the
                // others by exactly 1 (the chunk kernel skips that multiply: same bits).
                let (mut mo, mut mn, mut alpha) = ([0f32; 8], [0f32; 8], [1f32; 8]);
                _mm256_storeu_ps(mo.as_mut_ptr(), m_old);
                _mm256_storeu_ps(mn.as_mut_ptr(), m_new);
                for lane in 0..8 {
                    if mn[lane] != mo[lane] {
                        alpha[lane] = if mo[lane] == f32::NEG_INFINITY { 0.0 } else { (mo[lane] - mn[lane]).exp() };
                    }
                }
                let av = _mm256_loadu_ps(alpha.as_ptr());
                l = _mm256_mul_ps(l, av);
                for d in 0..hd {
                    _mm256_storeu_ps(ap.add(d * 16), _mm256_mul_ps(_mm256_loadu_ps(ap.add(d * 16)), av));
                }
                _mm256_storeu_ps(mv.as_mut_ptr().add(lane0), m_new);
            }
            _mm256_storeu_ps(lv.as_mut_ptr().add(lane0), _mm256_add_ps(l, psum));
            // PV: 8 dims at a time in registers, keys in order.
            for db in 0..2 * NV {
                let mut acc = [_mm256_setzero_ps(); 8];
                for k in 0..8 {
                    acc[k] = _mm256_loadu_ps(ap.add((db * 8 + k) * 16));
                }
                for t in 0..n {
                    for k in 0..8 {
                        acc[k] = _mm256_fmadd_ps(p[t], _mm256_set1_ps(vf[t * hd + db * 8 + k]), acc[k]);
                    }
                }
                for k in 0..8 {
                    _mm256_storeu_ps(ap.add((db * 8 + k) * 16), acc[k]);
                }
            }
        }
    }
}
