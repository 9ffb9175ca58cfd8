//! The engine's one error type; mapped to a gRPC status once, in engine-service's
//! `error::grpc_status`.

use std::path::PathBuf;

#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// A model file could not be read or is malformed; names the file and the problem.
    #[error("model file {path}: {problem}")]
    ModelFile { path: PathBuf, problem: String },
    #[error("unsupported model: {0}")]
    UnsupportedModel(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("cache service: {0}")]
    Cache(String),
    /// The engine cannot serve the request now; a retry may succeed (its step loop stopped, or
    /// the cache-service went away with the request's KV pages).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Out of a resource the request needs (KV pages, queue slots).
    #[error("resource exhausted: {0}")]
    Exhausted(String),
    #[error("internal: {0}")]
    Internal(String),
}

impl EngineError {
    pub fn model_file(path: impl Into<PathBuf>, problem: impl Into<String>) -> Self {
        EngineError::ModelFile { path: path.into(), problem: problem.into() }
    }
}
