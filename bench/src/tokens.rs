//! Client-side token counting for ISL/OSL figures.
//!
//! Contract: `TokenCounter::from_file(path)` loads a HF `tokenizer.json`; `count_reply` encodes
//! the reply parts (reasoning, content, each tool call's name and arguments) joined by newlines,
//! which is the reference harness's fallback method (spec 4.4) — we have no chat-template
//! renderer here, so the report names this method. `estimate_prompt` counts every message's
//! text fields plus a fixed per-message overhead; without a tokenizer it divides characters by
//! `CHARS_PER_TOKEN`. Both are estimates used only to pick the subset; the server's own
//! `usage.prompt_tokens` is what the figures report.

use std::path::Path;

use serde_json::Value;

use crate::client::Reply;

/// Template overhead per message (role markers, separators) in the prompt estimate.
const PER_MESSAGE_OVERHEAD: usize = 6;
/// Character-based fallback: conservative for English and code (most BPEs give ~3.5-4).
pub const CHARS_PER_TOKEN: f64 = 3.0;

#[derive(Debug, thiserror::Error)]
#[error("loading tokenizer {path}: {msg}")]
pub struct TokenizerError {
    path: String,
    msg: String,
}

pub struct TokenCounter {
    tokenizer: Option<tokenizers::Tokenizer>,
    pub name: String,
}

impl TokenCounter {
    pub fn from_file(path: &Path) -> Result<Self, TokenizerError> {
        let tokenizer = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| TokenizerError { path: path.display().to_string(), msg: e.to_string() })?;
        Ok(TokenCounter { tokenizer: Some(tokenizer), name: path.display().to_string() })
    }

    /// No tokenizer: OSL comes from the server's usage, prompts are estimated from characters.
    pub fn none() -> Self {
        TokenCounter { tokenizer: None, name: "none (server usage; prompt estimate chars/3)".into() }
    }

    pub fn has_tokenizer(&self) -> bool {
        self.tokenizer.is_some()
    }

    fn count_text(&self, text: &str) -> usize {
        match &self.tokenizer {
            Some(t) => t.encode(text, false).map(|e| e.len()).unwrap_or_else(|_| chars_estimate(text)),
            None => chars_estimate(text),
        }
    }

    /// Output tokens of a reply; `None` without a tokenizer.
    pub fn count_reply(&self, reply: &Reply) -> Option<usize> {
        self.tokenizer.as_ref()?;
        let mut parts: Vec<&str> = Vec::new();
        if !reply.reasoning.is_empty() {
            parts.push(&reply.reasoning);
        }
        if !reply.content.is_empty() {
            parts.push(&reply.content);
        }
        for c in &reply.tool_calls {
            parts.push(&c.name);
            parts.push(&c.arguments);
        }
        if parts.is_empty() {
            return Some(0);
        }
        Some(self.count_text(&parts.join("\n")))
    }

    /// Estimated prompt tokens of a request (messages + tool definitions).
    pub fn estimate_prompt(&self, messages: &[Value], tools: &Value) -> usize {
        let mut text = String::new();
        for m in messages {
            for key in ["content", "reasoning_content"] {
                if let Some(s) = m.get(key).and_then(Value::as_str) {
                    text.push_str(s);
                    text.push('\n');
                }
            }
            for c in m.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                if let Some(f) = c.get("function") {
                    text.push_str(f.get("name").and_then(Value::as_str).unwrap_or(""));
                    text.push_str(f.get("arguments").and_then(Value::as_str).unwrap_or(""));
                    text.push('\n');
                }
            }
        }
        if !tools.is_null() {
            text.push_str(&tools.to_string());
        }
        self.count_text(&text) + PER_MESSAGE_OVERHEAD * messages.len()
    }
}

fn chars_estimate(text: &str) -> usize {
    (text.chars().count() as f64 / CHARS_PER_TOKEN).ceil() as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn estimates_without_tokenizer() {
        let c = TokenCounter::none();
        let msgs = vec![json!({"role": "user", "content": "abcdefghi"})];
        assert_eq!(c.estimate_prompt(&msgs, &Value::Null), 4 + PER_MESSAGE_OVERHEAD);
        assert_eq!(c.count_reply(&Reply::default()), None);
    }

    #[test]
    fn counts_reply_parts_with_a_tokenizer_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        let json = r#"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
            "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,"decoder":null,
            "model":{"type":"WordLevel","vocab":{"[UNK]":0,"ls":1,"bash":2},"unk_token":"[UNK]"}}"#;
        std::fs::write(&path, json).unwrap();
        let c = TokenCounter::from_file(&path).unwrap();
        assert!(c.has_tokenizer());
        let reply = Reply {
            reasoning: "a b".into(),
            tool_calls: vec![crate::client::ToolCall {
                id: "x".into(),
                name: "bash".into(),
                arguments: r#"{"command":"ls"}"#.into(),
            }],
            ..Reply::default()
        };
        // a, b, bash, {", command, ":", ls, "}
        assert_eq!(c.count_reply(&reply), Some(8));
        assert_eq!(c.count_reply(&Reply::default()), Some(0));
        let msgs = vec![json!({"role": "user", "content": "ls ls"})];
        assert_eq!(c.estimate_prompt(&msgs, &Value::Null), 2 + PER_MESSAGE_OVERHEAD);
    }

    #[test]
    fn bad_tokenizer_path_is_an_error() {
        assert!(TokenCounter::from_file(Path::new("/nonexistent/tokenizer.json")).is_err());
    }
}
