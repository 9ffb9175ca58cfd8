//! What the step loop publishes to the cache and takes back from it: a sequence's pages
//! (flushed by the backend first), its prompt with the partial tail as a copy, and the
//! hybrid models' recurrent-state snapshots.

use super::StepLoop;
use crate::backend::Backend;
use crate::memory::PageId;
use crate::memory::store::{LeasedPage, PageSource, PageStore};
use crate::scheduler::Sequence;

impl StepLoop {
    /// Publishes a sequence's pages to the cache ([`PageStore::commit`]) once the backend
    /// has made their memory hold what it wrote (a device backend's copies go back first);
    /// pages that cannot be flushed are not published.
    pub(super) fn commit_pages(&mut self, salt: &str, tokens: &[u32], pages: &[LeasedPage], tail: bool) {
        let ids: Vec<PageId> = pages.iter().map(LeasedPage::page_id).collect();
        if let Err(e) = self.backend.flush_pages(&ids) {
            tracing::warn!(error = %e, "the backend could not flush pages; they are not published");
            return;
        }
        self.store.commit(salt, tokens, pages, tail);
    }

    /// Publishes a sequence's prompt: its full pages, and the partial tail as a copy (the
    /// sequence goes on writing its own tail page, while committed pages are immutable).
    pub(super) fn commit_prompt(&mut self, index: usize) {
        let pt = self.limits.page_tokens;
        let seq = &self.running[index];
        let n = seq.n_computed;
        let full = (n / pt).min(seq.pages.len());
        let mut pages: Vec<LeasedPage> = seq.pages[..full].to_vec();
        let tail_page = (!n.is_multiple_of(pt)).then(|| seq.pages.get(full).copied()).flatten();
        let (salt, tokens) = (seq.cache_salt.clone(), seq.tokens[..n].to_vec());
        let mut copy = None;
        let tail_page = tail_page.filter(|t| matches!(t.source, PageSource::Shared(_)) && self.store.is_usable(t));
        if let Some(tail_page) = tail_page {
            // No page to spare (or a failed copy) only costs the tail's reuse.
            let allocated = self.store.allocate_lease(1);
            self.sync_page_spaces();
            if let Ok(Some(fresh)) = allocated {
                match self.backend.copy_page(tail_page.page_id(), fresh[0].page_id()) {
                    Ok(()) => {
                        pages.push(fresh[0]);
                        copy = Some(fresh);
                    }
                    Err(e) => tracing::warn!(error = %e, "copying a prompt's tail page failed; it is not published"),
                }
            }
        }
        // The copy is given back (dropped) after its commit, which the cache-service then owns.
        self.commit_pages(&salt, &tokens, &pages, copy.is_some());
        drop(copy);
        self.snapshot(index);
    }

    /// The snapshot interval when the model has recurrent state and a cache to keep it in.
    pub(super) fn snapshot_every(&self) -> Option<usize> {
        let pt = self.limits.page_tokens;
        (self.backend.state_bytes() > 0 && self.store.is_shared()).then(|| self.state_snapshot_every.div_ceil(pt) * pt)
    }

    /// Hybrid models: saves the recurrent state after the sequence's `n_computed` tokens,
    /// so a later prompt sharing that prefix resumes there. Call after committing the pages
    /// of the same prefix (the cache publishes a snapshot only when they are cached). A
    /// failure only costs reuse.
    pub(super) fn snapshot(&mut self, index: usize) {
        if self.snapshot_every().is_none() {
            return;
        }
        let seq = &self.running[index];
        Self::save_snapshot(self.backend.as_ref(), &mut self.store, seq);
    }

    pub(super) fn save_snapshot(backend: &dyn Backend, store: &mut PageStore, seq: &Sequence) {
        if seq.n_computed == 0 {
            return;
        }
        let mut bytes = vec![0u8; backend.state_bytes()];
        let saved = backend
            .save_state(seq.seq_id, &mut bytes)
            .and_then(|_| store.save_state(&seq.cache_salt, &seq.tokens[..seq.n_computed], &bytes));
        if let Err(e) = saved {
            tracing::warn!(request_id = %seq.request_id, error = %e, "saving a recurrent-state snapshot failed");
        }
    }

    /// Hybrid models: loads the snapshot a lookup pinned (the state after exactly the cached
    /// tokens) into the backend and releases it. Cached KV without the state is useless to
    /// recurrent layers, so a failed restore drops the whole hit (the prompt is recomputed).
    pub(super) fn restore_state(&mut self, seq: &mut Sequence) {
        // The pin is given back when `pin` drops, loaded or not.
        let pin = seq.cached_state.take();
        if self.backend.state_bytes() == 0 || seq.n_computed == 0 {
            return;
        }
        let loaded = match &pin {
            Some(lease) if self.store.is_state_usable(lease) && lease.position == seq.n_computed => {
                let mut bytes = vec![0u8; lease.state_bytes];
                lease.copy_to(&mut bytes).and_then(|_| self.backend.load_state(seq.seq_id, &bytes))
            }
            _ => Err(crate::EngineError::Internal("no usable state snapshot at the cached position".into())),
        };
        if let Err(e) = loaded {
            tracing::warn!(request_id = %seq.request_id, error = %e, "recurrent state not restored; recomputing the prompt");
            seq.forget_cache_hit();
        }
    }
}
