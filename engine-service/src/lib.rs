//! engine-service: loads a model, schedules sequences (continuous batching, chunked
//! prefill), runs forward passes on a backend chosen once at startup, and reuses KV
//! pages from the cache-service's shared arena. Tokens in, tokens out.

pub mod backend;
pub mod config;
pub mod grammar;
pub mod memory;
pub mod metrics;
pub mod sampling;
pub mod scheduler;
pub mod server;
pub mod service;
pub mod speculative;
pub mod step;

// Transitional: the seam now lives in `engine-ops`; these keep the old paths until every
// caller names it directly.
pub use engine_models as model;
pub use engine_models::{format, tokenizer};
pub use engine_ops as ops;
pub use engine_ops::EngineError;
pub use engine_ops::error;
