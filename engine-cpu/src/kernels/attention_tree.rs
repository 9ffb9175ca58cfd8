//! Draft-tree keys for attention on the CPU ([`TreeKeys`], in `ops`, says which KV slot holds
//! each logical position a tree query sees).
//!
//! [`walk_gathered`] folds such keys chunk by canonical chunk of *logical* positions, copying
//! each chunk's rows into a contiguous buffer first, so the chunk kernel sees exactly the
//! bytes, count and order a chain query at that logical position sees: tree outputs are
//! bitwise the chain outputs of each node's root path. FP8 rows are decoded to f16 while
//! copied (exactly as the chain path decodes them).
//! Cost: one extra copy of at most `depth + 16` K/V rows per (query, KV head).

use std::ops::Range;

use super::{CHUNK, Chunk, State, chunk_end, decode_fp8_rows};
use crate::pages::PageAddr;
use engine_ops::kv::{KvDtype, KvLayout, KvPart};

pub use engine_ops::TreeKeys;

/// One layer's and KV head's keys and values in the sequence's pages.
pub(crate) struct KvSource<'a> {
    pub layout: &'a KvLayout,
    pub pages: &'a [PageAddr],
    pub layer: usize,
    pub kvh: usize,
}

/// Folds logical keys `keys` (starting at a canonical chunk boundary) into `st`, reading
/// position `x` from slot `slot(x)`. `buf` is scratch.
#[allow(clippy::too_many_arguments)]
pub(crate) fn walk_gathered(
    chunk_fn: unsafe fn(&Chunk, &mut State),
    kv: &KvSource,
    keys: Range<usize>,
    slot: impl Fn(usize) -> usize,
    q: &[f32],
    g: usize,
    st: &mut State,
    buf: &mut Vec<u16>,
) {
    let (hd, pt) = (kv.layout.head_dim, kv.layout.page_tokens);
    buf.resize(2 * CHUNK * hd, 0);
    let koff = kv.layout.block_offset_bytes(kv.layer, KvPart::Key, kv.kvh);
    let voff = kv.layout.block_offset_bytes(kv.layer, KvPart::Value, kv.kvh);
    let mut k = keys.start;
    while k < keys.end {
        let n = chunk_end(k, pt).min(keys.end) - k;
        let (kb, vb) = buf.split_at_mut(CHUNK * hd);
        for t in 0..n {
            let s = slot(k + t);
            let base = kv.pages[s / pt].as_ptr();
            if kv.layout.dtype == KvDtype::Fp8 {
                let row = (s % pt) * hd;
                // SAFETY: as below, with `hd` FP8 bytes per row.
                unsafe {
                    decode_fp8_rows(base.add(koff + row), 1, hd, &mut kb[t * hd..(t + 1) * hd]);
                    decode_fp8_rows(base.add(voff + row), 1, hd, &mut vb[t * hd..(t + 1) * hd]);
                }
                continue;
            }
            let row = (s % pt) * hd * 2;
            // SAFETY: slots of the tree pass lie inside the sequence's pages (checked by the
            // caller), and each row is `hd` f16 values inside its page's block.
            unsafe {
                let ks = std::slice::from_raw_parts(base.add(koff + row) as *const u16, hd);
                let vs = std::slice::from_raw_parts(base.add(voff + row) as *const u16, hd);
                kb[t * hd..(t + 1) * hd].copy_from_slice(ks);
                vb[t * hd..(t + 1) * hd].copy_from_slice(vs);
            }
        }
        let c = Chunk { k: kb.as_ptr(), v: vb.as_ptr(), n, head_dim: hd, q, g };
        // SAFETY: the chunk's rows are the `n * hd` values just copied into `buf`.
        unsafe { chunk_fn(&c, st) };
        k += n;
    }
}

#[cfg(test)]
#[path = "attention_tree_tests.rs"]
mod tests;
