//! KV pages as models and backends see them: the element type, the layout of one page, and
//! a page's id. Pages live in the cache-service's shared arena (or, when running uncached, in
//! a local pool); where they come from is the engine's business, where they are in memory the
//! backend's.

use std::ptr::NonNull;

/// A block of page memory mapped in this process (the engine's heap pool, or the
/// cache-service's arena mapping): page `i` starts at `base + i * stride`. The memory stays
/// mapped while the value lives (a backend's page table holds it by `Arc`). What a backend
/// does with it is its own: the CPU reads it in place; a GPU registers it with its driver (in
/// place on unified memory) or keeps device pages with it as their host tier.
pub trait HostPages: Send + Sync {
    fn base(&self) -> NonNull<u8>;
    /// Bytes between consecutive pages (at least a page's bytes).
    fn stride_bytes(&self) -> usize;
    fn page_count(&self) -> usize;
}

/// A KV page as the step loop, the models and the ops name it: a page `space` (a block of
/// page memory the backend was given, such as the engine's local pool or one attachment of the
/// cache-service's arena) and the page's `index` in it. Only the backend maps an id to an
/// address: a host pointer on the CPU and on unified memory, a device address for a discrete
/// GPU's page pool. Ids cross the op seam; addresses never do.
///
/// Exclusive writes are the scheduler's discipline: a sequence writes only its own uncommitted
/// pages; committed pages are read-only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageId {
    pub space: u32,
    pub index: u32,
}

impl PageId {
    pub const fn new(space: u32, index: u32) -> PageId {
        PageId { space, index }
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
}

/// Parses [`KvDtype::name`] (`fp8_e4m3` is accepted for `fp8`).
impl std::str::FromStr for KvDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "f16" => Ok(KvDtype::F16),
            "fp8" | "fp8_e4m3" => Ok(KvDtype::Fp8),
            other => Err(format!("unknown KV dtype {other:?} (known: f16, fp8)")),
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
