//! Response bodies of `/v1/chat/completions` (whole and chunked) and `/v1/models`.

use serde::Serialize;

/// Why generation ended, as OpenAI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    Stop,
    Length,
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
}

impl Usage {
    pub fn new(prompt_tokens: u32, completion_tokens: u32, cached_tokens: u32) -> Usage {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    pub content: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Choice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<()>,
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
    pub fn new(
        meta: &CompletionMeta,
        content: String,
        finish_reason: FinishReason,
        usage: Usage,
    ) -> Self {
        ChatCompletion {
            id: meta.id.clone(),
            object: "chat.completion",
            created: meta.created,
            model: meta.model.clone(),
            choices: vec![Choice {
                index: 0,
                message: AssistantMessage {
                    role: "assistant",
                    content,
                },
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
}

#[derive(Debug, Clone, Serialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<()>,
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
        ChunkChoice {
            index: 0,
            delta,
            logprobs: None,
            finish_reason,
        }
    }

    /// The first chunk: `{"role": "assistant", "content": ""}`.
    pub fn role_chunk(&self) -> ChatCompletionChunk {
        let delta = Delta {
            role: Some("assistant"),
            content: Some(String::new()),
        };
        self.chunk(vec![Self::choice(delta, None)], None)
    }

    pub fn content_chunk(&self, content: String) -> ChatCompletionChunk {
        let delta = Delta {
            role: None,
            content: Some(content),
        };
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
