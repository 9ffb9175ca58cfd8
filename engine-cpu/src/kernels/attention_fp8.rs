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
        use crate::kernels;
        if *AVX512.get_or_init(|| {
            kernels::simd_ceiling() >= kernels::SimdCeiling::Detected && is_x86_feature_detected!("avx512f")
        }) {
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

/// 16 values per step: E4M3 -> f32 exactly ([`super::super::fp8::e4m3x16_to_f32`]), then
/// `vcvtps2ph`, exact because every E4M3 value is an f16 value.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn decode_fp8_f16_avx512(src: &[u8], dst: &mut [u16]) {
    use std::arch::x86_64::*;
    let n = src.len().min(dst.len()) / 16 * 16;
    for i in (0..n).step_by(16) {
        // SAFETY: i + 16 <= n <= the length of both slices.
        let v = unsafe { super::super::fp8::e4m3x16_to_f32(src.as_ptr().add(i)) };
        let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
        // SAFETY: as above; 16 u16 values.
        unsafe { _mm256_storeu_si256(dst.as_mut_ptr().add(i) as *mut __m256i, h) };
    }
    decode_fp8_f16_scalar(&src[n..], &mut dst[n..]);
}
