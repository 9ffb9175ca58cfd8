//! aarch64 NEON kernels (Thor). Plain NEON only: `sdot`/`i8mm` intrinsics are unstable in
//! Rust 1.95, so the packed GEMM widens with `smull` + pairwise adds (4 rows per 128-bit
//! vector of the 16-row tile). Also the vector `exp` and SiLU the NEON set's attention
//! ([`super::neon_attention`]) and activations use.

#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::aarch64::*;
use std::ops::Range;

use super::Dispatch;
use super::matmul::{OutPtr, PackedMatrix, TILE_ROWS, tile_bytes};
use super::quant::{GgmlType, Q8Acts, QK, f16_to_f32};

static NEON: Dispatch = Dispatch {
    name: "neon",
    quantize_q8: quantize_q8_neon_safe,
    dot_f32: dot_f32_neon_safe,
    packed_gemm: packed_gemm_neon,
    attn_chunk: super::neon_attention::attn_chunk_neon,
    attn_wide: Some(super::neon_attention::attn_wide_neon),
};

pub(crate) fn available() -> Vec<&'static Dispatch> {
    if std::arch::is_aarch64_feature_detected!("neon") { vec![&NEON] } else { Vec::new() }
}

fn quantize_q8_neon_safe(x: &[f32], q: &mut [i8]) -> (f32, f32) {
    assert!(x.len() >= QK && q.len() >= QK);
    // SAFETY: NEON detected before this table is used; lengths checked above.
    unsafe { quantize_q8_neon(x.as_ptr(), q.as_mut_ptr()) }
}

#[target_feature(enable = "neon")]
unsafe fn quantize_q8_neon(x: *const f32, q: *mut i8) -> (f32, f32) {
    let mut v = [vdupq_n_f32(0.0); 8];
    let mut amax = vdupq_n_f32(0.0);
    for (i, vi) in v.iter_mut().enumerate() {
        *vi = vld1q_f32(x.add(4 * i));
        amax = vmaxq_f32(amax, vabsq_f32(*vi));
    }
    let d = vmaxvq_f32(amax) / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = vdupq_n_s32(0);
    for i in 0..4 {
        let a = vcvtnq_s32_f32(vmulq_n_f32(v[2 * i], id));
        let b = vcvtnq_s32_f32(vmulq_n_f32(v[2 * i + 1], id));
        sum = vaddq_s32(sum, vaddq_s32(a, b));
        let narrow = vqmovn_s16(vcombine_s16(vqmovn_s32(a), vqmovn_s32(b)));
        vst1_s8(q.add(8 * i), narrow);
    }
    (d, d * vaddvq_s32(sum) as f32)
}

fn dot_f32_neon_safe(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    // SAFETY: reads stay below n.
    unsafe { dot_f32_neon(a.as_ptr(), b.as_ptr(), n) }
}

#[target_feature(enable = "neon")]
unsafe fn dot_f32_neon(a: *const f32, b: *const f32, n: usize) -> f32 {
    let mut acc0 = vdupq_n_f32(0.0);
    let mut acc1 = vdupq_n_f32(0.0);
    let mut k = 0;
    while k + 8 <= n {
        acc0 = vfmaq_f32(acc0, vld1q_f32(a.add(k)), vld1q_f32(b.add(k)));
        acc1 = vfmaq_f32(acc1, vld1q_f32(a.add(k + 4)), vld1q_f32(b.add(k + 4)));
        k += 8;
    }
    let mut s = vaddvq_f32(vaddq_f32(acc0, acc1));
    while k < n {
        s += *a.add(k) * *b.add(k);
        k += 1;
    }
    s
}

/// Sums of 4 rows (4 bytes each in `w`) times the 4 activation bytes broadcast in `a`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn dot4x4(w: int8x16_t, a: int8x16_t) -> int32x4_t {
    let lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(a)));
    let hi = vpaddlq_s16(vmull_high_s8(w, a));
    vpaddq_s32(lo, hi)
}

unsafe fn packed_gemm_neon(w: &PackedMatrix, a: &Q8Acts, g: Range<usize>, out: OutPtr) {
    match w.dtype {
        GgmlType::Q4_1 | GgmlType::Q4_0 | GgmlType::Q8_0 => packed_gemm_neon_q(w, a, g, out),
        _ => super::matmul::packed_gemm_scalar(w, a, g, out),
    }
}

#[target_feature(enable = "neon")]
unsafe fn packed_gemm_neon_q(w: &PackedMatrix, a: &Q8Acts, g: Range<usize>, out: OutPtr) {
    let nb = w.cols / QK;
    let tb = tile_bytes(w.dtype);
    let q8 = w.dtype == GgmlType::Q8_0;
    let data = w.bytes().as_ptr();
    let mask = vdupq_n_u8(0x0f);
    let flip = vdupq_n_u8(0x80);
    for gi in g {
        for m in 0..a.m_rows {
            let mut acc = [vdupq_n_f32(0.0); 4];
            for b in 0..nb {
                let tile = data.add((gi * nb + b) * tb);
                let aq = a.qs.as_ptr().add(m * a.cols + b * QK);
                let mut isum = [vdupq_n_s32(0); 4];
                // vector j of the tile pairs with activation bytes 4j..4j+4 (PackedMatrix docs)
                for j in 0..(if q8 { 8 } else { 4 }) {
                    for (quad, s) in isum.iter_mut().enumerate() {
                        let raw = vld1q_u8(tile.add(64 * j + 16 * quad));
                        if q8 {
                            let av = vreinterpretq_s8_s32(vdupq_n_s32((aq.add(4 * j) as *const i32).read_unaligned()));
                            // stored q+128: flip back to signed (the offset term is then zero)
                            *s = vaddq_s32(*s, dot4x4(vreinterpretq_s8_u8(veorq_u8(raw, flip)), av));
                        } else {
                            let alo = vreinterpretq_s8_s32(vdupq_n_s32((aq.add(8 * j) as *const i32).read_unaligned()));
                            let ahi =
                                vreinterpretq_s8_s32(vdupq_n_s32((aq.add(8 * j + 4) as *const i32).read_unaligned()));
                            let lo = vreinterpretq_s8_u8(vandq_u8(raw, mask));
                            let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(raw));
                            *s = vaddq_s32(*s, vaddq_s32(dot4x4(lo, alo), dot4x4(hi, ahi)));
                        }
                    }
                }
                let da = a.d[m * nb + b];
                let sa = a.s[m * nb + b];
                let (doff, moff) = if q8 { (512, 0) } else { (256, 288) };
                for (quad, acc_q) in acc.iter_mut().enumerate() {
                    let mut dv = [0f32; 4];
                    let mut cv = [0f32; 4];
                    for r in 0..4 {
                        let row = 4 * quad + r;
                        let d = f16_to_f32((tile.add(doff + 2 * row) as *const u16).read_unaligned());
                        dv[r] = d * da;
                        cv[r] = match w.dtype {
                            GgmlType::Q4_1 => {
                                f16_to_f32((tile.add(moff + 2 * row) as *const u16).read_unaligned()) * sa
                            }
                            GgmlType::Q4_0 => -8.0 * d * sa,
                            _ => 0.0,
                        };
                    }
                    let f = vcvtq_f32_s32(isum[quad]);
                    *acc_q = vfmaq_f32(vaddq_f32(*acc_q, vld1q_f32(cv.as_ptr())), f, vld1q_f32(dv.as_ptr()));
                }
            }
            let rows = (w.rows - gi * TILE_ROWS).min(TILE_ROWS);
            let mut res = [0f32; TILE_ROWS];
            for (quad, acc_q) in acc.iter().enumerate() {
                vst1q_f32(res.as_mut_ptr().add(4 * quad), *acc_q);
            }
            for (r, &v) in res.iter().enumerate().take(rows) {
                *out.0.add(m * w.rows + gi * TILE_ROWS + r) = v;
            }
        }
    }
}

/// e^x for x <= 0 (softmax arguments), relative error ~1e-7: the x86 `exp8`'s polynomial on
/// 4 lanes. x = n ln2 + r with |r| <= ln2/2, a degree-6 Taylor polynomial in r, times 2^n
/// built in the exponent bits; arguments below -87 are clamped there (e^-87 ~ 1.6e-38, still
/// a normal f32).
#[inline(always)]
pub(super) unsafe fn exp4(x: float32x4_t) -> float32x4_t {
    let x = vmaxq_f32(x, vdupq_n_f32(-87.0));
    let n = vrndnq_f32(vmulq_n_f32(x, std::f32::consts::LOG2_E));
    let r = vfmsq_f32(x, n, vdupq_n_f32(0.693_145_75));
    let r = vfmsq_f32(r, n, vdupq_n_f32(1.428_606_8e-6));
    let mut p = vdupq_n_f32(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = vfmaq_f32(vdupq_n_f32(c), p, r);
    }
    let scale = vreinterpretq_f32_s32(vshlq_n_s32::<23>(vaddq_s32(vcvtnq_s32_f32(n), vdupq_n_s32(127))));
    vmulq_f32(p, scale)
}

/// `silu(x) = x / (1 + e^-x)` on 4 lanes with [`exp4`], whose exponent bits reach infinity
/// from e^88.4 on: the argument is capped at 89 so that e^-x is +inf there and silu(x) is
/// -0.0 as with libm.
#[inline(always)]
unsafe fn silu4(x: float32x4_t) -> float32x4_t {
    let e = exp4(vminq_f32(vnegq_f32(x), vdupq_n_f32(89.0)));
    vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0), e))
}

/// Applies `f` to `xs` 4 values at a time; a tail of fewer goes through a padded vector, so
/// every value gets the same lane arithmetic wherever it sits.
#[inline(always)]
unsafe fn map4(xs: &mut [f32], ys: Option<&[f32]>, f: impl Fn(float32x4_t, float32x4_t) -> float32x4_t) {
    let n = xs.len();
    let y_at = |i: usize| ys.map_or(vdupq_n_f32(0.0), |y| vld1q_f32(y.as_ptr().add(i)));
    let mut i = 0;
    while i + 4 <= n {
        vst1q_f32(xs.as_mut_ptr().add(i), f(vld1q_f32(xs.as_ptr().add(i)), y_at(i)));
        i += 4;
    }
    if i < n {
        let (mut x, mut y) = ([0f32; 4], [0f32; 4]);
        x[..n - i].copy_from_slice(&xs[i..]);
        if let Some(ys) = ys {
            y[..n - i].copy_from_slice(&ys[i..n]);
        }
        vst1q_f32(x.as_mut_ptr(), f(vld1q_f32(x.as_ptr()), vld1q_f32(y.as_ptr())));
        xs[i..].copy_from_slice(&x[..n - i]);
    }
}

/// `xs[i] = silu(xs[i])` ([`silu4`]).
pub(super) fn silu_neon(xs: &mut [f32]) {
    // SAFETY: NEON is baseline on aarch64; map4 stays inside the slices.
    unsafe { map4(xs, None, |x, _| silu4(x)) }
}

/// `gate[i] = silu(gate[i]) * up[i]` ([`silu4`]); `up` at least as long as `gate`.
pub(super) fn silu_mul_neon(gate: &mut [f32], up: &[f32]) {
    assert!(up.len() >= gate.len(), "silu_mul: short up");
    // SAFETY: as in `silu_neon`.
    unsafe { map4(gate, Some(up), |g, u| vmulq_f32(silu4(g), u)) }
}
