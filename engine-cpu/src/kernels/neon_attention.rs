//! NEON attention chunk kernel (Thor). Like the x86 chunk kernels, it does each query row's
//! arithmetic from that row and the chunk's keys only, so the attention exactness contract
//! (bits independent of chunking, batching, threads and prefix reuse; tree rows equal their
//! chains) holds by construction. Per row: each score is two 4-lane FMA accumulators over
//! head_dim (dims `d..d+4` and `d+4..d+8` of every 8), added lane by lane and summed across
//! lanes by `faddp`; the max over the chunk; [`exp4`] (the x86 `exp8`'s polynomial); the
//! probability sum in key order; libm's `exp` for the rescale; PV as broadcast FMAs over
//! head_dim in key order. K and V are widened from f16 in registers (`fcvtl`), once per group
//! of up to 4 rows: decode at depth is bound by reading K/V, and the scalar kernel's f32 copy
//! of every chunk doubled what it touched.

#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::aarch64::*;
use std::arch::asm;

use super::attention::{CHUNK, Chunk, State};
use super::neon::exp4;

/// 8 f16 values at `p` widened to two f32 vectors (`fcvtl`/`fcvtl2`: exact, subnormals,
/// infinities and NaN included). Rust 1.95 has no stable f16 vector type, hence the asm.
#[inline(always)]
unsafe fn load_f16x8(p: *const u16) -> [float32x4_t; 2] {
    let h = vld1q_u16(p);
    let (lo, hi): (float32x4_t, float32x4_t);
    asm!(
        "fcvtl {lo:v}.4s, {h:v}.4h",
        "fcvtl2 {hi:v}.4s, {h:v}.8h",
        h = in(vreg) h,
        lo = out(vreg) lo,
        hi = out(vreg) hi,
        options(pure, nomem, nostack, preserves_flags),
    );
    [lo, hi]
}

/// Online-softmax attention over one chunk of <= 16 keys for the chunk's `g` stacked rows,
/// in groups of up to 4 rows (see the module docs). Heads that are not a multiple of 16 dims
/// take the scalar reference kernel.
pub(super) unsafe fn attn_chunk_neon(c: &Chunk, st: &mut State) {
    if !c.head_dim.is_multiple_of(16) {
        return super::attention::chunk_scalar(c, st);
    }
    let mut h0 = 0;
    while h0 < c.g {
        let g = (c.g - h0).min(4);
        match g {
            4 => chunk_group::<4>(c, st, h0),
            3 => chunk_group::<3>(c, st, h0),
            2 => chunk_group::<2>(c, st, h0),
            _ => chunk_group::<1>(c, st, h0),
        }
        h0 += g;
    }
}

/// Scores of keys `t0..t0 + KEYS` for rows `h0..h0 + G` (see the module docs).
#[allow(clippy::needless_range_loop)] // register arrays indexed by row/key read clearer
#[inline(always)]
unsafe fn score_keys<const G: usize, const KEYS: usize>(c: &Chunk, h0: usize, t0: usize, s: &mut [[f32; CHUNK]; G]) {
    let hd = c.head_dim;
    let mut a = [[[vdupq_n_f32(0.0); 2]; KEYS]; G];
    let mut d = 0;
    while d < hd {
        let mut kv = [[vdupq_n_f32(0.0); 2]; KEYS];
        for (u, ku) in kv.iter_mut().enumerate() {
            *ku = load_f16x8(c.k.add((t0 + u) * hd + d));
        }
        for h in 0..G {
            let q = c.q.as_ptr().add((h0 + h) * hd + d);
            let (q0, q1) = (vld1q_f32(q), vld1q_f32(q.add(4)));
            for u in 0..KEYS {
                a[h][u][0] = vfmaq_f32(a[h][u][0], q0, kv[u][0]);
                a[h][u][1] = vfmaq_f32(a[h][u][1], q1, kv[u][1]);
            }
        }
        d += 8;
    }
    for h in 0..G {
        for u in 0..KEYS {
            s[h][t0 + u] = vaddvq_f32(vaddq_f32(a[h][u][0], a[h][u][1]));
        }
    }
}

/// PV for rows `h0..h0 + G` over dims `d..d + 16`, keys in order, accumulators in registers.
#[allow(clippy::needless_range_loop)] // register arrays indexed by row/key read clearer
#[inline(always)]
unsafe fn pv_dims<const G: usize>(c: &Chunk, st: &mut State, h0: usize, p: &[[f32; CHUNK]; G], d: usize) {
    let hd = c.head_dim;
    let acc = st.acc.as_mut_ptr();
    let mut o = [[vdupq_n_f32(0.0); 4]; G];
    for h in 0..G {
        for (x, ox) in o[h].iter_mut().enumerate() {
            *ox = vld1q_f32(acc.add((h0 + h) * hd + d + 4 * x));
        }
    }
    for t in 0..c.n {
        let v = c.v.add(t * hd + d);
        let [v0, v1] = load_f16x8(v);
        let [v2, v3] = load_f16x8(v.add(8));
        let vv = [v0, v1, v2, v3];
        for h in 0..G {
            let pb = vdupq_n_f32(p[h][t]);
            for x in 0..4 {
                o[h][x] = vfmaq_f32(o[h][x], pb, vv[x]);
            }
        }
    }
    for h in 0..G {
        for (x, ox) in o[h].iter().enumerate() {
            vst1q_f32(acc.add((h0 + h) * hd + d + 4 * x), *ox);
        }
    }
}

/// Rows `h0..h0 + G` of the chunk (see [`attn_chunk_neon`]).
#[allow(clippy::needless_range_loop)] // register arrays indexed by row/key read clearer
#[target_feature(enable = "neon")]
unsafe fn chunk_group<const G: usize>(c: &Chunk, st: &mut State, h0: usize) {
    let (hd, n) = (c.head_dim, c.n);
    let mut s = [[0f32; CHUNK]; G];
    let mut t = 0;
    while t + 2 <= n {
        score_keys::<G, 2>(c, h0, t, &mut s);
        t += 2;
    }
    if t < n {
        score_keys::<G, 1>(c, h0, t, &mut s);
    }
    let mut p = [[0f32; CHUNK]; G];
    for h in 0..G {
        let hh = h0 + h;
        let m_old = st.m[hh];
        let m_new = s[h][..n].iter().fold(m_old, |a, &b| a.max(b));
        let mv = vdupq_n_f32(m_new);
        for q4 in 0..CHUNK / 4 {
            let e = exp4(vsubq_f32(vld1q_f32(s[h].as_ptr().add(4 * q4)), mv));
            vst1q_f32(p[h].as_mut_ptr().add(4 * q4), e);
        }
        p[h][n..].fill(0.0);
        // key order, as a scalar loop over the keys
        let psum = p[h][..n].iter().fold(0.0f32, |a, &b| a + b);
        if m_new == m_old {
            // the running max did not move: alpha would be exactly 1
            st.l[hh] += psum;
        } else {
            let alpha = if m_old == f32::NEG_INFINITY { 0.0 } else { (m_old - m_new).exp() };
            st.l[hh] = st.l[hh] * alpha + psum;
            st.m[hh] = m_new;
            let av = vdupq_n_f32(alpha);
            let acc = st.acc.as_mut_ptr().add(hh * hd);
            for d in (0..hd).step_by(4) {
                vst1q_f32(acc.add(d), vmulq_f32(vld1q_f32(acc.add(d)), av));
            }
        }
    }
    for d in (0..hd).step_by(16) {
        pv_dims::<G>(c, st, h0, &p, d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_widening_is_exact_for_every_bit_pattern() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        for c in all.chunks_exact(8) {
            // SAFETY: 8 values; NEON is baseline on aarch64.
            let [lo, hi] = unsafe { load_f16x8(c.as_ptr()) };
            let mut got = [0f32; 8];
            unsafe {
                vst1q_f32(got.as_mut_ptr(), lo);
                vst1q_f32(got.as_mut_ptr().add(4), hi);
            }
            for (&h, &g) in c.iter().zip(&got) {
                let want = super::super::quant::f16_to_f32(h);
                assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()), "f16 {h:#06x}: {g} vs {want}");
            }
        }
    }
}
