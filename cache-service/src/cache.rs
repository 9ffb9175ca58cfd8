//! The cache as one object: the arena plus the page table behind one mutex, with metrics.
//! Every RPC is one short critical section here; `service.rs` only converts types.
//!
//! Layout rule on Attach: the first engine fixes the page stride (its `page_bytes` rounded
//! up to 4096) and `page_tokens`. A later engine whose pages fit the stride and whose
//! `page_tokens` match shares the arena (and its warm cache). Otherwise the arena is
//! re-formatted, dropping every cached page, but only when no session is attached: a live
//! engine has mapped the old geometry, and re-formatting would move its pages under it; in
//! that case Attach fails with FAILED_PRECONDITION.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use proto::cache::v1::ArenaLayout;

use crate::arena::{Arena, PAGES_OFFSET};
use crate::error::CacheError;
use crate::lease::SessionLease;
use crate::metrics;
use crate::table::{LookupHit, PageTable, StateAlloc, TableStats};

/// What an engine declares when it attaches.
#[derive(Clone, Debug)]
pub struct AttachParams {
    pub model_fingerprint: String,
    pub page_bytes: u64,
    pub page_tokens: u32,
    pub engine_name: String,
}

/// Largest page size accepted, in tokens.
pub const MAX_PAGE_TOKENS: u32 = 4096;

#[derive(Debug)]
struct Inner {
    arena: Arena,
    table: PageTable,
}

#[derive(Debug)]
pub struct Cache {
    inner: Mutex<Inner>,
    /// Configured tokens per page; the first engine's value wins (with a warning) if it differs.
    page_tokens: u32,
    shutdown: tokio::sync::watch::Sender<bool>,
    /// Where the table's KV events go, when published (crate::events).
    kv_events: Option<crate::events::Publisher>,
}

impl Cache {
    /// Wraps a freshly created arena; the page geometry is fixed by the first Attach.
    pub fn new(arena: Arena, page_tokens: u32) -> Arc<Cache> {
        Arc::new(Cache {
            inner: Mutex::new(Inner { arena, table: PageTable::new(0, 1) }),
            page_tokens,
            shutdown: tokio::sync::watch::Sender::new(false),
            kv_events: None,
        })
    }

    /// [`Cache::new`], publishing the arena's KV events on `publisher`.
    pub fn with_kv_events(arena: Arena, page_tokens: u32, publisher: crate::events::Publisher) -> Arc<Cache> {
        let mut table = PageTable::new(0, 1);
        table.record_events();
        Arc::new(Cache {
            inner: Mutex::new(Inner { arena, table }),
            page_tokens,
            shutdown: tokio::sync::watch::Sender::new(false),
            kv_events: Some(publisher),
        })
    }

    /// Hands the events an operation recorded to the publisher, still under the lock, so
    /// batches leave in the order the table changed.
    fn publish_events(&self, inner: &mut Inner) {
        if let Some(publisher) = &self.kv_events {
            publisher.publish(inner.table.take_events());
        }
    }

    /// Ends every Attach stream (engines see their session end) so the server can drain.
    pub fn begin_shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    pub(crate) fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-applied change behind (table ops
        // validate before mutating), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens a session; the returned lease closes it (dropping all its refs) when dropped.
    pub fn attach(self: &Arc<Self>, p: &AttachParams) -> Result<(SessionLease, ArenaLayout), CacheError> {
        if p.page_bytes == 0 {
            return Err(CacheError::InvalidArgument("page_bytes must be > 0".into()));
        }
        if p.page_tokens == 0 || p.page_tokens > MAX_PAGE_TOKENS {
            return Err(CacheError::InvalidArgument(format!(
                "page_tokens must be in 1..={MAX_PAGE_TOKENS}, got {}",
                p.page_tokens
            )));
        }
        if p.model_fingerprint.is_empty() {
            return Err(CacheError::InvalidArgument("model_fingerprint must not be empty".into()));
        }
        let mut inner = self.lock();
        let fits =
            inner.arena.geometry().is_some_and(|g| p.page_bytes <= g.page_stride && p.page_tokens == g.page_tokens);
        if !fits {
            let wanted = inner.arena.plan(p.page_bytes, p.page_tokens)?;
            if let Some(old) = inner.arena.geometry() {
                let sessions = inner.table.session_count();
                if sessions > 0 {
                    return Err(CacheError::LayoutConflict(format!(
                        "engine {:?} needs page_bytes {} / page_tokens {}, but the arena is formatted for \
                         page stride {} / page_tokens {} and {sessions} session(s) are attached; \
                         stop them or run another cache-service",
                        p.engine_name, p.page_bytes, p.page_tokens, old.page_stride, old.page_tokens
                    )));
                }
                tracing::warn!(
                    engine = %p.engine_name,
                    old_stride = old.page_stride,
                    old_page_tokens = old.page_tokens,
                    new_stride = wanted.page_stride,
                    new_page_tokens = wanted.page_tokens,
                    dropped_pages = inner.table.stats().pages_cached,
                    "re-formatting the arena for a new page layout; the cache is emptied"
                );
            } else {
                if p.page_tokens != self.page_tokens {
                    tracing::warn!(
                        engine = %p.engine_name,
                        configured = self.page_tokens,
                        engine_page_tokens = p.page_tokens,
                        "the first engine's page_tokens differs from the configured value; following the engine"
                    );
                }
                tracing::info!(
                    page_stride = wanted.page_stride,
                    page_count = wanted.page_count,
                    page_tokens = wanted.page_tokens,
                    "arena formatted"
                );
            }
            inner.arena.format(wanted);
            inner.table.reformat(wanted.page_count, wanted.page_tokens as usize);
            self.publish_events(&mut inner);
        }
        let session_id = inner.table.open_session(&p.model_fingerprint);
        let layout = layout_of(&inner.arena);
        let before = inner.table.stats().counters;
        metrics::record(&before, &inner.table.stats());
        drop(inner);
        tracing::info!(session_id, engine = %p.engine_name, fingerprint = %p.model_fingerprint, "engine attached");
        Ok((SessionLease::new(self.clone(), session_id), layout))
    }

    /// Drops a session and its references (called by [`SessionLease`]'s drop).
    pub(crate) fn close_session(&self, session_id: u64) {
        let mut inner = self.lock();
        let before = inner.table.stats().counters;
        let released = inner.table.close_session(session_id);
        metrics::record(&before, &inner.table.stats());
        drop(inner);
        tracing::info!(session_id, released_refs = released, "engine session closed");
    }

    pub fn lookup(&self, session_id: u64, cache_salt: &str, tokens: &[u32]) -> Result<LookupHit, CacheError> {
        self.lookup_with_state(session_id, cache_salt, tokens, None)
    }

    /// [`Cache::lookup`]; with `want_state = Some(state_bytes)` only up to a recurrent-state
    /// snapshot of that size (see `PageTable::lookup_with_state`).
    pub fn lookup_with_state(
        &self,
        session_id: u64,
        cache_salt: &str,
        tokens: &[u32],
        want_state: Option<u64>,
    ) -> Result<LookupHit, CacheError> {
        let start = Instant::now();
        let hit = self.with_table(|t| {
            let hit = t.lookup_with_state(session_id, cache_salt, tokens, want_state);
            t.add_latency(start.elapsed(), true);
            hit
        })?;
        metrics::record_lookup_latency(start.elapsed());
        Ok(hit)
    }

    pub fn allocate(&self, session_id: u64, count: u32) -> Result<Vec<u32>, CacheError> {
        self.with_table(|t| t.allocate(session_id, count))
    }

    pub fn commit(
        &self,
        session_id: u64,
        cache_salt: &str,
        tokens: &[u32],
        page_ids: &[u32],
        include_partial_tail: bool,
    ) -> Result<u32, CacheError> {
        let start = Instant::now();
        let n = self.with_table(|t| {
            let n = t.commit_with_tail(session_id, cache_salt, tokens, page_ids, include_partial_tail);
            t.add_latency(start.elapsed(), false);
            n
        })?;
        metrics::record_commit_latency(start.elapsed());
        Ok(n)
    }

    pub fn release(&self, session_id: u64, page_ids: &[u32]) -> Result<(), CacheError> {
        self.with_table(|t| t.release(session_id, page_ids))
    }

    /// Drops the session's references to pages and state snapshots (all-or-nothing).
    pub fn release_all(&self, session_id: u64, page_ids: &[u32], state_slots: &[u32]) -> Result<(), CacheError> {
        self.with_table(|t| t.release_all(session_id, page_ids, state_slots))
    }

    /// Leases pages for a `state_bytes`-byte snapshot of the state after `tokens` (as many
    /// pages as the bytes need at the arena's page stride), unless an equal one is cached.
    pub fn allocate_state(
        &self,
        session_id: u64,
        cache_salt: &str,
        tokens: &[u32],
        state_bytes: u64,
    ) -> Result<StateAlloc, CacheError> {
        let stride = self
            .lock()
            .arena
            .geometry()
            .map(|g| g.page_stride)
            .ok_or_else(|| CacheError::InvalidArgument("the arena is not formatted yet".into()))?;
        let n_pages = usize::try_from(state_bytes.div_ceil(stride))
            .map_err(|_| CacheError::InvalidArgument(format!("state_bytes {state_bytes} is too large")))?;
        self.with_table(|t| t.allocate_state(session_id, cache_salt, tokens, state_bytes, n_pages))
    }

    /// Publishes a snapshot written into an `allocate_state` lease; false if not published.
    pub fn commit_state(&self, session_id: u64, slot: u32) -> Result<bool, CacheError> {
        self.with_table(|t| t.commit_state(session_id, slot))
    }

    pub fn stats(&self) -> TableStats {
        self.lock().table.stats()
    }

    /// The arena layout engines map (page fields are 0 before the first Attach).
    pub fn layout(&self) -> ArenaLayout {
        layout_of(&self.lock().arena)
    }

    /// Runs one table operation and publishes the metric deltas it caused.
    fn with_table<T>(&self, op: impl FnOnce(&mut PageTable) -> Result<T, CacheError>) -> Result<T, CacheError> {
        let mut inner = self.lock();
        let before = inner.table.stats().counters;
        let out = op(&mut inner.table);
        self.publish_events(&mut inner);
        let after = inner.table.stats();
        drop(inner);
        metrics::record(&before, &after);
        out
    }

    /// Full invariant check of the table (tests and debugging).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.lock().table.check_invariants()
    }
}

fn layout_of(arena: &Arena) -> ArenaLayout {
    let g = arena.geometry();
    ArenaLayout {
        path: arena.path().display().to_string(),
        file_bytes: arena.file_bytes(),
        pages_offset: PAGES_OFFSET,
        page_stride: g.map_or(0, |g| g.page_stride),
        page_count: g.map_or(0, |g| g.page_count),
        page_tokens: g.map_or(0, |g| g.page_tokens),
    }
}
