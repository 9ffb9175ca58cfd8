//! The engine's `Generate` request as it arrives: arbitrary bytes decoded as the proto, then
//! the engine's bounds check (what `EngineService::generate` does before anything else).
#![no_main]

use engine_service::limits::RequestLimits;
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(request) = proto::engine::v1::GenerateRequest::decode(data) else { return };
    let limits = RequestLimits { context_length: 8192, vocab_size: 49_152 };
    if limits.check(&request).is_ok() {
        // A request that passes is inside every bound the step loop relies on.
        assert!(!request.prompt_token_ids.is_empty() && request.prompt_token_ids.len() < 8192);
        assert!(request.prompt_token_ids.iter().all(|&t| t < 49_152));
    }
});
