//! In-process tables of the cache (never in shared memory): full and partial pages, and the
//! recurrent-state snapshots of hybrid models, whose bytes live in pages of the same arena.

mod pages;
#[cfg(test)]
mod state_tests;
#[cfg(test)]
mod tests;

pub use pages::{Counters, LookupHit, MissReason, PageTable, StateAlloc, StateHit, TableStats};
