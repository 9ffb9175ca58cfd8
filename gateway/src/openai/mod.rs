//! OpenAI wire types the gateway writes (responses, stream chunks, model list) and the SSE
//! framing of a streamed completion. Requests are parsed in `validate.rs`.

pub mod sse;
pub mod types;

pub use types::*;
