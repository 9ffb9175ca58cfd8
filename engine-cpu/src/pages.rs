//! KV pages in host memory: the page memory a backend is given ([`HostPages`]: the engine's
//! heap pool, or the cache-service's arena mapping), the table that maps a [`PageId`] to an
//! address ([`PageTable`]), the backend's private pages, and the two page-to-page copies
//! (copy on write, tree path moves). All of it dereferences addresses, so it lives with the
//! kernels, not in `engine-ops`: ids cross the op seam, addresses stay on this side of it.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::Arc;

use engine_ops::EngineError;
use engine_ops::kv::{KvLayout, KvPart, PageId};

/// First byte of one page in this process. What the kernels take: the ops resolve ids to
/// addresses once per call.
///
/// Held as an address with its provenance exposed, so it is `Send`/`Sync` without `unsafe`; a
/// page is plain bytes, and exclusive writes are the scheduler's discipline (a sequence writes
/// only its own uncommitted pages; committed pages are read-only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageAddr(usize);

impl PageAddr {
    pub fn new(ptr: NonNull<u8>) -> PageAddr {
        PageAddr(ptr.as_ptr().expose_provenance())
    }

    pub fn as_ptr(self) -> *mut u8 {
        std::ptr::with_exposed_provenance_mut(self.0)
    }
}

pub use engine_ops::kv::HostPages;

/// Zeroed heap memory for `pages` pages, each 64-byte aligned.
///
/// Allocated as `u64` words (the allocator's calloc path: untouched pages stay unbacked until
/// first written) with the base aligned by hand; owned through a raw pointer because the
/// backend writes pages through addresses while this value is shared.
pub struct HostPageBuffer {
    words: NonNull<[u64]>,
    base: NonNull<u8>,
    stride: usize,
    pages: usize,
}

// SAFETY: the buffer is plain bytes owned by this value; concurrent access is governed by the
// page discipline above (no two writers of a page, no reads of a page being written).
unsafe impl Send for HostPageBuffer {}
// SAFETY: as for Send; `&HostPageBuffer` only hands out addresses.
unsafe impl Sync for HostPageBuffer {}

impl HostPageBuffer {
    pub fn new(page_bytes: usize, pages: usize) -> HostPageBuffer {
        let stride = page_bytes.max(1).div_ceil(64) * 64;
        // +8 words (64 bytes) of slack to align the base.
        let words = NonNull::from(Box::leak(vec![0u64; (stride * pages) / 8 + 8].into_boxed_slice()));
        let first = words.cast::<u8>();
        let misalign = first.as_ptr().addr() % 64;
        // SAFETY: the offset (< 64) stays inside the 64 spare bytes.
        let base = unsafe { first.add(if misalign == 0 { 0 } else { 64 - misalign }) };
        HostPageBuffer { words, base, stride, pages }
    }

    pub fn addr(&self, index: usize) -> PageAddr {
        assert!(index < self.pages, "page {index} outside a buffer of {}", self.pages);
        // SAFETY: index < pages, so the offset lies inside the allocation.
        PageAddr::new(unsafe { self.base.add(index * self.stride) })
    }
}

impl Drop for HostPageBuffer {
    fn drop(&mut self) {
        // SAFETY: `words` came from Box::leak in `new` and is freed once, here.
        drop(unsafe { Box::from_raw(self.words.as_ptr()) });
    }
}

impl HostPages for HostPageBuffer {
    fn base(&self) -> NonNull<u8> {
        self.base
    }
    fn stride_bytes(&self) -> usize {
        self.stride
    }
    fn page_count(&self) -> usize {
        self.pages
    }
}

/// A heap page pool for running without a cache-service (tests, benchmarks, and the uncached
/// fallback): the memory, which a backend maps, and which pages are free.
pub struct LocalPagePool {
    layout: KvLayout,
    memory: Arc<HostPageBuffer>,
    free: Vec<usize>,
}

impl LocalPagePool {
    pub fn new(layout: KvLayout, pages: usize) -> Self {
        let memory = Arc::new(HostPageBuffer::new(layout.page_bytes(), pages));
        LocalPagePool { layout, memory, free: (0..pages).rev().collect() }
    }

    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    /// The pool's memory, to map into a backend's page table.
    pub fn memory(&self) -> Arc<HostPageBuffer> {
        self.memory.clone()
    }

    /// Takes `n` free pages (index, address); `None` when fewer are free (nothing is taken).
    pub fn allocate(&mut self, n: usize) -> Option<Vec<(usize, PageAddr)>> {
        if self.free.len() < n {
            return None;
        }
        let ids: Vec<usize> = (0..n).filter_map(|_| self.free.pop()).collect();
        Some(ids.into_iter().map(|id| (id, self.memory.addr(id))).collect())
    }

    pub fn release(&mut self, id: usize) {
        debug_assert!(!self.free.contains(&id));
        self.free.push(id);
    }

    pub fn free_pages(&self) -> usize {
        self.free.len()
    }
}

/// The page space of a backend's [private pages](PageTable::private_pages).
pub const PRIVATE_SPACE: u32 = u32::MAX;

/// Page ids -> addresses: the spaces a backend was given, and its private pages.
#[derive(Default)]
pub struct PageTable {
    spaces: HashMap<u32, Arc<dyn HostPages>>,
    private: Vec<Option<HostPageBuffer>>,
    free_private: Vec<u32>,
}

impl PageTable {
    /// Makes the pages of `space` resolvable (replacing what the space was).
    pub fn map(&mut self, space: u32, memory: Arc<dyn HostPages>) -> Result<(), EngineError> {
        if space == PRIVATE_SPACE {
            return Err(EngineError::Internal(format!("page space {space} is reserved for private pages")));
        }
        self.spaces.insert(space, memory);
        Ok(())
    }

    pub fn unmap(&mut self, space: u32) {
        self.spaces.remove(&space);
    }

    /// The page's address, if its space is mapped and it lies inside.
    pub fn resolve(&self, id: PageId) -> Option<PageAddr> {
        let index = id.index as usize;
        if id.space == PRIVATE_SPACE {
            return self.private.get(index)?.as_ref().map(|b| b.addr(0));
        }
        let memory = self.spaces.get(&id.space)?;
        if index >= memory.page_count() {
            return None;
        }
        // SAFETY: index < page_count, so the offset lies inside the mapped block.
        Some(PageAddr::new(unsafe { memory.base().add(index * memory.stride_bytes()) }))
    }

    /// Resolves every id into `out` (cleared first), or says which one is not mapped.
    pub fn resolve_into(&self, ids: &[PageId], out: &mut Vec<PageAddr>) -> Result<(), EngineError> {
        out.clear();
        // A sequence's pages are nearly always of one space: look it up once per run of ids.
        let mut space: Option<(u32, NonNull<u8>, usize, usize)> = None;
        for &id in ids {
            if id.space == PRIVATE_SPACE {
                out.push(self.resolve(id).ok_or_else(|| unmapped(id))?);
                continue;
            }
            let (base, stride, count) = match space {
                Some((s, base, stride, count)) if s == id.space => (base, stride, count),
                _ => {
                    let memory = self.spaces.get(&id.space).ok_or_else(|| unmapped(id))?;
                    let found = (memory.base(), memory.stride_bytes(), memory.page_count());
                    space = Some((id.space, found.0, found.1, found.2));
                    found
                }
            };
            let index = id.index as usize;
            if index >= count {
                return Err(unmapped(id));
            }
            // SAFETY: index < page_count, so the offset lies inside the mapped block.
            out.push(PageAddr::new(unsafe { base.add(index * stride) }));
        }
        Ok(())
    }

    /// `n` zeroed pages that belong to the backend alone.
    pub fn private_pages(&mut self, layout: &KvLayout, n: usize) -> Vec<PageId> {
        (0..n)
            .map(|_| {
                let buffer = Some(HostPageBuffer::new(layout.page_bytes(), 1));
                let index = match self.free_private.pop() {
                    Some(i) => {
                        self.private[i as usize] = buffer;
                        i
                    }
                    None => {
                        self.private.push(buffer);
                        (self.private.len() - 1) as u32
                    }
                };
                PageId::new(PRIVATE_SPACE, index)
            })
            .collect()
    }

    pub fn zero_private_pages(&self, layout: &KvLayout, pages: &[PageId]) -> Result<(), EngineError> {
        for &id in pages {
            let addr = (id.space == PRIVATE_SPACE).then(|| self.resolve(id)).flatten().ok_or_else(|| unmapped(id))?;
            // SAFETY: a private page is one buffer of at least page_bytes, owned by the backend.
            unsafe { std::ptr::write_bytes(addr.as_ptr(), 0, layout.page_bytes()) };
        }
        Ok(())
    }

    pub fn free_private_pages(&mut self, pages: &[PageId]) {
        for id in pages {
            if id.space == PRIVATE_SPACE
                && let Some(slot) = self.private.get_mut(id.index as usize)
                && slot.take().is_some()
            {
                self.free_private.push(id.index);
            }
        }
    }
}

fn unmapped(id: PageId) -> EngineError {
    EngineError::Internal(format!("KV page {}:{} is not mapped in the backend", id.space, id.index))
}

/// Copies one whole page (copy on write). Bytes past the valid tokens are copied too;
/// attention never reads them.
pub fn copy_page(layout: &KvLayout, from: PageAddr, to: PageAddr) {
    if from == to {
        return;
    }
    // SAFETY: both addresses start whole pages (>= page_bytes) of mapped page memory; `to` is
    // a fresh page leased to the copying sequence alone, distinct from `from`.
    unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), to.as_ptr(), layout.page_bytes()) }
}

/// Copies the K and V of every layer and KV head at position `from` to position `to` of the
/// same sequence (tree verification writes drafts to scratch slots; the accepted path moves
/// into place). Both positions must lie inside `pages`.
pub fn move_kv_position(layout: &KvLayout, pages: &[PageAddr], from: usize, to: usize) -> Result<(), EngineError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use engine_ops::kv::KvDtype;

    fn layout() -> KvLayout {
        KvLayout { n_layers: 1, n_kv_heads: 1, head_dim: 4, page_tokens: 2, dtype: KvDtype::F16 }
    }

    #[test]
    fn ids_resolve_only_inside_mapped_spaces() {
        let pool = LocalPagePool::new(layout(), 3);
        let mut table = PageTable::default();
        assert!(table.resolve(PageId::new(0, 0)).is_none());
        table.map(0, pool.memory()).unwrap();
        assert_eq!(table.resolve(PageId::new(0, 2)), Some(pool.memory().addr(2)));
        assert!(table.resolve(PageId::new(0, 3)).is_none());
        assert!(table.resolve(PageId::new(1, 0)).is_none());
        let mut out = Vec::new();
        let err = table.resolve_into(&[PageId::new(0, 1), PageId::new(5, 0)], &mut out).unwrap_err();
        assert!(err.to_string().contains("5:0"), "{err}");
        table.unmap(0);
        assert!(table.resolve(PageId::new(0, 0)).is_none());
        assert!(table.map(PRIVATE_SPACE, pool.memory()).is_err());
    }

    #[test]
    fn private_pages_are_zeroed_reused_and_freed() {
        let l = layout();
        let mut table = PageTable::default();
        let pages = table.private_pages(&l, 2);
        assert_ne!(pages[0], pages[1]);
        let a = table.resolve(pages[0]).unwrap();
        // SAFETY: a private page of page_bytes bytes.
        unsafe { std::ptr::write_bytes(a.as_ptr(), 9, l.page_bytes()) };
        table.zero_private_pages(&l, &pages[..1]).unwrap();
        // SAFETY: as above.
        assert!(unsafe { std::slice::from_raw_parts(a.as_ptr(), l.page_bytes()) }.iter().all(|&b| b == 0));
        table.free_private_pages(&pages[..1]);
        assert!(table.resolve(pages[0]).is_none());
        assert_eq!(table.private_pages(&l, 1), vec![pages[0]], "a freed slot is reused");
    }
}
