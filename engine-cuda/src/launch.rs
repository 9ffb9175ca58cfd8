//! Host-side launch logic, kept apart from the driver so CI tests it without a GPU: grid
//! shapes, the parameter structs the kernels take (laid out as in the `.cu` files), and the
//! draft tree's ancestor table.

use engine_ops::kv::KvLayout;
use engine_ops::{AttnShape, TreeKeys};

/// A launch's grid and block (x only; the kernels use 1-D blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid {
    pub grid: (u32, u32, u32),
    pub block: u32,
}

/// Threads of the elementwise kernels' blocks.
const LINEAR_BLOCK: u32 = 256;
/// Grid-stride loops cover the rest; enough blocks to fill any GPU we target.
const LINEAR_MAX_BLOCKS: usize = 4096;
/// The GEMV kernels' block: 4 warps, one output row each (gemv.cu).
pub const GEMV_BLOCK: u32 = 128;
/// The attention kernel's block: 4 warps (attention.cu `ATTN_WARPS`).
pub const ATTENTION_BLOCK: u32 = 128;
/// head_dim limits of attention.cu: a multiple of 32, at most `MAX_DIMS * 32`.
pub const ATTENTION_MAX_HEAD_DIM: usize = 256;

/// `len` values, grid-stride.
pub fn linear(len: usize) -> Grid {
    let blocks = len.div_ceil(LINEAR_BLOCK as usize).clamp(1, LINEAR_MAX_BLOCKS);
    Grid { grid: (blocks as u32, 1, 1), block: LINEAR_BLOCK }
}

/// `rows` rows of `width` values: grid.y = row, grid.x strides the row.
pub fn rows_2d(width: usize, rows: usize) -> Grid {
    let x = width.div_ceil(LINEAR_BLOCK as usize).clamp(1, 64);
    Grid { grid: (x as u32, rows as u32, 1), block: LINEAR_BLOCK }
}

/// One block per row, its threads over `work` items of the row (a multiple of 32, 32..=256).
pub fn per_row(rows: usize, work: usize) -> Grid {
    let threads = work.div_ceil(32).clamp(1, 8) * 32;
    Grid { grid: (rows as u32, 1, 1), block: threads as u32 }
}

/// A weight GEMV over `out_rows` output rows (4 per block).
pub fn gemv(out_rows: usize) -> Grid {
    Grid { grid: (out_rows.div_ceil(4) as u32, 1, 1), block: GEMV_BLOCK }
}

/// Positions one attention split covers (attention.cu): a sequence of `n` positions runs as
/// `ceil(n / ATTENTION_SPLIT)` blocks per head, so one long sequence still fills the GPU.
pub const ATTENTION_SPLIT: usize = 256;

/// Splits of a launch whose longest row sees `max_visible` positions.
pub fn attention_splits(max_visible: usize) -> usize {
    max_visible.div_ceil(ATTENTION_SPLIT).max(1)
}

/// The split pass of attention: `rows` query rows, `heads` heads, `splits` splits.
pub fn attention(rows: usize, heads: usize, splits: usize) -> Grid {
    Grid { grid: (rows as u32, heads as u32, splits as u32), block: ATTENTION_BLOCK }
}

/// The merge pass of attention.
pub fn attention_merge(rows: usize, heads: usize) -> Grid {
    Grid { grid: (rows as u32, heads as u32, 1), block: ATTENTION_BLOCK }
}

/// Floats of the split pass's partial results (max, sum and `head_dim` values per split).
pub fn attention_partials(rows: usize, heads: usize, splits: usize, head_dim: usize) -> usize {
    rows * heads * splits * (2 + head_dim)
}

/// Whether attention.cu handles this head size.
pub fn attention_head_dim_ok(head_dim: usize) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(32) && head_dim <= ATTENTION_MAX_HEAD_DIM
}

/// kv.cu's `KvGeometry`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvGeometry {
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub page_tokens: u32,
    pub layer: u32,
}

impl KvGeometry {
    pub fn new(layout: &KvLayout, layer: usize) -> KvGeometry {
        KvGeometry {
            n_kv_heads: layout.n_kv_heads as u32,
            head_dim: layout.head_dim as u32,
            page_tokens: layout.page_tokens as u32,
            layer: layer as u32,
        }
    }
}

/// attention.cu's `AttnParams`. The FP8 scales are 1: the models fold `k_scale` into the
/// softmax scale and `v_scale` into the output, as on the CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    pub n_heads: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
    pub page_tokens: u32,
    pub layer: u32,
    pub start_pos: u32,
    pub tree_stride: u32,
    pub split_len: u32,
    pub max_splits: u32,
    pub scale: f32,
    pub k_scale: f32,
    pub v_scale: f32,
}

impl AttnParams {
    pub fn new(
        shape: &AttnShape,
        layout: &KvLayout,
        start_pos: usize,
        tree_stride: u32,
        max_splits: usize,
    ) -> AttnParams {
        AttnParams {
            n_heads: shape.n_heads as u32,
            n_kv_heads: shape.n_kv_heads as u32,
            head_dim: shape.head_dim as u32,
            page_tokens: layout.page_tokens as u32,
            layer: shape.layer as u32,
            start_pos: start_pos as u32,
            tree_stride,
            split_len: ATTENTION_SPLIT as u32,
            max_splits: max_splits as u32,
            scale: shape.scale,
            k_scale: 1.0,
            v_scale: 1.0,
        }
    }
}

/// attention.cu's tree tables, in one array: `n * stride` ancestor offsets (entry `e` of node
/// `i`: the slot of its ancestor at depth `e`, minus `start_pos`), then the `n` depths.
pub fn tree_tables(tree: &TreeKeys, start_pos: usize) -> (Vec<u32>, usize) {
    let (n, stride) = (tree.len(), tree.max_depth() + 1);
    let mut out = vec![0u32; n * stride + n];
    for i in 0..n {
        for e in 0..=tree.depth(i) {
            out[i * stride + e] = (tree.slot(start_pos, i, start_pos + e) - start_pos) as u32;
        }
        out[n * stride + i] = tree.depth(i) as u32;
    }
    (out, stride)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_cover_the_work() {
        assert_eq!(linear(1), Grid { grid: (1, 1, 1), block: 256 });
        assert_eq!(linear(1000), Grid { grid: (4, 1, 1), block: 256 });
        assert_eq!(linear(usize::MAX / 2).grid.0 as usize, LINEAR_MAX_BLOCKS);
        assert_eq!(per_row(3, 1), Grid { grid: (3, 1, 1), block: 32 });
        assert_eq!(per_row(3, 100), Grid { grid: (3, 1, 1), block: 128 });
        assert_eq!(per_row(3, 10_000), Grid { grid: (3, 1, 1), block: 256 });
        assert_eq!(gemv(9).grid.0, 3);
        assert_eq!(rows_2d(576, 5).grid, (3, 5, 1));
        assert!(attention_head_dim_ok(64) && attention_head_dim_ok(256));
        assert!(!attention_head_dim_ok(80) && !attention_head_dim_ok(512));
        assert_eq!(attention_splits(0), 1);
        assert_eq!(attention_splits(256), 1);
        assert_eq!(attention_splits(257), 2);
        assert_eq!(attention(3, 9, 2).grid, (3, 9, 2));
        assert_eq!(attention_partials(3, 9, 2, 64), 3 * 9 * 2 * 66);
    }

    #[test]
    fn structs_have_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<KvGeometry>(), 16);
        assert_eq!(std::mem::size_of::<AttnParams>(), 48);
    }

    #[test]
    fn tree_tables_name_each_nodes_ancestor_slots() {
        // 0 -> {1, 2}, 1 -> 3
        let tree = TreeKeys::new(&[None, Some(0), Some(0), Some(1)]).unwrap();
        let (t, stride) = tree_tables(&tree, 100);
        assert_eq!(stride, 3);
        // node 3 (depth 2): root, node 1, itself
        assert_eq!(&t[3 * stride..4 * stride], &[0, 1, 3]);
        // node 2 (depth 1): root, itself
        assert_eq!(&t[2 * stride..2 * stride + 2], &[0, 2]);
        assert_eq!(&t[4 * stride..], &[0, 1, 1, 2]);
        // What the kernel reads: logical position start + e of node i at slot start + t[..].
        for i in 0..4 {
            for e in 0..=tree.depth(i) {
                assert_eq!(100 + t[i * stride + e] as usize, tree.slot(100, i, 100 + e));
            }
        }
    }
}
