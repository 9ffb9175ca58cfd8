//! The page table's full invariant check (tests and debugging), kept apart from the hot
//! paths. A child module, so it reads the table's private state directly.

use super::{PageState, PageTable};
use crate::hash::{chain_hash, partial_hash};

impl PageTable {
    /// Verifies every invariant in the module doc; O(pages + references). For tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        let n = self.pages.len();
        let mut on_free = vec![false; n];
        for &id in &self.free {
            let i = id as usize;
            if i >= n || on_free[i] {
                return Err(format!("free list holds {id} twice or out of range"));
            }
            on_free[i] = true;
        }
        let mut refs = vec![0u32; n];
        for (sid, s) in &self.sessions {
            for (&page, &count) in &s.refs {
                if count == 0 || page as usize >= n {
                    return Err(format!("session {sid} has a bad ref entry {page}:{count}"));
                }
                refs[page as usize] += count;
            }
        }
        let mut children = vec![0u32; n];
        let (mut pinned, mut committed, mut evictable) = (0u32, 0usize, 0usize);
        let (mut partials, mut full_contents) = (0u32, 0u32);
        for (i, p) in self.pages.iter().enumerate() {
            if p.refcount != refs[i] {
                return Err(format!("page {i}: refcount {} but sessions hold {}", p.refcount, refs[i]));
            }
            if p.refcount > 0 {
                pinned += 1;
            }
            if on_free[i] != (p.state == PageState::Free) {
                return Err(format!("page {i}: state {:?} disagrees with the free list", p.state));
            }
            match p.state {
                PageState::Free if p.refcount != 0 => {
                    return Err(format!("free page {i} is referenced"));
                }
                PageState::Free => {}
                PageState::State { slot } => {
                    if p.refcount != 0 || self.by_hash.values().any(|&v| v as usize == i) {
                        return Err(format!("page {i} of state {slot} is referenced or hashed"));
                    }
                }
                PageState::Writable { session } => {
                    let held = self.sessions.get(&session).is_some_and(|s| s.refs.contains_key(&(i as u32)));
                    if !held || p.refcount == 0 {
                        return Err(format!("writable page {i} is not held by its owner {session}"));
                    }
                    if self.by_hash.values().any(|&v| v as usize == i) {
                        return Err(format!("writable page {i} is in the hash map"));
                    }
                }
                PageState::Committed => {
                    committed += 1;
                    if self.by_hash.get(&p.hash) != Some(&(i as u32)) {
                        return Err(format!("committed page {i} is not mapped under its hash"));
                    }
                    let partial = p.tokens.len() < self.page_tokens;
                    if p.tokens.is_empty() || p.tokens.len() > self.page_tokens {
                        return Err(format!("committed page {i} stores {} tokens", p.tokens.len()));
                    }
                    partials += u32::from(partial);
                    if partial && p.children != 0 {
                        return Err(format!("partial page {i} has children"));
                    }
                    if !partial {
                        full_contents += 1;
                    }
                    let listed = self
                        .children_of
                        .get(&p.parent_hash)
                        .map_or(0, |k| k.iter().filter(|&&k| k as usize == i).count());
                    if listed != 1 {
                        return Err(format!("committed page {i} listed {listed} times under its parent"));
                    }
                    if let Some(par) = p.parent {
                        let pp = &self.pages[par as usize];
                        if pp.state != PageState::Committed || pp.hash != p.parent_hash {
                            return Err(format!("committed page {i} has a dangling parent {par}"));
                        }
                        children[par as usize] += 1;
                    }
                    let expected = if partial {
                        partial_hash(p.parent_hash, &p.tokens)
                    } else {
                        chain_hash(p.parent_hash, &p.tokens)
                    };
                    if expected != p.hash {
                        return Err(format!("committed page {i}: hash does not match its tokens"));
                    }
                    let in_lru = self.lru.contains(i as u32, p.stamp);
                    if in_lru != p.evictable() {
                        return Err(format!("page {i}: in LRU = {in_lru}, evictable = {}", p.evictable()));
                    }
                    evictable += usize::from(in_lru);
                }
            }
        }
        for (i, p) in self.pages.iter().enumerate() {
            if p.state == PageState::Committed && p.children != children[i] {
                return Err(format!("page {i}: children {} but {} committed pages name it", p.children, children[i]));
            }
        }
        if committed != self.by_hash.len() {
            return Err(format!("{committed} committed pages but {} hash entries", self.by_hash.len()));
        }
        if partials != self.partial_pages {
            return Err(format!("{partials} partial pages, gauge says {}", self.partial_pages));
        }
        if self.children_of.values().map(Vec::len).sum::<usize>() != committed {
            return Err("children_of lists pages that are not committed".into());
        }
        if self.by_content.values().sum::<u32>() != full_contents {
            return Err("content index disagrees with the full pages".into());
        }
        if evictable != self.lru.len() {
            return Err(format!("LRU holds {} pages, {evictable} are evictable", self.lru.len()));
        }
        if pinned != self.pinned {
            return Err(format!("pinned gauge {} but {pinned} pages are referenced", self.pinned));
        }
        self.check_states()
    }
}
