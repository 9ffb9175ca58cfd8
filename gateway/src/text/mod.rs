//! Text <-> tokens for one model: chat template, tokenizer, incremental detokenizer, stop
//! strings. Built once from the engine's `Info`; prompt building runs on a blocking thread.

pub mod detokenize;
pub mod stop;
pub mod template;
pub mod tokenize;

use std::sync::Arc;

pub use detokenize::IncrementalDetokenizer;
pub use stop::{StopMatcher, StopOutput};
pub use template::{ChatTemplate, RenderInput, TemplateError};
pub use tokenize::{TextTokenizer, TokenizeError};

use crate::error::GatewayError;

/// The model's text side, shared by all requests.
#[derive(Clone, Debug)]
pub struct Text {
    pub template: Arc<ChatTemplate>,
    pub tokenizer: TextTokenizer,
}

impl Text {
    pub fn new(template: ChatTemplate, tokenizer: TextTokenizer) -> Self {
        Text {
            template: Arc::new(template),
            tokenizer,
        }
    }

    /// Renders the template and tokenizes it, off the async executor.
    pub async fn prompt_ids(&self, input: RenderInput) -> Result<Vec<u32>, GatewayError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let prompt = this
                .template
                .render(&input)
                .map_err(|e| GatewayError::Template(e.to_string()))?;
            this.tokenizer
                .encode(&prompt)
                .map_err(|e| GatewayError::Internal(e.to_string()))
        })
        .await
        .map_err(|e| GatewayError::Internal(format!("prompt task failed: {e}")))?
    }
}
