//! Rotary position embedding on the CPU.

pub use engine_ops::rope::{rope_table, rope_table_f32};

/// Rotates adjacent pairs of every head of every row; `cs` holds (cos, sin) per row and pair
/// (`head_dim / 2` pairs a row), and `x` has as many rows as `cs`.
pub fn rope_adjacent_pairs(x: &mut [f32], head_dim: usize, cs: &[(f32, f32)]) {
    let half = head_dim / 2;
    let n_rows = cs.len() / half;
    let row_len = x.len() / n_rows.max(1);
    for (xr, csr) in x.chunks_exact_mut(row_len).zip(cs.chunks_exact(half)) {
        for head in xr.chunks_exact_mut(head_dim) {
            for (pair, &(c, s)) in head.chunks_exact_mut(2).zip(csr) {
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * c - b * s;
                pair[1] = a * s + b * c;
            }
        }
    }
}

/// Rotate-half RoPE on the first `2 * pairs` values of every head of every row: pairs
/// `(i, i + pairs)`; the rest of each head passes through. `cs` holds `pairs` (cos, sin) per
/// row, and `x` has as many rows as `cs`.
pub fn rope_half_split(x: &mut [f32], head_dim: usize, pairs: usize, cs: &[(f32, f32)]) {
    let n_rows = cs.len() / pairs;
    let row_len = x.len() / n_rows.max(1);
    for (xr, csr) in x.chunks_exact_mut(row_len).zip(cs.chunks_exact(pairs)) {
        for head in xr.chunks_exact_mut(head_dim) {
            for (i, &(c, s)) in csr.iter().enumerate() {
                let (a, b) = (head[i], head[i + pairs]);
                head[i] = a * c - b * s;
                head[i + pairs] = b * c + a * s;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_half_split_rotates_pairs_i_and_i_plus_half_and_leaves_the_rest() {
        let mut head = [1.0, 0.0, 0.0, 1.0, 5.0, 6.0];
        let a = 0.3f32;
        let cs = [(a.cos(), a.sin()), (1.0, 0.0)];
        rope_half_split(&mut head, 6, 2, &cs);
        // Pair (0, 2): (1, 0) -> (cos, sin). Pair (1, 3): angle 0.
        assert!((head[0] - a.cos()).abs() < 1e-7 && (head[2] - a.sin()).abs() < 1e-7);
        assert_eq!(&head[1..2], &[0.0]);
        assert_eq!(&head[3..], &[1.0, 5.0, 6.0]);
    }

    #[test]
    fn rope_rotates_adjacent_pairs_by_position_times_frequency() {
        // One row, head_dim 4: pairs (0,1) at freq 1 and (2,3) at freq theta^(-1/2).
        let theta: f64 = 100.0;
        let pos = 3usize;
        let mut cs = Vec::new();
        rope_table(&[pos], &[1.0, theta.powf(-0.5)], &mut cs);
        let mut x = vec![1.0, 0.0, 0.0, 1.0];
        rope_adjacent_pairs(&mut x, 4, &cs);
        let a = pos as f64;
        let b = pos as f64 * theta.powf(-0.5);
        let want = [a.cos(), a.sin(), -b.sin(), b.cos()];
        for (g, w) in x.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{x:?} vs {want:?}");
        }
    }
}
