//! Page ids to device addresses: each mapped space is a base address, a stride and a page
//! count. Host logic, tested without a GPU.

use std::collections::HashMap;

use engine_ops::kv::PageId;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Space {
    base: u64,
    stride: usize,
    pages: usize,
}

#[derive(Default, Debug)]
pub struct SpaceTable {
    spaces: HashMap<u32, Space>,
}

impl SpaceTable {
    pub fn insert(&mut self, space: u32, base: u64, stride: usize, pages: usize) {
        self.spaces.insert(space, Space { base, stride, pages });
    }

    pub fn remove(&mut self, space: u32) {
        self.spaces.remove(&space);
    }

    /// The page's address, or `None` when its space is not mapped or the index is outside it.
    pub fn address(&self, id: PageId) -> Option<u64> {
        let s = self.spaces.get(&id.space)?;
        ((id.index as usize) < s.pages).then(|| s.base + id.index as u64 * s.stride as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_ids_inside_mapped_spaces_only() {
        let mut t = SpaceTable::default();
        t.insert(0, 0x1000, 256, 4);
        t.insert(7, 0x10_0000, 512, 2);
        assert_eq!(t.address(PageId::new(0, 0)), Some(0x1000));
        assert_eq!(t.address(PageId::new(0, 3)), Some(0x1000 + 3 * 256));
        assert_eq!(t.address(PageId::new(0, 4)), None);
        assert_eq!(t.address(PageId::new(7, 1)), Some(0x10_0000 + 512));
        assert_eq!(t.address(PageId::new(1, 0)), None);
        t.remove(7);
        assert_eq!(t.address(PageId::new(7, 1)), None);
    }
}
