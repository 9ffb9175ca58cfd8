//! The one mapping of engine errors to gRPC statuses. Every failure the engine reports over
//! gRPC, from request validation to a sequence failing in the step loop, is an
//! [`EngineError`] until it passes through here.

use engine_ops::EngineError;
use tonic::Status;

/// The gRPC status of an engine error: the request's fault is INVALID_ARGUMENT, a passing
/// condition (cache gone, step loop stopped) UNAVAILABLE, a full cache or queue
/// RESOURCE_EXHAUSTED, the engine's own fault INTERNAL. Client-facing reasons are passed as
/// they are; the rest carry their kind (`cache service: ...`).
pub fn grpc_status(error: EngineError) -> Status {
    match error {
        EngineError::InvalidRequest(reason) => Status::invalid_argument(reason),
        EngineError::Unavailable(reason) => Status::unavailable(reason),
        EngineError::Exhausted(reason) => Status::resource_exhausted(reason),
        e @ EngineError::Cache(_) => Status::unavailable(e.to_string()),
        e @ (EngineError::ModelFile { .. }
        | EngineError::UnsupportedModel(_)
        | EngineError::Tokenizer(_)
        | EngineError::Internal(_)) => Status::internal(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn each_kind_of_error_gets_its_code_and_a_bad_request_keeps_its_reason() {
        let cases = [
            (EngineError::InvalidRequest("token id 9 >= vocab 4".into()), Code::InvalidArgument),
            (EngineError::Unavailable("engine step loop has stopped".into()), Code::Unavailable),
            (EngineError::Exhausted("KV cache is full".into()), Code::ResourceExhausted),
            (EngineError::Cache("connection refused".into()), Code::Unavailable),
            (EngineError::Internal("forward failed".into()), Code::Internal),
            (EngineError::Tokenizer("bad vocab".into()), Code::Internal),
        ];
        for (error, code) in cases {
            let text = error.to_string();
            let status = grpc_status(error);
            assert_eq!(status.code(), code, "{text}");
        }
        assert_eq!(grpc_status(EngineError::InvalidRequest("r".into())).message(), "r");
        assert_eq!(grpc_status(EngineError::Cache("down".into())).message(), "cache service: down");
    }
}
