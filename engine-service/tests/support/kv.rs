//! KV bytes read straight from a sequence's pages, for tests that compare caches bit for bit.

use engine_cpu::CpuOps;
use engine_service::memory::{KvLayout, KvPart, PageId};

/// Bytes of `positions` of every layer's K and V (all KV heads), position by position.
pub fn kv_bytes(ops: &CpuOps, layout: &KvLayout, pages: &[PageId], positions: std::ops::Range<usize>) -> Vec<u8> {
    let row = layout.row_bytes();
    let mut out = Vec::new();
    for pos in positions {
        for layer in 0..layout.n_layers {
            for part in [KvPart::Key, KvPart::Value] {
                for h in 0..layout.n_kv_heads {
                    let off = layout.block_offset_bytes(layer, part, h) + (pos % layout.page_tokens) * row;
                    let page = pages[pos / layout.page_tokens];
                    out.extend(ops.read_page_bytes(layout, page, off, row).expect("a mapped page"));
                }
            }
        }
    }
    out
}
