//! The page table: page hash -> page id, per-page state and refcounts, sessions' references.
//!
//! Two kinds of committed page: *full* pages (`page_tokens` tokens, keyed by the chained hash)
//! and *partial* pages (the tail of a prefix, 1..page_tokens tokens, keyed by
//! [`partial_hash`] of (parent hash, tail tokens)). A partial page is always a leaf. Lookup
//! walks full pages, then picks the child of the last matched prefix (full or partial) that
//! shares the most leading tokens with the rest of the prompt: the reuse point has token
//! granularity. A page used only in part is read-only to the engine, which copies it into a
//! fresh page before appending (copy on write).
//!
//! Invariants (checked by [`PageTable::check_invariants`] in the randomized test):
//! - every page is exactly one of: free (on the free list, refcount 0), writable (leased to
//!   one session, refcount >= 1, not in the hash map), committed (in the hash map under its
//!   hash, immutable tokens);
//! - a page's refcount equals the number of references all sessions hold to it;
//! - a committed page's parent (the page of the previous prefix) is committed, and its
//!   `children` counts the committed pages naming it as parent, and `children_of` lists it
//!   under its parent hash;
//! - the LRU holds exactly the committed pages with refcount 0 and no cached children;
//! - pages holding recurrent-state snapshots belong to exactly one state entry (see
//!   [`states`], which lists the state invariants) and are never referenced, hashed or on
//!   the page LRU; their space comes from the same free list, and eviction takes the least
//!   recently used of an evictable page and an evictable state.
//!
//! One owner: the whole table sits behind one `Mutex` in [`crate::Cache`]. Operations touch
//! several entries at once (a commit links child to parent, an eviction unlinks and may make
//! the parent evictable), which a sharded map could not make atomic without its own locking
//! protocol; each call holds the lock for microseconds (hashing a 24K-token prompt ~10 µs).

use std::collections::{HashMap, HashSet};

use crate::error::CacheError;
use crate::events::KvEvent;
use crate::evict::Lru;
use crate::hash::{PageHash, content_root, partial_hash, root_hash};

mod check;
mod lookup;
mod states;

pub use states::{StateAlloc, StateHit};

/// Why the uncached part of a prompt missed (the reason of the first page that missed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MissReason {
    /// Everything but the last token hit (it is always computed: its logits start generation).
    #[default]
    None,
    /// Nothing was ever cached for the next page of this prefix.
    NoMatch,
    /// The next page was cached once and evicted since.
    Evicted,
    /// The same tokens are cached, but under another model fingerprint or `cache_salt`.
    SaltMismatch,
    /// KV pages reach further, but no recurrent-state snapshot exists past the served point.
    NoStateSnapshot,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PageState {
    Free,
    /// Leased to one session, which may write it.
    Writable {
        session: u64,
    },
    /// Published under `Page::hash`; immutable.
    Committed,
    /// Holds part of the bytes of the state snapshot in this slot (see [`states`]).
    State {
        slot: u32,
    },
}

#[derive(Debug)]
struct Page {
    state: PageState,
    /// Valid while committed.
    hash: PageHash,
    /// Hash of the prefix this page extends (the root for page 0); valid while committed.
    parent_hash: PageHash,
    /// Page holding `parent_hash` (None for a first page); valid while committed.
    parent: Option<u32>,
    /// Salt-free chain hash of the prefix through this page (full pages; see `content_root`).
    content: PageHash,
    /// Token ids the KV was computed from; compared on every hit.
    tokens: Box<[u32]>,
    refcount: u32,
    /// Committed pages whose parent is this page.
    children: u32,
    /// Last use (logical clock); the LRU key.
    stamp: u64,
}

impl Page {
    fn free() -> Page {
        Page {
            state: PageState::Free,
            hash: PageHash(0),
            parent_hash: PageHash(0),
            parent: None,
            content: PageHash(0),
            tokens: Box::new([]),
            refcount: 0,
            children: 0,
            stamp: 0,
        }
    }

    fn evictable(&self) -> bool {
        self.state == PageState::Committed && self.refcount == 0 && self.children == 0
    }
}

#[derive(Debug)]
struct Session {
    model_fingerprint: String,
    /// Multiset of page references: page id -> count.
    refs: HashMap<u32, u32>,
    /// Multiset of state snapshot references: slot -> count.
    state_refs: HashMap<u32, u32>,
}

/// Lifetime counters (the same numbers as the Prometheus counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub prompt_tokens_queried: u64,
    pub tokens_hit_full_pages: u64,
    /// Tokens served from a page used in part (a partial page, or the head of a full page).
    pub tokens_hit_partial_pages: u64,
    /// Missed prompt tokens by reason; the four sum to `queried - hit`.
    pub tokens_missed_no_match: u64,
    pub tokens_missed_evicted: u64,
    pub tokens_missed_salt_mismatch: u64,
    /// The last prompt token of every lookup (never served from the cache).
    pub tokens_missed_last_token: u64,
    pub partial_pages_committed: u64,
    /// Total time spent in Lookup / Commit (the histograms' sums), nanoseconds.
    pub lookup_ns: u64,
    pub commit_ns: u64,
    pub lookups: u64,
    pub commits: u64,
    pub pages_committed: u64,
    pub evictions: u64,
    /// Tokens the KV pages could have served but a lookup gave up for lack of a state
    /// snapshot at a later position (a miss reason like the four above).
    pub tokens_missed_no_state: u64,
    /// Lookups that asked for a state snapshot, and those that got one.
    pub state_lookups: u64,
    pub state_restores: u64,
    /// Snapshots published, and cached snapshots evicted (for room, or with their prefix).
    pub states_committed: u64,
    pub state_evictions: u64,
}

/// A snapshot of the table's gauges and counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableStats {
    pub pages_total: u32,
    pub pages_free: u32,
    pub pages_cached: u32,
    /// Of `pages_cached`, the partial pages.
    pub pages_partial: u32,
    pub pages_pinned: u32,
    pub sessions: u32,
    /// Published state snapshots, those referenced by a session, the pages holding any
    /// snapshot (published or being written) and their bytes.
    pub states_cached: u32,
    pub states_pinned: u32,
    pub state_pages: u32,
    pub state_bytes: u64,
    pub counters: Counters,
}

/// Result of a lookup: pinned pages covering `cached_tokens` prompt tokens.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LookupHit {
    pub page_ids: Vec<u32>,
    pub cached_tokens: usize,
    /// Of `cached_tokens`, those in full pages (`page_ids` minus the partial one).
    pub full_page_tokens: usize,
    /// Of `cached_tokens`, those from the last page of `page_ids`, used in part: the engine
    /// must copy that page before appending to it.
    pub partial_page_tokens: usize,
    pub miss_reason: MissReason,
    /// Tokens the KV pages alone could serve (>= `cached_tokens`; larger only when a state
    /// was wanted and none exists that far).
    pub kv_cached_tokens: usize,
    /// The pinned state snapshot at exactly `cached_tokens`, when one was wanted and found.
    pub state: Option<StateHit>,
}

#[derive(Debug)]
pub struct PageTable {
    page_tokens: usize,
    pages: Vec<Page>,
    by_hash: HashMap<PageHash, u32>,
    /// Parent hash -> committed pages (full and partial) extending that prefix.
    children_of: HashMap<PageHash, Vec<u32>>,
    /// Content hash -> committed full pages with it (miss classification).
    by_content: HashMap<PageHash, u32>,
    /// Hashes of recently evicted pages (miss classification); cleared when it grows past
    /// a few times the arena, so its memory stays bounded.
    evicted: HashSet<PageHash>,
    partial_pages: u32,
    free: Vec<u32>,
    lru: Lru,
    sessions: HashMap<u64, Session>,
    states: states::StateTable,
    next_session: u64,
    clock: u64,
    pinned: u32,
    counters: Counters,
    /// Full pages published and evicted since the last [`PageTable::take_events`], when
    /// recorded ([`PageTable::record_events`]; crate::events).
    events: Option<Vec<KvEvent>>,
}

impl PageTable {
    /// An empty table over `page_count` pages of `page_tokens` tokens each.
    pub fn new(page_count: u32, page_tokens: usize) -> PageTable {
        PageTable {
            page_tokens: page_tokens.max(1),
            pages: (0..page_count).map(|_| Page::free()).collect(),
            by_hash: HashMap::new(),
            children_of: HashMap::new(),
            by_content: HashMap::new(),
            evicted: HashSet::new(),
            partial_pages: 0,
            // Reversed so that allocation hands out low ids first (nicer logs and tests).
            free: (0..page_count).rev().collect(),
            lru: Lru::new(),
            sessions: HashMap::new(),
            states: states::StateTable::default(),
            next_session: 1,
            clock: 0,
            pinned: 0,
            counters: Counters::default(),
            events: None,
        }
    }

    /// From now on, records the KV events of full pages published and evicted.
    pub fn record_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// The events recorded since the last call (none when not recording).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn record(&mut self, event: KvEvent) {
        if let Some(events) = &mut self.events {
            events.push(event);
        }
    }

    /// Drops every page and adopts a new geometry. Sessions and counters are kept; the caller
    /// guarantees no session holds a page (see `Cache::attach`).
    pub fn reformat(&mut self, page_count: u32, page_tokens: usize) {
        debug_assert!(self.pinned == 0);
        let sessions = std::mem::take(&mut self.sessions);
        let (next_session, counters) = (self.next_session, self.counters);
        let recording = self.events.is_some();
        *self = PageTable::new(page_count, page_tokens);
        self.sessions = sessions;
        self.next_session = next_session;
        self.counters = counters;
        if recording {
            self.events = Some(vec![KvEvent::AllCleared]);
        }
    }

    pub fn page_tokens(&self) -> usize {
        self.page_tokens
    }

    pub fn page_count(&self) -> u32 {
        self.pages.len() as u32
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// Pages referenced by any session.
    pub fn pinned_pages(&self) -> u32 {
        self.pinned
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    pub fn open_session(&mut self, model_fingerprint: &str) -> u64 {
        let id = self.next_session;
        self.next_session += 1;
        self.sessions.insert(
            id,
            Session {
                model_fingerprint: model_fingerprint.to_string(),
                refs: HashMap::new(),
                state_refs: HashMap::new(),
            },
        );
        id
    }

    /// Ends a session and drops every reference it holds; returns how many it held.
    /// Unknown ids are ignored (closing is idempotent).
    pub fn close_session(&mut self, session: u64) -> u64 {
        let Some(s) = self.sessions.remove(&session) else {
            return 0;
        };
        let mut released = 0u64;
        for (page, n) in s.refs {
            for _ in 0..n {
                self.unpin(page);
            }
            released += u64::from(n);
        }
        for (slot, n) in s.state_refs {
            for _ in 0..n {
                self.unpin_state(slot);
            }
            released += u64::from(n);
        }
        released
    }

    fn check_page(&self, page: u32) -> Result<(), CacheError> {
        if (page as usize) < self.pages.len() {
            Ok(())
        } else {
            Err(CacheError::PageOutOfRange { page, count: self.page_count() })
        }
    }

    /// Takes one reference to a page for `session` (the session must exist).
    fn pin(&mut self, session: u64, page: u32) {
        let stamp = self.tick();
        let p = &mut self.pages[page as usize];
        if p.evictable() {
            self.lru.remove(page, p.stamp);
        }
        if p.refcount == 0 {
            self.pinned += 1;
        }
        p.refcount += 1;
        p.stamp = stamp;
        if let Some(s) = self.sessions.get_mut(&session) {
            *s.refs.entry(page).or_insert(0) += 1;
        }
    }

    /// Drops one reference (the session's own bookkeeping is the caller's job).
    fn unpin(&mut self, page: u32) {
        let stamp = self.tick();
        let p = &mut self.pages[page as usize];
        debug_assert!(p.refcount > 0, "unpin of an unreferenced page");
        p.refcount = p.refcount.saturating_sub(1);
        p.stamp = stamp;
        if p.refcount > 0 {
            return;
        }
        self.pinned -= 1;
        match p.state {
            PageState::Committed => {
                if p.children == 0 {
                    self.lru.insert(page, stamp);
                }
            }
            PageState::Writable { .. } => {
                *p = Page::free();
                self.free.push(page);
            }
            PageState::Free | PageState::State { .. } => {
                debug_assert!(false, "free or state page had references")
            }
        }
    }

    /// Leases `count` fresh writable pages, evicting least recently used leaves as needed.
    /// Returns an empty list when the arena cannot supply them (nothing is evicted then).
    pub fn allocate(&mut self, session: u64, count: u32) -> Result<Vec<u32>, CacheError> {
        if !self.sessions.contains_key(&session) {
            return Err(CacheError::UnknownSession(session));
        }
        let count = count as usize;
        if count == 0 || !self.make_room(count) {
            return Ok(Vec::new());
        }
        let ids: Vec<u32> = self.free.split_off(self.free.len() - count);
        for &id in &ids {
            self.pages[id as usize].state = PageState::Writable { session };
            self.pin(session, id);
        }
        Ok(ids)
    }

    /// Evicts least recently used pages and states until `count` pages are free; false
    /// (evicting nothing) when even evicting everything unreferenced would not be enough.
    fn make_room(&mut self, count: usize) -> bool {
        if count > self.pages.len() {
            return false;
        }
        let have = self.free.len() + self.lru.len() + self.states.lru_pages();
        if have < count && self.free.len() + self.reclaimable_pages() + self.states.lru_pages() < count {
            return false;
        }
        while self.free.len() < count {
            let page = self.lru.peek_oldest();
            let state = self.states.peek_oldest();
            match (page, state) {
                (Some(p), Some(s)) if s.0 < p.0 => self.evict_state(s.1),
                (Some((_, p)), _) => {
                    self.lru.pop_oldest();
                    self.evict(p);
                }
                (None, Some((_, s))) => self.evict_state(s),
                (None, None) => break,
            }
        }
        if self.free.len() < count {
            // Unreachable while the invariants hold (reclaimable pages drain through the LRU).
            tracing::error!(count, free = self.free.len(), "eviction freed fewer pages than counted");
            return false;
        }
        true
    }

    /// Committed pages that eviction could free: unreferenced and with no referenced
    /// descendant. O(pages); only used when the LRU alone cannot satisfy an allocation.
    fn reclaimable_pages(&self) -> usize {
        let mut blocked = vec![false; self.pages.len()];
        for (id, p) in self.pages.iter().enumerate() {
            if p.state != PageState::Committed || p.refcount == 0 {
                continue;
            }
            let mut cur = Some(id as u32);
            while let Some(c) = cur {
                if blocked[c as usize] {
                    break;
                }
                blocked[c as usize] = true;
                cur = self.pages[c as usize].parent;
            }
        }
        self.pages.iter().zip(&blocked).filter(|(p, b)| p.state == PageState::Committed && !**b).count()
    }

    /// Frees an evictable page (already taken off the LRU).
    fn evict(&mut self, page: u32) {
        let p = &mut self.pages[page as usize];
        debug_assert!(p.evictable());
        let (hash, parent, parent_hash, content) = (p.hash, p.parent, p.parent_hash, p.content);
        let partial = p.tokens.len() < self.page_tokens;
        *p = Page::free();
        self.by_hash.remove(&hash);
        self.unlink_child(parent_hash, page);
        if partial {
            self.partial_pages -= 1;
        } else if let Some(n) = self.by_content.get_mut(&content) {
            *n -= 1;
            if *n == 0 {
                self.by_content.remove(&content);
            }
        }
        if self.evicted.len() >= 4 * self.pages.len() + 1024 {
            self.evicted.clear();
        }
        self.evicted.insert(hash);
        self.free.push(page);
        self.counters.evictions += 1;
        if !partial {
            self.record(KvEvent::Removed { hash: hash.event_id() });
        }
        if let Some(parent) = parent {
            let pp = &mut self.pages[parent as usize];
            pp.children -= 1;
            if pp.evictable() {
                // Its own last use, so an old chain is trimmed back to its root first.
                self.lru.insert(parent, pp.stamp);
            }
        }
        // Snapshots of prefixes this page covered cannot be served any more.
        self.drop_states_after_eviction(hash, parent_hash, partial);
    }

    fn unlink_child(&mut self, parent_hash: PageHash, page: u32) {
        if let Some(kids) = self.children_of.get_mut(&parent_hash) {
            kids.retain(|&k| k != page);
            if kids.is_empty() {
                self.children_of.remove(&parent_hash);
            }
        }
    }

    /// Links a newly committed page under its parent (the parent stops being a leaf).
    fn link_child(&mut self, parent_hash: PageHash, parent: Option<u32>, page: u32) {
        self.children_of.entry(parent_hash).or_default().push(page);
        if let Some(par) = parent {
            let pp = &mut self.pages[par as usize];
            if pp.evictable() {
                self.lru.remove(par, pp.stamp);
            }
            pp.children += 1;
        }
    }

    /// Publishes the session's full, writable pages of a sequence under their chained hashes.
    /// Returns how many pages were newly published. Validates everything before changing
    /// anything, so a rejected call leaves the table as it was.
    pub fn commit(
        &mut self,
        session: u64,
        cache_salt: &str,
        tokens: &[u32],
        page_ids: &[u32],
    ) -> Result<u32, CacheError> {
        self.commit_with_tail(session, cache_salt, tokens, page_ids, false)
    }

    /// [`PageTable::commit`], and with `tail` also publishes the page after the last full one
    /// as a partial page holding the remaining `tokens.len() % page_tokens` tokens, when it
    /// is the session's writable page and no equal partial page is cached yet (otherwise the
    /// tail is silently not published: it stays private and is freed on release).
    pub fn commit_with_tail(
        &mut self,
        session: u64,
        cache_salt: &str,
        tokens: &[u32],
        page_ids: &[u32],
        tail: bool,
    ) -> Result<u32, CacheError> {
        let s = self.sessions.get(&session).ok_or(CacheError::UnknownSession(session))?;
        for &id in page_ids {
            self.check_page(id)?;
            if !s.refs.contains_key(&id) {
                return Err(CacheError::PageNotHeld { session, page: id });
            }
        }
        let pt = self.page_tokens;
        let full = page_ids.len().min(tokens.len() / pt);
        let root = root_hash(&s.model_fingerprint, cache_salt);
        let hashes = crate::hash::page_hashes(root, tokens, pt, full);
        let contents = crate::hash::page_hashes(content_root(), tokens, pt, full);
        let mut writable_seen = HashSet::new();
        for (index, (&id, &h)) in page_ids.iter().zip(&hashes).enumerate() {
            let p = &self.pages[id as usize];
            match p.state {
                PageState::Committed if p.hash == h => {}
                PageState::Committed => return Err(CacheError::PageMismatch { page: id, index }),
                PageState::Writable { session: owner } if owner == session => {
                    if !writable_seen.insert(id) {
                        return Err(CacheError::InvalidArgument(format!("page {id} appears twice in page_ids")));
                    }
                }
                _ => return Err(CacheError::PageNotHeld { session, page: id }),
            }
        }

        let mut published = 0u32;
        let mut parent: Option<u32> = None;
        let mut prev = root;
        let mut chain_intact = true;
        for (i, (&id, &h)) in page_ids.iter().zip(&hashes).enumerate() {
            let page_tokens = &tokens[i * pt..(i + 1) * pt];
            if self.pages[id as usize].state == PageState::Committed {
                parent = Some(id);
                prev = h;
                continue;
            }
            if let Some(&existing) = self.by_hash.get(&h) {
                // Someone published this prefix first; ours stays private and is freed on release.
                let e = &self.pages[existing as usize];
                if *e.tokens != *page_tokens || e.parent != parent {
                    tracing::warn!(page = existing, "page hash collision on commit; not publishing the rest");
                    chain_intact = false;
                    break;
                }
                parent = Some(existing);
                prev = h;
                continue;
            }
            let stamp = self.tick();
            let p = &mut self.pages[id as usize];
            p.state = PageState::Committed;
            p.hash = h;
            p.parent_hash = prev;
            p.parent = parent;
            p.content = contents[i];
            p.tokens = page_tokens.into();
            p.stamp = stamp;
            self.by_hash.insert(h, id);
            *self.by_content.entry(contents[i]).or_insert(0) += 1;
            self.evicted.remove(&h);
            self.link_child(prev, parent, id);
            published += 1;
            let parent_event = parent.map(|_| prev.event_id());
            self.record(KvEvent::Stored { hash: h.event_id(), parent: parent_event, tokens: page_tokens.to_vec() });
            parent = Some(id);
            prev = h;
        }
        if tail
            && chain_intact
            && !tokens.len().is_multiple_of(pt)
            && hashes.len() == tokens.len() / pt
            && let Some(&id) = page_ids.get(full)
        {
            let rest = &tokens[full * pt..];
            let key = partial_hash(prev, rest);
            let own = self.pages[id as usize].state == PageState::Writable { session };
            if own && !self.by_hash.contains_key(&key) {
                let stamp = self.tick();
                let p = &mut self.pages[id as usize];
                p.state = PageState::Committed;
                p.hash = key;
                p.parent_hash = prev;
                p.parent = parent;
                p.tokens = rest.into();
                p.stamp = stamp;
                self.by_hash.insert(key, id);
                self.evicted.remove(&key);
                self.link_child(prev, parent, id);
                self.partial_pages += 1;
                self.counters.partial_pages_committed += 1;
                published += 1;
            }
        }
        self.counters.commits += 1;
        self.counters.pages_committed += u64::from(published);
        Ok(published)
    }

    /// Drops one of the session's references per listed page (a page may be listed as often
    /// as the session holds it). All-or-nothing.
    pub fn release(&mut self, session: u64, page_ids: &[u32]) -> Result<(), CacheError> {
        let s = self.sessions.get(&session).ok_or(CacheError::UnknownSession(session))?;
        let mut wanted: HashMap<u32, u32> = HashMap::new();
        for &id in page_ids {
            self.check_page(id)?;
            *wanted.entry(id).or_insert(0) += 1;
        }
        for (&id, &n) in &wanted {
            if s.refs.get(&id).copied().unwrap_or(0) < n {
                return Err(CacheError::PageNotHeld { session, page: id });
            }
        }
        for &id in page_ids {
            if let Some(s) = self.sessions.get_mut(&session)
                && let Some(n) = s.refs.get_mut(&id)
            {
                *n -= 1;
                if *n == 0 {
                    s.refs.remove(&id);
                }
            }
            self.unpin(id);
        }
        Ok(())
    }

    /// Adds one call's latency to the Lookup (`lookup`) or Commit totals.
    pub fn add_latency(&mut self, d: std::time::Duration, lookup: bool) {
        let ns = d.as_nanos() as u64;
        if lookup {
            self.counters.lookup_ns += ns;
        } else {
            self.counters.commit_ns += ns;
        }
    }

    pub fn stats(&self) -> TableStats {
        TableStats {
            pages_total: self.page_count(),
            pages_free: self.free.len() as u32,
            pages_cached: self.by_hash.len() as u32,
            pages_partial: self.partial_pages,
            pages_pinned: self.pinned,
            sessions: self.sessions.len() as u32,
            states_cached: self.states.cached(),
            states_pinned: self.states.pinned(),
            state_pages: self.states.pages_held(),
            state_bytes: self.states.bytes_in_use(),
            counters: self.counters,
        }
    }

    /// Committed page ids with their stored tokens (tests use it to check immutability).
    pub fn committed_pages(&self) -> Vec<(u32, PageHash, Vec<u32>)> {
        let mut out: Vec<_> = self
            .pages
            .iter()
            .enumerate()
            .filter(|(_, p)| p.state == PageState::Committed)
            .map(|(i, p)| (i as u32, p.hash, p.tokens.to_vec()))
            .collect();
        out.sort_by_key(|e| e.0);
        out
    }

    /// Test hook: maps `hash` to `page` as if it had been committed with `tokens`, simulating
    /// a hash collision. `page` must be free.
    #[cfg(test)]
    pub(crate) fn force_entry(&mut self, hash: PageHash, parent_hash: PageHash, page: u32, tokens: &[u32]) {
        let stamp = self.tick();
        self.free.retain(|&f| f != page);
        let p = &mut self.pages[page as usize];
        p.state = PageState::Committed;
        p.hash = hash;
        p.parent_hash = parent_hash;
        p.parent = None;
        p.tokens = tokens.into();
        p.stamp = stamp;
        p.content = PageHash(0);
        self.by_hash.insert(hash, page);
        self.children_of.entry(parent_hash).or_default().push(page);
        *self.by_content.entry(PageHash(0)).or_insert(0) += 1;
        self.lru.insert(page, stamp);
    }
}
