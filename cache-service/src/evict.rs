//! Eviction order: least recently used first, over *evictable* pages only.
//!
//! A page is evictable when it is committed, no session references it (refcount 0) and no
//! committed page names it as parent (it is a leaf of the prefix tree). Keeping only leaves
//! here means eviction trims conversations from their tails and never orphans a cached
//! suffix. When a leaf is evicted its parent may become a leaf; it is re-inserted under its
//! own last-use stamp, so an old conversation is trimmed back to its root before a newer one
//! loses a page. All operations are O(log n) (a `BTreeSet` keyed by (stamp, page id)).

use std::collections::BTreeSet;

/// Evictable pages ordered by last use.
#[derive(Debug, Default)]
pub struct Lru {
    order: BTreeSet<(u64, u32)>,
}

impl Lru {
    pub fn new() -> Lru {
        Lru::default()
    }

    /// Adds a page that just became evictable. `stamp` is its last-use time.
    pub fn insert(&mut self, page: u32, stamp: u64) {
        self.order.insert((stamp, page));
    }

    /// Removes a page that stopped being evictable; returns whether it was present.
    pub fn remove(&mut self, page: u32, stamp: u64) -> bool {
        self.order.remove(&(stamp, page))
    }

    /// Takes the least recently used evictable page.
    pub fn pop_oldest(&mut self) -> Option<u32> {
        self.order.pop_first().map(|(_, page)| page)
    }

    /// The least recently used entry as (stamp, id), without taking it.
    pub fn peek_oldest(&self) -> Option<(u64, u32)> {
        self.order.first().copied()
    }

    pub fn contains(&self, page: u32, stamp: u64) -> bool {
        self.order.contains(&(stamp, page))
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    pub fn clear(&mut self) {
        self.order.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_oldest_first_even_when_inserted_late() {
        let mut lru = Lru::new();
        lru.insert(1, 10);
        lru.insert(2, 5);
        lru.insert(3, 7);
        assert_eq!(lru.pop_oldest(), Some(2));
        // A parent re-inserted with its old stamp goes before newer pages.
        lru.insert(4, 1);
        assert_eq!(lru.pop_oldest(), Some(4));
        assert!(lru.remove(1, 10));
        assert!(!lru.remove(1, 10));
        assert_eq!(lru.pop_oldest(), Some(3));
        assert!(lru.is_empty());
    }
}
