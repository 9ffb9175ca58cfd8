//! The Anthropic Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`): its
//! request translated into the chat request the gateway already runs (`request`), and its
//! response, event stream and error bodies (`response`). The handlers are in `messages.rs`.

pub mod request;
pub mod response;
