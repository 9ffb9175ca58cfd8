//! Where a sequence's pages come from: the cache-service's shared arena (the normal case)
//! or a local heap pool (running uncached). The step loop calls this from its own thread;
//! arena calls go over gRPC on the tokio runtime. Allocation blocks (its answer is needed
//! now); commits and releases are queued to one worker per session so they stay in order.
//!
//! Surviving a cache-service restart: the engine's current session lives in a
//! [`CacheLink`], which a background task ([`keep_attached`]) refills after the session
//! dies. Every [`LeasedPage`] records its [`PageSource`] (the local pool, or the arena of one
//! session *generation*). [`PageStore::refresh`] notices a dead session: it stops using the
//! arena (new sequences get local pages, uncached) and reports the lost generation so the
//! step loop can fail the sequences that hold its pages; when the link holds a live session
//! again, the store switches back to it. Pages of a dead generation are never released or
//! committed (the cache-service dropped them with the session).
//!
//! Hybrid models also save and restore recurrent-state snapshots through the same session
//! ([`PageStore::save_state`], [`PageStore::lookup_with_state`]; see [`super::state`]).
//!
//! Surviving a stalled cache-service: every call whose answer the engine waits for (lookup,
//! allocate, snapshot lease) has a deadline ([`CacheLink::call_timeout`]; [`super::deadline`]).
//! A miss marks the link *degraded*: from then on new work skips the cache (local pages,
//! no lookups, no snapshots) without waiting, until [`keep_attached`] sees the cache-service
//! answer again. Sequences already on arena pages keep them (the memory stays mapped), and
//! their commits and releases wait in the ordered queue.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use cache_client::client::{CacheClient, CacheSession};
use tokio::sync::mpsc;

use super::deadline::{self, CACHE_TIMEOUTS_TOTAL};
use super::lease::{PageLease, Returned, Returns};
use super::state::{self, SaveOutcome, StateLease, StatePrefix};
use super::{HostPages, KvLayout, LOCAL_SPACE, LocalPagePool, PageId};
use crate::EngineError;

/// Where a leased page lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageSource {
    Local,
    /// The arena of the cache session with this generation (see [`CacheLink`]).
    Shared(u64),
}

/// A page leased to one sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeasedPage {
    /// The page's index in its source (the pool's, or the arena's page id).
    pub id: u32,
    pub source: PageSource,
}

impl LeasedPage {
    /// The page as the backend knows it: its source's page space and its index there.
    pub fn page_id(&self) -> PageId {
        PageId::new(space_of(self.source), self.id)
    }
}

/// The page space of a source: [`LOCAL_SPACE`], or the arena's session generation.
pub fn space_of(source: PageSource) -> u32 {
    match source {
        PageSource::Local => LOCAL_SPACE,
        // Generations count re-attaches of one process; u32 is ample.
        PageSource::Shared(generation) => u32::try_from(generation).unwrap_or(u32::MAX - 1),
    }
}

/// A change in the page memory the backend must know (see [`PageStore::take_space_changes`]).
pub enum SpaceChange {
    Map(u32, Arc<dyn HostPages>),
    Unmap(u32),
}

/// A cache session's arena as page memory: mapped for as long as this (and so the session)
/// lives.
struct ArenaPages(Arc<CacheSession>);

impl HostPages for ArenaPages {
    fn base(&self) -> NonNull<u8> {
        // Dangling only for an arena without pages, whose base is never offset.
        self.0.page_ptr(0).unwrap_or(NonNull::dangling())
    }
    fn stride_bytes(&self) -> usize {
        self.0.page_stride()
    }
    fn page_count(&self) -> usize {
        self.0.page_count() as usize
    }
}

/// How long the engine waits for one cache-service table call (lookup, allocate, snapshot
/// lease) before going on uncached. They take well under a millisecond on a live service.
pub const DEFAULT_CACHE_CALL_TIMEOUT: Duration = Duration::from_millis(100);

/// How long a degraded link's probe waits for the cache-service.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The engine's current cache session, replaced after a reconnect. Generations number the
/// sessions of this process (1, 2, ...), so pages of an old session are recognisable.
#[derive(Debug)]
pub struct CacheLink {
    current: RwLock<Option<(u64, Arc<CacheSession>)>>,
    generations: std::sync::atomic::AtomicU64,
    /// Why new work skips the live session (a call missed its deadline), until it answers.
    degraded: Mutex<Option<String>>,
    call_timeout: Duration,
}

/// The link as `/health` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkStatus {
    Attached,
    /// Attached, but skipped: the reason.
    Degraded(String),
    /// No live session (the cache-service is gone); re-attaching in the background.
    Detached,
}

impl CacheLink {
    pub fn new() -> Arc<CacheLink> {
        CacheLink::with_call_timeout(DEFAULT_CACHE_CALL_TIMEOUT)
    }

    /// A link whose table calls wait at most `call_timeout`.
    pub fn with_call_timeout(call_timeout: Duration) -> Arc<CacheLink> {
        Arc::new(CacheLink {
            current: RwLock::new(None),
            generations: Default::default(),
            degraded: Mutex::new(None),
            call_timeout,
        })
    }

    /// The deadline of one table call.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// The live session for new work: `None` while detached or degraded.
    pub fn usable(&self) -> Option<(u64, Arc<CacheSession>)> {
        if self.degraded().is_some() { None } else { self.current() }
    }

    /// Why new work skips the cache, if it does.
    pub fn degraded(&self) -> Option<String> {
        self.degraded.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// A call (`op`) missed its deadline: new work skips the cache until it answers again.
    pub fn mark_degraded(&self, op: &'static str) {
        metrics::counter!(CACHE_TIMEOUTS_TOTAL, "op" => op).increment(1);
        let mut degraded = self.degraded.lock().unwrap_or_else(|p| p.into_inner());
        if degraded.is_none() {
            let reason = format!("the cache-service did not answer {op} within {} ms", self.call_timeout.as_millis());
            tracing::warn!(%reason, "cache-service stalled: serving uncached until it answers again");
            *degraded = Some(reason);
        }
    }

    fn clear_degraded(&self) {
        *self.degraded.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    pub fn status(&self) -> LinkStatus {
        match (self.current(), self.degraded()) {
            (None, _) => LinkStatus::Detached,
            (Some(_), Some(reason)) => LinkStatus::Degraded(reason),
            (Some(_), None) => LinkStatus::Attached,
        }
    }

    /// The live session and its generation; `None` while detached or after it died.
    pub fn current(&self) -> Option<(u64, Arc<CacheSession>)> {
        let guard = self.current.read().unwrap_or_else(|p| p.into_inner());
        guard.as_ref().filter(|(_, s)| s.is_alive()).cloned()
    }

    /// Installs a new session; returns its generation.
    pub fn set(&self, session: Arc<CacheSession>) -> u64 {
        let generation = self.generations.fetch_add(1, std::sync::atomic::Ordering::AcqRel) + 1;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some((generation, session));
        generation
    }
}

/// How the engine attaches: endpoint and what it declares.
#[derive(Clone, Debug)]
pub struct AttachSpec {
    pub endpoint: String,
    /// The services' shared secret, sent on every cache call (none: no token).
    pub auth: proto::transport::AuthToken,
    pub fingerprint: String,
    pub page_bytes: u64,
    pub page_tokens: u32,
}

impl AttachSpec {
    pub async fn attach(&self) -> Result<CacheSession, EngineError> {
        let client = CacheClient::connect_with_token(&self.endpoint, self.auth.clone())
            .await
            .map_err(|e| EngineError::Cache(e.to_string()))?;
        client
            .attach(&self.fingerprint, self.page_bytes, self.page_tokens, "engine-service")
            .await
            .map_err(|e| EngineError::Cache(e.to_string()))
    }
}

/// Re-attaches whenever the link's session is dead (cache-service restarted), and clears a
/// degraded link once its session answers a probe, checking every `poll`. Runs until the
/// link is dropped by everyone else.
pub async fn keep_attached(link: std::sync::Weak<CacheLink>, spec: AttachSpec, poll: Duration) {
    let mut announced = false;
    loop {
        tokio::time::sleep(poll).await;
        let Some(l) = link.upgrade() else { return };
        if let Some((_, session)) = l.current() {
            announced = false;
            if l.degraded().is_some() {
                // Stalled, not gone: the session comes back into use once it answers.
                if let Ok(Ok(_)) = tokio::time::timeout(PROBE_TIMEOUT, session.stats()).await {
                    l.clear_degraded();
                    tracing::info!(endpoint = %spec.endpoint, "the cache-service answers again; caching resumed");
                }
            }
            continue;
        }
        if !announced {
            tracing::warn!(endpoint = %spec.endpoint, "cache session lost; serving uncached and reconnecting");
            announced = true;
        }
        match tokio::time::timeout(Duration::from_secs(5), spec.attach()).await {
            Ok(Ok(session)) => {
                let generation = l.set(Arc::new(session));
                tracing::info!(endpoint = %spec.endpoint, generation, "re-attached to the cache-service");
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "cache-service not back yet"),
            Err(_) => tracing::debug!("cache-service attach timed out"),
        }
    }
}

enum CacheOp {
    Commit {
        salt: String,
        tokens: Vec<u32>,
        page_ids: Vec<u32>,
        tail: bool,
    },
    Release {
        page_ids: Vec<u32>,
    },
    /// Publish a written snapshot, then drop the writer's lease on it.
    CommitState {
        slot: u32,
    },
    ReleaseStates {
        slots: Vec<u32>,
    },
    /// Answers once every earlier op is done.
    Barrier(tokio::sync::oneshot::Sender<()>),
}

/// The arena of one session plus its ordered op worker.
pub struct SharedStore {
    session: Arc<CacheSession>,
    generation: u64,
    runtime: tokio::runtime::Handle,
    ops: mpsc::UnboundedSender<CacheOp>,
}

impl SharedStore {
    /// Spawns the session's ordered op worker on `runtime`.
    pub fn new(session: Arc<CacheSession>, generation: u64, runtime: tokio::runtime::Handle) -> SharedStore {
        let (ops, mut rx) = mpsc::unbounded_channel::<CacheOp>();
        let worker_session = session.clone();
        runtime.spawn(async move {
            while let Some(op) = rx.recv().await {
                if let CacheOp::Barrier(done) = op {
                    let _ = done.send(());
                    continue;
                }
                if !worker_session.is_alive() {
                    continue; // its leases died with the session
                }
                let result = match op {
                    CacheOp::Commit { salt, tokens, page_ids, tail } => {
                        worker_session.commit_with_tail(&salt, &tokens, &page_ids, tail).await.map(|_| ())
                    }
                    CacheOp::Release { page_ids } => worker_session.release(&page_ids).await.map(|_| ()),
                    CacheOp::CommitState { slot } => {
                        match worker_session.commit_state(slot).await {
                            Ok(committed) => {
                                if !committed {
                                    tracing::debug!(slot, "state snapshot not published (duplicate, or its KV pages are not cached)");
                                }
                                worker_session.release_all(&[], &[slot]).await
                            }
                            Err(e) => {
                                let _ = worker_session.release_all(&[], &[slot]).await;
                                Err(e)
                            }
                        }
                    }
                    CacheOp::ReleaseStates { slots } => worker_session.release_all(&[], &slots).await,
                    CacheOp::Barrier(_) => Ok(()),
                };
                if let Err(e) = result {
                    tracing::warn!(error = %e, "cache-service call failed; the cache may hold stale pins until the session ends");
                }
            }
        });
        SharedStore { session, generation, runtime, ops }
    }
}

/// What [`PageStore::refresh`] changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refresh {
    Unchanged,
    /// The session of this generation died: its pages are gone (a live successor, if the
    /// link already has one, is in use from now on).
    Lost(u64),
    /// A (new) session is in use from now on.
    Attached(u64),
}

/// The step loop's source of pages.
pub struct PageStore {
    layout: KvLayout,
    local_pages: usize,
    /// Created on first use (a cached engine normally never needs it).
    local: Option<LocalPagePool>,
    shared: Option<SharedStore>,
    link: Option<(Arc<CacheLink>, tokio::runtime::Handle)>,
    /// Spaces mapped or gone since the step loop last told the backend.
    space_changes: Vec<SpaceChange>,
    /// Pages and snapshot pins given back by dropped guards, applied in order.
    returns: (std::sync::mpsc::Sender<Returned>, std::sync::mpsc::Receiver<Returned>),
}

impl PageStore {
    /// A store without a cache-service: every page is local.
    pub fn local(layout: KvLayout, local_pages: usize) -> PageStore {
        PageStore {
            layout,
            local_pages,
            local: None,
            shared: None,
            link: None,
            space_changes: Vec::new(),
            returns: std::sync::mpsc::channel(),
        }
    }

    /// A store that uses the link's session while it is alive and the local pool otherwise.
    pub fn linked(
        layout: KvLayout,
        local_pages: usize,
        link: Arc<CacheLink>,
        runtime: tokio::runtime::Handle,
    ) -> PageStore {
        let mut store = PageStore {
            layout,
            local_pages,
            local: None,
            shared: None,
            link: Some((link, runtime)),
            space_changes: Vec::new(),
            returns: std::sync::mpsc::channel(),
        };
        store.refresh();
        store
    }

    /// Follows the link: drops a dead session and adopts the link's live one (in the same
    /// call, so a sequence looked up on the new session is usable at once). Call once per step.
    pub fn refresh(&mut self) -> Refresh {
        self.apply_returns();
        let Some((link, runtime)) = &self.link else { return Refresh::Unchanged };
        let mut lost = None;
        if let Some(shared) = &self.shared {
            if shared.session.is_alive() {
                return Refresh::Unchanged;
            }
            let generation = shared.generation;
            lost = Some(generation);
            self.shared = None;
            self.space_changes.push(SpaceChange::Unmap(space_of(PageSource::Shared(generation))));
            tracing::warn!(generation, "cache session died: new sequences run uncached on local pages");
        }
        if let Some((generation, session)) = link.current() {
            let space = space_of(PageSource::Shared(generation));
            self.space_changes.push(SpaceChange::Map(space, Arc::new(ArenaPages(session.clone()))));
            self.shared = Some(SharedStore::new(session, generation, runtime.clone()));
            if lost.is_none() {
                return Refresh::Attached(generation);
            }
        }
        lost.map_or(Refresh::Unchanged, Refresh::Lost)
    }

    /// The generation of the session in use, if any.
    pub fn generation(&self) -> Option<u64> {
        self.shared.as_ref().map(|s| s.generation)
    }

    /// Whether a page can still be used: local, or from the session in use.
    pub fn is_usable(&self, page: &LeasedPage) -> bool {
        match page.source {
            PageSource::Local => true,
            PageSource::Shared(g) => self.generation() == Some(g),
        }
    }

    fn local_pool(&mut self) -> &mut LocalPagePool {
        let (layout, n) = (self.layout, self.local_pages);
        let changes = &mut self.space_changes;
        self.local.get_or_insert_with(|| {
            let pool = LocalPagePool::new(layout, n);
            changes.push(SpaceChange::Map(LOCAL_SPACE, pool.memory()));
            pool
        })
    }

    /// The spaces mapped (the local pool on first use, each session's arena) and gone (a
    /// dead session's) since the last call, in order: the step loop tells the backend.
    pub fn take_space_changes(&mut self) -> Vec<SpaceChange> {
        std::mem::take(&mut self.space_changes)
    }

    /// Where guards ([`PageLease`], [`super::lease::StatePin`]) give back what they hold.
    pub fn returns(&self) -> Returns {
        Returns(self.returns.0.clone())
    }

    /// Releases what dropped guards gave back, in the order they were dropped (also done
    /// before every allocation, refresh and flush).
    pub fn apply_returns(&mut self) {
        while let Ok(returned) = self.returns.1.try_recv() {
            match returned {
                Returned::Pages(pages) => self.release(&pages),
                Returned::State(lease) => self.release_state(&lease),
            }
        }
    }

    /// [`PageStore::allocate`] as a guard: the pages come back when it is dropped.
    pub fn allocate_lease(&mut self, n: usize) -> Result<Option<PageLease>, EngineError> {
        let returns = self.returns();
        Ok(self.allocate(n)?.map(|pages| PageLease::new(pages, returns)))
    }

    /// Whether the link is degraded (new work skips the cache).
    fn degraded(&self) -> bool {
        self.link.as_ref().is_some_and(|(link, _)| link.degraded().is_some())
    }

    /// The deadline of one table call.
    fn call_timeout(&self) -> Duration {
        self.link.as_ref().map_or(DEFAULT_CACHE_CALL_TIMEOUT, |(link, _)| link.call_timeout())
    }

    /// A call missed its deadline.
    fn timed_out(&self, op: &'static str) {
        if let Some((link, _)) = &self.link {
            link.mark_degraded(op);
        }
    }

    /// The session for new work: the one in use, unless the link is degraded.
    fn usable_shared(&self) -> Option<&SharedStore> {
        self.shared.as_ref().filter(|_| !self.degraded())
    }

    fn allocate_local(&mut self, n: usize) -> Option<Vec<LeasedPage>> {
        self.local_pool().allocate(n).map(|pages| {
            pages.into_iter().map(|(id, _)| LeasedPage { id: id as u32, source: PageSource::Local }).collect()
        })
    }

    /// Leases `n` writable pages, or `Ok(None)` when the store cannot supply them now. With a
    /// stalled cache-service (the call misses its deadline, or missed one before) the pages
    /// are local: the sequence runs uncached.
    pub fn allocate(&mut self, n: usize) -> Result<Option<Vec<LeasedPage>>, EngineError> {
        self.apply_returns();
        if n == 0 {
            return Ok(Some(Vec::new()));
        }
        let Some(shared) = self.usable_shared() else {
            return Ok(self.allocate_local(n));
        };
        let session = shared.session.clone();
        let generation = shared.generation;
        let late_ops = shared.ops.clone();
        let answer = deadline::within_blocking(
            &shared.runtime,
            self.call_timeout(),
            async move { session.allocate(n as u32).await },
            // pages leased after the deadline go straight back
            move |late| async move {
                if let Ok(ids) = late
                    && !ids.is_empty()
                {
                    let _ = late_ops.send(CacheOp::Release { page_ids: ids });
                }
            },
        );
        let Some(answer) = answer else {
            self.timed_out("allocate");
            return Ok(self.allocate_local(n));
        };
        let shared = self.shared.as_ref().expect("checked above");
        let ids = answer.map_err(|e| EngineError::Cache(e.to_string()))?;
        if ids.len() < n {
            if !ids.is_empty() {
                let _ = shared.ops.send(CacheOp::Release { page_ids: ids });
            }
            return Ok(None);
        }
        if let Some(&bad) = ids.iter().find(|&&id| id >= shared.session.page_count()) {
            let _ = shared.ops.send(CacheOp::Release { page_ids: ids });
            return Err(EngineError::Cache(format!("the cache-service leased page {bad}, outside its arena")));
        }
        Ok(Some(ids.into_iter().map(|id| LeasedPage { id, source: PageSource::Shared(generation) }).collect()))
    }

    /// Publishes a sequence's pages covering `tokens` (full pages; with `tail`, also the
    /// partial page after them). Skipped unless every page is of the session in use.
    pub fn commit(&mut self, salt: &str, tokens: &[u32], pages: &[LeasedPage], tail: bool) {
        let Some(shared) = &self.shared else { return };
        if pages.is_empty() || pages.iter().any(|p| p.source != PageSource::Shared(shared.generation)) {
            return;
        }
        let _ = shared.ops.send(CacheOp::Commit {
            salt: salt.to_string(),
            tokens: tokens.to_vec(),
            page_ids: pages.iter().map(|p| p.id).collect(),
            tail,
        });
    }

    /// Returns pages: local ones to the pool, the current session's to the cache-service;
    /// pages of a dead session are just forgotten.
    pub fn release(&mut self, pages: &[LeasedPage]) {
        let current = self.generation();
        let mut ids = Vec::new();
        for p in pages {
            match p.source {
                PageSource::Local => {
                    if let Some(pool) = &mut self.local {
                        pool.release(p.id as usize);
                    }
                }
                PageSource::Shared(g) if Some(g) == current => ids.push(p.id),
                PageSource::Shared(_) => {}
            }
        }
        if let (Some(shared), false) = (&self.shared, ids.is_empty()) {
            let _ = shared.ops.send(CacheOp::Release { page_ids: ids });
        }
    }

    /// Pages free right now, when the store knows (the local pool); `None` for the arena,
    /// where the cache-service answers each lease.
    pub fn free_pages_hint(&self) -> Option<usize> {
        match (&self.shared, &self.local) {
            (Some(_), _) => None,
            (None, Some(pool)) => Some(pool.free_pages()),
            (None, None) => Some(self.local_pages),
        }
    }

    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Pages the store leases from: the arena's while attached, else the local pool's.
    pub fn capacity_pages(&self) -> usize {
        match &self.shared {
            Some(shared) => shared.session.page_count() as usize,
            None => self.local_pages,
        }
    }

    pub fn page_tokens(&self) -> usize {
        self.layout.page_tokens
    }

    /// Pins the longest cached prefix of `tokens` and, with `state_bytes > 0` (a hybrid
    /// model's `Backend::state_bytes()`), only up to a recurrent-state snapshot of that size,
    /// which comes back pinned in `state`. Blocks on the cache-service; call it from the step
    /// loop thread, not from the runtime (the gRPC handler uses [`state::lookup_prefix`]).
    /// Without a session (uncached), nothing is served.
    pub fn lookup_with_state(
        &mut self,
        salt: &str,
        tokens: &[u32],
        state_bytes: usize,
    ) -> Result<StatePrefix, EngineError> {
        let Some(shared) = self.usable_shared() else { return Ok(StatePrefix::default()) };
        let (session, generation) = (shared.session.clone(), shared.generation);
        let (salt, tokens) = (salt.to_string(), tokens.to_vec());
        let answer = deadline::within_blocking(
            &shared.runtime,
            self.call_timeout(),
            state::lookup_prefix_owned(session.clone(), generation, salt, tokens, state_bytes),
            move |late| state::release_late_prefix(session, late),
        );
        answer.unwrap_or_else(|| {
            self.timed_out("lookup");
            Ok(StatePrefix::default())
        })
    }

    /// Saves `bytes` (a `Backend::save_state` snapshot) as the state after exactly
    /// `tokens_prefix` (from position 0). Commit the pages covering the prefix first
    /// ([`PageStore::commit`]: the snapshot's commit is queued behind them); the cache-service
    /// publishes it only if they are cached. Blocks for the lease (one RPC) and the copy.
    pub fn save_state(&mut self, salt: &str, tokens_prefix: &[u32], bytes: &[u8]) -> Result<SaveOutcome, EngineError> {
        if tokens_prefix.is_empty() || bytes.is_empty() {
            return Err(EngineError::Internal("a state snapshot needs a non-empty prefix and bytes".into()));
        }
        let Some(shared) = self.usable_shared() else { return Ok(SaveOutcome::Uncached) };
        let started = std::time::Instant::now();
        let session = shared.session.clone();
        let late_session = session.clone();
        let (salt_owned, prefix) = (salt.to_string(), tokens_prefix.to_vec());
        let len = bytes.len() as u64;
        let lease = deadline::within_blocking(
            &shared.runtime,
            self.call_timeout(),
            async move { session.allocate_state(&salt_owned, &prefix, len).await },
            move |late| state::release_late_state_lease(late_session, late),
        );
        let Some(lease) = lease else {
            self.timed_out("allocate_state");
            return Ok(SaveOutcome::Uncached);
        };
        let shared = self.shared.as_ref().expect("usable_shared checked it");
        let lease = lease.map_err(|e| EngineError::Cache(e.to_string()))?;
        let leased = state::write_leased(&shared.session, lease, bytes).map_err(|(slot, e)| {
            let _ = shared.ops.send(CacheOp::ReleaseStates { slots: vec![slot] });
            e
        })?;
        let outcome = match leased {
            Ok(slot) => {
                let _ = shared.ops.send(CacheOp::CommitState { slot });
                SaveOutcome::Stored
            }
            Err(outcome) => outcome,
        };
        let label = match outcome {
            SaveOutcome::Stored => "stored",
            SaveOutcome::AlreadyCached => "already_cached",
            SaveOutcome::NoRoom => "no_room",
            SaveOutcome::Uncached => "uncached",
        };
        metrics::counter!(state::STATE_SAVES_TOTAL, "outcome" => label).increment(1);
        metrics::histogram!(state::STATE_SAVE_SECONDS).record(started.elapsed().as_secs_f64());
        Ok(outcome)
    }

    /// Whether a looked-up snapshot can still be read: it belongs to the session in use
    /// (a snapshot of a dead session is gone with its arena).
    pub fn is_state_usable(&self, lease: &StateLease) -> bool {
        matches!(lease.source, PageSource::Shared(g) if self.generation() == Some(g))
    }

    /// Drops a lookup's pin on a snapshot (once loaded into the backend); a snapshot of a
    /// dead session is just forgotten.
    pub fn release_state(&mut self, lease: &StateLease) {
        let Some(shared) = &self.shared else { return };
        if lease.source == PageSource::Shared(shared.generation) {
            let _ = shared.ops.send(CacheOp::ReleaseStates { slots: vec![lease.slot] });
        }
    }

    /// Waits until every queued commit and release has reached the cache-service (tests, and
    /// callers that need a published prefix visible to the next lookup).
    pub fn flush(&mut self) {
        self.apply_returns();
        let Some(shared) = &self.shared else { return };
        let (done, wait) = tokio::sync::oneshot::channel();
        if shared.ops.send(CacheOp::Barrier(done)).is_ok() {
            let _ = wait.blocking_recv();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> KvLayout {
        KvLayout { n_layers: 2, n_kv_heads: 1, head_dim: 4, page_tokens: 4, dtype: super::super::KvDtype::F16 }
    }

    #[test]
    fn local_store_allocates_maps_its_pool_once_and_releases() {
        let mut store = PageStore::local(layout(), 3);
        assert_eq!(store.refresh(), Refresh::Unchanged);
        assert!(store.take_space_changes().is_empty(), "the pool is made on first use");
        let pages = store.allocate(2).unwrap().unwrap();
        assert!(pages.iter().all(|p| p.source == PageSource::Local && store.is_usable(p)));
        assert!(pages.iter().all(|p| p.page_id().space == LOCAL_SPACE));
        match &store.take_space_changes()[..] {
            [SpaceChange::Map(LOCAL_SPACE, memory)] => assert_eq!(memory.page_count(), 3),
            _ => panic!("the pool's memory is announced once"),
        }
        assert!(store.allocate(2).unwrap().is_none(), "only one page is left");
        assert!(store.take_space_changes().is_empty());
        store.release(&pages);
        assert_eq!(store.allocate(3).unwrap().map(|p| p.len()), Some(3));
        // Pages of a session that is not in use are not usable.
        let stale = LeasedPage { source: PageSource::Shared(9), ..pages[0] };
        assert!(!store.is_usable(&stale));
    }

    #[test]
    fn dropped_leases_give_their_pages_back() {
        let mut store = PageStore::local(layout(), 3);
        let mut lease = store.allocate_lease(2).unwrap().unwrap();
        let last = lease.pop().unwrap();
        assert_eq!((lease.len(), last.len()), (1, 1));
        assert!(store.allocate(2).unwrap().is_none(), "two of three pages are leased");
        drop(last);
        let third = store.allocate_lease(1).unwrap().unwrap();
        lease.append(third);
        assert_eq!(lease.len(), 2);
        assert!(store.allocate(2).unwrap().is_none());
        drop(lease);
        assert_eq!(store.allocate(3).unwrap().map(|p| p.len()), Some(3), "everything came back");
    }

    #[test]
    fn uncached_store_saves_and_serves_no_state() {
        let mut store = PageStore::local(layout(), 3);
        assert_eq!(store.save_state("", &[1, 2, 3], &[7; 64]).unwrap(), SaveOutcome::Uncached);
        let prefix = store.lookup_with_state("", &[1, 2, 3, 4], 64).unwrap();
        assert!(prefix.state.is_none() && prefix.pages.is_empty() && prefix.cached_tokens == 0);
        store.flush();
    }
}
