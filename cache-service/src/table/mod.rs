//! In-process tables of the cache (never in shared memory): today the full-page table.
//! Partial pages and recurrent-state slots get their own tables beside it.

mod pages;
#[cfg(test)]
mod tests;

pub use pages::{Counters, LookupHit, PageTable, TableStats};
