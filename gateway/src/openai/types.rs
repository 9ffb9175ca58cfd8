//! Response bodies of `/v1/chat/completions` (whole and chunked) and `/v1/models`.

use serde::Serialize;

/// Why generation ended, as OpenAI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
    /// Of the cached tokens, those from a cached page used in part (the engine's split).
    #[serde(skip)]
    pub cached_partial_tokens: u32,
    /// Extension (not an OpenAI field; clients ignore it): how the prompt tokens were served.
    /// Present on every final usage, streamed or not; the same numbers as `x-edge-cache`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub edge_cache: Option<CacheExplain>,
}

/// How a request's prompt tokens were served: whole cached pages, a cached page used in
/// part (copied on write), and prefill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CacheExplain {
    pub full_page_tokens: u32,
    pub partial_page_tokens: u32,
    pub prefill_tokens: u32,
}

impl Usage {
    pub fn new(prompt_tokens: u32, completion_tokens: u32, cached_tokens: u32) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
            cached_partial_tokens: 0,
            edge_cache: None,
        }
    }

    /// The split of the prompt tokens by how they were served.
    pub fn explain(&self) -> CacheExplain {
        let cached = self.prompt_tokens_details.cached_tokens.min(self.prompt_tokens);
        let partial = self.cached_partial_tokens.min(cached);
        CacheExplain {
            full_page_tokens: cached - partial,
            partial_page_tokens: partial,
            prefill_tokens: self.prompt_tokens - cached,
        }
    }

    /// The `x-edge-cache` header value, `full=<n>;partial=<n>;prefill=<n>`: how many prompt
    /// tokens came from whole cached pages, from a cached page used in part, and from prefill.
    pub fn cache_explain(&self) -> String {
        let e = self.explain();
        format!("full={};partial={};prefill={}", e.full_page_tokens, e.partial_page_tokens, e.prefill_tokens)
    }
}

/// `{"name", "arguments"}` of a call; in stream deltas either part may be absent.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FunctionCall {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// A tool call as OpenAI writes it: whole in a message, or as a delta with `index`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ToolCall {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionCall,
}

impl ToolCall {
    /// The start of a call in a non-streamed message; arguments are appended to it.
    pub fn started(id: String, name: String) -> ToolCall {
        ToolCall {
            index: None,
            id: Some(id),
            kind: Some("function"),
            function: FunctionCall { name: Some(name), arguments: Some(String::new()) },
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// `null` when the answer is only tool calls, as OpenAI does.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// One alternative of a generation step (`top_logprobs` entries).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    /// The token's exact UTF-8 bytes (a token may hold half of a character).
    pub bytes: Vec<u8>,
}

/// One generated token with its log-probability and the most likely alternatives.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

/// What OpenAI returns as a choice's `logprobs` when `logprobs: true` was asked.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChoiceLogprobs {
    pub content: Vec<TokenLogprob>,
    pub refusal: Option<Vec<TokenLogprob>>,
}

impl ChoiceLogprobs {
    pub fn new(content: Vec<TokenLogprob>) -> Self {
        ChoiceLogprobs { content, refusal: None }
    }
}

/// OpenAI reports impossible tokens as -9999.0 (JSON has no -inf).
pub fn finite_logprob(lp: f32) -> f32 {
    if lp.is_finite() { lp } else { -9999.0 }
}

#[derive(Debug, Clone, Serialize)]
pub struct Choice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: FinishReason,
}

/// A whole (non-streamed) completion.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<Choice>,
    pub usage: Usage,
}

impl ChatCompletion {
    pub fn new(meta: &CompletionMeta, content: String, finish_reason: FinishReason, usage: Usage) -> Self {
        Self::with_tool_calls(meta, content, Vec::new(), finish_reason, usage)
    }

    pub fn with_tool_calls(
        meta: &CompletionMeta,
        content: String,
        tool_calls: Vec<ToolCall>,
        finish_reason: FinishReason,
        usage: Usage,
    ) -> Self {
        let content = if tool_calls.is_empty() || !content.trim().is_empty() { Some(content) } else { None };
        ChatCompletion {
            id: meta.id.clone(),
            object: "chat.completion",
            created: meta.created,
            model: meta.model.clone(),
            choices: vec![Choice {
                index: 0,
                message: AssistantMessage { role: "assistant", content, tool_calls },
                logprobs: None,
                finish_reason,
            }],
            usage,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: Option<FinishReason>,
}

/// One `chat.completion.chunk` of a stream.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// What every response and chunk of one completion shares.
#[derive(Debug, Clone)]
pub struct CompletionMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl CompletionMeta {
    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    fn choice(delta: Delta, finish_reason: Option<FinishReason>) -> ChunkChoice {
        ChunkChoice { index: 0, delta, logprobs: None, finish_reason }
    }

    /// The first chunk: `{"role": "assistant", "content": ""}`.
    pub fn role_chunk(&self) -> ChatCompletionChunk {
        let delta = Delta { role: Some("assistant"), content: Some(String::new()), tool_calls: None };
        self.chunk(vec![Self::choice(delta, None)], None)
    }

    pub fn content_chunk(&self, content: String) -> ChatCompletionChunk {
        let delta = Delta { role: None, content: Some(content), tool_calls: None };
        self.chunk(vec![Self::choice(delta, None)], None)
    }

    /// A call's first delta, as OpenAI sends it: index, id, type and name, empty arguments.
    pub fn tool_call_start_chunk(&self, index: u32, id: String, name: String) -> ChatCompletionChunk {
        let mut call = ToolCall::started(id, name);
        call.index = Some(index);
        self.tool_delta(call)
    }

    /// A later delta of a call: the next fragment of its arguments.
    pub fn tool_call_args_chunk(&self, index: u32, fragment: String) -> ChatCompletionChunk {
        self.tool_delta(ToolCall {
            index: Some(index),
            id: None,
            kind: None,
            function: FunctionCall { name: None, arguments: Some(fragment) },
        })
    }

    fn tool_delta(&self, call: ToolCall) -> ChatCompletionChunk {
        let delta = Delta { tool_calls: Some(vec![call]), ..Delta::default() };
        self.chunk(vec![Self::choice(delta, None)], None)
    }

    /// The last choice chunk: empty delta and the finish reason.
    pub fn finish_chunk(&self, reason: FinishReason) -> ChatCompletionChunk {
        self.chunk(vec![Self::choice(Delta::default(), Some(reason))], None)
    }

    /// `stream_options.include_usage`: empty choices, usage set.
    pub fn usage_chunk(&self, usage: Usage) -> ChatCompletionChunk {
        self.chunk(Vec::new(), Some(usage))
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Model {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// Extension: the served context length, for clients that size prompts.
    pub context_length: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<Model>,
}

#[cfg(test)]
mod cache_explain_tests {
    use super::Usage;

    #[test]
    fn splits_prompt_tokens_into_full_partial_and_prefill() {
        let mut u = Usage::new(100, 5, 90);
        u.cached_partial_tokens = 10;
        assert_eq!(u.cache_explain(), "full=80;partial=10;prefill=10");
        assert_eq!(Usage::new(7, 1, 0).cache_explain(), "full=0;partial=0;prefill=7");
        // The OpenAI body does not carry the split.
        assert!(!serde_json::to_string(&u).unwrap().contains("cached_partial"));
    }
}
