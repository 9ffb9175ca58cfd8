//! The arena file's header: the one piece of the shared-memory layout both sides read. The
//! cache-service writes it when it sizes the arena; an engine checks it before mapping pages.

/// "EDGEKVA1" little-endian.
pub const MAGIC: u64 = u64::from_le_bytes(*b"EDGEKVA1");
pub const VERSION: u32 = 1;
/// Offset of page 0; the header occupies the first OS page.
pub const PAGES_OFFSET: u64 = 4096;
/// Page stride alignment.
pub const PAGE_ALIGN: u64 = 4096;

/// The header as stored at offset 0 (little-endian fields at fixed offsets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub magic: u64,
    pub version: u32,
    pub page_tokens: u32,
    pub page_stride: u64,
    pub page_count: u32,
    pub pages_offset: u64,
    pub file_bytes: u64,
}

impl Header {
    pub const BYTES: usize = 48;

    pub fn encode(&self) -> [u8; Self::BYTES] {
        let mut b = [0u8; Self::BYTES];
        b[0..8].copy_from_slice(&self.magic.to_le_bytes());
        b[8..12].copy_from_slice(&self.version.to_le_bytes());
        b[12..16].copy_from_slice(&self.page_tokens.to_le_bytes());
        b[16..24].copy_from_slice(&self.page_stride.to_le_bytes());
        b[24..28].copy_from_slice(&self.page_count.to_le_bytes());
        b[32..40].copy_from_slice(&self.pages_offset.to_le_bytes());
        b[40..48].copy_from_slice(&self.file_bytes.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<Header> {
        let b = b.get(..Self::BYTES)?;
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or_default());
        Some(Header {
            magic: u64_at(0),
            version: u32_at(8),
            page_tokens: u32_at(12),
            page_stride: u64_at(16),
            page_count: u32_at(24),
            pages_offset: u64_at(32),
            file_bytes: u64_at(40),
        })
    }
}
