//! The engine's view of KV pages. A page holds the K and V of `page_tokens` consecutive
//! positions for every layer and KV head. Pages live in the cache-service's shared arena
//! (or, when running uncached, in a local pool); the engine only ever sees raw page
//! pointers that stay valid while the page is leased to it.

/// Pointer to the first byte of one page. Valid while its lease is held by the engine;
/// the scheduler guarantees no two running sequences write the same page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagePtr(pub std::ptr::NonNull<u8>);

// SAFETY: a page is plain bytes in shared memory; exclusive-write discipline is kept by the
// scheduler (a sequence writes only its own uncommitted pages; committed pages are read-only).
unsafe impl Send for PagePtr {}
unsafe impl Sync for PagePtr {}

impl PagePtr {
    pub fn as_ptr(self) -> *mut u8 {
        self.0.as_ptr()
    }
}

/// Element type of KV pages. Pages of different dtypes are never interchangeable (the model
/// fingerprint includes [`KvDtype::name`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// IEEE half precision (the default).
    #[default]
    F16,
    /// FP8 E4M3 (`float8_e4m3fn`): byte = E4M3(x / scale), per-tensor K and V scales kept by
    /// the model (spec 8.3); half the bytes of f16.
    Fp8,
}

impl KvDtype {
    /// Bytes of one stored K or V value.
    pub const fn bytes_per_value(self) -> usize {
        match self {
            KvDtype::F16 => 2,
            KvDtype::Fp8 => 1,
        }
    }

    /// The name used in configs and the model fingerprint: `f16` or `fp8`.
    pub const fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::Fp8 => "fp8",
        }
    }

    /// Parses [`KvDtype::name`] (`fp8_e4m3` is accepted for `fp8`).
    pub fn parse(s: &str) -> Option<KvDtype> {
        match s {
            "f16" => Some(KvDtype::F16),
            "fp8" | "fp8_e4m3" => Some(KvDtype::Fp8),
            _ => None,
        }
    }
}

/// Shape of the KV cache of one model, independent of where pages live.
///
/// Page layout (values of `dtype`): for each layer, a K block then a V block; each block is
/// `[n_kv_heads][page_tokens][head_dim]`. See [`KvLayout::block_offset_bytes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub page_tokens: usize,
    pub dtype: KvDtype,
}

/// Which half of a layer's KV a block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvPart {
    Key = 0,
    Value = 1,
}

impl KvLayout {
    /// Bytes per value of an f16 layout (the default dtype); see [`KvLayout::bytes_per_value`].
    pub const BYTES_PER_VALUE: usize = 2;

    /// Bytes of one stored value of this layout's dtype.
    pub fn bytes_per_value(&self) -> usize {
        self.dtype.bytes_per_value()
    }

    /// Bytes of one `head_dim` row (one position of one block).
    pub fn row_bytes(&self) -> usize {
        self.head_dim * self.bytes_per_value()
    }

    /// Bytes of one `[page_tokens][head_dim]` block (one layer, one K or V, one KV head).
    pub fn head_block_bytes(&self) -> usize {
        self.page_tokens * self.row_bytes()
    }

    /// Bytes of one whole page.
    pub fn page_bytes(&self) -> usize {
        self.n_layers * 2 * self.n_kv_heads * self.head_block_bytes()
    }

    /// Offset within a page of the `[page_tokens][head_dim]` block of (layer, part, kv_head).
    pub fn block_offset_bytes(&self, layer: usize, part: KvPart, kv_head: usize) -> usize {
        ((layer * 2 + part as usize) * self.n_kv_heads + kv_head) * self.head_block_bytes()
    }

    /// KV bytes per token (all layers, K and V).
    pub fn bytes_per_token(&self) -> usize {
        self.page_bytes() / self.page_tokens
    }
}

/// Copies the K and V of every layer and KV head at position `from` to position `to` of the
/// same sequence (tree verification writes drafts to scratch slots; the accepted path moves
/// into place). Both positions must lie inside `pages`.
pub fn move_kv_position(
    layout: &KvLayout,
    pages: &[PagePtr],
    from: usize,
    to: usize,
) -> Result<(), crate::EngineError> {
    let pt = layout.page_tokens;
    let (src_page, dst_page) = (from / pt, to / pt);
    if src_page >= pages.len() || dst_page >= pages.len() {
        return Err(crate::EngineError::Internal(format!(
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
                    (id, PagePtr(std::ptr::NonNull::new(p).expect("non-null heap pointer")))
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

pub mod state;
pub mod store;
