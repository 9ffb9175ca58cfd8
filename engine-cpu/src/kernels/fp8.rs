//! FP8 E4M3 (the `float8_e4m3fn` of PyTorch/ModelOpt): exact decoding, round-to-nearest-even
//! encoding, and the scaled encode/decode of KV rows.
//!
//! Format: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits, no infinities; `S.1111.111`
//! (0x7f, 0xff) is NaN, so the largest finite value is 448 (0x7e). Exponent 0 is subnormal:
//! `m * 2^-9`. Every E4M3 value is exactly representable in f32, so [`e4m3_to_f32`] (and the
//! [`E4M3_TO_F32`] table the kernels index) is exact.
//!
//! Encoding ([`f32_to_e4m3`]) rounds to nearest, ties to even, and **saturates** finite values
//! beyond ±448 to ±448 (as vLLM/ModelOpt clamp before casting; a plain torch cast would give
//! NaN). NaN encodes as 0x7f (0xff when negative).
//!
//! KV use (spec 8.3): stored byte = E4M3(x / scale), read back as E4M3 -> f32 times scale, one
//! scale per tensor (K and V separately). [`encode_scaled`] and [`decode_scaled`] do exactly
//! that for a row of values (decoding takes 16 values per step on AVX-512).

pub use engine_ops::fp8::{E4M3_MAX, E4M3_TO_F32, e4m3_to_f32, f32_to_e4m3};

/// `dst[i] = E4M3(src[i] * (1 / scale))` (saturating); `scale` must be positive and finite.
/// (A reciprocal multiply, as GPU FP8 KV writers do; for the usual scale 1.0 it is exact.)
pub fn encode_scaled(src: &[f32], scale: f32, dst: &mut [u8]) {
    assert_eq!(src.len(), dst.len(), "encode_scaled: length mismatch");
    let inv = 1.0 / scale;
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32_to_e4m3(s * inv);
    }
}

/// `dst[i] = e4m3(src[i]) * scale` (16 values per step on AVX-512, else a table lookup).
pub fn decode_scaled(src: &[u8], scale: f32, dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "decode_scaled: length mismatch");
    #[cfg(target_arch = "x86_64")]
    {
        static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        use crate::kernels;
        if *AVX512.get_or_init(|| {
            kernels::simd_ceiling() >= kernels::SimdCeiling::Detected && is_x86_feature_detected!("avx512f")
        }) {
            // SAFETY: AVX-512F is present; lengths are equal (checked above).
            unsafe { decode_scaled_avx512(src, scale, dst) };
            return;
        }
    }
    decode_scaled_scalar(src, scale, dst);
}

/// The portable [`decode_scaled`] (also the reference the SIMD version is tested against).
pub fn decode_scaled_scalar(src: &[u8], scale: f32, dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = E4M3_TO_F32[s as usize] * scale;
    }
}

/// 16 E4M3 bytes at `src` to f32, exactly. Bit-level: `(b & 0x7f) << 20` puts E4M3's
/// exponent and mantissa at the bottom of f32's, and multiplying by 2^120 rebiases the
/// exponent (7 -> 127) exactly, subnormals included (an f32 subnormal times 2^120 is exact);
/// then NaN (0x7f) and the sign are patched.
///
/// # Safety
/// `src` must point to 16 readable bytes; the CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn e4m3x16_to_f32(src: *const u8) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: the caller guarantees 16 readable bytes.
    let b = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(src as *const __m128i) });
    let low7 = _mm512_set1_epi32(0x7f);
    let mag = _mm512_and_si512(b, low7);
    let v = _mm512_mul_ps(
        _mm512_castsi512_ps(_mm512_slli_epi32::<20>(mag)),
        _mm512_set1_ps(f32::from_bits((127 + 120) << 23)),
    );
    let v = _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(mag, low7), v, _mm512_set1_ps(f32::NAN));
    let sign = _mm512_slli_epi32::<24>(_mm512_and_si512(b, _mm512_set1_epi32(0x80)));
    _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn decode_scaled_avx512(src: &[u8], scale: f32, dst: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = src.len() / 16 * 16;
    let vscale = _mm512_set1_ps(scale);
    for i in (0..n).step_by(16) {
        // SAFETY: i + 16 <= n <= len of both slices.
        unsafe {
            _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_mul_ps(e4m3x16_to_f32(src.as_ptr().add(i)), vscale))
        };
    }
    decode_scaled_scalar(&src[n..], scale, &mut dst[n..]);
}

#[cfg(test)]
#[path = "fp8_tests.rs"]
mod tests;
