//! Rotary angle tables, made on the host the same way for every backend (a device uploads
//! the table), so every backend rotates by the same f32 cos/sin bits.

/// `(cos, sin)` of `p * f` for every position `p` and frequency `f`, computed in f64 and
/// rounded to f32: row `r` of `out` (of `inv_freq.len()` pairs) is `positions[r]`'s.
pub fn rope_table(positions: &[usize], inv_freq: &[f64], out: &mut Vec<(f32, f32)>) {
    out.clear();
    out.reserve(positions.len() * inv_freq.len());
    for &p in positions {
        let pos = p as f64;
        for &fr in inv_freq {
            let (sin, cos) = (pos * fr).sin_cos();
            out.push((cos as f32, sin as f32));
        }
    }
}

/// `(cos, sin)` of `p * f` as HF computes them: the product rounded to f32 (HF's inverse
/// frequencies are f32), then cos/sin in f64 rounded to f32.
pub fn rope_table_f32(positions: &[usize], inv_freq: &[f32], out: &mut Vec<(f32, f32)>) {
    out.clear();
    out.reserve(positions.len() * inv_freq.len());
    for &p in positions {
        for &f in inv_freq {
            let angle = (p as f32 * f) as f64;
            out.push((angle.cos() as f32, angle.sin() as f32));
        }
    }
}
