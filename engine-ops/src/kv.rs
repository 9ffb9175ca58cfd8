//! KV pages as models and backends see them: the element type, the layout of one page, and
//! a page's address. Pages live in the cache-service's shared arena (or, when running
//! uncached, in a local pool); where they come from is the engine's business.

/// Pointer to the first byte of one page. Valid while its lease is held by the engine;
/// the scheduler guarantees no two running sequences write the same page.
///
/// Held as an address with its provenance exposed, so this crate needs no `unsafe` to make it
/// `Send`/`Sync`: a page is plain bytes in shared memory; exclusive-write discipline is kept by
/// the scheduler (a sequence writes only its own uncommitted pages; committed pages are
/// read-only), and only a backend dereferences it. Step 3 of the op seam replaces it by ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagePtr(usize);

impl PagePtr {
    pub fn new(ptr: std::ptr::NonNull<u8>) -> PagePtr {
        PagePtr(ptr.as_ptr().expose_provenance())
    }

    pub fn as_ptr(self) -> *mut u8 {
        std::ptr::with_exposed_provenance_mut(self.0)
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
