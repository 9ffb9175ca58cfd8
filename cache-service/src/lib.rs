//! cache-service: the prefix KV cache. It owns a shared-memory arena of KV pages (bytes
//! only, mapped by engines) and, in this process only, the tables that say which page holds
//! which prefix: chained page hashes, refcounts, sessions' leases and an LRU that evicts
//! leaves first. gRPC carries page ids; KV bytes never leave the arena. Hybrid models also
//! keep recurrent-state snapshots there (in pages of the same arena, keyed by the prefix at
//! an exact token position; see `table`).
//!
//! Engines link the `cache-client` crate (re-exported here as [`client`]), not this one.

pub mod arena;
pub mod cache;
pub mod config;
pub mod events;
pub mod evict;
pub mod hash;
pub mod lease;
pub mod metrics;
pub mod server;
pub mod service;
pub mod table;

pub use cache_client::{client, error};

pub use cache::Cache;
pub use client::{CacheClient, CacheSession, StateAllocation, StateSnapshot};
pub use error::CacheError;
