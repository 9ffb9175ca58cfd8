//! The cache's one error type, shared by both sides: mapped once to a gRPC status by the
//! server and produced from statuses and transport failures by the client.

use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("unknown session {0} (never attached, or its Attach stream closed)")]
    UnknownSession(u64),
    #[error("page id {page} is out of range: the arena has {count} pages")]
    PageOutOfRange { page: u32, count: u32 },
    #[error("session {session} does not hold page {page} (enough times)")]
    PageNotHeld { session: u64, page: u32 },
    #[error("session {session} does not hold state snapshot slot {slot} (enough times, or as its writer)")]
    StateNotHeld { session: u64, slot: u32 },
    #[error("page {page} at position {index} is committed for different tokens than the ones sent")]
    PageMismatch { page: u32, index: usize },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("arena layout conflict: {0}")]
    LayoutConflict(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot reach the cache-service: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A socket, address or token problem (bad endpoint, open runtime directory, ...).
    #[error("{0}")]
    Endpoint(#[from] proto::transport::TransportError),
    #[error("cache-service call failed: {0}")]
    Status(#[from] Status),
    #[error("cache-service protocol error: {0}")]
    Protocol(String),
}

impl CacheError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> CacheError {
        CacheError::Io { what: what.into(), source }
    }
}

impl From<CacheError> for Status {
    fn from(e: CacheError) -> Status {
        let code = match &e {
            CacheError::UnknownSession(_) => Code::NotFound,
            CacheError::PageOutOfRange { .. }
            | CacheError::PageNotHeld { .. }
            | CacheError::StateNotHeld { .. }
            | CacheError::PageMismatch { .. }
            | CacheError::InvalidArgument(_) => Code::InvalidArgument,
            CacheError::LayoutConflict(_) => Code::FailedPrecondition,
            CacheError::Io { .. } | CacheError::Protocol(_) | CacheError::Endpoint(_) => Code::Internal,
            CacheError::Transport(_) => Code::Unavailable,
            CacheError::Status(s) => return s.clone(),
        };
        Status::new(code, e.to_string())
    }
}
