//! Server-sent events of a streamed completion: one `data: <json>` event per chunk, an
//! error event `data: {"error": {...}}` if the stream fails after it began, and the final
//! `data: [DONE]`.

use axum::response::sse::Event;
use serde::Serialize;

use crate::error::GatewayError;

/// A `data: <json>` event. Serializing these plain structs cannot fail; if it ever did, the
/// client gets an error event instead of a malformed stream.
pub fn json_event<T: Serialize>(value: &T) -> Event {
    match serde_json::to_string(value) {
        Ok(json) => Event::default().data(json),
        Err(e) => error_event(&GatewayError::Internal(format!("serializing a chunk: {e}"))),
    }
}

pub fn error_event(error: &GatewayError) -> Event {
    let json = serde_json::to_string(&error.to_body()).unwrap_or_else(|_| {
        r#"{"error":{"message":"internal error","type":"server_error","param":null,"code":null}}"#.to_owned()
    });
    Event::default().data(json)
}

pub fn done_event() -> Event {
    Event::default().data("[DONE]")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::{CompletionMeta, FinishReason, Usage};

    /// The wire form of an event, as a client reads it.
    fn wire(event: Event) -> String {
        use axum::response::IntoResponse;
        let stream = futures::stream::iter([Ok::<_, std::convert::Infallible>(event)]);
        let response = axum::response::sse::Sse::new(stream).into_response();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let bytes = rt.block_on(axum::body::to_bytes(response.into_body(), 1 << 20)).unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    fn meta() -> CompletionMeta {
        CompletionMeta { id: "chatcmpl-1".into(), created: 7, model: "m".into() }
    }

    #[test]
    fn chunks_have_the_openai_shape() {
        let m = meta();
        let role: serde_json::Value = serde_json::to_value(m.role_chunk()).unwrap();
        assert_eq!(role["object"], "chat.completion.chunk");
        assert_eq!(role["choices"][0]["delta"], serde_json::json!({"role": "assistant", "content": ""}));
        assert!(role["choices"][0]["finish_reason"].is_null());
        assert!(role.get("usage").is_none());
        let fin = serde_json::to_value(m.finish_chunk(FinishReason::Length)).unwrap();
        assert_eq!(fin["choices"][0]["delta"], serde_json::json!({}));
        assert_eq!(fin["choices"][0]["finish_reason"], "length");
        let usage = serde_json::to_value(m.usage_chunk(Usage::new(10, 3, 8))).unwrap();
        assert_eq!(usage["choices"], serde_json::json!([]));
        assert_eq!(usage["usage"]["total_tokens"], 13);
        assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
    }

    #[test]
    fn events_are_framed_as_data_lines() {
        let text = wire(json_event(&meta().content_chunk("a\nb".into())));
        assert!(text.starts_with("data: {\"id\":\"chatcmpl-1\""), "{text}");
        assert!(text.contains(r#""delta":{"content":"a\nb"}"#), "{text}");
        assert!(text.ends_with("\n\n"));
        assert_eq!(wire(done_event()), "data: [DONE]\n\n");
        let err = wire(error_event(&GatewayError::Timeout(5)));
        assert!(
            err.starts_with("data: {\"error\":{\"message\":\"Request timed out after 5 s\",\"type\":\"server_error\""),
            "{err}"
        );
    }
}
