//! A draft tree as attention sees it: which KV slot holds each logical position a tree query
//! reads. Device-neutral data: every backend's tree attention reads the same description.
//!
//! Contract: a tree pass from `start_pos` writes node `j`'s KV to slot `start_pos + j`, while
//! node `j` logically sits at `start_pos + depth(j)`. Query `j` sees positions `[0, start_pos]`
//! in place (the root is every node's ancestor and sits at its own position) and position
//! `start_pos + e` (0 < e <= depth(j)) in the slot of its ancestor at depth `e`.

/// Ancestor slots of every node of a draft tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeKeys {
    depth: Vec<usize>,
    /// Row `i` (of `stride` entries): node `i`'s ancestor at each depth `0..=depth(i)`.
    anc: Vec<usize>,
    stride: usize,
}

impl TreeKeys {
    /// From a `SeqInput::tree` parents array: `parents[0]` is `None` (the root), every other
    /// entry an earlier index.
    pub fn new(parents: &[Option<usize>]) -> Result<TreeKeys, String> {
        let n = parents.len();
        let depth = crate::batch::tree_depths(parents)?;
        let stride = depth.iter().copied().max().unwrap_or(0) + 1;
        let mut anc = vec![0usize; n * stride];
        for j in 1..n {
            let (p, d) = (parents[j].unwrap_or(0), depth[j]);
            let (head, tail) = anc.split_at_mut(j * stride);
            tail[..d].copy_from_slice(&head[p * stride..p * stride + d]);
            tail[d] = j;
        }
        Ok(TreeKeys { depth, anc, stride })
    }

    pub fn len(&self) -> usize {
        self.depth.len()
    }

    pub fn is_empty(&self) -> bool {
        self.depth.is_empty()
    }

    pub fn depth(&self, i: usize) -> usize {
        self.depth[i]
    }

    pub fn max_depth(&self) -> usize {
        self.stride - 1
    }

    /// The KV slot holding logical position `x` (`<= start_pos + depth(i)`) as query `i` sees it.
    #[inline]
    pub fn slot(&self, start_pos: usize, i: usize, x: usize) -> usize {
        if x <= start_pos { x } else { start_pos + self.anc[i * self.stride + (x - start_pos)] }
    }
}
