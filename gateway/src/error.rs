//! The gateway's one error type, mapped once to an HTTP status and an OpenAI error body
//! `{"error":{"message","type","param","code"}}`.
//!
//! Engine gRPC statuses map as InvalidArgument -> 400, ResourceExhausted -> 429,
//! Unavailable -> 503, DeadlineExceeded -> 504, anything else -> 500. The gateway's own
//! deadlines say which one passed: an engine that does not take the call (503
//! `engine_unavailable`), no first token (504 `first_token_timeout`), the whole request (504
//! `timeout`). The same body is used for the SSE error event when a stream fails after it
//! began (see `openai::sse`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The request is malformed or violates a limit; `param` names the offending field.
    #[error("{message}")]
    InvalidRequest { message: String, param: Option<String> },
    /// Prompt plus requested completion do not fit the model's context.
    #[error("{message}")]
    ContextLengthExceeded { message: String, param: String },
    /// Missing or wrong API key.
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("The model `{0}` does not exist")]
    ModelNotFound(String),
    #[error("Unknown route: {method} {path}")]
    RouteNotFound { method: String, path: String },
    #[error("Method {0} is not allowed on this route")]
    MethodNotAllowed(String),
    #[error("Request body exceeds the limit of {limit_bytes} bytes")]
    PayloadTooLarge { limit_bytes: usize },
    /// The gateway's own concurrency limit is reached.
    #[error("Too many concurrent requests (limit {0}); retry later")]
    Overloaded(usize),
    /// Every connection slot is busy with a request (the accept loop's refusal).
    #[error("Too many open connections (limit {0}); retry later")]
    TooManyConnections(usize),
    /// The request body did not arrive within its deadline.
    #[error("The request body did not arrive within {0} s")]
    BodyTimeout(u64),
    /// The per-request deadline passed.
    #[error("Request timed out after {0} s")]
    Timeout(u64),
    /// The engine's connection is open but it did not take the request in time (a stalled
    /// or overloaded engine process): worth a retry, possibly elsewhere.
    #[error("The engine did not accept the request within {0} s")]
    EngineNotAnswering(f64),
    /// The engine took the request but produced no token in time (queue or prefill too slow).
    #[error("No first token from the engine within {0} s")]
    FirstTokenTimeout(f64),
    /// The engine answered with an error status (or could not be reached).
    #[error("engine: {}", .0.message())]
    Engine(tonic::Status),
    /// The engine broke the stream contract (e.g. ended without `Finished`).
    #[error("engine protocol error: {0}")]
    EngineProtocol(String),
    /// The chat template refused the messages (e.g. its `raise_exception`).
    #[error("chat template rejected the messages: {0}")]
    Template(String),
    #[error("internal error: {0}")]
    Internal(String),
}

/// The inner object of an OpenAI error body.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ErrorObject {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

/// `{"error": {...}}`, the body of every error response and of the SSE error event.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorBody {
    pub error: ErrorObject,
}

impl GatewayError {
    pub fn invalid(message: impl Into<String>, param: impl Into<Option<&'static str>>) -> Self {
        GatewayError::InvalidRequest { message: message.into(), param: param.into().map(str::to_owned) }
    }

    /// Like [`GatewayError::invalid`] with a computed parameter path (e.g. `messages[2].role`).
    pub fn invalid_param(message: impl Into<String>, param: String) -> Self {
        GatewayError::InvalidRequest { message: message.into(), param: Some(param) }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::InvalidRequest { .. }
            | GatewayError::ContextLengthExceeded { .. }
            | GatewayError::Template(_) => StatusCode::BAD_REQUEST,
            GatewayError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            GatewayError::ModelNotFound(_) | GatewayError::RouteNotFound { .. } => StatusCode::NOT_FOUND,
            GatewayError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            GatewayError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::Overloaded(_) => StatusCode::TOO_MANY_REQUESTS,
            GatewayError::Timeout(_) | GatewayError::FirstTokenTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            GatewayError::EngineNotAnswering(_) | GatewayError::TooManyConnections(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            GatewayError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            GatewayError::Engine(status) => match status.code() {
                tonic::Code::InvalidArgument | tonic::Code::OutOfRange => StatusCode::BAD_REQUEST,
                tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
                tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                tonic::Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            },
            GatewayError::EngineProtocol(_) | GatewayError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn to_body(&self) -> ErrorBody {
        let status = self.status();
        let (param, code) = match self {
            GatewayError::InvalidRequest { param, .. } => (param.clone(), None),
            GatewayError::ContextLengthExceeded { param, .. } => (Some(param.clone()), Some("context_length_exceeded")),
            GatewayError::ModelNotFound(_) => (Some("model".to_owned()), Some("model_not_found")),
            GatewayError::RouteNotFound { .. } => (None, Some("not_found")),
            GatewayError::Unauthorized(_) => (None, Some("invalid_api_key")),
            GatewayError::MethodNotAllowed(_) => (None, Some("method_not_allowed")),
            GatewayError::PayloadTooLarge { .. } => (None, Some("payload_too_large")),
            GatewayError::Overloaded(_) => (None, Some("rate_limit_exceeded")),
            GatewayError::Timeout(_) => (None, Some("timeout")),
            GatewayError::FirstTokenTimeout(_) => (None, Some("first_token_timeout")),
            GatewayError::EngineNotAnswering(_) => (None, Some("engine_unavailable")),
            GatewayError::TooManyConnections(_) => (None, Some("too_many_connections")),
            GatewayError::BodyTimeout(_) => (None, Some("request_timeout")),
            GatewayError::Template(_) => (Some("messages".to_owned()), None),
            GatewayError::Engine(s) if s.code() == tonic::Code::Unavailable => (None, Some("engine_unavailable")),
            _ => (None, None),
        };
        let kind = match status.as_u16() {
            429 => "rate_limit_error",
            404 if matches!(self, GatewayError::ModelNotFound(_)) => "invalid_request_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        ErrorBody { error: ErrorObject { message: self.to_string(), kind, param, code } }
    }
}

impl From<tonic::Status> for GatewayError {
    fn from(status: tonic::Status) -> Self {
        // A status the engine sent arrives without a source; one with a source was made here
        // from a transport failure (the engine process died mid-call, the connection broke):
        // not an answer but a lost engine, which a retry may find restarted.
        if status.code() != tonic::Code::Unavailable && std::error::Error::source(&status).is_some() {
            return GatewayError::Engine(tonic::Status::unavailable(format!(
                "lost the engine connection: {}",
                status.message()
            )));
        }
        GatewayError::Engine(status)
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(error = %self, status = status.as_u16(), "request failed");
        } else {
            tracing::debug!(error = %self, status = status.as_u16(), "request rejected");
        }
        (status, axum::Json(self.to_body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_statuses_map_to_http_statuses() {
        let cases = [
            (tonic::Code::InvalidArgument, 400),
            (tonic::Code::ResourceExhausted, 429),
            (tonic::Code::Unavailable, 503),
            (tonic::Code::DeadlineExceeded, 504),
            (tonic::Code::Internal, 500),
            (tonic::Code::Unknown, 500),
        ];
        for (code, http) in cases {
            let err = GatewayError::from(tonic::Status::new(code, "x"));
            assert_eq!(err.status().as_u16(), http, "{code:?}");
        }
    }

    #[test]
    fn a_transport_failure_is_a_lost_engine_not_an_internal_error() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "h2 protocol error");
        let err = GatewayError::from(tonic::Status::from_error(Box::new(io)));
        assert_eq!(err.status().as_u16(), 503, "{err}");
        assert_eq!(err.to_body().error.code, Some("engine_unavailable"));
        // The engine's own answer (no source) keeps its code.
        assert_eq!(GatewayError::from(tonic::Status::internal("bug")).status().as_u16(), 500);
    }

    #[test]
    fn context_error_body_carries_code_and_param() {
        let err = GatewayError::ContextLengthExceeded { message: "too long".into(), param: "messages".into() };
        let body = serde_json::to_value(err.to_body()).unwrap();
        assert_eq!(body["error"]["code"], "context_length_exceeded");
        assert_eq!(body["error"]["param"], "messages");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }
}
