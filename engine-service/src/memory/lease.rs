//! Guards for what a sequence holds in the page store: its KV pages ([`PageLease`]) and a
//! pinned recurrent-state snapshot ([`StatePin`]). Dropping a guard gives its pages or pin
//! back; nothing releases them by hand. The guards only queue the return (they may be dropped
//! on any thread, e.g. a request refused before it reached the step loop); the store applies
//! queued returns before it next allocates, refreshes or flushes, in the order they came.

use std::sync::mpsc::Sender;

use super::state::StateLease;
use super::store::LeasedPage;

/// What a dropped guard gives back.
#[derive(Debug)]
pub(crate) enum Returned {
    Pages(Vec<LeasedPage>),
    State(StateLease),
}

/// Where guards send what they give back (cloned from `PageStore::returns`).
#[derive(Clone, Debug)]
pub struct Returns(pub(crate) Sender<Returned>);

/// A sequence's pages, in position order; returned to the store when dropped (or
/// [`PageLease::release`]d).
#[derive(Debug, Default)]
pub struct PageLease {
    pages: Vec<LeasedPage>,
    /// `None` only for a lease that never held pages.
    returns: Option<Returns>,
}

impl PageLease {
    pub fn new(pages: Vec<LeasedPage>, returns: Returns) -> PageLease {
        PageLease { pages, returns: Some(returns) }
    }

    /// Moves `other`'s pages to the end of this lease (nothing is returned).
    pub fn append(&mut self, mut other: PageLease) {
        if self.returns.is_none() {
            self.returns = other.returns.clone();
        }
        self.pages.append(&mut other.pages);
    }

    /// The last page, as a lease of its own.
    pub fn pop(&mut self) -> Option<PageLease> {
        let page = self.pages.pop()?;
        Some(PageLease { pages: vec![page], returns: self.returns.clone() })
    }

    /// Gives every page back now; the lease stays, empty.
    pub fn release(&mut self) {
        let pages = std::mem::take(&mut self.pages);
        if let (false, Some(returns)) = (pages.is_empty(), &self.returns) {
            // A store that is gone has nothing left to return them to.
            let _ = returns.0.send(Returned::Pages(pages));
        }
    }
}

impl std::ops::Deref for PageLease {
    type Target = [LeasedPage];
    fn deref(&self) -> &[LeasedPage] {
        &self.pages
    }
}

impl Drop for PageLease {
    fn drop(&mut self) {
        self.release();
    }
}

/// A snapshot pinned by a lookup; the pin is dropped with the guard (after loading it).
#[derive(Debug)]
pub struct StatePin {
    lease: StateLease,
    returns: Returns,
}

impl StatePin {
    pub fn new(lease: StateLease, returns: Returns) -> StatePin {
        StatePin { lease, returns }
    }
}

impl std::ops::Deref for StatePin {
    type Target = StateLease;
    fn deref(&self) -> &StateLease {
        &self.lease
    }
}

impl Drop for StatePin {
    fn drop(&mut self) {
        let _ = self.returns.0.send(Returned::State(self.lease.clone()));
    }
}
