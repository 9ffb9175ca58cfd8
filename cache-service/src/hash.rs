//! Chained page hashes: one 128-bit hash names a whole prefix.
//!
//! `root = H(len(fingerprint) || fingerprint || 0x00 || cache_salt)` and
//! `h_i = H(h_{i-1} || tokens of page i)` (xxh3-128, little-endian encodings). Different
//! fingerprints or salts give different roots, so two tenants or two models never share a
//! page. The fingerprint is length-prefixed so that no (fingerprint, salt) pair can be spelled
//! two ways. xxh3 is not collision resistant against an adversary; the page table therefore
//! compares stored token ids on every hit, so a collision can cost a miss, never wrong KV.
//! Cost: one pass over the prompt's bytes (~10 µs for 24K tokens).

use xxhash_rust::xxh3::Xxh3;

/// Hash of a prefix ending at a page boundary (or of the empty prefix: the root).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageHash(pub u128);

impl PageHash {
    /// The 64 bits a KV event names the page by (consumers of vLLM's stream take integers of
    /// that size; they identify a block by its tokens and parent chain, the hash only keys it).
    pub fn event_id(self) -> u64 {
        self.0 as u64
    }
}

/// The hash of the empty prefix for one model and one tenant salt.
pub fn root_hash(model_fingerprint: &str, cache_salt: &str) -> PageHash {
    let mut h = Xxh3::new();
    h.update(&(model_fingerprint.len() as u64).to_le_bytes());
    h.update(model_fingerprint.as_bytes());
    h.update(&[0u8]);
    h.update(cache_salt.as_bytes());
    PageHash(h.digest128())
}

/// The hash of a prefix extended by one page of tokens.
pub fn chain_hash(parent: PageHash, page_tokens: &[u32]) -> PageHash {
    let mut h = Xxh3::new();
    h.update(&parent.0.to_le_bytes());
    // Token ids as little-endian u32, written in chunks to avoid a per-token call.
    let mut buf = [0u8; 256];
    for chunk in page_tokens.chunks(buf.len() / 4) {
        for (dst, t) in buf.chunks_exact_mut(4).zip(chunk) {
            dst.copy_from_slice(&t.to_le_bytes());
        }
        h.update(&buf[..chunk.len() * 4]);
    }
    PageHash(h.digest128())
}

/// Key of a partial page: the prefix hash it extends plus its tail tokens (fewer than a
/// page). A domain byte keeps it apart from every full-page chain hash.
pub fn partial_hash(parent: PageHash, tail: &[u32]) -> PageHash {
    let mut h = Xxh3::new();
    h.update(&[0xA5u8]);
    h.update(&(tail.len() as u64).to_le_bytes());
    h.update(&chain_hash(parent, tail).0.to_le_bytes());
    PageHash(h.digest128())
}

/// Key of a recurrent-state snapshot: the hash of the full-page prefix before it (the root
/// for positions below one page) plus the tokens after that boundary (fewer than a page).
/// Its own domain byte keeps it apart from page keys.
pub fn state_hash(boundary: PageHash, tail: &[u32]) -> PageHash {
    let mut h = Xxh3::new();
    h.update(&[0x5Bu8]);
    h.update(&(tail.len() as u64).to_le_bytes());
    h.update(&chain_hash(boundary, tail).0.to_le_bytes());
    PageHash(h.digest128())
}

/// Root of the salt-free "content" chain: the same tokens under any fingerprint or salt give
/// the same content hashes, which is how a miss is classified as a salt/fingerprint mismatch.
/// (Engines cannot attach with an empty fingerprint, so no real chain starts here.)
pub fn content_root() -> PageHash {
    root_hash("", "")
}

/// Hashes of every full page of `tokens` (at most `max_pages`), in order.
pub fn page_hashes(root: PageHash, tokens: &[u32], page_tokens: usize, max_pages: usize) -> Vec<PageHash> {
    let mut out = Vec::with_capacity((tokens.len() / page_tokens.max(1)).min(max_pages));
    if page_tokens == 0 {
        return out;
    }
    let mut prev = root;
    for page in tokens.chunks_exact(page_tokens).take(max_pages) {
        prev = chain_hash(prev, page);
        out.push(prev);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn different_salts_give_different_chains() {
        let tokens: Vec<u32> = (0..64).collect();
        let a = page_hashes(root_hash("m", "tenant-a"), &tokens, 16, usize::MAX);
        let b = page_hashes(root_hash("m", "tenant-b"), &tokens, 16, usize::MAX);
        assert_eq!(a.len(), 4);
        assert!(a.iter().zip(&b).all(|(x, y)| x != y));
    }

    #[test]
    fn fingerprint_and_salt_boundary_is_unambiguous() {
        assert_ne!(root_hash("a", "b\0c"), root_hash("a\0b", "c"));
        assert_ne!(root_hash("ab", ""), root_hash("a", "b"));
    }

    #[test]
    fn chain_depends_on_every_earlier_page() {
        let mut tokens: Vec<u32> = (0..48).collect();
        let root = root_hash("m", "");
        let before = page_hashes(root, &tokens, 16, usize::MAX);
        tokens[3] = 999;
        let after = page_hashes(root, &tokens, 16, usize::MAX);
        assert!(before.iter().zip(&after).all(|(x, y)| x != y));
    }

    #[test]
    fn same_prefix_gives_same_hashes_and_partial_pages_are_ignored() {
        let root = root_hash("m", "s");
        let long: Vec<u32> = (0..50).collect();
        let hashes = page_hashes(root, &long, 16, usize::MAX);
        assert_eq!(hashes.len(), 3);
        assert_eq!(page_hashes(root, &long[..32], 16, usize::MAX), hashes[..2]);
        assert_eq!(page_hashes(root, &long, 16, 1), hashes[..1]);
    }

    #[test]
    fn partial_keys_differ_from_full_chains_and_by_length() {
        let root = root_hash("m", "");
        let t: Vec<u32> = (0..16).collect();
        assert_ne!(partial_hash(root, &t), chain_hash(root, &t));
        assert_ne!(partial_hash(root, &t[..3]), partial_hash(root, &t[..4]));
        assert_ne!(partial_hash(root, &t[..3]), partial_hash(root_hash("m", "x"), &t[..3]));
    }

    #[test]
    fn state_keys_differ_from_page_keys_and_by_tail() {
        let root = root_hash("m", "");
        let t: Vec<u32> = (0..16).collect();
        assert_ne!(state_hash(root, &t[..3]), partial_hash(root, &t[..3]));
        assert_ne!(state_hash(root, &[]), state_hash(root, &t[..1]));
        assert_ne!(state_hash(root, &[]), root);
    }

    #[test]
    fn long_pages_hash_all_tokens() {
        // Pages longer than the internal chunk must still depend on their last token.
        let root = root_hash("m", "");
        let mut tokens: Vec<u32> = (0..256).collect();
        let a = chain_hash(root, &tokens);
        tokens[255] = 7;
        assert_ne!(a, chain_hash(root, &tokens));
    }
}
