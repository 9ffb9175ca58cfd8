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

use super::attention::{CHUNK, Chunk, ChunkRef, State, WideState, in_groups_of_four};

/// Online-softmax attention over one chunk of <= 16 keys for the chunk's `g` stacked rows,
/// in groups of up to 4 rows: each K and V vector is converted from f16 once, in registers,
/// and used by every row of the group (no scratch copy: decode at depth is bound by reading
/// K/V). Per row: scores as two 8-lane FMA accumulators over head_dim, added lane by lane and
/// summed by [`hsum8`]'s tree (eight keys at a time, [`hsum8_x8`]), a vectorized exp, the
/// probability sum in key order, and PV as broadcast FMAs over head_dim in key order.
pub(super) unsafe fn attn_chunk_avx2(c: &Chunk, st: &mut State) {
    if !c.head_dim.is_multiple_of(16) {
        return super::attention::chunk_scalar(c, st);
    }
    in_groups_of_four!(c, st, attn_chunk_group)
}

/// [`attn_chunk_avx2`] for CPUs with AVX-512VL: the same instructions on ymm vectors, with
/// the 32 registers EVEX encoding reaches, so scores run two keys per step (each q vector
/// loaded once for both) and PV 32 dims per pass. Every (row, key) score and every
/// accumulator lane gets the same operations in the same order: the same bits.
pub(super) unsafe fn attn_chunk_avx2_evex(c: &Chunk, st: &mut State) {
    if !c.head_dim.is_multiple_of(32) {
        return attn_chunk_avx2(c, st);
    }
    in_groups_of_four!(c, st, attn_chunk_group_evex)
}

/// Scores of keys `t0..t0 + KEYS` for rows `h0..h0 + G`: per (row, key) two 8-lane FMA
/// accumulators over head_dim in order, added lane by lane into `lanes`.
#[allow(clippy::needless_range_loop)] // register arrays indexed by row/key read clearer
#[inline(always)]
unsafe fn score_keys<const G: usize, const KEYS: usize>(
    c: &Chunk,
    h0: usize,
    t0: usize,
    lanes: &mut [[__m256; CHUNK]; G],
) {
    let hd = c.head_dim;
    let mut a = [[[_mm256_setzero_ps(); 2]; KEYS]; G];
    let mut d = 0;
    while d < hd {
        let mut kv = [[_mm256_setzero_ps(); 2]; KEYS];
        for (u, ku) in kv.iter_mut().enumerate() {
            let k = c.k.add((t0 + u) * hd + d);
            *ku = [
                _mm256_cvtph_ps(_mm_loadu_si128(k as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(k.add(8) as *const __m128i)),
            ];
        }
        for h in 0..G {
            let q = c.q.as_ptr().add((h0 + h) * hd + d);
            let (q0, q1) = (_mm256_loadu_ps(q), _mm256_loadu_ps(q.add(8)));
            for u in 0..KEYS {
                a[h][u][0] = _mm256_fmadd_ps(q0, kv[u][0], a[h][u][0]);
                a[h][u][1] = _mm256_fmadd_ps(q1, kv[u][1], a[h][u][1]);
            }
        }
        d += 16;
    }
    for h in 0..G {
        for u in 0..KEYS {
            lanes[h][t0 + u] = _mm256_add_ps(a[h][u][0], a[h][u][1]);
        }
    }
}

/// PV for rows `h0..h0 + G` over dims `d..d + 8 * VECS`, keys in order, accumulators in
/// registers.
#[allow(clippy::needless_range_loop)] // register arrays indexed by row/key read clearer
#[inline(always)]
unsafe fn pv_dims<const G: usize, const VECS: usize>(
    c: &Chunk,
    st: &mut State,
    h0: usize,
    p: &[[f32; CHUNK]; G],
    d: usize,
) {
    let hd = c.head_dim;
    let acc = st.acc.as_mut_ptr();
    let mut o = [[_mm256_setzero_ps(); VECS]; G];
    for h in 0..G {
        for (x, ox) in o[h].iter_mut().enumerate() {
            *ox = _mm256_loadu_ps(acc.add((h0 + h) * hd + d + 8 * x));
        }
    }
    for t in 0..c.n {
        let v = c.v.add(t * hd + d);
        let mut vv = [_mm256_setzero_ps(); VECS];
        for (x, vx) in vv.iter_mut().enumerate() {
            *vx = _mm256_cvtph_ps(_mm_loadu_si128(v.add(8 * x) as *const __m128i));
        }
        for h in 0..G {
            let pb = _mm256_set1_ps(p[h][t]);
            for x in 0..VECS {
                o[h][x] = _mm256_fmadd_ps(pb, vv[x], o[h][x]);
            }
        }
    }
    for h in 0..G {
        for (x, ox) in o[h].iter().enumerate() {
            _mm256_storeu_ps(acc.add((h0 + h) * hd + d + 8 * x), *ox);
        }
    }
}

/// The softmax step of rows `h0..h0 + G` (G <= 4) from their per-key score lanes: `p` gets
/// the probabilities (zero past `n`), `st` the new max and sum, and the accumulators are
/// rescaled when the max moved. The max is exact in any order, so it is taken across lanes;
/// each row's probability sum is in key order, with the rows side by side in the lanes.
#[allow(clippy::needless_range_loop)] // register arrays indexed by row/key read clearer
#[inline(always)]
unsafe fn softmax_rows<const G: usize>(
    c: &Chunk,
    st: &mut State,
    h0: usize,
    lanes: &[[__m256; CHUNK]; G],
    p: &mut [[f32; CHUNK]; G],
) {
    let (hd, n) = (c.head_dim, c.n);
    let live = |first: i32| {
        let keys = _mm256_add_epi32(_mm256_set1_epi32(first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), keys))
    };
    let (live_lo, live_hi) = (live(0), live(8));
    let no_key = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut m_new = [0f32; G];
    let mut probs = [[_mm256_setzero_ps(); 2]; G];
    for h in 0..G {
        let lo: &[__m256; 8] = lanes[h][..8].try_into().expect("8 keys");
        let hi: &[__m256; 8] = lanes[h][8..].try_into().expect("8 keys");
        let (s_lo, s_hi) = (hsum8_x8(lo), hsum8_x8(hi));
        let both = _mm256_max_ps(_mm256_blendv_ps(no_key, s_lo, live_lo), _mm256_blendv_ps(no_key, s_hi, live_hi));
        m_new[h] = st.m[h0 + h].max(hmax8(both));
        let mv = _mm256_set1_ps(m_new[h]);
        probs[h] = [
            _mm256_and_ps(exp8(_mm256_sub_ps(s_lo, mv)), live_lo),
            _mm256_and_ps(exp8(_mm256_sub_ps(s_hi, mv)), live_hi),
        ];
        _mm256_storeu_ps(p[h].as_mut_ptr(), probs[h][0]);
        _mm256_storeu_ps(p[h].as_mut_ptr().add(8), probs[h][1]);
    }
    let psum = key_order_sums::<G>(&probs);
    for h in 0..G {
        let hh = h0 + h;
        let m_old = st.m[hh];
        if m_new[h] == m_old {
            // the running max did not move: alpha would be exactly 1
            st.l[hh] += psum[h];
        } else {
            let alpha = if m_old == f32::NEG_INFINITY { 0.0 } else { (m_old - m_new[h]).exp() };
            st.l[hh] = st.l[hh] * alpha + psum[h];
            st.m[hh] = m_new[h];
            let acc = st.acc.as_mut_ptr().add(hh * hd);
            let av = _mm256_set1_ps(alpha);
            let mut d = 0;
            while d < hd {
                _mm256_storeu_ps(acc.add(d), _mm256_mul_ps(_mm256_loadu_ps(acc.add(d)), av));
                d += 8;
            }
        }
    }
}

/// The largest of 8 lanes (exact in any order).
#[inline(always)]
unsafe fn hmax8(v: __m256) -> f32 {
    let x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    let x = _mm_max_ss(x, _mm_shuffle_ps::<0b01>(x, x));
    _mm_cvtss_f32(x)
}

/// For each of up to 4 rows, the sum of its 16 probabilities (`rows[h]`: keys 0-7, 8-15) in
/// key order, `((p0 + p1) + p2) + ...`: what a scalar loop over the keys gives (probabilities
/// are >= +0, so starting from p0 equals starting from a zero). The rows are transposed into
/// the lanes of 128-bit vectors, so one chain of 15 adds serves all of them.
#[inline(always)]
unsafe fn key_order_sums<const G: usize>(rows: &[[__m256; 2]; G]) -> [f32; G] {
    let row = |h: usize, half: usize| if h < G { rows[h][half] } else { _mm256_setzero_ps() };
    let mut acc = _mm_setzero_ps();
    for half in 0..2 {
        let (r0, r1, r2, r3) = (row(0, half), row(1, half), row(2, half), row(3, half));
        let (t0, t1) = (_mm256_unpacklo_ps(r0, r1), _mm256_unpackhi_ps(r0, r1));
        let (t2, t3) = (_mm256_unpacklo_ps(r2, r3), _mm256_unpackhi_ps(r2, r3));
        // u[k]: key k of the four rows in the low 128 bits, key k + 4 in the high.
        let u = [
            _mm256_shuffle_ps::<0x44>(t0, t2),
            _mm256_shuffle_ps::<0xee>(t0, t2),
            _mm256_shuffle_ps::<0x44>(t1, t3),
            _mm256_shuffle_ps::<0xee>(t1, t3),
        ];
        for (k, &uk) in u.iter().enumerate() {
            let key = _mm256_castps256_ps128(uk);
            acc = if half == 0 && k == 0 { key } else { _mm_add_ps(acc, key) };
        }
        for &uk in &u {
            acc = _mm_add_ps(acc, _mm256_extractf128_ps::<1>(uk));
        }
    }
    let mut out = [0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), acc);
    std::array::from_fn(|h| out[h])
}

/// Rows `h0..h0 + G` of the chunk (see [`attn_chunk_avx2`]).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attn_chunk_group<const G: usize>(c: &Chunk, st: &mut State, h0: usize) {
    // Per row and key: the two score accumulators added lane by lane (keys past n stay zero;
    // their scores are never used).
    let mut lanes = [[_mm256_setzero_ps(); CHUNK]; G];
    for t in 0..c.n {
        score_keys::<G, 1>(c, h0, t, &mut lanes);
    }
    let mut p = [[0f32; CHUNK]; G];
    softmax_rows::<G>(c, st, h0, &lanes, &mut p);
    // PV: 16 dims of every row in registers, keys in order.
    for d in (0..c.head_dim).step_by(16) {
        pv_dims::<G, 2>(c, st, h0, &p, d);
    }
}

/// [`attn_chunk_group`] with 32 registers (see [`attn_chunk_avx2_evex`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn attn_chunk_group_evex<const G: usize>(c: &Chunk, st: &mut State, h0: usize) {
    let mut lanes = [[_mm256_setzero_ps(); CHUNK]; G];
    let mut t = 0;
    while t + 2 <= c.n {
        score_keys::<G, 2>(c, h0, t, &mut lanes);
        t += 2;
    }
    if t < c.n {
        score_keys::<G, 1>(c, h0, t, &mut lanes);
    }
    let mut p = [[0f32; CHUNK]; G];
    softmax_rows::<G>(c, st, h0, &lanes, &mut p);
    for d in (0..c.head_dim).step_by(32) {
        pv_dims::<G, 4>(c, st, h0, &p, d);
    }
}

/// [`attn_chunk_avx2`] on 512-bit vectors for CPUs with AVX-512F, for heads of a multiple of
/// 64 dims: a zmm holds the two 8-lane score accumulators of a (row, key), dims `d..d + 8`
/// and `d + 8..d + 16`, side by side, and PV accumulators 16 dims at a time, so each
/// instruction does the work of two of the ymm kernel's with the same lane operations in the
/// same order: the same bits. One `vcvtph2ps` converts 16 K or V values instead of 8 (the
/// conversion, not the FMAs, bounds the ymm kernel on CPUs with full-width AVX-512).
pub(super) unsafe fn attn_chunk_zmm(c: &Chunk, st: &mut State) {
    if !c.head_dim.is_multiple_of(64) {
        return attn_chunk_avx2_evex(c, st);
    }
    in_groups_of_four!(c, st, attn_chunk_group_zmm)
}

/// [`score_keys`] with each (row, key)'s two accumulators as the halves of one zmm.
#[allow(clippy::needless_range_loop)] // register arrays indexed by row/key read clearer
#[inline(always)]
unsafe fn score_keys_zmm<const G: usize, const KEYS: usize>(
    c: &Chunk,
    h0: usize,
    t0: usize,
    lanes: &mut [[__m256; CHUNK]; G],
) {
    let hd = c.head_dim;
    let mut a = [[_mm512_setzero_ps(); KEYS]; G];
    let mut d = 0;
    while d < hd {
        let mut kv = [_mm512_setzero_ps(); KEYS];
        for (u, ku) in kv.iter_mut().enumerate() {
            *ku = _mm512_cvtph_ps(_mm256_loadu_si256(c.k.add((t0 + u) * hd + d) as *const __m256i));
        }
        for h in 0..G {
            let q = _mm512_loadu_ps(c.q.as_ptr().add((h0 + h) * hd + d));
            for u in 0..KEYS {
                a[h][u] = _mm512_fmadd_ps(q, kv[u], a[h][u]);
            }
        }
        d += 16;
    }
    for h in 0..G {
        for u in 0..KEYS {
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(a[h][u])));
            lanes[h][t0 + u] = _mm256_add_ps(_mm512_castps512_ps256(a[h][u]), hi);
        }
    }
}

/// [`pv_dims`] over dims `d..d + 16 * VECS` in zmm accumulators.
#[allow(clippy::needless_range_loop)] // register arrays indexed by row/key read clearer
#[inline(always)]
unsafe fn pv_dims_zmm<const G: usize, const VECS: usize>(
    c: &Chunk,
    st: &mut State,
    h0: usize,
    p: &[[f32; CHUNK]; G],
    d: usize,
) {
    let hd = c.head_dim;
    let acc = st.acc.as_mut_ptr();
    let mut o = [[_mm512_setzero_ps(); VECS]; G];
    for h in 0..G {
        for (x, ox) in o[h].iter_mut().enumerate() {
            *ox = _mm512_loadu_ps(acc.add((h0 + h) * hd + d + 16 * x));
        }
    }
    for t in 0..c.n {
        let v = c.v.add(t * hd + d);
        let mut vv = [_mm512_setzero_ps(); VECS];
        for (x, vx) in vv.iter_mut().enumerate() {
            *vx = _mm512_cvtph_ps(_mm256_loadu_si256(v.add(16 * x) as *const __m256i));
        }
        for h in 0..G {
            let pb = _mm512_set1_ps(p[h][t]);
            for x in 0..VECS {
                o[h][x] = _mm512_fmadd_ps(pb, vv[x], o[h][x]);
            }
        }
    }
    for h in 0..G {
        for (x, ox) in o[h].iter().enumerate() {
            _mm512_storeu_ps(acc.add((h0 + h) * hd + d + 16 * x), *ox);
        }
    }
}

/// Rows `h0..h0 + G` of the chunk (see [`attn_chunk_zmm`]).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
unsafe fn attn_chunk_group_zmm<const G: usize>(c: &Chunk, st: &mut State, h0: usize) {
    let mut lanes = [[_mm256_setzero_ps(); CHUNK]; G];
    let mut t = 0;
    while t + 4 <= c.n {
        score_keys_zmm::<G, 4>(c, h0, t, &mut lanes);
        t += 4;
    }
    while t < c.n {
        score_keys_zmm::<G, 1>(c, h0, t, &mut lanes);
        t += 1;
    }
    let mut p = [[0f32; CHUNK]; G];
    softmax_rows::<G>(c, st, h0, &lanes, &mut p);
    for d in (0..c.head_dim).step_by(64) {
        pv_dims_zmm::<G, 4>(c, st, h0, &p, d);
    }
}

/// [`hsum8`] of 8 vectors at once, in key order: transposing adds that pair exactly the lanes
/// `hsum8` pairs (i with i+4, then 0+2 with 1+3 of those, then the two), so the same bits.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hsum8_x8(v: &[__m256; 8]) -> __m256 {
    // y: [t: v[i] + v[i+4], i < 4] for keys 2k (low half) and 2k+1 (high half)
    let y: [__m256; 4] = std::array::from_fn(|k| {
        let (a, b) = (v[2 * k], v[2 * k + 1]);
        _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(a, b), _mm256_permute2f128_ps::<0x31>(a, b))
    });
    // z: [y0 + y2, y1 + y3] per key; low half keys 4m, 4m+2, high half 4m+1, 4m+3
    let z: [__m256; 2] = std::array::from_fn(|m| {
        let (a, b) = (y[2 * m], y[2 * m + 1]);
        _mm256_add_ps(_mm256_shuffle_ps::<0x44>(a, b), _mm256_shuffle_ps::<0xee>(a, b))
    });
    // keys 0, 2, 4, 6 | 1, 3, 5, 7
    let s = _mm256_add_ps(_mm256_shuffle_ps::<0x88>(z[0], z[1]), _mm256_shuffle_ps::<0xdd>(z[0], z[1]));
    _mm256_permutevar8x32_ps(s, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Horizontal sum of 8 lanes, in a fixed order: ((0+4) + (2+6)) + ((1+5) + (3+7)): the
/// reference [`hsum8_x8`] is tested against.
#[cfg(test)]
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

/// `silu(x) = x / (1 + e^-x)` on 8 lanes with [`exp8`]'s polynomial, whose exponent bits
/// reach infinity from e^88.4 on: the argument is capped at 89 so that e^-x is +inf there and
/// silu(x) is -0.0 as with libm (libm's is a denormal down to x = -103, under 4e-37).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu8(x: __m256) -> __m256 {
    let e = _mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), x), _mm256_set1_ps(89.0));
    let e = exp8(e);
    _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e))
}

/// Applies `f` to `xs` 8 values at a time; a tail of fewer goes through a padded vector, so
/// every value gets the same lane arithmetic wherever it sits.
#[inline(always)]
unsafe fn map8(xs: &mut [f32], ys: Option<&[f32]>, f: impl Fn(__m256, __m256) -> __m256) {
    let n = xs.len();
    let y_at = |i: usize| ys.map_or(_mm256_setzero_ps(), |y| _mm256_loadu_ps(y.as_ptr().add(i)));
    let mut i = 0;
    while i + 8 <= n {
        let v = f(_mm256_loadu_ps(xs.as_ptr().add(i)), y_at(i));
        _mm256_storeu_ps(xs.as_mut_ptr().add(i), v);
        i += 8;
    }
    if i < n {
        let (mut x, mut y) = ([0f32; 8], [0f32; 8]);
        x[..n - i].copy_from_slice(&xs[i..]);
        if let Some(ys) = ys {
            y[..n - i].copy_from_slice(&ys[i..n]);
        }
        let v = f(_mm256_loadu_ps(x.as_ptr()), _mm256_loadu_ps(y.as_ptr()));
        _mm256_storeu_ps(x.as_mut_ptr(), v);
        xs[i..].copy_from_slice(&x[..n - i]);
    }
}

/// `xs[i] = silu(xs[i])` ([`silu8`]).
///
/// # Safety
/// AVX2 and FMA present.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn silu_avx2(xs: &mut [f32]) {
    map8(xs, None, |x, _| silu8(x))
}

/// `gate[i] = silu(gate[i]) * up[i]` ([`silu8`]); `up` at least as long as `gate`.
///
/// # Safety
/// AVX2 and FMA present.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
    assert!(up.len() >= gate.len(), "silu_mul: short up");
    map8(gate, Some(up), |g, u| _mm256_mul_ps(silu8(g), u))
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
        256 => attn_wide_nv::<16>(chunks, qt, nlb, ws),
        _ => unreachable!("attention only selects the wide kernel for these head sizes"),
    }
}

/// Score partials of a chunk's key slots for one vector of rows: `[partial l][key slot]`.
pub(super) type Partials<V> = [[V; CHUNK]; 16];

/// Keys whose score partials one pass of [`scores_half`] keeps in registers (with the q
/// vector: 9 of the 16 ymm registers).
const SCORE_KEYS: usize = 8;

/// Scores of all [`CHUNK`] key slots of the chunk in `kf` (f32 rows, stride `NV * 16`) for 8
/// rows, in the chunk kernel's order per (row, key): partial `l` (0..16) over dims
/// `l, l + 16, ...` as one product then FMAs in order (the chunk kernel's lane `l % 8` of
/// accumulator `l / 8`), then `v_i = p_i + p_(i+8)` and `hsum8`'s tree
/// `((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7))`.
///
/// One partial at a time for [`SCORE_KEYS`] keys: each q vector feeds that many independent
/// FMA chains; the partials wait in `part` (L1, the caller's, so not zeroed per call) for the tree. Slots past the chunk's keys
/// read stale finite rows of `kf`; the caller ignores their scores.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_half<const NV: usize>(
    qp: *const f32,
    kf: *const f32,
    part: &mut Partials<__m256>,
    s: &mut [__m256; CHUNK],
) {
    let hd = NV * 16;
    for t0 in (0..CHUNK).step_by(SCORE_KEYS) {
        for (l, pl) in part.iter_mut().enumerate() {
            let q0 = _mm256_loadu_ps(qp.add(l * 16));
            let mut x = [_mm256_setzero_ps(); SCORE_KEYS];
            for (u, xu) in x.iter_mut().enumerate() {
                *xu = _mm256_mul_ps(q0, _mm256_set1_ps(*kf.add((t0 + u) * hd + l)));
            }
            for j in 1..NV {
                let qj = _mm256_loadu_ps(qp.add((16 * j + l) * 16));
                for (u, xu) in x.iter_mut().enumerate() {
                    *xu = _mm256_fmadd_ps(qj, _mm256_set1_ps(*kf.add((t0 + u) * hd + 16 * j + l)), *xu);
                }
            }
            pl[t0..t0 + SCORE_KEYS].copy_from_slice(&x);
        }
    }
    for (t, st) in s.iter_mut().enumerate() {
        let v = |i: usize| _mm256_add_ps(part[i][t], part[i + 8][t]);
        let z0 = _mm256_add_ps(_mm256_add_ps(v(0), v(4)), _mm256_add_ps(v(2), v(6)));
        let z1 = _mm256_add_ps(_mm256_add_ps(v(1), v(5)), _mm256_add_ps(v(3), v(7)));
        *st = _mm256_add_ps(z0, z1);
    }
}

#[allow(clippy::needless_range_loop)] // register arrays indexed by key/dim read clearer
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attn_wide_nv<const NV: usize>(chunks: &[ChunkRef], qt: &[f32], nlb: usize, ws: &mut WideState) {
    let hd = NV * 16;
    let (mv, lv, acct) = (&mut ws.m, &mut ws.l, &mut ws.acc);
    // Key slots past `n` hold finite stale rows (their scores are ignored).
    let mut kf = [0f32; CHUNK * 256];
    let mut vf = [0f32; CHUNK * 256];
    let mut part = [[_mm256_setzero_ps(); CHUNK]; 16];
    for (ci, c) in chunks.iter().enumerate() {
        let n = c.n;
        if let Some(next) = chunks.get(ci + 1) {
            next.prefetch(hd);
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
            scores_half::<NV>(qp, kf.as_ptr(), &mut part, &mut s);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_sums_at_once_add_the_same_pairs_as_one_at_a_time() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        for seed in 0..100u32 {
            let vals: [[f32; 8]; 8] = std::array::from_fn(|t| {
                std::array::from_fn(|i| {
                    let h = seed.wrapping_mul(2654435761) ^ (t as u32 * 97 + i as u32).wrapping_mul(40503);
                    ((h % 200_003) as f32 - 100_000.0) * 1.3e-4 * if i % 3 == 0 { 1e3 } else { 1.0 }
                })
            });
            // SAFETY: AVX2 checked above; every pointer is to 8 floats.
            unsafe {
                let v: [__m256; 8] = std::array::from_fn(|t| _mm256_loadu_ps(vals[t].as_ptr()));
                let mut got = [0f32; 8];
                _mm256_storeu_ps(got.as_mut_ptr(), hsum8_x8(&v));
                for t in 0..8 {
                    assert_eq!(got[t].to_bits(), hsum8(v[t]).to_bits(), "key {t}");
                }
            }
        }
    }
}
