//! Request validation of the other endpoints: completions, Responses, Anthropic messages and
//! count_tokens. The first byte picks the endpoint, the rest is the body.
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else { return };
    let limits = common::gateway_limits();
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
