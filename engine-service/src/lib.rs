//! engine-service: loads a model, schedules sequences (continuous batching, chunked
//! prefill), runs forward passes on a backend chosen once at startup, and reuses KV
//! pages from the cache-service's shared arena. Tokens in, tokens out.

pub mod backend;
pub mod config;
pub mod error;
pub mod grammar;
pub mod limits;
pub mod memory;
pub mod metrics;
pub mod sampling;
pub mod scheduler;
pub mod server;
pub mod service;
pub mod speculative;
pub mod step;

pub use engine_ops::EngineError;
