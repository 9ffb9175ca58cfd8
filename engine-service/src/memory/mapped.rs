//! A local page pool mapped into a backend, for code that drives a backend directly
//! (benchmarks, tests) instead of through the step loop and its [`super::store::PageStore`].

use std::sync::atomic::{AtomicU32, Ordering};

use super::{LocalPagePool, PageId};
use crate::EngineError;
use crate::backend::Backend;

/// Page spaces of mapped pools are numbered from here: far above the arena generations
/// (which count re-attaches from 1) and the local pool's space 0.
const FIRST_POOL_SPACE: u32 = 1 << 30;
static NEXT_POOL_SPACE: AtomicU32 = AtomicU32::new(FIRST_POOL_SPACE);

/// Pages of a heap pool under a page space of their own in one backend.
pub struct MappedPool {
    pool: LocalPagePool,
    space: u32,
}

impl MappedPool {
    /// A pool of `pages` pages of the backend's KV layout, mapped into it.
    pub fn new(backend: &mut dyn Backend, pages: usize) -> Result<MappedPool, EngineError> {
        let pool = LocalPagePool::new(backend.kv_layout(), pages);
        let space = NEXT_POOL_SPACE.fetch_add(1, Ordering::Relaxed);
        backend.map_pages(space, pool.memory())?;
        Ok(MappedPool { pool, space })
    }

    /// `n` free pages; `None` when fewer are free.
    pub fn allocate(&mut self, n: usize) -> Option<Vec<PageId>> {
        let pages = self.pool.allocate(n)?;
        Some(pages.into_iter().map(|(index, _)| PageId::new(self.space, index as u32)).collect())
    }

    /// Pages covering `positions` positions.
    pub fn pages_for(&mut self, positions: usize) -> Result<Vec<PageId>, EngineError> {
        let n = positions.div_ceil(self.pool.layout().page_tokens);
        self.allocate(n).ok_or_else(|| {
            EngineError::Exhausted(format!("{n} pages wanted, {} free in the pool", self.pool.free_pages()))
        })
    }

    pub fn release(&mut self, pages: &[PageId]) {
        for p in pages.iter().filter(|p| p.space == self.space) {
            self.pool.release(p.index as usize);
        }
    }

    pub fn free_pages(&self) -> usize {
        self.pool.free_pages()
    }
}
