//! cache-service (filled in by the cache work).
