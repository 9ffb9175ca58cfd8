//! KV bytes read straight from a sequence's pages, for tests that compare caches bit for bit.

use engine_service::memory::{KvLayout, KvPart, PagePtr};

/// Bytes of `positions` of every layer's K and V (all KV heads), position by position.
pub fn kv_bytes(layout: &KvLayout, pages: &[PagePtr], positions: std::ops::Range<usize>) -> Vec<u8> {
    let row = layout.head_dim * KvLayout::BYTES_PER_VALUE;
    let mut out = Vec::new();
    for pos in positions {
        for layer in 0..layout.n_layers {
            for part in [KvPart::Key, KvPart::Value] {
                for h in 0..layout.n_kv_heads {
                    let off = layout.block_offset_bytes(layer, part, h) + (pos % layout.page_tokens) * row;
                    // SAFETY: the position lies inside the pages, which stay alive for the call.
                    out.extend_from_slice(unsafe {
                        std::slice::from_raw_parts(pages[pos / layout.page_tokens].as_ptr().add(off), row)
                    });
                }
            }
        }
    }
    out
}
