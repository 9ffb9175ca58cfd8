//! AVX-512 rows-in-lanes attention for the heads whose chunk (decode) kernel on this kernel
//! set is the AVX2 one: 256 dims (Qwen3.6's full attention), which do not keep q in the 32
//! registers of the AVX-512 chunk kernel. It is the AVX2 wide kernel ([`super::x86_avx2`])
//! with a whole lane block of 16 rows in one vector instead of two halves of 8: every lane does
//! that kernel's operations in the same order (the same score partials and sum tree, the same
//! exp polynomial, libm's `exp` for the rescale, the probability sum over the chunk's slots,
//! PV in key order), so each row still gets the AVX2 chunk kernel's bits
//! (`wide_kernel_gives_each_row_the_chunk_kernels_bits`), at twice the lanes per instruction.
//! Prefill and tree verification over long cached prefixes spend most of their time here.

#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use super::attention::{CHUNK, ChunkRef, WideState};
use super::x86_avx2::Partials;
// The AVX-512 set's exp: the AVX2 kernel's `exp8` polynomial lane by lane; its final
// `scalef` rounds `p * 2^n` exactly as `exp8`'s multiply by a built 2^n does.
use super::x86::{exp_ps as exp16, pv_lane_block};

/// Scores of all [`CHUNK`] key slots of the chunk in `kf` (f32 rows, stride `NV * 16`) for
/// the 16 rows of a lane block, in the AVX2 kernel's order per (row, key): partial `l`
/// (0..16) over dims `l, l + 16, ...` as one product then FMAs in order, then the tree
/// `v_i = p_i + p_(i+8)`, `((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7))`.
///
/// One partial at a time for all 16 keys: each q vector is loaded once per chunk and feeds
/// 16 independent FMA chains (the key broadcasts come from memory), so the FMA units stay
/// busy; the partials wait in `part` (L1, the caller's, so not zeroed per call) for the tree. Slots past the chunk's keys read
/// stale finite rows of `kf`; the caller ignores their scores.
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn scores_block<const NV: usize>(
    qp: *const f32,
    kf: *const f32,
    part: &mut Partials<__m512>,
    s: &mut [__m512; CHUNK],
) {
    let hd = NV * 16;
    for (l, pl) in part.iter_mut().enumerate() {
        let q0 = _mm512_loadu_ps(qp.add(l * 16));
        let mut x = [_mm512_setzero_ps(); CHUNK];
        for (t, xt) in x.iter_mut().enumerate() {
            *xt = _mm512_mul_ps(q0, _mm512_set1_ps(*kf.add(t * hd + l)));
        }
        for j in 1..NV {
            let qj = _mm512_loadu_ps(qp.add((16 * j + l) * 16));
            for (t, xt) in x.iter_mut().enumerate() {
                *xt = _mm512_fmadd_ps(qj, _mm512_set1_ps(*kf.add(t * hd + 16 * j + l)), *xt);
            }
        }
        *pl = x;
    }
    for (t, st) in s.iter_mut().enumerate() {
        let v = |i: usize| _mm512_add_ps(part[i][t], part[i + 8][t]);
        let z0 = _mm512_add_ps(_mm512_add_ps(v(0), v(4)), _mm512_add_ps(v(2), v(6)));
        let z1 = _mm512_add_ps(_mm512_add_ps(v(1), v(5)), _mm512_add_ps(v(3), v(7)));
        *st = _mm512_add_ps(z0, z1);
    }
}

/// Rows-in-lanes attention for 256-dim heads (see the module docs). `qt`/`ws` hold 16 rows
/// per lane block (`[lane block][d][16]`).
///
/// # Safety
/// AVX-512F, FMA and F16C present (the dispatcher checks); chunks valid for `n * hd` reads
/// of K and V; `qt` and `ws` sized for `nlb` lane blocks.
pub(super) unsafe fn attn_wide_256(chunks: &[ChunkRef], qt: &[f32], nlb: usize, ws: &mut WideState) {
    assert!(
        qt.len() >= nlb * 256 * 16 && ws.acc.len() >= nlb * 256 * 16 && ws.m.len() >= nlb * 16,
        "attn_wide: short buffers"
    );
    attn_wide_nv::<16>(chunks, qt, nlb, ws)
}

#[allow(clippy::needless_range_loop)] // register arrays indexed by key/dim read clearer
#[target_feature(enable = "avx512f,avx512vl,fma,f16c")]
unsafe fn attn_wide_nv<const NV: usize>(chunks: &[ChunkRef], qt: &[f32], nlb: usize, ws: &mut WideState) {
    let hd = NV * 16;
    let (mv, lv, acct) = (&mut ws.m, &mut ws.l, &mut ws.acc);
    // Key slots past `n` hold finite stale rows (their scores are ignored).
    let mut kf = [0f32; CHUNK * 256];
    let mut vf = [0f32; CHUNK * 256];
    let mut part = [[_mm512_setzero_ps(); CHUNK]; 16];
    for (ci, c) in chunks.iter().enumerate() {
        let n = c.n;
        if let Some(next) = chunks.get(ci + 1) {
            next.prefetch(hd);
        }
        let mut i = 0;
        while i < n * hd {
            _mm512_storeu_ps(kf.as_mut_ptr().add(i), _mm512_cvtph_ps(_mm256_loadu_si256(c.k.add(i) as *const __m256i)));
            _mm512_storeu_ps(vf.as_mut_ptr().add(i), _mm512_cvtph_ps(_mm256_loadu_si256(c.v.add(i) as *const __m256i)));
            i += 16;
        }
        for lb in 0..nlb {
            let qp = qt.as_ptr().add(lb * hd * 16);
            let ap = acct.as_mut_ptr().add(lb * hd * 16);
            let lane0 = lb * 16;
            let mut s = [_mm512_setzero_ps(); CHUNK];
            scores_block::<NV>(qp, kf.as_ptr(), &mut part, &mut s);
            let mut mx = s[0];
            for t in 1..n {
                mx = _mm512_max_ps(mx, s[t]);
            }
            let m_old = _mm512_loadu_ps(mv.as_ptr().add(lane0));
            let m_new = _mm512_max_ps(m_old, mx);
            let mut p = [_mm512_setzero_ps(); CHUNK];
            for t in 0..n {
                p[t] = exp16(_mm512_sub_ps(s[t], m_new));
            }
            // The chunk kernel's sum over all 16 slots in key order (slots past n are zero).
            let mut psum = p[0];
            for t in 1..CHUNK {
                psum = _mm512_add_ps(psum, p[t]);
            }
            let mut l = _mm512_loadu_ps(lv.as_ptr().add(lane0));
            if _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(m_new, m_old) != 0 {
                // Lanes whose max moved rescale by libm's exp, as the chunk kernel does; the
                // others by exactly 1 (the chunk kernel skips that multiply: same bits).
                let (mut mo, mut mn, mut alpha) = ([0f32; 16], [0f32; 16], [1f32; 16]);
                _mm512_storeu_ps(mo.as_mut_ptr(), m_old);
                _mm512_storeu_ps(mn.as_mut_ptr(), m_new);
                for lane in 0..16 {
                    if mn[lane] != mo[lane] {
                        alpha[lane] = if mo[lane] == f32::NEG_INFINITY { 0.0 } else { (mo[lane] - mn[lane]).exp() };
                    }
                }
                let av = _mm512_loadu_ps(alpha.as_ptr());
                l = _mm512_mul_ps(l, av);
                for d in 0..hd {
                    _mm512_storeu_ps(ap.add(d * 16), _mm512_mul_ps(_mm512_loadu_ps(ap.add(d * 16)), av));
                }
                _mm512_storeu_ps(mv.as_mut_ptr().add(lane0), m_new);
            }
            _mm512_storeu_ps(lv.as_mut_ptr().add(lane0), _mm512_add_ps(l, psum));
            // PV: 16 dims at a time in registers, keys in order.
            pv_lane_block::<NV>(ap, &p, &vf, n);
        }
    }
}
