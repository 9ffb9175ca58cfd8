//! FP8 E4M3 KV rows -> f16 for the attention kernels: exact (every E4M3 value is an f16
//! value, NaN stays NaN), AVX-512 16 values per step when present, else a 256-entry table;
//! both give the same bits for every non-NaN code.

use super::f32_to_f16;

/// E4M3 byte -> the f16 bits of the same value (exact: E4M3's 3-bit mantissa and exponents
/// 2^-9..2^8 all lie inside f16's range; NaN stays NaN).
pub(super) fn e4m3_f16_table() -> &'static [u16; 256] {
    static TABLE: std::sync::OnceLock<[u16; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|b| f32_to_f16(super::super::fp8::E4M3_TO_F32[b])))
}

/// Decodes `n` FP8 rows of `hd` values at `src` into `dst` as f16 bits (AVX-512 when present;
/// both paths give the table's bits).
///
/// # Safety
/// `src` must be valid for `n * hd` reads, and `dst` at least that long.
#[inline]
pub(super) unsafe fn decode_fp8_rows(src: *const u8, n: usize, hd: usize, dst: &mut [u16]) {
    // SAFETY: per the function contract.
    let bytes = unsafe { std::slice::from_raw_parts(src, n * hd) };
    let dst = &mut dst[..n * hd];
    #[cfg(target_arch = "x86_64")]
    {
        static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *AVX512.get_or_init(|| is_x86_feature_detected!("avx512f")) {
            // SAFETY: AVX-512F is present; the slices have equal lengths.
            unsafe { decode_fp8_f16_avx512(bytes, dst) };
            return;
        }
    }
    decode_fp8_f16_scalar(bytes, dst);
}

fn decode_fp8_f16_scalar(src: &[u8], dst: &mut [u16]) {
    let table = e4m3_f16_table();
    for (d, &b) in dst.iter_mut().zip(src) {
        *d = table[b as usize];
    }
}

/// 16 values per step: E4M3 -> f32 exactly (the bits of `fp8::decode_scaled`'s rebias
/// multiply), then `vcvtps2ph`, exact because every E4M3 value is an f16 value.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn decode_fp8_f16_avx512(src: &[u8], dst: &mut [u16]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len()) / 16 * 16;
    let rebias = _mm512_set1_ps(f32::from_bits((127 + 120) << 23));
    let low7 = _mm512_set1_epi32(0x7f);
    let nan = _mm512_set1_ps(f32::NAN);
    for i in (0..n).step_by(16) {
        // SAFETY: i + 16 <= n <= the length of both slices.
        let b = _mm512_cvtepu8_epi32(unsafe { _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i) });
        let mag = _mm512_and_si512(b, low7);
        let v = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32::<20>(mag)), rebias);
        let v = _mm512_mask_blend_ps(_mm512_cmpeq_epi32_mask(mag, low7), v, nan);
        let sign = _mm512_slli_epi32::<24>(_mm512_and_si512(b, _mm512_set1_epi32(0x80)));
        let v = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(v), sign));
        let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
        // SAFETY: as above; 16 u16 values.
        unsafe { _mm256_storeu_si256(dst.as_mut_ptr().add(i) as *mut __m256i, h) };
    }
    decode_fp8_f16_scalar(&src[n..], &mut dst[n..]);
}

