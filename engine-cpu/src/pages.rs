//! KV pages in host memory: a heap pool for running without a cache-service, and the one
//! page-to-page move tree verification needs. Both dereference page addresses, so they live
//! with the kernels, not in `engine-ops`.

use engine_ops::EngineError;
use engine_ops::kv::{KvLayout, KvPart, PagePtr};

/// Copies the K and V of every layer and KV head at position `from` to position `to` of the
/// same sequence (tree verification writes drafts to scratch slots; the accepted path moves
/// into place). Both positions must lie inside `pages`.
pub fn move_kv_position(layout: &KvLayout, pages: &[PagePtr], from: usize, to: usize) -> Result<(), EngineError> {
    let pt = layout.page_tokens;
    let (src_page, dst_page) = (from / pt, to / pt);
    if src_page >= pages.len() || dst_page >= pages.len() {
        return Err(EngineError::Internal(format!(
            "KV move {from} -> {to} outside the sequence's {} pages",
            pages.len()
        )));
    }
    let row = layout.row_bytes();
    for layer in 0..layout.n_layers {
        for part in [KvPart::Key, KvPart::Value] {
            for head in 0..layout.n_kv_heads {
                let block = layout.block_offset_bytes(layer, part, head);
                // SAFETY: both offsets lie inside their pages (checked above); the sequence
                // owns its uncommitted pages, and `from != to` rows never overlap.
                unsafe {
                    let src = pages[src_page].as_ptr().add(block + (from % pt) * row);
                    let dst = pages[dst_page].as_ptr().add(block + (to % pt) * row);
                    if src != dst {
                        std::ptr::copy_nonoverlapping(src, dst, row);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Pages of one sequence, in position order: page `i` holds positions
/// `[i * page_tokens, (i + 1) * page_tokens)`.
pub type PageTable<'a> = &'a [PagePtr];

/// A heap-backed page pool for running without a cache-service (tests, benchmarks, and the
/// uncached fallback). Pages are 64-byte aligned.
pub struct LocalPagePool {
    layout: KvLayout,
    buf: Vec<u64>,
    stride_bytes: usize,
    free: Vec<usize>,
}

impl LocalPagePool {
    pub fn new(layout: KvLayout, pages: usize) -> Self {
        let stride_bytes = layout.page_bytes().div_ceil(64) * 64;
        // u64 storage keeps 8-byte alignment; +8 words lets us align the base to 64 bytes.
        let buf = vec![0u64; (stride_bytes * pages) / 8 + 8];
        LocalPagePool { layout, buf, stride_bytes, free: (0..pages).rev().collect() }
    }

    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    fn base(&mut self) -> *mut u8 {
        let p = self.buf.as_mut_ptr() as *mut u8;
        let misalign = (p as usize) % 64;
        // SAFETY: the buffer has 64 spare bytes at the end.
        unsafe { p.add(if misalign == 0 { 0 } else { 64 - misalign }) }
    }

    /// Takes `n` free pages; `None` when fewer are free (nothing is taken then).
    pub fn allocate(&mut self, n: usize) -> Option<Vec<(usize, PagePtr)>> {
        if self.free.len() < n {
            return None;
        }
        let base = self.base();
        let stride = self.stride_bytes;
        let ids: Vec<usize> = (0..n).filter_map(|_| self.free.pop()).collect();
        Some(
            ids.into_iter()
                .map(|id| {
                    // SAFETY: id < pages, so the page lies inside the buffer.
                    let p = unsafe { base.add(id * stride) };
                    (id, PagePtr::new(std::ptr::NonNull::new(p).expect("non-null heap pointer")))
                })
                .collect(),
        )
    }

    pub fn release(&mut self, id: usize) {
        debug_assert!(!self.free.contains(&id));
        self.free.push(id);
    }

    pub fn free_pages(&self) -> usize {
        self.free.len()
    }
}
