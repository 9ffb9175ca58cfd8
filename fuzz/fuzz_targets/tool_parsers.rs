//! The streaming tool-call parsers (Qwen XML, Hermes JSON, generic) fed the model's text in
//! arbitrary chunkings, as a speculative step delivers several tokens at once. Input: byte 0
//! picks the format and `parallel_tool_calls`, byte 1 seeds the chunk sizes, the rest is the
//! model's text. Besides not panicking: call indices count from 0 and argument fragments
//! belong to a started call, and the calls assembled from the chunks are the ones assembled
//! from the whole text in one piece.
#![no_main]

use gateway::tools::{ToolEvent, ToolFormat, ToolParser};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

fn tools() -> Vec<serde_json::Value> {
    vec![json!({"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
        "opts": {"type": "object"}}, "required": ["city"]}}})]
}

/// (name, arguments) of every call, in order.
fn calls(events: Vec<ToolEvent>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for e in events {
        match e {
            ToolEvent::Content(_) => {}
            ToolEvent::CallStart { index, name, .. } => {
                assert_eq!(index as usize, out.len(), "call indices count from 0");
                out.push((name, String::new()));
            }
            ToolEvent::CallArgs { index, fragment } => {
                let call = out.get_mut(index as usize).expect("arguments of a call that never started");
                call.1.push_str(&fragment);
            }
        }
    }
    out
}

fn run(format: ToolFormat, parallel: bool, pieces: &[&str]) -> Vec<(String, String)> {
    let mut parser = ToolParser::new(format, tools(), parallel);
    let mut events = Vec::new();
    for piece in pieces {
        events.extend(parser.push(piece));
    }
    events.extend(parser.finish());
    calls(events)
}

fuzz_target!(|data: &[u8]| {
    let [mode, seed, rest @ ..] = data else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let format = [ToolFormat::Xml, ToolFormat::Json, ToolFormat::Generic][(*mode % 3) as usize];
    let parallel = mode & 0x80 != 0;
    // Chunks of 1..=8 characters (cut at char boundaries), sizes from the seed.
    let mut pieces = Vec::new();
    let mut state = u32::from(*seed) | 1;
    let mut start = 0;
    let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
    let mut at = 0;
    while at + 1 < bounds.len() {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        at = (at + 1 + (state % 8) as usize).min(bounds.len() - 1);
        pieces.push(&text[start..bounds[at]]);
        start = bounds[at];
    }
    let whole = run(format, parallel, &[text]);
    let chunked = run(format, parallel, &pieces);
    assert_eq!(chunked, whole, "chunking changed the calls: {pieces:?}");
});
