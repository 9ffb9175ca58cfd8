//! What one request may ask of this engine. Each bound is defined once, here or where the
//! thing it bounds lives (the context by the model, the tree by [`TreeShape`]); `Info`
//! publishes them and the gateway validates its APIs' requests against what it was told, so
//! a request the gateway accepts is one the engine accepts.

use proto::engine::v1 as pb;

use crate::EngineError;
use crate::speculative::TreeShape;

/// Most alternatives a request may ask for per token (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Most stop conditions per request: stop token ids here, stop strings at the gateway.
/// Each is checked against every generated token (or piece of text).
pub const MAX_STOP_SEQUENCES: usize = 16;

/// The bounds of one loaded model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    /// Prompt + completion tokens.
    pub context_length: usize,
    /// Token ids are below this.
    pub vocab_size: usize,
}

impl RequestLimits {
    /// The limits as `InfoResponse.limits` publishes them.
    pub fn to_proto(&self) -> pb::EngineLimits {
        pb::EngineLimits {
            // A prompt has at least one token.
            max_completion_tokens: self.context_length.saturating_sub(1) as u32,
            max_top_logprobs: MAX_TOP_LOGPROBS as u32,
            max_stop_sequences: MAX_STOP_SEQUENCES as u32,
            max_speculation_depth: TreeShape::MAX_DEPTH as u32,
            max_speculation_top_k: TreeShape::MAX_TOP_K as u32,
            max_speculation_nodes: TreeShape::MAX_NODES as u32,
        }
    }

    /// A request inside every bound, or `InvalidRequest` naming the first it breaks.
    pub fn check(&self, req: &pb::GenerateRequest) -> Result<(), EngineError> {
        let invalid = |msg: String| Err(EngineError::InvalidRequest(msg));
        let context = self.context_length;
        if req.prompt_token_ids.is_empty() {
            return invalid("prompt_token_ids is empty".into());
        }
        if req.prompt_token_ids.len() >= context {
            return invalid(format!(
                "prompt has {} tokens; the context length is {context} and at least one token must be generated",
                req.prompt_token_ids.len()
            ));
        }
        if let Some(bad) = req.prompt_token_ids.iter().find(|&&t| t as usize >= self.vocab_size) {
            return invalid(format!("token id {bad} is outside the vocabulary (size {})", self.vocab_size));
        }
        let s = req.sampling.clone().unwrap_or_default();
        if !s.temperature.is_finite() || s.temperature < 0.0 {
            return invalid("temperature must be a finite number >= 0".into());
        }
        if !s.top_p.is_finite() || !(0.0..=1.0).contains(&s.top_p) {
            return invalid("top_p must be in [0, 1]".into());
        }
        if s.top_logprobs as usize > MAX_TOP_LOGPROBS {
            return invalid(format!("top_logprobs must be at most {MAX_TOP_LOGPROBS}"));
        }
        if s.stop_token_ids.len() > MAX_STOP_SEQUENCES {
            return invalid(format!("at most {MAX_STOP_SEQUENCES} stop_token_ids are supported"));
        }
        if let Some(bad) = s.stop_token_ids.iter().find(|&&t| t as usize >= self.vocab_size) {
            return invalid(format!("stop token id {bad} is outside the vocabulary (size {})", self.vocab_size));
        }
        if let Some(spec) = &req.speculation {
            // Zero keeps the server's value.
            let bounds = [
                ("max_depth", spec.max_depth, 1, TreeShape::MAX_DEPTH),
                ("top_k", spec.top_k, 1, TreeShape::MAX_TOP_K),
                ("max_nodes", spec.max_nodes, 2, TreeShape::MAX_NODES),
            ];
            for (name, value, low, high) in bounds {
                if value != 0 && !(low..=high).contains(&(value as usize)) {
                    return invalid(format!("speculation.{name} must be 0 (server default) or in [{low}, {high}]"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> RequestLimits {
        RequestLimits { context_length: 100, vocab_size: 50 }
    }

    fn request(prompt: Vec<u32>) -> pb::GenerateRequest {
        pb::GenerateRequest { prompt_token_ids: prompt, ..Default::default() }
    }

    fn refused(req: &pb::GenerateRequest) -> String {
        match limits().check(req) {
            Err(EngineError::InvalidRequest(msg)) => msg,
            other => panic!("expected InvalidRequest, got {other:?}"),
        }
    }

    #[test]
    fn published_limits_are_the_ones_checked() {
        let published = limits().to_proto();
        assert_eq!(published.max_completion_tokens, 99);
        let sampling = |f: &dyn Fn(&mut pb::SamplingParams)| {
            let mut s = pb::SamplingParams::default();
            f(&mut s);
            pb::GenerateRequest { sampling: Some(s), ..request(vec![1]) }
        };
        let at = published.max_top_logprobs;
        assert!(limits().check(&sampling(&|s| s.top_logprobs = at)).is_ok());
        assert!(refused(&sampling(&|s| s.top_logprobs = at + 1)).contains("top_logprobs"));
        let stops = published.max_stop_sequences as usize;
        assert!(limits().check(&sampling(&|s| s.stop_token_ids = vec![2; stops])).is_ok());
        assert!(refused(&sampling(&|s| s.stop_token_ids = vec![2; stops + 1])).contains("stop_token_ids"));
        assert!(refused(&sampling(&|s| s.stop_token_ids = vec![50])).contains("outside the vocabulary"));

        let spec = |p: pb::SpeculationParams| pb::GenerateRequest { speculation: Some(p), ..request(vec![1]) };
        let most = pb::SpeculationParams {
            max_depth: published.max_speculation_depth,
            top_k: published.max_speculation_top_k,
            max_nodes: published.max_speculation_nodes,
            ..Default::default()
        };
        assert!(limits().check(&spec(most)).is_ok());
        assert!(limits().check(&spec(pb::SpeculationParams::default())).is_ok());
        for over in [
            pb::SpeculationParams { max_depth: most.max_depth + 1, ..most },
            pb::SpeculationParams { top_k: most.top_k + 1, ..most },
            pb::SpeculationParams { max_nodes: most.max_nodes + 1, ..most },
            pb::SpeculationParams { max_nodes: 1, ..most },
        ] {
            assert!(refused(&spec(over)).starts_with("speculation."), "{over:?}");
        }
    }

    #[test]
    fn prompts_must_fit_and_use_the_vocabulary() {
        assert!(refused(&request(vec![])).contains("empty"));
        assert!(refused(&request(vec![1; 100])).contains("context length is 100"));
        assert!(limits().check(&request(vec![1; 99])).is_ok());
        assert!(refused(&request(vec![1, 50])).contains("token id 50"));
    }
}
