//! cache-client: what an engine links to talk to the cache-service, without compiling the
//! server. [`CacheClient::connect`]`(endpoint)?.attach(..)` gives a [`CacheSession`]: the
//! session's leases over gRPC and the arena mapped read-write, checked against its header
//! ([`arena_header`], the one layout both sides read).

pub mod arena_header;
pub mod client;
pub mod error;

pub use client::{CacheClient, CacheSession, StateAllocation, StateSnapshot};
pub use error::CacheError;
