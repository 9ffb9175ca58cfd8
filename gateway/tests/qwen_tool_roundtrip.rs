//! What the Qwen3.5/3.6 template renders for an assistant's tool calls parses back, through
//! the gateway's XML tool-call parser, to the same function names and the same arguments
//! (strings, integers, floats, booleans, null, objects, arrays; key order kept), at any
//! chunking of the streamed text.

use gateway::text::{ChatTemplate, RenderInput};
use gateway::tools::{ToolEvent, ToolFormat, ToolParser};
use serde_json::{Value, json};

const TEMPLATE: &str = include_str!("../src/text/testdata/qwen3_5.jinja");

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "code": {"type": "string"}, "digits": {"type": "string"},
            "empty": {"type": "string"}, "unicode": {"type": "string"},
            "limit": {"type": "integer"}, "offset": {"type": "integer"}, "ratio": {"type": "number"},
            "tiny": {"type": "number"}, "whole": {"type": "number"}, "big": {"type": "integer"},
            "regex": {"type": "boolean"}, "fuzzy": {"type": "boolean"}, "since": {"type": ["string", "null"]},
            "paths": {"type": "array"}, "options": {"type": "object"}, "none_list": {"type": "array"},
            "no_opts": {"type": "object"}}}}},
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}}}}},
        {"type": "function", "function": {"name": "now", "parameters": {}}},
    ])
}

/// The assistant turn as the template renders it in history: exactly what the model writes.
fn rendered_turn(content: &str, calls: &[(&str, Value)]) -> String {
    let template = ChatTemplate::new(TEMPLATE, "", "<|im_end|>").unwrap();
    let tool_calls: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"id": format!("call_{i}"), "type": "function", "function": {"name": name, "arguments": args}})
        })
        .collect();
    // A later user turn keeps the template from adding a <think> block to this one.
    let messages = json!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": content, "tool_calls": tool_calls},
        {"role": "user", "content": "next"},
    ]);
    let prompt = template.render(&RenderInput { messages, tools: Some(tools()), extra: Default::default() }).unwrap();
    let start = prompt.find("<|im_start|>assistant\n").unwrap() + "<|im_start|>assistant\n".len();
    let end = start + prompt[start..].find("<|im_end|>").unwrap();
    prompt[start..end].to_owned()
}

/// Feeds `text` in pieces of `step` chars; returns the content and the (name, arguments) calls.
fn parse(text: &str, step: usize) -> (String, Vec<(String, Value)>) {
    let mut parser = ToolParser::new(ToolFormat::Xml, tools().as_array().unwrap().clone(), true);
    let chars: Vec<char> = text.chars().collect();
    let mut events = Vec::new();
    for piece in chars.chunks(step) {
        events.extend(parser.push(&piece.iter().collect::<String>()));
    }
    events.extend(parser.finish());
    let mut content = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for event in events {
        match event {
            ToolEvent::Content(text) => content.push_str(&text),
            ToolEvent::CallStart { index, name, .. } => {
                assert_eq!(index as usize, calls.len());
                calls.push((name, String::new()));
            }
            ToolEvent::CallArgs { index, fragment } => calls[index as usize].1.push_str(&fragment),
        }
    }
    let calls = calls
        .into_iter()
        .map(|(name, args)| {
            let parsed = serde_json::from_str(&args).unwrap_or_else(|e| panic!("{name} arguments {args:?}: {e}"));
            (name, parsed)
        })
        .collect();
    (content, calls)
}

fn keys(v: &Value) -> Vec<&String> {
    v.as_object().map(|m| m.keys().collect()).unwrap_or_default()
}

fn assert_round_trip(content: &str, calls: &[(&str, Value)]) {
    let text = rendered_turn(content, calls);
    assert!(text.contains("<tool_call>\n<function="), "{text}");
    for step in [usize::MAX, 1, 2, 3, 7, 16] {
        let (got_content, got_calls) = parse(&text, step);
        assert_eq!(got_content, content, "content at step {step}; text {text:?}");
        assert_eq!(got_calls.len(), calls.len(), "calls at step {step}; text {text:?}");
        for ((got_name, got_args), (name, args)) in got_calls.iter().zip(calls) {
            assert_eq!(got_name, name, "step {step}");
            assert_eq!(got_args, args, "{name} at step {step}; text {text:?}");
            assert_eq!(keys(got_args), keys(args), "key order of {name}");
        }
    }
}

#[test]
fn the_template_speaks_the_xml_format() {
    assert_eq!(ToolFormat::detect(TEMPLATE), ToolFormat::Xml);
}

#[test]
fn every_argument_type_round_trips() {
    let args = json!({
        "query": "fn main",
        "code": "\nfn main() {\n    println!(\"hi\");\n}\n",
        "digits": "42",
        "empty": "",
        "unicode": "naïve 日本語 🦀 <b>&amp;</b>",
        "limit": 7,
        "offset": -3,
        "ratio": 2.5,
        "tiny": 1e-7,
        "whole": 3.0,
        "big": 12345678901234567i64,
        "regex": true,
        "fuzzy": false,
        "since": null,
        "paths": ["src/", "tests/ünï.rs", 1, {"deep": [null, true]}],
        "options": {"case": "smart", "context": 2, "nested": {"a": [1.5, "x"]}},
        "none_list": [],
        "no_opts": {},
    });
    assert_round_trip("", &[("search", args)]);
}

#[test]
fn parallel_calls_after_content_round_trip() {
    assert_round_trip(
        "Let me check both cities.",
        &[
            ("get_weather", json!({"city": "Paris", "days": 2})),
            ("get_weather", json!({"city": "東京"})),
            ("now", json!({})),
        ],
    );
}

#[test]
fn values_of_undeclared_parameters_keep_their_json_type() {
    // `now` declares no parameters: the parser reads values as JSON, strings stay strings.
    assert_round_trip(
        "",
        &[(
            "now",
            json!({"tz": "Europe/Paris", "n": 5, "x": 0.25, "on": true, "off": false,
                          "nothing": null, "list": [1, 2], "map": {"k": "v"}}),
        )],
    );
}
