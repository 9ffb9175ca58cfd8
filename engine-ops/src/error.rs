//! The engine's one error type; mapped to a gRPC status once, in `service.rs`.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
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
    #[error("internal: {0}")]
    Internal(String),
}

impl EngineError {
    pub fn model_file(path: impl Into<PathBuf>, problem: impl Into<String>) -> Self {
        EngineError::ModelFile { path: path.into(), problem: problem.into() }
    }
}
