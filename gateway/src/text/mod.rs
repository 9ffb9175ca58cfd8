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
    /// Whether to find snapshot hints ([`Prompt::snapshot_hints`]): only models with
    /// recurrent state use them, so others skip the extra renders.
    pub hint_snapshots: bool,
}

/// Fewer preamble tokens than this get no hint of their own: recomputing them costs less
/// than keeping one more recurrent-state snapshot in the cache.
const MIN_PREAMBLE_TOKENS: usize = 128;

impl Text {
    pub fn new(template: ChatTemplate, tokenizer: TextTokenizer) -> Self {
        Text { template: Arc::new(template), tokenizer, hint_snapshots: true }
    }

    /// Renders the template and tokenizes it, off the async executor.
    pub async fn prompt_ids(&self, input: RenderInput) -> Result<Vec<u32>, GatewayError> {
        Ok(self.prompt(input).await?.ids)
    }

    /// The prompt's tokens and where a recurrent-state snapshot would be shared (see [`Prompt`]).
    pub async fn prompt(&self, input: RenderInput) -> Result<Prompt, GatewayError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let prompt = this.template.render(&input).map_err(|e| GatewayError::Template(e.to_string()))?;
            let ids = this.tokenizer.encode(&prompt).map_err(|e| GatewayError::Internal(e.to_string()))?;
            let snapshot_hints =
                if this.hint_snapshots { this.snapshot_hints(&input, &prompt, &ids) } else { Vec::new() };
            Ok(Prompt { ids, snapshot_hints })
        })
        .await
        .map_err(|e| GatewayError::Internal(format!("prompt task failed: {e}")))?
    }

    /// The preamble's end and the generation prompt's start, ascending, without repeats.
    fn snapshot_hints(&self, input: &RenderInput, prompt: &str, ids: &[u32]) -> Vec<usize> {
        let preamble = self.preamble_end(input, prompt, ids).filter(|&p| p >= MIN_PREAMBLE_TOKENS);
        let mut hints: Vec<usize> = preamble.into_iter().chain(self.generation_start(input, prompt, ids)).collect();
        hints.sort_unstable();
        hints.dedup();
        hints
    }

    /// Token position where the conversation's preamble ends: the leading system (or
    /// developer) messages and the tool list the template prints with them. Agents send the
    /// same preamble, often thousands of tokens, at the start of every conversation, so a
    /// snapshot there lets a new conversation skip it.
    ///
    /// Found by rendering the preamble followed by two different probe user turns: the
    /// renders agree up to where the probe's text begins (rendering the preamble alone is not
    /// an option: Qwen's templates refuse a conversation without a user turn), and the prompt
    /// must agree with them that far. The hint counts the prompt's tokens that the preamble
    /// text alone tokenizes to; `None` without a preamble or when a render fails.
    fn preamble_end(&self, input: &RenderInput, prompt: &str, ids: &[u32]) -> Option<usize> {
        let messages = input.messages.as_array()?;
        let n_system =
            messages.iter().take_while(|m| matches!(m["role"].as_str(), Some("system" | "developer"))).count();
        if n_system == 0 && input.tools.is_none() {
            return None;
        }
        let probe = |text: &str| {
            let mut turns = messages[..n_system].to_vec();
            turns.push(serde_json::json!({"role": "user", "content": text}));
            let probe_input =
                RenderInput { messages: turns.into(), tools: input.tools.clone(), extra: input.extra.clone() };
            self.template.render_with(&probe_input, false).ok()
        };
        let (a, b) = (probe("a")?, probe("b")?);
        let mut cut = common_prefix_len(&a, &b).min(common_prefix_len(&a, prompt));
        while !prompt.is_char_boundary(cut) {
            cut -= 1;
        }
        let preamble_ids = self.tokenizer.encode(&prompt[..cut]).ok()?;
        // A token that the cut splits differs from the prompt's; stop before it.
        let shared = preamble_ids.iter().zip(ids).take_while(|(x, y)| x == y).count();
        (shared > 0 && shared < ids.len()).then_some(shared)
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

/// Length in bytes of the longest common prefix of `a` and `b`.
fn common_prefix_len(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

/// A rendered, tokenized chat prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    pub ids: Vec<u32>,
    /// Token positions, ascending, where a recurrent-state snapshot is worth taking (hybrid
    /// models only): where the preamble (system prompt and tools) ends, which every
    /// conversation that starts the same shares, and where the generation prompt begins,
    /// which the next turn of this conversation shares.
    pub snapshot_hints: Vec<usize>,
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::tokenize::test_tokenizer;
    use super::*;

    const QWEN: &str = include_str!("testdata/qwen3_5.jinja");

    fn text() -> Text {
        Text::new(ChatTemplate::new(QWEN, "", "<|im_end|>").expect("template compiles"), test_tokenizer::tokenizer())
    }

    fn input(messages: Value, tools: Option<Value>) -> RenderInput {
        RenderInput { messages, tools, extra: Default::default() }
    }

    /// The prompt's tokens and hints, as `Text::prompt` computes them.
    fn hints(text: &Text, input: &RenderInput) -> (Vec<u32>, Vec<usize>) {
        let prompt = text.template.render(input).unwrap();
        let ids = text.tokenizer.encode(&prompt).unwrap();
        let hints = text.snapshot_hints(input, &prompt, &ids);
        (ids, hints)
    }

    fn tools() -> Value {
        json!([{"type": "function", "function": {"name": "read_file", "description": "Reads a file of the workspace.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}])
    }

    const SYSTEM: &str = "You are a coding agent. Read the files you need, change what the task asks, run the tests, \
        and say what you changed. Never invent a file's contents; read it first.";

    #[test]
    fn conversations_with_the_same_preamble_share_a_hint_where_it_ends() {
        let text = text();
        let first = input(
            json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix the parser."}]),
            Some(tools()),
        );
        let other = input(
            json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "add a --verbose flag"}]),
            Some(tools()),
        );
        let (ids_a, hints_a) = hints(&text, &first);
        let (ids_b, hints_b) = hints(&text, &other);
        assert_eq!(hints_a.len(), 2, "{hints_a:?}");
        let at = hints_a[0];
        assert_eq!(hints_b[0], at, "the same preamble ends at the same token");
        assert_eq!(ids_a[..at], ids_b[..at]);
        assert_ne!(ids_a[at], ids_b[at], "the hint is where the conversations part");
        let preamble = text.tokenizer.decode(&ids_a[..at]).unwrap();
        assert!(preamble.contains(SYSTEM) && preamble.contains("read_file"), "{preamble}");
        // The second hint is the generation prompt's start.
        let opening = text.tokenizer.decode(&ids_a[hints_a[1]..]).unwrap();
        assert_eq!(ids_a[hints_a[1]], test_tokenizer::IM_START);
        assert!(opening.starts_with("assistant\n"), "{opening}");
    }

    #[test]
    fn tools_alone_make_a_preamble_and_a_short_one_gets_no_hint() {
        let text = text();
        let (ids, with_tools) = hints(&text, &input(json!([{"role": "user", "content": "hi"}]), Some(tools())));
        assert_eq!(with_tools.len(), 2, "{with_tools:?}");
        assert!(text.tokenizer.decode(&ids[..with_tools[0]]).unwrap().contains("read_file"));
        // No system message and no tools: only the generation prompt's start.
        let (_, bare) = hints(&text, &input(json!([{"role": "user", "content": "hi"}]), None));
        assert_eq!(bare.len(), 1, "{bare:?}");
        // A system prompt under MIN_PREAMBLE_TOKENS is cheaper to recompute than to keep.
        let short = input(json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]), None);
        assert_eq!(hints(&text, &short).1.len(), 1);
    }

    #[test]
    fn a_preamble_followed_by_another_role_still_ends_before_it() {
        let text = text();
        let messages = json!([
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Fix the parser."},
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "Now the lexer."}
        ]);
        let (ids, h) = hints(&text, &input(messages, None));
        let (ids_one_turn, h_one) = hints(
            &text,
            &input(json!([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "x"}]), None),
        );
        assert_eq!(h[0], h_one[0]);
        assert_eq!(ids[..h[0]], ids_one_turn[..h[0]]);
        assert!(h[0] < h[1] && h[1] < ids.len());
    }
}
