//! The engine's per-request bounds as the gateway holds them (from `Info`), for validation.

/// What the engine accepts per request, as its `Info` publishes it: the gateway checks its
/// APIs' requests against these, so a request out of bounds is the API's own 400 (naming the
/// field) and never an engine error. The engine defines each bound; nothing here repeats one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Prompt + completion tokens.
    pub context_length: u32,
    pub max_completion_tokens: u32,
    pub max_top_logprobs: u32,
    /// Stop strings per request.
    pub max_stop_sequences: u32,
    /// Bounds of the `speculation` extension's D, k and N (N is at least 2).
    pub max_speculation_depth: u32,
    pub max_speculation_top_k: u32,
    pub max_speculation_nodes: u32,
}

impl Limits {
    /// The limits an `Info` answer publishes, or why they are unusable.
    pub fn from_info(info: &proto::engine::v1::InfoResponse) -> Result<Limits, String> {
        let published = info.limits.as_ref().ok_or("the engine publishes no limits (an older engine build?)")?;
        let limits = Limits {
            context_length: info.context_length,
            max_completion_tokens: published.max_completion_tokens,
            max_top_logprobs: published.max_top_logprobs,
            max_stop_sequences: published.max_stop_sequences,
            max_speculation_depth: published.max_speculation_depth,
            max_speculation_top_k: published.max_speculation_top_k,
            max_speculation_nodes: published.max_speculation_nodes,
        };
        if limits.context_length == 0 || limits.max_completion_tokens == 0 {
            return Err(format!("the engine's limits leave no room to generate: {limits:?}"));
        }
        if limits.max_speculation_depth == 0 || limits.max_speculation_top_k == 0 || limits.max_speculation_nodes < 2 {
            return Err(format!("the engine's speculation limits are empty: {limits:?}"));
        }
        Ok(limits)
    }
}

/// Limits like an engine's over an 8K context, for tests that parse requests.
#[cfg(test)]
pub(crate) fn test_limits() -> Limits {
    Limits {
        context_length: 8192,
        max_completion_tokens: 8191,
        max_top_logprobs: 20,
        max_stop_sequences: 16,
        max_speculation_depth: 63,
        max_speculation_top_k: 8,
        max_speculation_nodes: 64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn bounds_are_the_engines() {
        let tight = Limits {
            max_top_logprobs: 3,
            max_stop_sequences: 2,
            max_speculation_depth: 5,
            max_speculation_top_k: 2,
            max_speculation_nodes: 6,
            ..test_limits()
        };
        let with = |extra: Value| {
            let mut body = json!({"messages": [{"role": "user", "content": "q"}]});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            crate::validate::parse_chat_request(body.to_string().as_bytes(), &tight)
        };
        assert!(with(json!({"logprobs": true, "top_logprobs": 3})).is_ok());
        assert!(with(json!({"stop": ["a", "b"]})).is_ok());
        assert!(with(json!({"speculation": {"max_depth": 5, "top_k": 2, "max_nodes": 6}})).is_ok());
        for (extra, param) in [
            (json!({"logprobs": true, "top_logprobs": 4}), "top_logprobs"),
            (json!({"stop": ["a", "b", "c"]}), "stop"),
            (json!({"speculation": {"max_depth": 6}}), "speculation.max_depth"),
            (json!({"speculation": {"top_k": 3}}), "speculation.top_k"),
            (json!({"speculation": {"max_nodes": 7}}), "speculation.max_nodes"),
        ] {
            let err = with(extra.clone()).unwrap_err();
            assert_eq!(err.to_body().error.param.as_deref(), Some(param), "{extra}");
        }
    }

    #[test]
    fn limits_come_from_info_or_the_engine_is_refused() {
        use proto::engine::v1::{EngineLimits, InfoResponse};
        let l = test_limits();
        let published = EngineLimits {
            max_completion_tokens: l.max_completion_tokens,
            max_top_logprobs: l.max_top_logprobs,
            max_stop_sequences: l.max_stop_sequences,
            max_speculation_depth: l.max_speculation_depth,
            max_speculation_top_k: l.max_speculation_top_k,
            max_speculation_nodes: l.max_speculation_nodes,
        };
        let info = InfoResponse { context_length: l.context_length, limits: Some(published), ..Default::default() };
        assert_eq!(Limits::from_info(&info).unwrap(), test_limits());
        assert!(Limits::from_info(&InfoResponse { limits: None, ..info.clone() }).unwrap_err().contains("no limits"));
        let none = EngineLimits { max_speculation_nodes: 1, ..published };
        assert!(Limits::from_info(&InfoResponse { limits: Some(none), ..info }).is_err());
    }
}
