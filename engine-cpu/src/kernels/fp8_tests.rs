use super::*;

/// Independent decoding from the format definition (powi, no bit tricks).
fn reference_value(b: u8) -> f32 {
    let s = if b & 0x80 != 0 { -1.0f64 } else { 1.0 };
    let e = ((b >> 3) & 0xf) as i32;
    let m = (b & 7) as f64;
    if e == 15 && m == 7.0 {
        return f32::NAN;
    }
    let v = if e == 0 { m / 8.0 * 2f64.powi(-6) } else { (1.0 + m / 8.0) * 2f64.powi(e - 7) };
    (s * v) as f32
}

/// Nearest finite code by exhaustive search, ties to the even code, saturating.
fn reference_encode(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = (x.abs() as f64).min(448.0);
    let mut best = 0u8;
    let mut best_err = f64::INFINITY;
    for c in 0u8..0x7f {
        let err = (reference_value(c) as f64 - a).abs();
        if err < best_err || (err == best_err && c % 2 == 0) {
            best = c;
            best_err = err;
        }
    }
    sign | best
}

#[test]
fn decoding_matches_the_format_definition_for_all_256_codes() {
    for b in 0..=255u8 {
        let (got, want) = (e4m3_to_f32(b), reference_value(b));
        if want.is_nan() {
            assert!(got.is_nan() && E4M3_TO_F32[b as usize].is_nan(), "code {b:#04x} must be NaN");
        } else {
            assert_eq!(got.to_bits(), want.to_bits(), "code {b:#04x}");
            assert_eq!(E4M3_TO_F32[b as usize].to_bits(), want.to_bits(), "table at {b:#04x}");
        }
    }
    assert_eq!(e4m3_to_f32(0x7e), 448.0);
    assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
    assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
    assert_eq!(e4m3_to_f32(0x38), 1.0);
    assert_eq!(e4m3_to_f32(0xb8), -1.0);
    assert!(e4m3_to_f32(0x80).is_sign_negative() && e4m3_to_f32(0x80) == 0.0);
}

#[test]
fn every_finite_code_round_trips() {
    for b in 0..=255u8 {
        if b & 0x7f != 0x7f {
            assert_eq!(f32_to_e4m3(e4m3_to_f32(b)), b, "code {b:#04x}");
        }
    }
}

#[test]
fn encoding_is_nearest_ties_to_even_and_saturates() {
    // exact midpoints between neighbouring codes go to the even one
    for c in 0u8..0x7e {
        let mid = (e4m3_to_f32(c) + e4m3_to_f32(c + 1)) / 2.0;
        let want = if c % 2 == 0 { c } else { c + 1 };
        assert_eq!(f32_to_e4m3(mid), want, "midpoint above {c:#04x}");
        assert_eq!(f32_to_e4m3(-mid), 0x80 | want);
    }
    assert_eq!(f32_to_e4m3(449.0), 0x7e);
    assert_eq!(f32_to_e4m3(1e30), 0x7e);
    assert_eq!(f32_to_e4m3(f32::INFINITY), 0x7e);
    assert_eq!(f32_to_e4m3(-f32::INFINITY), 0xfe);
    assert_eq!(f32_to_e4m3(f32::NAN), 0x7f);
    assert_eq!(f32_to_e4m3(1e-30), 0);
    // a pseudo-random sweep over many magnitudes against exhaustive search
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..20_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mant = (state >> 40) as f32 / (1u64 << 24) as f32;
        let exp = ((state >> 8) % 28) as i32 - 16;
        let x = (1.0 + mant) * 2f32.powi(exp) * if state & 1 == 0 { 1.0 } else { -1.0 };
        assert_eq!(f32_to_e4m3(x), reference_encode(x), "x = {x:e}");
    }
}

#[test]
fn scaled_round_trip_error_is_within_half_a_step() {
    let scale = 0.05f32;
    let src: Vec<f32> = (0..1000).map(|i| ((i as f32) * 0.37).sin() * 20.0).collect();
    let mut bytes = vec![0u8; src.len()];
    let mut back = vec![0f32; src.len()];
    encode_scaled(&src, scale, &mut bytes);
    decode_scaled(&bytes, scale, &mut back);
    for (&s, &b) in src.iter().zip(&back) {
        // 3 mantissa bits: relative step 2^-3, so half a step is 1/16 of the value (normals);
        // subnormals have an absolute step of 2^-9 * scale
        let tol = (s.abs() / 16.0).max(scale * 2f32.powi(-10)) * 1.0001;
        assert!((s - b).abs() <= tol, "{s} -> {b}");
    }
}

#[test]
fn simd_decode_equals_the_table_for_every_code_and_tail_length() {
    let src: Vec<u8> = (0..=255u8).chain(0..=255u8).rev().collect();
    for len in [0, 1, 15, 16, 17, 100, src.len()] {
        for scale in [1.0f32, 0.37, 3.0e4] {
            let mut a = vec![0f32; len];
            let mut b = vec![0f32; len];
            decode_scaled(&src[..len], scale, &mut a);
            decode_scaled_scalar(&src[..len], scale, &mut b);
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!(
                    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                    "len {len} code {:#04x}: {x} vs {y}",
                    src[i]
                );
            }
        }
    }
}
