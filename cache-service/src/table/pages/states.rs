//! Recurrent-state snapshots of hybrid models (Gated DeltaNet conv + SSM state of every
//! linear-attention layer). A snapshot is the state after exactly `position` tokens of a
//! prefix; it is only usable together with the KV pages of that prefix.
//!
//! Storage: a snapshot's bytes fill whole arena pages taken from the same free list as KV
//! pages (page `i` of the snapshot holds bytes `[i * stride, (i + 1) * stride)`), so KV and
//! states share one memory budget and one eviction order. An entry (a *slot*) owns its
//! pages; sessions reference slots, never state pages.
//!
//! Key: `state_hash(boundary, tail)`, where `boundary` is the chained hash of the prefix's
//! full pages (the root when `position < page_tokens`) and `tail` the tokens after them;
//! `tail` is stored and compared on every hit, and `boundary` is verified by the lookup's
//! walk over the full pages.
//!
//! Life of an entry: *writable* (leased by AllocateState to its writer) -> *committed*
//! (published by CommitState, immutable, findable) -> evicted; or *detached* (never
//! published, or its prefix's pages were evicted while a session still held it): not
//! findable, freed with its last reference.
//!
//! Invariants (checked by `check_states` in the randomized test):
//! - every page in state `State { slot }` is listed exactly once by that slot's entry, and
//!   every entry's pages are in that state; `pages_held` and `bytes_in_use` are the sums;
//! - an entry's refcount equals the references sessions hold to it; writable and detached
//!   entries are referenced (an unreferenced one is freed at once);
//! - `by_key` and `by_boundary` list exactly the committed entries;
//! - a committed entry's prefix is covered by committed pages: its boundary is the root or a
//!   committed full page, and a committed child of the boundary starts with its tail;
//! - the state LRU holds exactly the committed entries with refcount 0, and `lru_pages`
//!   their pages.

use std::collections::HashMap;

use super::{PageState, PageTable};
use crate::error::CacheError;
use crate::evict::Lru;
use crate::hash::{PageHash, page_hashes, root_hash, state_hash};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StateStatus {
    Writable { session: u64 },
    Committed,
    Detached,
}

#[derive(Debug)]
pub(super) struct StateEntry {
    status: StateStatus,
    key: PageHash,
    boundary: PageHash,
    /// Full pages before the tail (`position / page_tokens`).
    full_pages: usize,
    tail: Box<[u32]>,
    state_bytes: u64,
    pages: Vec<u32>,
    refcount: u32,
    stamp: u64,
}

impl StateEntry {
    fn position(&self, page_tokens: usize) -> usize {
        self.full_pages * page_tokens + self.tail.len()
    }
}

/// The state entries of one page table.
#[derive(Debug, Default)]
pub(super) struct StateTable {
    entries: HashMap<u32, StateEntry>,
    next_slot: u32,
    by_key: HashMap<PageHash, u32>,
    /// Boundary hash -> committed entries under it.
    by_boundary: HashMap<PageHash, Vec<u32>>,
    lru: Lru,
    lru_pages: usize,
    /// Entries with refcount > 0.
    pinned: u32,
    pages_held: u32,
    bytes_in_use: u64,
}

impl StateTable {
    pub(super) fn lru_pages(&self) -> usize {
        self.lru_pages
    }

    pub(super) fn peek_oldest(&self) -> Option<(u64, u32)> {
        self.lru.peek_oldest()
    }

    pub(super) fn cached(&self) -> u32 {
        self.by_key.len() as u32
    }

    pub(super) fn pinned(&self) -> u32 {
        self.pinned
    }

    pub(super) fn pages_held(&self) -> u32 {
        self.pages_held
    }

    pub(super) fn bytes_in_use(&self) -> u64 {
        self.bytes_in_use
    }

    fn unlink(&mut self, slot: u32) {
        let Some(e) = self.entries.get(&slot) else {
            return;
        };
        if self.by_key.get(&e.key) == Some(&slot) {
            self.by_key.remove(&e.key);
        }
        let boundary = e.boundary;
        if let Some(v) = self.by_boundary.get_mut(&boundary) {
            v.retain(|&s| s != slot);
            if v.is_empty() {
                self.by_boundary.remove(&boundary);
            }
        }
    }
}

/// A snapshot served by a lookup, pinned to the session.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateHit {
    pub slot: u32,
    /// Tokens the snapshot has consumed (= the lookup's `cached_tokens`).
    pub position: usize,
    pub page_ids: Vec<u32>,
    pub state_bytes: u64,
}

/// Answer of [`PageTable::allocate_state`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateAlloc {
    /// An equal snapshot is cached: nothing leased.
    pub already_cached: bool,
    pub slot: u32,
    /// Writable pages for the bytes; empty when they cannot be supplied now (or cached).
    pub page_ids: Vec<u32>,
}

impl PageTable {
    /// Leases `n_pages` pages for the snapshot of the state after the last of `tokens`
    /// (`state_bytes` bytes), unless an equal snapshot is cached (then it only counts as
    /// used). Evicts like [`PageTable::allocate`]; answers no pages when they do not fit.
    pub fn allocate_state(
        &mut self,
        session: u64,
        cache_salt: &str,
        tokens: &[u32],
        state_bytes: u64,
        n_pages: usize,
    ) -> Result<StateAlloc, CacheError> {
        let s = self.sessions.get(&session).ok_or(CacheError::UnknownSession(session))?;
        if tokens.is_empty() || state_bytes == 0 || n_pages == 0 {
            return Err(CacheError::InvalidArgument(
                "a state snapshot needs a non-empty prefix and a non-zero size".into(),
            ));
        }
        let pt = self.page_tokens;
        let full_pages = tokens.len() / pt;
        let root = root_hash(&s.model_fingerprint, cache_salt);
        let boundary = page_hashes(root, tokens, pt, full_pages).last().copied().unwrap_or(root);
        let tail = &tokens[full_pages * pt..];
        let key = state_hash(boundary, tail);
        if let Some(&slot) = self.states.by_key.get(&key)
            && let Some(e) = self.states.entries.get(&slot)
            && e.state_bytes == state_bytes
            && *e.tail == *tail
        {
            self.touch_state(slot);
            return Ok(StateAlloc { already_cached: true, ..Default::default() });
        }
        if !self.make_room(n_pages) {
            return Ok(StateAlloc::default());
        }
        let mut slot = self.states.next_slot;
        while self.states.entries.contains_key(&slot) {
            slot = slot.wrapping_add(1);
        }
        self.states.next_slot = slot.wrapping_add(1);
        let pages: Vec<u32> = self.free.split_off(self.free.len() - n_pages);
        for &id in &pages {
            self.pages[id as usize].state = PageState::State { slot };
        }
        let stamp = self.tick();
        self.states.pages_held += n_pages as u32;
        self.states.bytes_in_use += state_bytes;
        self.states.pinned += 1;
        self.states.entries.insert(
            slot,
            StateEntry {
                status: StateStatus::Writable { session },
                key,
                boundary,
                full_pages,
                tail: tail.into(),
                state_bytes,
                pages: pages.clone(),
                refcount: 1,
                stamp,
            },
        );
        if let Some(s) = self.sessions.get_mut(&session) {
            *s.state_refs.entry(slot).or_insert(0) += 1;
        }
        Ok(StateAlloc { already_cached: false, slot, page_ids: pages })
    }

    /// Publishes the session's written snapshot. Returns false (the entry stays private and
    /// is freed on release) when an equal one is cached already, or when the KV pages of its
    /// prefix are not all cached: a snapshot is useless without them.
    pub fn commit_state(&mut self, session: u64, slot: u32) -> Result<bool, CacheError> {
        if !self.sessions.contains_key(&session) {
            return Err(CacheError::UnknownSession(session));
        }
        let e = self.states.entries.get(&slot).ok_or(CacheError::StateNotHeld { session, slot })?;
        match e.status {
            StateStatus::Writable { session: owner } if owner == session => {}
            StateStatus::Committed | StateStatus::Detached
                if self.sessions[&session].state_refs.contains_key(&slot) =>
            {
                return Ok(false);
            }
            _ => return Err(CacheError::StateNotHeld { session, slot }),
        }
        let (key, boundary, full_pages) = (e.key, e.boundary, e.full_pages);
        let covered = self.state_prefix_covered(boundary, full_pages, &e.tail);
        let publish = covered && !self.states.by_key.contains_key(&key);
        let stamp = self.tick();
        let Some(e) = self.states.entries.get_mut(&slot) else {
            return Err(CacheError::StateNotHeld { session, slot });
        };
        e.stamp = stamp;
        if !publish {
            tracing::debug!(slot, covered, "state snapshot not published (duplicate, or its KV pages are not cached)");
            e.status = StateStatus::Detached;
            return Ok(false);
        }
        e.status = StateStatus::Committed;
        self.states.by_key.insert(key, slot);
        self.states.by_boundary.entry(boundary).or_default().push(slot);
        self.counters.states_committed += 1;
        Ok(true)
    }

    /// Drops one of the session's references per listed page and per listed state slot.
    /// All-or-nothing: every reference is checked before any is dropped.
    pub fn release_all(&mut self, session: u64, page_ids: &[u32], slots: &[u32]) -> Result<(), CacheError> {
        let s = self.sessions.get(&session).ok_or(CacheError::UnknownSession(session))?;
        let mut wanted: HashMap<u32, u32> = HashMap::new();
        for &slot in slots {
            *wanted.entry(slot).or_insert(0) += 1;
        }
        for (&slot, &n) in &wanted {
            if s.state_refs.get(&slot).copied().unwrap_or(0) < n {
                return Err(CacheError::StateNotHeld { session, slot });
            }
        }
        self.release(session, page_ids)?;
        for &slot in slots {
            if let Some(s) = self.sessions.get_mut(&session)
                && let Some(n) = s.state_refs.get_mut(&slot)
            {
                *n -= 1;
                if *n == 0 {
                    s.state_refs.remove(&slot);
                }
            }
            self.unpin_state(slot);
        }
        Ok(())
    }

    /// Whether committed pages cover the prefix of a snapshot: the full pages up to its
    /// boundary, and a child of the boundary starting with its tail.
    fn state_prefix_covered(&self, boundary: PageHash, full_pages: usize, tail: &[u32]) -> bool {
        let parent = if full_pages == 0 {
            None
        } else {
            match self.by_hash.get(&boundary) {
                Some(&id)
                    if self.pages[id as usize].state == PageState::Committed
                        && self.pages[id as usize].tokens.len() == self.page_tokens =>
                {
                    Some(id)
                }
                _ => return false,
            }
        };
        tail.is_empty() || self.tail_covered(boundary, parent, tail)
    }

    fn tail_covered(&self, boundary: PageHash, parent: Option<u32>, tail: &[u32]) -> bool {
        self.children_of.get(&boundary).is_some_and(|kids| {
            kids.iter().any(|&k| {
                let p = &self.pages[k as usize];
                p.parent == parent && p.tokens.starts_with(tail)
            })
        })
    }

    /// The deepest committed snapshot of `state_bytes` bytes along the matched prefix
    /// (`bounds[i]` = hash after `i` full pages) at a position in `1..=max_position`:
    /// (slot, position).
    pub(super) fn find_state(
        &self,
        bounds: &[PageHash],
        tokens: &[u32],
        max_position: usize,
        state_bytes: u64,
    ) -> Option<(u32, usize)> {
        let pt = self.page_tokens;
        for (i, boundary) in bounds.iter().enumerate().rev() {
            let base = i * pt;
            if base > max_position {
                continue;
            }
            let Some(slots) = self.states.by_boundary.get(boundary) else {
                continue;
            };
            let best = slots
                .iter()
                .filter_map(|&slot| self.states.entries.get(&slot).map(|e| (slot, e)))
                .filter(|(_, e)| {
                    let end = base + e.tail.len();
                    e.status == StateStatus::Committed
                        && e.full_pages == i
                        && e.state_bytes == state_bytes
                        && end > 0
                        && end <= max_position
                        && tokens[base..end] == *e.tail
                })
                .max_by_key(|(_, e)| e.tail.len());
            if let Some((slot, e)) = best {
                return Some((slot, base + e.tail.len()));
            }
        }
        None
    }

    /// Takes one reference to a committed snapshot for `session`.
    pub(super) fn pin_state(&mut self, session: u64, slot: u32) -> StateHit {
        let stamp = self.tick();
        let pt = self.page_tokens;
        let Some(e) = self.states.entries.get_mut(&slot) else {
            return StateHit::default();
        };
        if e.refcount == 0 {
            self.states.pinned += 1;
            if e.status == StateStatus::Committed {
                self.states.lru.remove(slot, e.stamp);
                self.states.lru_pages -= e.pages.len();
            }
        }
        e.refcount += 1;
        e.stamp = stamp;
        let hit = StateHit { slot, position: e.position(pt), page_ids: e.pages.clone(), state_bytes: e.state_bytes };
        if let Some(s) = self.sessions.get_mut(&session) {
            *s.state_refs.entry(slot).or_insert(0) += 1;
        }
        hit
    }

    /// Marks a cached snapshot as just used (its LRU position moves to the newest).
    fn touch_state(&mut self, slot: u32) {
        let stamp = self.tick();
        let Some(e) = self.states.entries.get_mut(&slot) else {
            return;
        };
        if e.refcount == 0 && e.status == StateStatus::Committed {
            self.states.lru.remove(slot, e.stamp);
            self.states.lru.insert(slot, stamp);
        }
        e.stamp = stamp;
    }

    /// Drops one reference (the session's own bookkeeping is the caller's job).
    pub(super) fn unpin_state(&mut self, slot: u32) {
        let stamp = self.tick();
        let Some(e) = self.states.entries.get_mut(&slot) else {
            debug_assert!(false, "unpin of an unknown state slot");
            return;
        };
        if e.refcount == 0 {
            debug_assert!(false, "unpin of an unreferenced state");
            return;
        }
        e.refcount -= 1;
        e.stamp = stamp;
        if e.refcount > 0 {
            return;
        }
        self.states.pinned -= 1;
        match e.status {
            StateStatus::Committed => {
                self.states.lru.insert(slot, stamp);
                self.states.lru_pages += e.pages.len();
            }
            StateStatus::Writable { .. } | StateStatus::Detached => self.free_state(slot),
        }
    }

    /// Removes an entry and returns its pages to the free list.
    fn free_state(&mut self, slot: u32) {
        self.states.unlink(slot);
        let Some(e) = self.states.entries.remove(&slot) else {
            return;
        };
        for &id in &e.pages {
            self.pages[id as usize] = super::Page::free();
            self.free.push(id);
        }
        self.states.pages_held -= e.pages.len() as u32;
        self.states.bytes_in_use -= e.state_bytes;
    }

    /// Evicts an unreferenced committed snapshot (on the state LRU).
    pub(super) fn evict_state(&mut self, slot: u32) {
        if let Some(e) = self.states.entries.get(&slot) {
            debug_assert!(e.refcount == 0 && e.status == StateStatus::Committed);
            if self.states.lru.remove(slot, e.stamp) {
                self.states.lru_pages -= e.pages.len();
            }
        }
        self.free_state(slot);
        self.counters.state_evictions += 1;
    }

    /// A committed snapshot whose prefix lost a page: evicted if unreferenced, otherwise
    /// detached (never served again, freed with its last reference).
    fn drop_state(&mut self, slot: u32) {
        let Some(e) = self.states.entries.get(&slot) else {
            return;
        };
        if e.refcount == 0 {
            self.evict_state(slot);
        } else {
            self.states.unlink(slot);
            if let Some(e) = self.states.entries.get_mut(&slot) {
                e.status = StateStatus::Detached;
            }
            self.counters.state_evictions += 1;
        }
    }

    /// After evicting the page with `hash` (child of `parent_hash`): drops the snapshots
    /// whose prefix it covered. Eviction goes leaves first, so snapshots below a full page
    /// have lost their tails already; those at its boundary and those under its parent whose
    /// tail no remaining child covers go now.
    pub(super) fn drop_states_after_eviction(&mut self, hash: PageHash, parent_hash: PageHash, partial: bool) {
        if !partial && let Some(slots) = self.states.by_boundary.get(&hash).cloned() {
            for slot in slots {
                self.drop_state(slot);
            }
        }
        let Some(siblings) = self.states.by_boundary.get(&parent_hash).cloned() else {
            return;
        };
        for slot in siblings {
            let Some(e) = self.states.entries.get(&slot) else {
                continue;
            };
            if e.tail.is_empty() {
                continue;
            }
            let parent = if e.full_pages == 0 { None } else { self.by_hash.get(&parent_hash).copied() };
            if !self.tail_covered(parent_hash, parent, &e.tail) {
                self.drop_state(slot);
            }
        }
    }

    /// Verifies the state invariants in the module doc (part of `check_invariants`).
    pub(super) fn check_states(&self) -> Result<(), String> {
        let st = &self.states;
        let mut refs: HashMap<u32, u32> = HashMap::new();
        for s in self.sessions.values() {
            for (&slot, &n) in &s.state_refs {
                *refs.entry(slot).or_insert(0) += n;
            }
        }
        let (mut pages, mut bytes, mut lru, mut lru_pages, mut committed) = (0u32, 0u64, 0, 0, 0);
        for (&slot, e) in &st.entries {
            let held = refs.get(&slot).copied().unwrap_or(0);
            if e.refcount != held {
                return Err(format!("state {slot}: refcount {} but sessions hold {held}", e.refcount));
            }
            for &id in &e.pages {
                if self.pages.get(id as usize).map(|p| p.state) != Some(PageState::State { slot }) {
                    return Err(format!("state {slot} lists page {id} which is not its own"));
                }
            }
            pages += e.pages.len() as u32;
            bytes += e.state_bytes;
            if e.key != state_hash(e.boundary, &e.tail) || e.tail.len() >= self.page_tokens {
                return Err(format!("state {slot}: key does not match its prefix"));
            }
            let listed = st.by_boundary.get(&e.boundary).map_or(0, |v| v.iter().filter(|&&s| s == slot).count());
            let in_lru = st.lru.contains(slot, e.stamp);
            match e.status {
                StateStatus::Writable { session } => {
                    if e.refcount == 0 || !self.sessions.contains_key(&session) {
                        return Err(format!("writable state {slot} is not held by its writer"));
                    }
                }
                StateStatus::Detached if e.refcount == 0 => {
                    return Err(format!("detached state {slot} is unreferenced but not freed"));
                }
                StateStatus::Detached => {}
                StateStatus::Committed => {
                    committed += 1;
                    if st.by_key.get(&e.key) != Some(&slot) || listed != 1 {
                        return Err(format!("committed state {slot} is not indexed once"));
                    }
                    if !self.state_prefix_covered(e.boundary, e.full_pages, &e.tail) {
                        return Err(format!("committed state {slot} has lost its prefix's pages"));
                    }
                    if in_lru != (e.refcount == 0) {
                        return Err(format!("state {slot}: in LRU = {in_lru}, refcount {}", e.refcount));
                    }
                    if in_lru {
                        lru += 1;
                        lru_pages += e.pages.len();
                    }
                }
            }
            if e.status != StateStatus::Committed && (listed != 0 || in_lru) {
                return Err(format!("unpublished state {slot} is indexed or on the LRU"));
            }
        }
        let state_pages = self.pages.iter().filter(|p| matches!(p.state, PageState::State { .. })).count();
        if pages != st.pages_held || state_pages != pages as usize || bytes != st.bytes_in_use {
            return Err(format!(
                "state pages {state_pages} / listed {pages} / gauge {}; bytes {bytes} / gauge {}",
                st.pages_held, st.bytes_in_use
            ));
        }
        if committed != st.by_key.len() || st.by_boundary.values().map(Vec::len).sum::<usize>() != committed {
            return Err("state indexes disagree with the committed entries".into());
        }
        if lru != st.lru.len() || lru_pages != st.lru_pages {
            return Err(format!(
                "state LRU holds {} ({} pages), {lru} ({lru_pages} pages) evictable",
                st.lru.len(),
                st.lru_pages
            ));
        }
        let pinned = st.entries.values().filter(|e| e.refcount > 0).count() as u32;
        if pinned != st.pinned {
            return Err(format!("states pinned gauge {} but {pinned} are referenced", st.pinned));
        }
        if refs.keys().any(|s| !st.entries.contains_key(s)) {
            return Err("a session references an unknown state slot".into());
        }
        Ok(())
    }
}
