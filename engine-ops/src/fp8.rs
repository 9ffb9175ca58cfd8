//! FP8 E4M3 (the `float8_e4m3fn` of PyTorch/ModelOpt), the scalar codec: exact decoding and
//! round-to-nearest-even encoding. NVFP4 block scales and FP8 KV pages are stored in it.
//!
//! Format: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits, no infinities; `S.1111.111`
//! (0x7f, 0xff) is NaN, so the largest finite value is 448 (0x7e). Exponent 0 is subnormal:
//! `m * 2^-9`. Every E4M3 value is exactly representable in f32, so [`e4m3_to_f32`] (and the
//! [`E4M3_TO_F32`] table kernels index) is exact.
//!
//! Encoding ([`f32_to_e4m3`]) rounds to nearest, ties to even, and **saturates** finite values
//! beyond ±448 to ±448 (as vLLM/ModelOpt clamp before casting; a plain torch cast would give
//! NaN). NaN encodes as 0x7f (0xff when negative).

/// Largest finite E4M3 value.
pub const E4M3_MAX: f32 = 448.0;

/// Exact value of an E4M3 byte (NaN for 0x7f/0xff).
pub const fn e4m3_to_f32(b: u8) -> f32 {
    let neg = b & 0x80 != 0;
    let e = ((b >> 3) & 0x0f) as u32;
    let m = (b & 0x07) as u32;
    let mag = if e == 15 && m == 7 {
        f32::NAN
    } else if e == 0 {
        // subnormal: m * 2^-9, exact
        m as f32 * (1.0 / 512.0)
    } else {
        // (1 + m/8) * 2^(e-7): f32 exponent field e - 7 + 127, mantissa m in its top 3 bits
        f32::from_bits(((e + 120) << 23) | (m << 20))
    };
    if neg { -mag } else { mag }
}

const fn build_table() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = e4m3_to_f32(i as u8);
        i += 1;
    }
    t
}

/// `E4M3_TO_F32[b] == e4m3_to_f32(b)` (1 KiB; stays in L1 in the kernels that index it).
pub static E4M3_TO_F32: [f32; 256] = build_table();

/// Nearest E4M3 byte to `x` (ties to even), saturating to ±448; NaN -> 0x7f | sign.
pub fn f32_to_e4m3(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    if x.is_nan() {
        return sign | 0x7f;
    }
    let a = x.abs().min(E4M3_MAX);
    if a < 1.0 / 64.0 {
        // below the smallest normal (2^-6): subnormal step 2^-9; a*512 is exact, and a result
        // of 8 is exactly the smallest normal, whose code is also 8
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    // Rebias the f32 exponent to E4M3's and round the 23-bit mantissa to 3 bits; a mantissa
    // carry correctly bumps the exponent. a <= 448 keeps the result <= 0x7e.
    let t = a.to_bits() - (120 << 23);
    let mut code = t >> 20;
    let rem = t & 0xf_ffff;
    if rem > 0x8_0000 || (rem == 0x8_0000 && code & 1 == 1) {
        code += 1;
    }
    sign | code as u8
}
