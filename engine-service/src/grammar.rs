//! Grammar-constrained decoding (structured outputs) with llguidance.
//!
//! Contract: a request's grammar (a JSON schema, or a Lark grammar) is compiled against the
//! model's vocabulary into a [`TokenConstraint`]; the sampler asks it for the tokens the
//! grammar allows next, sets every other logit to -inf before it samples, and feeds it the
//! token it drew. The constraint only ever sees emitted tokens, in order, so it works
//! unchanged under speculative decoding: acceptance draws each emitted token with the same
//! sampler call as plain decoding (`speculative::accept`), and a draft the grammar forbids is
//! simply never drawn. End-of-sequence ids are allowed exactly when the grammar accepts the
//! text so far; once the grammar is complete only they are.
//!
//! Cost: building the token trie and the lexer's token slices takes a few hundred ms for a
//! large vocabulary, so it happens once, on the first constrained request; compiling a schema
//! is milliseconds; a mask is tens of microseconds per token for JSON.

use std::sync::{Arc, OnceLock};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};

use crate::EngineError;

/// What a request asks its output to match.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// A JSON Schema (the text of a JSON object); `{"type": "object"}` is "any JSON object".
    JsonSchema(String),
    /// A Lark grammar (llguidance's dialect).
    Lark(String),
}

/// Compiles grammars against one model's vocabulary (built on first use).
pub struct GrammarCompiler {
    tokenizer_json: String,
    eos_token_ids: Vec<u32>,
    vocab_size: usize,
    factory: OnceLock<Result<Arc<ParserFactory>, String>>,
}

impl GrammarCompiler {
    /// `tokenizer_json` is the model's HF `tokenizer.json`; `vocab_size` the width of a logits
    /// row (it may exceed the tokenizer's ids: the padding ids are never allowed).
    pub fn new(tokenizer_json: String, eos_token_ids: Vec<u32>, vocab_size: usize) -> GrammarCompiler {
        GrammarCompiler { tokenizer_json, eos_token_ids, vocab_size, factory: OnceLock::new() }
    }

    fn factory(&self) -> Result<&Arc<ParserFactory>, EngineError> {
        self.factory
            .get_or_init(|| build_factory(&self.tokenizer_json, &self.eos_token_ids, self.vocab_size))
            .as_ref()
            .map_err(|e| EngineError::Internal(format!("structured outputs are unavailable for this model: {e}")))
    }

    /// The grammar as a constraint for one sequence; a grammar llguidance cannot compile (a
    /// schema feature it does not support, a malformed schema) is an `InvalidRequest` naming
    /// the problem.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<TokenConstraint, EngineError> {
        let grammar = match spec {
            GrammarSpec::JsonSchema(text) => {
                let mut schema: serde_json::Value = serde_json::from_str(text)
                    .map_err(|e| EngineError::InvalidRequest(format!("the JSON schema is not JSON: {e}")))?;
                // One layout, `{"a": 1, "b": [2, 3]}`: free whitespace would let a sampled
                // reply wander through newlines until max_tokens.
                if let Some(object) = schema.as_object_mut() {
                    object.entry("x-guidance").or_insert_with(|| {
                        serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
                    });
                }
                TopLevelGrammar::from_json_schema(schema)
            }
            GrammarSpec::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        };
        let factory = self.factory()?;
        let parser = factory
            .create_parser(grammar)
            .map_err(|e| EngineError::InvalidRequest(format!("the grammar cannot be used: {e}")))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(EngineError::InvalidRequest(format!("the grammar cannot be used: {e}")));
        }
        Ok(TokenConstraint { matcher, last_mask: None, eos_token_ids: self.eos_token_ids.clone(), failed: false })
    }
}

fn build_factory(tokenizer_json: &str, eos: &[u32], vocab_size: usize) -> Result<Arc<ParserFactory>, String> {
    let json: serde_json::Value = serde_json::from_str(tokenizer_json).map_err(|e| format!("tokenizer.json: {e}"))?;
    // The byte-fallback decoder path asserts on odd vocabularies: a panic here is an error.
    let mut words = std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&json))
        .map_err(|_| "reading the vocabulary's bytes panicked".to_owned())?
        .map_err(|e| format!("reading the vocabulary's bytes: {e}"))?;
    words.resize(vocab_size, Vec::new());
    // Every end-of-sequence id the model has ends a reply the grammar accepts (Qwen ends a turn
    // with `<|im_end|>`, not its first EOS id).
    let eos: Vec<u32> = eos.iter().copied().filter(|&e| (e as usize) < vocab_size).collect();
    let first = *eos.first().ok_or("the model has no end-of-sequence token")?;
    let info = TokRxInfo::new(vocab_size as u32, first);
    let trie = TokTrie::from(&info, &words).with_eos_tokens(&eos);
    let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
    let mut factory = ParserFactory::new_simple(&env).map_err(|e| format!("building the token slices: {e}"))?;
    factory.quiet();
    Ok(Arc::new(factory))
}

/// One sequence's grammar state.
pub struct TokenConstraint {
    matcher: Matcher,
    /// The mask of the last draw (what the grammar allowed there), for draft statistics.
    last_mask: Option<llguidance::toktrie::SimpleVob>,
    eos_token_ids: Vec<u32>,
    /// The matcher broke (an internal llguidance error): only end-of-sequence is allowed from
    /// here, so the output ends as a valid prefix instead of going on unconstrained.
    failed: bool,
}

impl TokenConstraint {
    /// Sets every logit the grammar forbids next to -inf.
    pub fn mask(&mut self, logits: &mut [f32]) {
        let mask = if self.failed { None } else { self.matcher.compute_mask_or_eos().ok() };
        let Some(mask) = mask else {
            self.fail("computing the token mask");
            for (id, l) in logits.iter_mut().enumerate() {
                if !self.eos_token_ids.contains(&(id as u32)) {
                    *l = f32::NEG_INFINITY;
                }
            }
            return;
        };
        let known = mask.len().min(logits.len());
        mask.iter_unset_entries(|id| {
            if id < known {
                logits[id] = f32::NEG_INFINITY;
            }
        });
        for l in &mut logits[known..] {
            *l = f32::NEG_INFINITY;
        }
        self.last_mask = Some(mask);
    }

    /// Whether the last mask allowed `token` (`true` before any mask).
    pub fn last_mask_allows(&self, token: u32) -> bool {
        match &self.last_mask {
            None => true,
            Some(_) if self.failed => self.eos_token_ids.contains(&token),
            Some(mask) => (token as usize) < mask.len() && mask.is_allowed(token),
        }
    }

    /// Advances the grammar past an emitted token (end-of-sequence ids end the sequence and
    /// are not fed).
    pub fn commit(&mut self, token: u32) {
        if self.failed || self.eos_token_ids.contains(&token) {
            return;
        }
        if self.matcher.consume_token(token).is_err() {
            self.fail("consuming a token");
        }
    }

    fn fail(&mut self, what: &str) {
        if !self.failed {
            let error = self.matcher.get_error().unwrap_or_default();
            tracing::error!(%error, "grammar matcher failed {what}; ending the sequence");
            self.failed = true;
        }
    }
}

impl std::fmt::Debug for TokenConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenConstraint").field("failed", &self.failed).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::{Sampler, SamplingParams};
    use engine_models::tokenizer::ModelTokenizer;

    /// A byte-level vocabulary at Qwen3.5's real size (its end-of-sequence ids included).
    fn compiler() -> GrammarCompiler {
        let tok = ModelTokenizer::byte_level_fallback(248_320, "").unwrap();
        GrammarCompiler::new(tok.json, tok.eos_token_ids, 248_320)
    }

    const SCHEMA: &str = r#"{"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 6},
        "kind": {"enum": ["cat", "dog", "fish"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 3},
        "owner": {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
                  "required": ["age"], "additionalProperties": false}},
        "required": ["name", "kind", "owner"], "additionalProperties": false}"#;

    /// Draws until an end-of-sequence id with `sampler` over pseudo-random logits, as the
    /// step loop would (at most `cap` tokens); returns the text and whether it ended.
    fn generate_upto(sampler: &mut Sampler, eos: &[u32], vocab: usize, salt: u64, cap: u64) -> (String, bool) {
        let tok = ModelTokenizer::byte_level_fallback(vocab, "").unwrap();
        let mut ids = Vec::new();
        let mut logits = vec![0f32; vocab];
        for step in 0..cap {
            for (i, l) in logits.iter_mut().enumerate() {
                let h = (i as u64 ^ (step << 20) ^ salt).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                *l = (h >> 40) as f32 / (1u64 << 24) as f32 * 4.0;
            }
            let token = sampler.sample(&logits);
            if eos.contains(&token) {
                return (tok.decode(&ids, false).unwrap(), true);
            }
            ids.push(token);
        }
        (tok.decode(&ids, false).unwrap(), false)
    }

    fn generate(sampler: &mut Sampler, eos: &[u32], vocab: usize, salt: u64) -> String {
        let (text, ended) = generate_upto(sampler, eos, vocab, salt, 400);
        assert!(ended, "no end of sequence after 400 tokens: {text}");
        text
    }

    fn check_against_schema(text: &str) {
        let v: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let o = v.as_object().unwrap();
        assert!(o.keys().all(|k| ["name", "kind", "tags", "owner"].contains(&k.as_str())), "{text}");
        assert!(o["name"].as_str().unwrap().chars().count() <= 6, "{text}");
        assert!(["cat", "dog", "fish"].contains(&o["kind"].as_str().unwrap()), "{text}");
        if let Some(tags) = o.get("tags") {
            let tags = tags.as_array().unwrap();
            assert!(tags.len() <= 3 && tags.iter().all(|t| t.as_str().unwrap().chars().count() <= 3), "{text}");
        }
        let owner = o["owner"].as_object().unwrap();
        assert_eq!(owner.len(), 1, "{text}");
        assert!((0..=120).contains(&owner["age"].as_i64().unwrap()), "{text}");
    }

    #[test]
    fn sampled_replies_match_the_schema() {
        let c = compiler();
        let eos = ModelTokenizer::byte_level_fallback(248_320, "").unwrap().eos_token_ids;
        let spec = GrammarSpec::JsonSchema(SCHEMA.into());
        let mut texts = std::collections::HashSet::new();
        for seed in 0..20 {
            let params = SamplingParams { temperature: 1.0, top_p: 1.0, top_k: 0, seed: Some(seed) };
            let mut sampler = Sampler::new(params).with_constraint(c.compile(&spec).unwrap());
            let text = generate(&mut sampler, &eos, 248_320, seed);
            check_against_schema(&text);
            texts.insert(text);
        }
        assert!(texts.len() > 10, "sampling explores: {texts:?}");
        // Greedy too, and a Lark grammar.
        let mut sampler = Sampler::new(SamplingParams::greedy()).with_constraint(c.compile(&spec).unwrap());
        check_against_schema(&generate(&mut sampler, &eos, 248_320, 99));
        let lark = GrammarSpec::Lark(r#"start: "yes" | "no""#.into());
        let mut sampler = Sampler::new(SamplingParams::greedy()).with_constraint(c.compile(&lark).unwrap());
        assert!(["yes", "no"].contains(&generate(&mut sampler, &eos, 248_320, 5).as_str()));
    }

    /// The shape of the gateway's tool-call grammar (`gateway::tools::call_grammar`).
    const CALLS: &str = r#"start: tool_call ("\n" tool_call)*
tool_call: "<tool_call>\n" %json {"anyOf": [{"type": "object", "properties": {"name": {"const": "get_time"}, "arguments": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"], "additionalProperties": false}}, "required": ["name", "arguments"], "additionalProperties": false}, {"type": "object", "properties": {"name": {"const": "ping"}, "arguments": {"type": "object", "properties": {}, "additionalProperties": false}}, "required": ["name", "arguments"], "additionalProperties": false}], "x-guidance": {"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}} "\n</tool_call>"
"#;

    #[test]
    fn a_tool_call_grammar_yields_only_calls_with_valid_arguments() {
        let c = compiler();
        let eos = ModelTokenizer::byte_level_fallback(248_320, "").unwrap().eos_token_ids;
        let spec = GrammarSpec::Lark(CALLS.into());
        for seed in 0..10 {
            let params = SamplingParams { temperature: 1.0, top_p: 1.0, top_k: 0, seed: Some(seed) };
            let mut sampler = Sampler::new(params).with_constraint(c.compile(&spec).unwrap());
            // Parallel calls: the grammar may go on calling; complete calls are checked.
            let (text, ended) = generate_upto(&mut sampler, &eos, 248_320, seed + 100, 300);
            let mut blocks: Vec<&str> = text.split("\n<tool_call>\n").collect();
            if !ended {
                blocks.pop();
            }
            assert!(!blocks.is_empty(), "{text}");
            for block in blocks {
                let body = block.trim_start_matches("<tool_call>\n").strip_suffix("\n</tool_call>").expect(&text);
                let call: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text}"));
                match call["name"].as_str() {
                    Some("get_time") => assert!(["UTC", "CET"].contains(&call["arguments"]["zone"].as_str().unwrap())),
                    Some("ping") => assert_eq!(call["arguments"], serde_json::json!({})),
                    _ => panic!("{text}"),
                }
            }
        }
    }

    #[test]
    fn every_end_of_sequence_id_ends_an_accepted_reply() {
        let c = compiler();
        let tok = ModelTokenizer::byte_level_fallback(248_320, "").unwrap();
        let mut k = c.compile(&GrammarSpec::Lark(r#"start: "ok""#.into())).unwrap();
        let mut logits = vec![0f32; 248_320];
        k.mask(&mut logits);
        assert!(tok.eos_token_ids.iter().all(|&e| logits[e as usize] == f32::NEG_INFINITY), "not yet");
        for t in tok.encode("ok", false).unwrap() {
            k.commit(t);
        }
        let mut logits = vec![0f32; 248_320];
        k.mask(&mut logits);
        assert!(tok.eos_token_ids.len() > 1);
        assert!(tok.eos_token_ids.iter().all(|&e| logits[e as usize] == 0.0 && k.last_mask_allows(e)));
    }

    #[test]
    fn bad_grammars_are_invalid_requests_that_say_why() {
        let c = compiler();
        for (spec, needle) in [
            (GrammarSpec::JsonSchema("{not json".into()), "not JSON"),
            (GrammarSpec::JsonSchema(r#"{"type": "nonsense"}"#.into()), "nonsense"),
            (GrammarSpec::Lark("start: undefined_rule".into()), "undefined_rule"),
        ] {
            match c.compile(&spec) {
                Err(EngineError::InvalidRequest(reason)) => assert!(reason.contains(needle), "{reason}"),
                other => panic!("{spec:?}: {other:?}"),
            }
        }
    }
}
