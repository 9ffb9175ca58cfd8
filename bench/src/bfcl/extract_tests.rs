//! One test per way a reply can be read differently; expectations are the official harness's
//! (checked against its `FunctionCallExtractor` with `scripts/bench/bfcl_official.py`).

use serde_json::{Value, json};

use super::*;
use crate::client::{Reply, ToolCall};

fn text(s: &str) -> Reply {
    Reply { content: s.into(), ..Reply::default() }
}

fn names(reply: &Reply) -> Vec<Option<String>> {
    calls(&scoring_output(reply)).expect("no raise").into_iter().map(|c| c.name).collect()
}

fn one(reply: &Reply) -> Value {
    let c = calls(&scoring_output(reply)).expect("no raise");
    assert_eq!(c.len(), 1, "{c:?}");
    c[0].args.clone()
}

#[test]
fn structured_calls_win_and_prose_is_ignored() {
    let r = Reply {
        content: "Sure: f(a=1)".into(),
        tool_calls: vec![
            ToolCall { id: "x".into(), name: "g".into(), arguments: "{\"b\": 2}".into() },
            ToolCall { id: "y".into(), name: "h".into(), arguments: "{bad".into() },
        ],
        ..Reply::default()
    };
    let c = calls(&scoring_output(&r)).unwrap();
    assert_eq!(c.iter().map(|c| c.name.as_deref()).collect::<Vec<_>>(), vec![Some("g"), Some("h")]);
    assert_eq!(c[0].args, json!({"b": 2}));
    assert_eq!(c[1].args, json!({}));
}

#[test]
fn reasoning_is_part_of_the_scored_text() {
    let r = Reply { reasoning: "think ".into(), content: "f(a=1)".into(), ..Reply::default() };
    assert_eq!(scoring_output(&r), "think f(a=1)");
    assert_eq!(one(&r), json!({"a": 1}));
}

#[test]
fn a_space_before_the_parenthesis_is_still_a_call() {
    assert_eq!(names(&text("calculate_area (base=10, height=5)")), vec![Some("calculate_area".into())]);
    // The regex starts at a word boundary: a dotted name gives its last part.
    assert_eq!(names(&text("math.hypot(x=3, y=4)")), vec![Some("hypot".into())]);
}

#[test]
fn prose_in_parentheses_is_an_extra_call() {
    let r = text("calculate_area(base=10, height=5) gives the area (in square units).");
    let c = calls(&scoring_output(&r)).unwrap();
    assert_eq!(c.len(), 2);
    assert_eq!(c[1].name.as_deref(), Some("area"));
    assert_eq!(c[1].args, json!({"_raw": "in square units"}));
    // Signature-like lists and skipped names are not calls.
    assert!(names(&text("print(x=1) and def f(a, b)")).is_empty());
}

#[test]
fn json_is_read_only_as_a_bare_array() {
    let arr = r#"[{"name": "f", "arguments": {"x": 1}}]"#;
    assert_eq!(one(&text(arr)), json!({"x": 1}));
    // A lone object, JSON after prose and a fenced array are not read as JSON.
    assert!(names(&text(r#"{"name": "f", "arguments": {"x": 1}}"#)).is_empty());
    assert!(names(&text(&format!("Here you go: {arr}"))).is_empty());
    assert!(names(&text(&format!("```json\n{arr}\n```"))).is_empty());
    // "parameters" is not read: the call has no arguments.
    assert_eq!(one(&text(r#"[{"name": "f", "parameters": {"x": 1}}]"#)), json!({}));
    // A function name inside JSON strings is still found by the last-resort regex.
    assert_eq!(names(&text(r#"{"expr": "sqrt(4)"}"#)), vec![Some("sqrt".into())]);
}

#[test]
fn a_json_tool_calls_list_in_text_is_a_tool_call() {
    let t = r#"[{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]"#;
    assert!(makes_tool_call(t));
    assert_eq!(one(&text(t)), json!({"x": 1}));
    assert!(!makes_tool_call("I cannot help with that."));
    assert!(!makes_tool_call(r#"[{"name": "f"}]"#));
    assert!(!makes_tool_call("[]"));
    assert!(makes_tool_call(&scoring_output(&Reply {
        tool_calls: vec![ToolCall { name: "f".into(), ..ToolCall::default() }],
        ..Reply::default()
    })));
}

#[test]
fn arguments_are_decoded_twice_and_names_may_be_missing() {
    // A JSON string holding JSON: the extractor decodes once, the scorer once more.
    let r = Reply {
        tool_calls: vec![ToolCall { name: "f".into(), arguments: "\"{\\\"x\\\": 1}\"".into(), ..ToolCall::default() }],
        ..Reply::default()
    };
    assert_eq!(one(&r), json!({"x": 1}));
    let nameless = Reply { tool_calls: vec![ToolCall::default()], ..Reply::default() };
    assert_eq!(names(&nameless), vec![Some(String::new())]);
    assert_eq!(names(&text(r#"[{"name": 5, "arguments": {}}]"#)), vec![None]);
    assert!(calls(&scoring_output(&text(r#"[{"name": [1], "arguments": {}}]"#))).is_err());
}

#[test]
fn empty_replies_have_no_calls() {
    assert!(names(&text("")).is_empty());
    assert!(names(&text("   \n")).is_empty());
}
