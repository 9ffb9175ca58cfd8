//! Request validation of the other endpoints: completions, Responses, Anthropic messages and
//! count_tokens. The first byte picks the endpoint, the rest is the body.
#![no_main]

use gateway::limits::Limits;
use libfuzzer_sys::fuzz_target;

fn limits() -> Limits {
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

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else { return };
    let limits = limits();
    // "" joins text parts as list-walking templates do; "\n\n" as the others.
    let joiner = if which & 0x80 == 0 { "" } else { "\n\n" };
    match which % 5 {
        0 => drop(gateway::completions::parse_completion_request(body, &limits)),
        1 => drop(gateway::responses::request::parse_responses_request(body, joiner, &limits)),
        2 => drop(gateway::anthropic::request::parse_messages_request(body, joiner, &limits)),
        3 => drop(gateway::anthropic::request::parse_count_tokens_request(body, joiner, &limits)),
        _ => drop(gateway::validate::parse_chat_request_with(body, joiner, &limits)),
    }
});
