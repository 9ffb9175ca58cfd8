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
    /// Whether to find the generation prompt's start (a snapshot hint): only models with
    /// recurrent state use it, so others skip the second render.
    pub hint_generation_start: bool,
}

impl Text {
    pub fn new(template: ChatTemplate, tokenizer: TextTokenizer) -> Self {
        Text { template: Arc::new(template), tokenizer, hint_generation_start: true }
    }

    /// Renders the template and tokenizes it, off the async executor.
    pub async fn prompt_ids(&self, input: RenderInput) -> Result<Vec<u32>, GatewayError> {
        Ok(self.prompt(input).await?.ids)
    }

    /// The prompt's tokens and where its generation prompt begins (see [`Prompt`]).
    pub async fn prompt(&self, input: RenderInput) -> Result<Prompt, GatewayError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let prompt = this.template.render(&input).map_err(|e| GatewayError::Template(e.to_string()))?;
            let ids = this.tokenizer.encode(&prompt).map_err(|e| GatewayError::Internal(e.to_string()))?;
            let generation_start =
                this.hint_generation_start.then(|| this.generation_start(&input, &prompt, &ids)).flatten();
            Ok(Prompt { ids, generation_start })
        })
        .await
        .map_err(|e| GatewayError::Internal(format!("prompt task failed: {e}")))?
    }

    /// Token position where the generation prompt (e.g. `<|im_start|>assistant\n`) begins:
    /// the next turn of the conversation shares everything before it. Found by rendering
    /// without the generation prompt; `None` when that is not a prefix of the prompt or the
    /// tokens do not split there.
    fn generation_start(&self, input: &RenderInput, prompt: &str, ids: &[u32]) -> Option<usize> {
        let history = self.template.render_with(input, false).ok()?;
        let opening = prompt.strip_prefix(history.as_str())?;
        if opening.is_empty() {
            return None;
        }
        let opening_ids = self.tokenizer.encode(opening).ok()?;
        (ids.len() > opening_ids.len() && ids.ends_with(&opening_ids)).then(|| ids.len() - opening_ids.len())
    }
}

/// A rendered, tokenized chat prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    pub ids: Vec<u32>,
    /// Where the generation prompt begins, when it could be told (a snapshot hint for
    /// hybrid models: the next turn shares the prompt up to here).
    pub generation_start: Option<usize>,
}
