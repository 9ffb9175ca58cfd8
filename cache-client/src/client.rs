//! What the engine links: a typed client of the Cache service and the engine's mapping of
//! the arena.
//!
//! [`CacheClient::attach`] opens the session stream, reads `Attached`, maps the arena file
//! read-write and keeps the stream open in a background task for the life of the
//! [`CacheSession`]. Dropping the session closes the stream, and the cache-service then
//! releases every page the session held. [`CacheSession::is_alive`] turns false when the
//! cache-service goes away (the stream ends or errors). All calls are async (tonic); each
//! is one RPC carrying ids only, the KV bytes are read and written through
//! [`CacheSession::page_ptr`].

use std::fs::OpenOptions;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use memmap2::{MmapOptions, MmapRaw};
use proto::cache::v1::cache_client::CacheClient as Grpc;
use proto::cache::v1::{
    AllocateRequest, AllocateStateRequest, ArenaLayout, AttachRequest, CommitRequest, CommitStateRequest,
    LookupRequest, ReleaseRequest, StatsRequest, StatsResponse, session_event,
};
use proto::transport::{AuthToken, Dial};
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// The generated client over a channel that adds the auth token.
type Rpc = Grpc<InterceptedService<Channel, AuthToken>>;

use crate::arena_header::{Header, MAGIC, VERSION};
use crate::error::CacheError;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to a cache-service (cheap to clone).
#[derive(Clone, Debug)]
pub struct CacheClient {
    grpc: Rpc,
}

impl CacheClient {
    /// Connects to `unix:/path.sock`, `http://host:port` or a bare `host:port`, without an
    /// auth token.
    pub async fn connect(endpoint: &str) -> Result<CacheClient, CacheError> {
        CacheClient::connect_with_token(endpoint, AuthToken::none()).await
    }

    /// Connects and sends `auth` on every call (a cache-service with a token requires it).
    pub async fn connect_with_token(endpoint: &str, auth: AuthToken) -> Result<CacheClient, CacheError> {
        let channel = Dial::new(endpoint, CONNECT_TIMEOUT)?.connect().await?;
        Ok(CacheClient { grpc: Grpc::with_interceptor(channel, auth) })
    }

    /// Opens a session for one engine and maps the arena. `page_bytes` is the engine's KV
    /// bytes per page; `page_tokens` must match the arena's (or the arena is re-formatted
    /// if no other engine is attached).
    pub async fn attach(
        &self,
        model_fingerprint: &str,
        page_bytes: u64,
        page_tokens: u32,
        engine_name: &str,
    ) -> Result<CacheSession, CacheError> {
        let mut grpc = self.grpc.clone();
        let request = AttachRequest {
            model_fingerprint: model_fingerprint.to_string(),
            page_bytes,
            page_tokens,
            engine_name: engine_name.to_string(),
        };
        let mut stream = grpc.attach(request).await?.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| CacheError::Protocol("the Attach stream ended before Attached".into()))?;
        let Some(session_event::Kind::Attached(attached)) = first.kind else {
            return Err(CacheError::Protocol("the first Attach event is not Attached".into()));
        };
        let layout = attached.layout.ok_or_else(|| CacheError::Protocol("Attached carries no arena layout".into()))?;
        let map = open_arena(&layout, page_bytes, page_tokens)?;

        let alive = Arc::new(AtomicBool::new(true));
        let flag = alive.clone();
        let session_id = attached.session_id;
        // Holding the stream keeps the session; its end means the cache-service is gone.
        let keepalive = tokio::spawn(async move {
            let reason = loop {
                match stream.message().await {
                    Ok(Some(_)) => continue,
                    Ok(None) => break "the cache-service ended the session".to_string(),
                    Err(status) => break status.to_string(),
                }
            };
            flag.store(false, Ordering::Release);
            tracing::warn!(session_id, %reason, "cache session lost");
        });
        tracing::info!(session_id, page_count = layout.page_count, page_stride = layout.page_stride, "cache attached");
        Ok(CacheSession { grpc, session_id, layout, map, alive, keepalive })
    }

    /// Counters and gauges of the cache-service.
    pub async fn stats(&self) -> Result<StatsResponse, CacheError> {
        Ok(self.grpc.clone().stats(StatsRequest { prometheus_text: false }).await?.into_inner())
    }

    /// The cache-service's Prometheus page, as its `/metrics` serves it.
    pub async fn prometheus_text(&self) -> Result<String, CacheError> {
        Ok(self.grpc.clone().stats(StatsRequest { prometheus_text: true }).await?.into_inner().prometheus_text)
    }
}

/// Maps the arena an `Attached` describes, after checking that the layout is one the engine
/// asked for and that the file and its header agree with it: a corrupted or foreign file is
/// an error, never a mapping the engine would read out of bounds.
pub fn open_arena(layout: &ArenaLayout, page_bytes: u64, page_tokens: u32) -> Result<MmapRaw, CacheError> {
    check_layout(layout, page_bytes, page_tokens)?;
    map_arena(layout)
}

fn check_layout(layout: &ArenaLayout, page_bytes: u64, page_tokens: u32) -> Result<(), CacheError> {
    let bad = |what: String| Err(CacheError::Protocol(format!("arena layout: {what}")));
    if layout.page_tokens != page_tokens {
        return bad(format!("page_tokens {} != requested {page_tokens}", layout.page_tokens));
    }
    if layout.page_stride < page_bytes || layout.page_count == 0 {
        return bad(format!(
            "stride {} / {} pages cannot hold {page_bytes}-byte pages",
            layout.page_stride, layout.page_count
        ));
    }
    let end =
        layout.page_stride.checked_mul(u64::from(layout.page_count)).and_then(|b| b.checked_add(layout.pages_offset));
    if end.is_none_or(|end| end > layout.file_bytes) || layout.pages_offset < Header::BYTES as u64 {
        return bad(format!("pages do not fit the {}-byte file", layout.file_bytes));
    }
    Ok(())
}

fn map_arena(layout: &ArenaLayout) -> Result<MmapRaw, CacheError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&layout.path)
        .map_err(|e| CacheError::io(format!("opening the arena {}", layout.path), e))?;
    let len = file.metadata().map_err(|e| CacheError::io(format!("stat {}", layout.path), e))?.len();
    if len != layout.file_bytes {
        return Err(CacheError::Protocol(format!(
            "{} is {len} bytes, the layout says {}",
            layout.path, layout.file_bytes
        )));
    }
    let map = MmapOptions::new()
        .len(layout.file_bytes as usize)
        .map_raw(&file)
        .map_err(|e| CacheError::io(format!("mapping {}", layout.path), e))?;
    // SAFETY: the mapping is at least `layout.file_bytes` >= Header::BYTES long (checked above);
    // the header is written once per format, before any Attached that describes it.
    let head = unsafe { std::slice::from_raw_parts(map.as_ptr(), Header::BYTES) };
    let h = Header::decode(head).ok_or_else(|| CacheError::Protocol("short arena header".into()))?;
    if h.magic != MAGIC
        || h.version != VERSION
        || h.page_stride != layout.page_stride
        || h.page_count != layout.page_count
        || h.pages_offset != layout.pages_offset
    {
        return Err(CacheError::Protocol(format!("arena header {h:?} disagrees with the layout {layout:?}")));
    }
    Ok(map)
}

/// A pinned cached prefix (see [`CacheSession::lookup_detailed`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheHit {
    pub page_ids: Vec<u32>,
    pub cached_tokens: usize,
    pub full_page_tokens: usize,
    pub partial_page_tokens: usize,
    pub miss_reason: proto::cache::v1::MissReason,
    /// Tokens the KV pages alone could serve (> `cached_tokens` only when a state snapshot
    /// was wanted and none exists that far).
    pub kv_cached_tokens: usize,
    /// The pinned recurrent-state snapshot after exactly `cached_tokens` tokens (lookups
    /// with a state only); release it with [`CacheSession::release_all`] once loaded.
    pub state: Option<StateSnapshot>,
}

/// A recurrent-state snapshot in the arena: `state_bytes` bytes spread over whole pages
/// (see [`CacheSession::state_chunks`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateSnapshot {
    pub slot: u32,
    /// Tokens the state has consumed.
    pub position: usize,
    pub page_ids: Vec<u32>,
    pub state_bytes: u64,
}

/// Answer of [`CacheSession::allocate_state`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum StateAllocation {
    /// An equal snapshot is cached already: nothing to write.
    #[default]
    AlreadyCached,
    /// The arena cannot supply the pages now (everything pinned).
    NoRoom,
    /// Write the bytes into these pages, then `commit_state(slot)` and release the slot.
    Leased { slot: u32, page_ids: Vec<u32> },
}

/// One engine's session: page leases plus the arena mapping. Share it with `Arc`.
#[derive(Debug)]
pub struct CacheSession {
    grpc: Rpc,
    session_id: u64,
    layout: ArenaLayout,
    map: MmapRaw,
    alive: Arc<AtomicBool>,
    keepalive: JoinHandle<()>,
}

impl Drop for CacheSession {
    fn drop(&mut self) {
        // Dropping the stream resets it; the cache-service then releases our pages.
        self.keepalive.abort();
    }
}

impl CacheSession {
    pub fn session_id(&self) -> u64 {
        self.session_id
    }

    pub fn layout(&self) -> &ArenaLayout {
        &self.layout
    }

    pub fn page_tokens(&self) -> usize {
        self.layout.page_tokens as usize
    }

    pub fn page_count(&self) -> u32 {
        self.layout.page_count
    }

    /// Bytes between consecutive pages (>= the engine's page_bytes, 4096-aligned).
    pub fn page_stride(&self) -> usize {
        self.layout.page_stride as usize
    }

    /// False once the session stream has ended: the cache-service exited or dropped us.
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// First byte of a page in this process's mapping. The pointer stays valid for the life
    /// of the session; writing is allowed only to pages leased writable by `allocate` and
    /// not yet committed.
    pub fn page_ptr(&self, page_id: u32) -> Result<NonNull<u8>, CacheError> {
        if page_id >= self.layout.page_count {
            return Err(CacheError::PageOutOfRange { page: page_id, count: self.layout.page_count });
        }
        let offset = self.layout.pages_offset + u64::from(page_id) * self.layout.page_stride;
        // SAFETY: check_layout proved pages_offset + page_count * stride <= file_bytes = map length.
        let p = unsafe { self.map.as_mut_ptr().add(offset as usize) };
        NonNull::new(p).ok_or_else(|| CacheError::Protocol("null arena mapping".into()))
    }

    /// Pins the longest cached full-page prefix of `tokens`: (page ids, cached tokens).
    /// Kept for callers that only use whole pages; it drops (releases) a partial-page hit.
    pub async fn lookup(&self, cache_salt: &str, tokens: &[u32]) -> Result<(Vec<u32>, usize), CacheError> {
        let mut hit = self.lookup_detailed(cache_salt, tokens).await?;
        if hit.partial_page_tokens > 0
            && let Some(last) = hit.page_ids.pop()
        {
            self.release(&[last]).await?;
        }
        Ok((hit.page_ids, hit.full_page_tokens))
    }

    /// Pins the longest cached prefix of `tokens` at token granularity. When
    /// `partial_page_tokens > 0` the last page is shared and used in part: copy it into a
    /// page of your own before appending to it.
    pub async fn lookup_detailed(&self, cache_salt: &str, tokens: &[u32]) -> Result<CacheHit, CacheError> {
        self.lookup_inner(cache_salt, tokens, None).await
    }

    /// For hybrid models: pins the longest cached prefix of `tokens` that ends exactly at a
    /// recurrent-state snapshot of `state_bytes` bytes, and that snapshot (`hit.state`).
    /// Without a snapshot nothing is served. Release both pages and slot when done.
    pub async fn lookup_with_state(
        &self,
        cache_salt: &str,
        tokens: &[u32],
        state_bytes: u64,
    ) -> Result<CacheHit, CacheError> {
        if state_bytes == 0 {
            return Err(CacheError::InvalidArgument("lookup_with_state needs state_bytes > 0".into()));
        }
        self.lookup_inner(cache_salt, tokens, Some(state_bytes)).await
    }

    async fn lookup_inner(
        &self,
        cache_salt: &str,
        tokens: &[u32],
        state_bytes: Option<u64>,
    ) -> Result<CacheHit, CacheError> {
        let request = LookupRequest {
            session_id: self.session_id,
            cache_salt: cache_salt.to_string(),
            token_ids: tokens.to_vec(),
            want_state: state_bytes.is_some(),
            state_bytes: state_bytes.unwrap_or(0),
        };
        let r = self.grpc.clone().lookup(request).await?.into_inner();
        let state = r.has_state.then(|| StateSnapshot {
            slot: r.state_slot,
            position: r.state_position as usize,
            page_ids: r.state_page_ids.clone(),
            state_bytes: r.state_bytes,
        });
        let hit = CacheHit {
            miss_reason: r.miss_reason(),
            page_ids: r.page_ids,
            cached_tokens: r.cached_tokens as usize,
            full_page_tokens: r.full_page_tokens as usize,
            partial_page_tokens: r.partial_page_tokens as usize,
            kv_cached_tokens: r.kv_cached_tokens as usize,
            state,
        };
        let state_ok = match (&hit.state, state_bytes) {
            (None, _) => true,
            (Some(s), Some(bytes)) => {
                s.position == hit.cached_tokens
                    && s.state_bytes == bytes
                    && s.page_ids.len() as u64 == bytes.div_ceil(self.layout.page_stride.max(1))
            }
            (Some(_), None) => false,
        };
        if hit.full_page_tokens + hit.partial_page_tokens != hit.cached_tokens
            || hit.cached_tokens > tokens.len()
            || !state_ok
        {
            let slots: Vec<u32> = hit.state.iter().map(|s| s.slot).collect();
            let _ = self.release_all(&hit.page_ids, &slots).await;
            return Err(CacheError::Protocol(format!("inconsistent lookup answer {hit:?}")));
        }
        Ok(hit)
    }

    /// Leases pages for the snapshot of the state after the last of `tokens` (the prefix
    /// from position 0), unless an equal snapshot is cached.
    pub async fn allocate_state(
        &self,
        cache_salt: &str,
        tokens: &[u32],
        state_bytes: u64,
    ) -> Result<StateAllocation, CacheError> {
        let request = AllocateStateRequest {
            session_id: self.session_id,
            cache_salt: cache_salt.to_string(),
            token_ids: tokens.to_vec(),
            state_bytes,
        };
        let r = self.grpc.clone().allocate_state(request).await?.into_inner();
        if r.already_cached {
            return Ok(StateAllocation::AlreadyCached);
        }
        if r.page_ids.is_empty() {
            return Ok(StateAllocation::NoRoom);
        }
        if r.page_ids.len() as u64 != state_bytes.div_ceil(self.layout.page_stride.max(1)) {
            let _ = self.release_all(&[], &[r.slot]).await;
            return Err(CacheError::Protocol(format!(
                "AllocateState gave {} pages for {state_bytes} bytes",
                r.page_ids.len()
            )));
        }
        Ok(StateAllocation::Leased { slot: r.slot, page_ids: r.page_ids })
    }

    /// Publishes a snapshot written into an `allocate_state` lease; false when it was not
    /// published (an equal one is cached, or the prefix's KV pages are not). The session
    /// keeps its reference either way.
    pub async fn commit_state(&self, slot: u32) -> Result<bool, CacheError> {
        let request = CommitStateRequest { session_id: self.session_id, slot };
        Ok(self.grpc.clone().commit_state(request).await?.into_inner().committed)
    }

    /// Where the bytes of a snapshot live in this process's mapping: one (pointer, length)
    /// per page, in order; the lengths add up to `state_bytes`. Reading is allowed while the
    /// slot is held; writing only to a slot leased by `allocate_state` and not committed.
    pub fn state_chunks(&self, page_ids: &[u32], state_bytes: u64) -> Result<Vec<(NonNull<u8>, usize)>, CacheError> {
        let stride = self.layout.page_stride;
        if page_ids.len() as u64 != state_bytes.div_ceil(stride.max(1)) {
            return Err(CacheError::InvalidArgument(format!(
                "{} pages cannot hold exactly {state_bytes} state bytes",
                page_ids.len()
            )));
        }
        let mut left = state_bytes;
        page_ids
            .iter()
            .map(|&id| {
                let n = left.min(stride);
                left -= n;
                self.page_ptr(id).map(|p| (p, n as usize))
            })
            .collect()
    }

    /// Leases `count` writable pages; an empty list means they do not fit right now.
    pub async fn allocate(&self, count: u32) -> Result<Vec<u32>, CacheError> {
        let request = AllocateRequest { session_id: self.session_id, count };
        Ok(self.grpc.clone().allocate(request).await?.into_inner().page_ids)
    }

    /// Publishes the full pages of a sequence (`page_ids` from position 0); returns how many
    /// were newly published. The session keeps its references.
    pub async fn commit(&self, cache_salt: &str, tokens: &[u32], page_ids: &[u32]) -> Result<u32, CacheError> {
        self.commit_with_tail(cache_salt, tokens, page_ids, false).await
    }

    /// [`CacheSession::commit`], and with `partial_tail` also the page after the last full
    /// one as a partial page (it must be a writable page of this session and is immutable
    /// afterwards).
    pub async fn commit_with_tail(
        &self,
        cache_salt: &str,
        tokens: &[u32],
        page_ids: &[u32],
        partial_tail: bool,
    ) -> Result<u32, CacheError> {
        let request = CommitRequest {
            session_id: self.session_id,
            cache_salt: cache_salt.to_string(),
            token_ids: tokens.to_vec(),
            page_ids: page_ids.to_vec(),
            include_partial_tail: partial_tail,
        };
        Ok(self.grpc.clone().commit(request).await?.into_inner().committed_pages)
    }

    /// Drops one reference per listed page.
    pub async fn release(&self, page_ids: &[u32]) -> Result<(), CacheError> {
        self.release_all(page_ids, &[]).await
    }

    /// Drops one reference per listed page and per listed state snapshot slot.
    pub async fn release_all(&self, page_ids: &[u32], state_slots: &[u32]) -> Result<(), CacheError> {
        let request = ReleaseRequest {
            session_id: self.session_id,
            page_ids: page_ids.to_vec(),
            state_slots: state_slots.to_vec(),
        };
        self.grpc.clone().release(request).await?;
        Ok(())
    }

    /// Counters and gauges of the cache-service.
    pub async fn stats(&self) -> Result<StatsResponse, CacheError> {
        Ok(self.grpc.clone().stats(StatsRequest { prometheus_text: false }).await?.into_inner())
    }

    /// The cache-service's Prometheus page, as its `/metrics` serves it.
    pub async fn prometheus_text(&self) -> Result<String, CacheError> {
        Ok(self.grpc.clone().stats(StatsRequest { prometheus_text: true }).await?.into_inner().prometheus_text)
    }
}
