//! Where a sequence's pages come from: the cache-service's shared arena (the normal case)
//! or a local heap pool (running uncached). The step loop calls this from its own thread;
//! arena calls go over gRPC on the tokio runtime. Allocation blocks (its answer is needed
//! now); commits and releases are queued to one worker so they stay in order.

use std::sync::Arc;

use cache_service::client::CacheSession;
use tokio::sync::mpsc;

use super::{LocalPagePool, PagePtr};
use crate::EngineError;

/// A page leased to one sequence.
#[derive(Clone, Copy, Debug)]
pub struct LeasedPage {
    pub id: u32,
    pub ptr: PagePtr,
}

enum CacheOp {
    Commit { salt: String, tokens: Vec<u32>, page_ids: Vec<u32> },
    Release { page_ids: Vec<u32> },
}

pub enum PageStore {
    Shared(SharedStore),
    Local(LocalPagePool),
}

pub struct SharedStore {
    session: Arc<CacheSession>,
    runtime: tokio::runtime::Handle,
    ops: mpsc::UnboundedSender<CacheOp>,
}

impl SharedStore {
    /// Must be called inside the tokio runtime (it spawns the ordered op worker).
    pub fn new(session: Arc<CacheSession>) -> SharedStore {
        let (ops, mut rx) = mpsc::unbounded_channel::<CacheOp>();
        let worker_session = session.clone();
        tokio::spawn(async move {
            while let Some(op) = rx.recv().await {
                let result = match op {
                    CacheOp::Commit { salt, tokens, page_ids } => {
                        worker_session.commit(&salt, &tokens, &page_ids).await.map(|_| ())
                    }
                    CacheOp::Release { page_ids } => worker_session.release(&page_ids).await.map(|_| ()),
                };
                if let Err(e) = result {
                    tracing::warn!(error = %e, "cache-service call failed; the cache may hold stale pins until the session ends");
                }
            }
        });
        SharedStore { session, runtime: tokio::runtime::Handle::current(), ops }
    }

    pub fn session(&self) -> &Arc<CacheSession> {
        &self.session
    }
}

impl PageStore {
    /// Leases `n` writable pages, or `Ok(None)` when the store cannot supply them now.
    pub fn allocate(&mut self, n: usize) -> Result<Option<Vec<LeasedPage>>, EngineError> {
        if n == 0 {
            return Ok(Some(Vec::new()));
        }
        match self {
            PageStore::Local(pool) => Ok(pool.allocate(n).map(|pages| {
                pages.into_iter().map(|(id, ptr)| LeasedPage { id: id as u32, ptr }).collect()
            })),
            PageStore::Shared(shared) => {
                let session = shared.session.clone();
                let ids = shared
                    .runtime
                    .block_on(async move { session.allocate(n as u32).await })
                    .map_err(|e| EngineError::Cache(e.to_string()))?;
                if ids.len() < n {
                    if !ids.is_empty() {
                        self.release(&ids);
                    }
                    return Ok(None);
                }
                self.resolve(&ids).map(Some)
            }
        }
    }

    /// Pointers for pages this engine already holds (e.g. pinned by a cache lookup).
    pub fn resolve(&self, ids: &[u32]) -> Result<Vec<LeasedPage>, EngineError> {
        match self {
            PageStore::Local(_) => Err(EngineError::Internal("local pool pages cannot be resolved by id".into())),
            PageStore::Shared(shared) => ids
                .iter()
                .map(|&id| {
                    shared
                        .session
                        .page_ptr(id)
                        .map(|p| LeasedPage { id, ptr: PagePtr(p) })
                        .map_err(|e| EngineError::Cache(e.to_string()))
                })
                .collect(),
        }
    }

    /// Publishes the full pages of a sequence (positions covered by `tokens`).
    pub fn commit(&mut self, salt: &str, tokens: &[u32], page_ids: &[u32]) {
        if let PageStore::Shared(shared) = self {
            let _ = shared.ops.send(CacheOp::Commit {
                salt: salt.to_string(),
                tokens: tokens.to_vec(),
                page_ids: page_ids.to_vec(),
            });
        }
    }

    pub fn release(&mut self, page_ids: &[u32]) {
        match self {
            PageStore::Local(pool) => page_ids.iter().for_each(|&id| pool.release(id as usize)),
            PageStore::Shared(shared) => {
                let _ = shared.ops.send(CacheOp::Release { page_ids: page_ids.to_vec() });
            }
        }
    }

    pub fn is_shared(&self) -> bool {
        matches!(self, PageStore::Shared(_))
    }
}
