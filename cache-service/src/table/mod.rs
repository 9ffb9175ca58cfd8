//! In-process tables of the cache (never in shared memory): full and partial pages.
//! Recurrent-state slots get their own table beside it.

mod pages;
#[cfg(test)]
mod tests;

pub use pages::{Counters, LookupHit, MissReason, PageTable, TableStats};
