//! How one attention call divides its work: queries into blocks (stacked or wide kernel,
//! [`query_blocks`]) and, when there are few units, segments merged back in order
//! ([`merge_splits`]).

use super::{MAX_STACKED_HEADS, MAX_WIDE_ROWS, WIDE_LANES, WIDE_TAIL_ROWS, inv_sum, merge_row};

/// A block of consecutive queries `i0..i1` whose shared keys are folded together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct QueryBlock {
    pub i0: usize,
    pub i1: usize,
    pub wide: bool,
}

/// Cuts `n_q` queries of `g` rows each into blocks. With a wide kernel, the queries whose
/// rows fill whole vectors of [`WIDE_LANES`] lanes go to it (a vector costs the same however
/// few of its lanes are used, and a query's rows may straddle two vectors); the rest, under
/// one vector, runs on the stacked kernel if it fits one stacked block of
/// [`MAX_STACKED_HEADS`] rows (about a decode step's attention; a vector costs ~1.7 of
/// those), else on one more vector. E.g. g = 3: 1-2 queries stacked, 3-5 one vector,
/// 6-7 = 5 wide + the rest stacked, 16 = three vectors.
pub(super) fn query_blocks(n_q: usize, g: usize, has_wide: bool) -> Vec<QueryBlock> {
    let mut blocks = Vec::new();
    let mut wide_end = 0;
    if has_wide {
        let vectors = n_q * g / WIDE_LANES;
        wide_end = (vectors * WIDE_LANES / g).min(n_q);
        if (n_q - wide_end) * g > WIDE_TAIL_ROWS {
            wide_end = n_q;
        }
        // Blocks whose rows fill whole vectors (g = 3: 16 queries, 48 rows), about
        // MAX_WIDE_ROWS rows each.
        let unit = WIDE_LANES / gcd(WIDE_LANES, g);
        let qb = (MAX_WIDE_ROWS / (unit * g)).max(1) * unit;
        let mut i = 0;
        while i < wide_end {
            blocks.push(QueryBlock { i0: i, i1: (i + qb).min(wide_end), wide: true });
            i += qb;
        }
    }
    let qb = (MAX_STACKED_HEADS / g).max(1);
    let mut i = wide_end;
    while i < n_q {
        blocks.push(QueryBlock { i0: i, i1: (i + qb).min(n_q), wide: false });
        i += qb;
    }
    blocks
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

pub(super) struct MergeShape {
    pub n_kv: usize,
    pub splits: usize,
    pub g: usize,
    /// Rows of the largest block (the partials' stride).
    pub gmax: usize,
    pub hd: usize,
}

/// Merges per-segment partials (in segment order, as the one-unit path does) into outputs.
pub(super) fn merge_splits(parts: &[f32], sh: &MergeShape, blocks: &[QueryBlock], out: &mut [f32]) {
    let (g, hd, splits, gmax) = (sh.g, sh.hd, sh.splits, sh.gmax);
    let part_len = gmax * (hd + 2);
    let row = sh.n_kv * g * hd;
    let mut acc = vec![0f32; hd];
    for (b, block) in blocks.iter().enumerate() {
        for i in block.i0..block.i1 {
            let qi = i - block.i0;
            for kvh in 0..sh.n_kv {
                let unit0 = (b * sh.n_kv + kvh) * splits;
                for h in 0..g {
                    let hs = qi * g + h;
                    let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
                    acc.fill(0.0);
                    for s in 0..splits {
                        let pp = &parts[(unit0 + s) * part_len..][..part_len];
                        merge_row(&mut m, &mut l, &mut acc, pp[hs], pp[gmax + hs], &pp[2 * gmax + hs * hd..][..hd]);
                    }
                    let inv = inv_sum(l);
                    for (o, &a) in out[i * row + (kvh * g + h) * hd..][..hd].iter_mut().zip(&acc) {
                        *o = a * inv;
                    }
                }
            }
        }
    }
}
