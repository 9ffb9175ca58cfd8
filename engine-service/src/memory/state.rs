//! Recurrent-state snapshots through the prefix cache (hybrid models: the conv window and
//! fp32 SSM state of every Gated DeltaNet layer, `Backend::state_bytes()` bytes).
//!
//! Contract. A snapshot is the backend's per-sequence state after exactly `position` tokens
//! of a prefix. It lives in pages of the cache-service's arena (whole pages, in order; see
//! `CacheSession::state_chunks`) and is only usable together with the KV pages of that
//! prefix, so a lookup that wants a state serves the longest prefix whose pages are cached
//! AND that ends exactly at a snapshot; nothing when there is none. The engine then loads the
//! snapshot (`Backend::load_state`) and runs the rest of the prompt from `position`.
//!
//! Saving: `PageStore::save_state` leases pages (AllocateState, blocking up to the link's
//! call deadline: the answer says whether the snapshot is cached already, which spares the
//! copy; a missed deadline skips the snapshot), copies the bytes in, and
//! queues CommitState + Release on the session's ordered worker, behind the sequence's page
//! commits; the cache-service publishes a snapshot only if its prefix's KV pages are cached.
//! Without a cache-service everything here is a no-op (`SaveOutcome::Uncached`, no state).

use std::ptr::NonNull;
use std::sync::Arc;

use cache_client::client::{CacheSession, StateAllocation};

use engine_cpu::pages::PageAddr;

use super::deadline;
use super::store::{CacheLink, LeasedPage, PageSource};
use crate::EngineError;

/// Snapshots saved, by `outcome` (`stored`, `already_cached`, `no_room`) (counter).
pub const STATE_SAVES_TOTAL: &str = "edge_engine_state_saves_total";
/// Time to lease, copy in and queue the commit of one snapshot (histogram, seconds).
pub const STATE_SAVE_SECONDS: &str = "edge_engine_state_save_seconds";
/// Lookups that came back with a snapshot to restore (counter).
pub const STATE_RESTORES_TOTAL: &str = "edge_engine_state_restores_total";
/// Prompt tokens the KV pages could have served but no snapshot reached (counter).
pub const STATE_SHORTENED_TOKENS_TOTAL: &str = "edge_engine_state_shortened_tokens_total";

/// A snapshot pinned by a lookup: read it with [`StateLease::copy_to`], load it into the
/// backend, then hand it back with `PageStore::release_state` (or [`release_state`]).
#[derive(Clone, Debug)]
pub struct StateLease {
    pub slot: u32,
    /// Tokens the state has consumed: the sequence resumes at this position.
    pub position: usize,
    pub state_bytes: usize,
    pub source: PageSource,
    chunks: Vec<(PageAddr, usize)>,
}

impl StateLease {
    /// Copies the snapshot into `dst` (exactly `state_bytes` long).
    pub fn copy_to(&self, dst: &mut [u8]) -> Result<(), EngineError> {
        if dst.len() != self.state_bytes {
            return Err(EngineError::Internal(format!(
                "state buffer of {} bytes for a {}-byte snapshot",
                dst.len(),
                self.state_bytes
            )));
        }
        let mut at = 0;
        for &(p, n) in &self.chunks {
            // SAFETY: the chunk lies inside an arena page of this session (state_chunks checked
            // the ids); the snapshot is committed and pinned, so nothing writes it meanwhile.
            unsafe { std::ptr::copy_nonoverlapping(p.as_ptr(), dst[at..at + n].as_mut_ptr(), n) };
            at += n;
        }
        Ok(())
    }

    /// The snapshot's bytes as a new buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.state_bytes];
        // Cannot fail: the buffer has exactly state_bytes bytes.
        let _ = self.copy_to(&mut out);
        out
    }
}

/// What a lookup pinned for one prompt: KV pages covering `cached_tokens`, and with a
/// wanted state, the snapshot at exactly `cached_tokens`.
#[derive(Debug, Default)]
pub struct StatePrefix {
    pub pages: Vec<LeasedPage>,
    pub cached_tokens: usize,
    /// Of `cached_tokens`, those taken from the last page used in part (copy it on write).
    pub partial_page_tokens: usize,
    /// What the KV pages alone could have served (`- cached_tokens` were given up for lack
    /// of a snapshot).
    pub kv_cached_tokens: usize,
    pub state: Option<StateLease>,
    /// Generation of the cache session the pins belong to (0: nothing pinned).
    pub generation: u64,
}

/// How [`super::store::PageStore::save_state`] went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveOutcome {
    /// Written and its commit queued (the cache-service still refuses it if the prefix's KV
    /// pages are not cached by then).
    Stored,
    /// An equal snapshot is cached already; nothing copied.
    AlreadyCached,
    /// The arena has no room right now (everything pinned); nothing saved.
    NoRoom,
    /// No cache-service session: nothing to save into.
    Uncached,
}

fn cache_err(e: impl std::fmt::Display) -> EngineError {
    EngineError::Cache(e.to_string())
}

fn chunks(session: &CacheSession, page_ids: &[u32], bytes: u64) -> Result<Vec<(PageAddr, usize)>, EngineError> {
    Ok(session
        .state_chunks(page_ids, bytes)
        .map_err(cache_err)?
        .into_iter()
        .map(|(p, n)| (PageAddr::new(p), n))
        .collect())
}

/// Pins the longest cached prefix of `tokens` for session `generation`; with `state_bytes > 0`
/// only up to a snapshot of that size (which is pinned too). On an error nothing stays pinned.
pub async fn lookup_prefix(
    session: &CacheSession,
    generation: u64,
    salt: &str,
    tokens: &[u32],
    state_bytes: usize,
) -> Result<StatePrefix, EngineError> {
    let hit = if state_bytes == 0 {
        session.lookup_detailed(salt, tokens).await
    } else {
        session.lookup_with_state(salt, tokens, state_bytes as u64).await
    }
    .map_err(cache_err)?;
    let slots: Vec<u32> = hit.state.iter().map(|s| s.slot).collect();
    let built = (|| {
        let pages = hit
            .page_ids
            .iter()
            .map(|&id| {
                // An id outside the arena is a protocol error, not a page to use.
                session.page_ptr(id).map(|_| LeasedPage { id, source: PageSource::Shared(generation) })
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(cache_err)?;
        let state = match &hit.state {
            Some(s) => Some(StateLease {
                slot: s.slot,
                position: s.position,
                state_bytes: s.state_bytes as usize,
                source: PageSource::Shared(generation),
                chunks: chunks(session, &s.page_ids, s.state_bytes)?,
            }),
            None => None,
        };
        Ok::<_, EngineError>((pages, state))
    })();
    match built {
        Ok((pages, state)) => {
            if state.is_some() {
                metrics::counter!(STATE_RESTORES_TOTAL).increment(1);
            }
            metrics::counter!(STATE_SHORTENED_TOKENS_TOTAL)
                .increment(hit.kv_cached_tokens.saturating_sub(hit.cached_tokens) as u64);
            Ok(StatePrefix {
                pages,
                cached_tokens: hit.cached_tokens,
                partial_page_tokens: hit.partial_page_tokens,
                kv_cached_tokens: hit.kv_cached_tokens,
                state,
                generation,
            })
        }
        Err(e) => {
            let _ = session.release_all(&hit.page_ids, &slots).await;
            Err(e)
        }
    }
}

/// [`lookup_prefix`] with owned arguments (to run as a task under a deadline).
pub async fn lookup_prefix_owned(
    session: Arc<CacheSession>,
    generation: u64,
    salt: String,
    tokens: Vec<u32>,
    state_bytes: usize,
) -> Result<StatePrefix, EngineError> {
    lookup_prefix(&session, generation, &salt, &tokens, state_bytes).await
}

/// Gives back what a lookup pinned after its caller stopped waiting for it.
pub async fn release_late_prefix(session: Arc<CacheSession>, late: Result<StatePrefix, EngineError>) {
    if let Ok(prefix) = late {
        let pages: Vec<u32> = prefix.pages.iter().map(|p| p.id).collect();
        let slots: Vec<u32> = prefix.state.iter().map(|s| s.slot).collect();
        if !pages.is_empty() || !slots.is_empty() {
            let _ = session.release_all(&pages, &slots).await;
        }
    }
}

/// [`lookup_prefix`] on the link's live session, for the gRPC handler: without a usable
/// session (detached, or degraded after a missed deadline), when the cache fails, or when it
/// does not answer within the link's call timeout, the prompt simply runs uncached (an
/// empty prefix).
pub async fn lookup_prefix_linked(
    link: Option<&CacheLink>,
    salt: &str,
    tokens: &[u32],
    state_bytes: usize,
) -> StatePrefix {
    let Some(link) = link else { return StatePrefix::default() };
    let Some((generation, session)) = link.usable() else { return StatePrefix::default() };
    let call = lookup_prefix_owned(session.clone(), generation, salt.to_string(), tokens.to_vec(), state_bytes);
    match deadline::within(link.call_timeout(), call, move |late| release_late_prefix(session, late)).await {
        Some(Ok(prefix)) => prefix,
        Some(Err(e)) => {
            tracing::warn!(error = %e, "cache lookup failed; running uncached");
            StatePrefix::default()
        }
        None => {
            link.mark_degraded("lookup");
            StatePrefix::default()
        }
    }
}

/// Drops a lookup's pin on a snapshot (after loading it), if its session is still `session`'s.
pub async fn release_state(session: &CacheSession, generation: u64, lease: &StateLease) -> Result<(), EngineError> {
    if lease.source != PageSource::Shared(generation) {
        return Ok(());
    }
    session.release_all(&[], &[lease.slot]).await.map_err(cache_err)
}

/// Copies `bytes` into the pages an AllocateState answer leased. Returns the slot to commit
/// and release, or the outcome when there is nothing to write; on an error, the leased slot
/// (for the caller to release) with it.
pub(crate) fn write_leased(
    session: &CacheSession,
    alloc: StateAllocation,
    bytes: &[u8],
) -> Result<Result<u32, SaveOutcome>, (u32, EngineError)> {
    let (slot, page_ids) = match alloc {
        StateAllocation::AlreadyCached => return Ok(Err(SaveOutcome::AlreadyCached)),
        StateAllocation::NoRoom => return Ok(Err(SaveOutcome::NoRoom)),
        StateAllocation::Leased { slot, page_ids } => (slot, page_ids),
    };
    let chunks = session.state_chunks(&page_ids, bytes.len() as u64).map_err(|e| (slot, cache_err(e)))?;
    let mut at = 0;
    for (p, n) in chunks {
        write_chunk(p, &bytes[at..at + n]);
        at += n;
    }
    Ok(Ok(slot))
}

/// Gives back a snapshot lease that came after its caller stopped waiting for it.
pub(crate) async fn release_late_state_lease(
    session: Arc<CacheSession>,
    late: Result<StateAllocation, cache_client::CacheError>,
) {
    if let Ok(StateAllocation::Leased { slot, .. }) = late {
        let _ = session.release_all(&[], &[slot]).await;
    }
}

fn write_chunk(dst: NonNull<u8>, src: &[u8]) {
    // SAFETY: `dst` starts a chunk of at most one page stride inside the arena mapping
    // (state_chunks), of pages AllocateState leased writable to this session alone.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_ptr(), src.len()) };
}
