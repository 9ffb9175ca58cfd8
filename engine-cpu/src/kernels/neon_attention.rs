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
//!
//! The wide kernel [`attn_wide_neon`] (prefill and verification at depth: many stacked rows
//! over the same keys) puts 4 rows in the lanes and repeats, lane by lane, exactly the chunk
//! kernel's operations (the same eight dot-product partials and their tree, `exp4`, the
//! probability sum in key order, libm's `exp` for the rescale, PV in key order), so a row
//! gets the same bits from either kernel (`wide_kernel_gives_each_row_the_chunk_kernels_bits`).

#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::aarch64::*;
use std::arch::asm;

use super::attention::{CHUNK, Chunk, ChunkRef, State, WideState, in_groups_of_four};
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
    in_groups_of_four!(c, st, chunk_group)
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

/// Rows-in-lanes attention (see the module docs). `qt`/`ws` hold 16 rows per lane block
/// (`[lane block][d][16]`); each block runs as four quarters of 4 lanes.
///
/// # Safety
/// Chunks valid for `n * hd` reads of K and V; `qt` and `ws` sized for `nlb` lane blocks.
pub(super) unsafe fn attn_wide_neon(chunks: &[ChunkRef], qt: &[f32], nlb: usize, hd: usize, ws: &mut WideState) {
    assert!(
        qt.len() >= nlb * hd * 16 && ws.acc.len() >= nlb * hd * 16 && ws.m.len() >= nlb * 16,
        "attn_wide: short buffers"
    );
    match hd {
        16 => wide_nv::<2>(chunks, qt, nlb, ws),
        32 => wide_nv::<4>(chunks, qt, nlb, ws),
        64 => wide_nv::<8>(chunks, qt, nlb, ws),
        128 => wide_nv::<16>(chunks, qt, nlb, ws),
        256 => wide_nv::<32>(chunks, qt, nlb, ws),
        _ => unreachable!("attention only selects the wide kernel for these head sizes"),
    }
}

/// Keys whose score partials one pass of [`scores_quarter`] keeps in registers.
const SCORE_KEYS: usize = 8;

/// Scores of all [`CHUNK`] key slots of the chunk in `kf` (f32 rows, stride `NV * 8`) for 4
/// rows, in the chunk kernel's order per (row, key): partial `l` (0..8) over dims
/// `l, l + 8, ...` as FMAs in order from zero (the chunk kernel's lane `l % 4` of accumulator
/// `l / 4`), then `((p0+p4) + (p1+p5)) + ((p2+p6) + (p3+p7))` (its lane-wise add and
/// `faddp` pair). One partial at a time for [`SCORE_KEYS`] keys; the partials wait in
/// `part` (L1) for the tree. Slots past the chunk's keys read stale finite rows of `kf`; the
/// caller ignores their scores.
#[inline(always)]
unsafe fn scores_quarter<const NV: usize>(
    qp: *const f32,
    kf: *const f32,
    part: &mut [[float32x4_t; CHUNK]; 8],
    s: &mut [float32x4_t; CHUNK],
) {
    let hd = NV * 8;
    for t0 in (0..CHUNK).step_by(SCORE_KEYS) {
        for (l, pl) in part.iter_mut().enumerate() {
            let mut x = [vdupq_n_f32(0.0); SCORE_KEYS];
            for j in 0..NV {
                let qj = vld1q_f32(qp.add((8 * j + l) * 16));
                for (u, xu) in x.iter_mut().enumerate() {
                    *xu = vfmaq_n_f32(*xu, qj, *kf.add((t0 + u) * hd + 8 * j + l));
                }
            }
            pl[t0..t0 + SCORE_KEYS].copy_from_slice(&x);
        }
    }
    for (t, st) in s.iter_mut().enumerate() {
        let v = |i: usize| vaddq_f32(part[i][t], part[i + 4][t]);
        *st = vaddq_f32(vaddq_f32(v(0), v(1)), vaddq_f32(v(2), v(3)));
    }
}

#[allow(clippy::needless_range_loop)] // register arrays indexed by key/dim read clearer
#[target_feature(enable = "neon")]
unsafe fn wide_nv<const NV: usize>(chunks: &[ChunkRef], qt: &[f32], nlb: usize, ws: &mut WideState) {
    let hd = NV * 8;
    let (mv, lv, acct) = (&mut ws.m, &mut ws.l, &mut ws.acc);
    // Key slots past `n` hold finite stale rows (their scores are ignored).
    let mut kf = [0f32; CHUNK * 256];
    let mut vf = [0f32; CHUNK * 256];
    let mut part = [[vdupq_n_f32(0.0); CHUNK]; 8];
    for (ci, c) in chunks.iter().enumerate() {
        let n = c.n;
        if let Some(next) = chunks.get(ci + 1) {
            next.prefetch(hd);
        }
        for i in (0..n * hd).step_by(8) {
            let [k0, k1] = load_f16x8(c.k.add(i));
            let [v0, v1] = load_f16x8(c.v.add(i));
            vst1q_f32(kf.as_mut_ptr().add(i), k0);
            vst1q_f32(kf.as_mut_ptr().add(i + 4), k1);
            vst1q_f32(vf.as_mut_ptr().add(i), v0);
            vst1q_f32(vf.as_mut_ptr().add(i + 4), v1);
        }
        for quarter_block in 0..4 * nlb {
            let (lb, quarter) = (quarter_block / 4, quarter_block % 4);
            let qp = qt.as_ptr().add(lb * hd * 16 + 4 * quarter);
            let ap = acct.as_mut_ptr().add(lb * hd * 16 + 4 * quarter);
            let lane0 = lb * 16 + 4 * quarter;
            let mut s = [vdupq_n_f32(0.0); CHUNK];
            scores_quarter::<NV>(qp, kf.as_ptr(), &mut part, &mut s);
            let mut mx = s[0];
            for t in 1..n {
                mx = vmaxq_f32(mx, s[t]);
            }
            let m_old = vld1q_f32(mv.as_ptr().add(lane0));
            let m_new = vmaxq_f32(m_old, mx);
            let mut p = [vdupq_n_f32(0.0); CHUNK];
            for t in 0..n {
                p[t] = exp4(vsubq_f32(s[t], m_new));
            }
            // The chunk kernel's sum in key order (slots past n are zero: exact).
            let mut psum = p[0];
            for t in 1..CHUNK {
                psum = vaddq_f32(psum, p[t]);
            }
            let mut l = vld1q_f32(lv.as_ptr().add(lane0));
            if vmaxvq_u32(vmvnq_u32(vceqq_f32(m_new, m_old))) != 0 {
                // Lanes whose max moved rescale by libm's exp, as the chunk kernel does; the
                // others by exactly 1 (the chunk kernel skips that multiply: same bits).
                let (mut mo, mut mn, mut alpha) = ([0f32; 4], [0f32; 4], [1f32; 4]);
                vst1q_f32(mo.as_mut_ptr(), m_old);
                vst1q_f32(mn.as_mut_ptr(), m_new);
                for lane in 0..4 {
                    if mn[lane] != mo[lane] {
                        alpha[lane] = if mo[lane] == f32::NEG_INFINITY { 0.0 } else { (mo[lane] - mn[lane]).exp() };
                    }
                }
                let av = vld1q_f32(alpha.as_ptr());
                l = vmulq_f32(l, av);
                for d in 0..hd {
                    vst1q_f32(ap.add(d * 16), vmulq_f32(vld1q_f32(ap.add(d * 16)), av));
                }
                vst1q_f32(mv.as_mut_ptr().add(lane0), m_new);
            }
            vst1q_f32(lv.as_mut_ptr().add(lane0), vaddq_f32(l, psum));
            // PV: 16 dims at a time in registers, keys in order.
            for db in 0..hd / 16 {
                let mut acc = [vdupq_n_f32(0.0); 16];
                for k in 0..16 {
                    acc[k] = vld1q_f32(ap.add((db * 16 + k) * 16));
                }
                for t in 0..n {
                    for k in 0..16 {
                        acc[k] = vfmaq_n_f32(acc[k], p[t], vf[t * hd + db * 16 + k]);
                    }
                }
                for k in 0..16 {
                    vst1q_f32(ap.add((db * 16 + k) * 16), acc[k]);
                }
            }
        }
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
