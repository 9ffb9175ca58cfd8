//! Row-wise normalisation and the small element-wise ops around it, in plain f32 (these
//! loops are a few percent of a pass; their bits are what every model's goldens were taken
//! with, so they stay the reference formula).

/// `out = x / rms(x) * weight`, row by row (rows of `weight.len()` values).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ss: f32 = xr.iter().map(|v| v * v).sum();
        let inv = 1.0 / (ss / d as f32 + eps).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * inv * w;
        }
    }
}

/// `x += y`.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_scales_rows_to_unit_rms_times_weight() {
        let x = [3.0, 4.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0];
        let w = [1.0, 2.0, 1.0, 1.0];
        let mut out = [0.0; 8];
        rms_norm(&x, &w, 0.0, &mut out);
        let inv = 1.0 / (25.0f32 / 4.0).sqrt();
        assert!((out[0] - 3.0 * inv).abs() < 1e-6 && (out[1] - 8.0 * inv).abs() < 1e-6);
        assert!(out[4..].iter().zip(&w).all(|(o, w)| (o - w).abs() < 1e-6));
    }
}
