//! The Qwen3.5/3.6 chat template renders byte for byte as Jinja2 does under transformers'
//! `apply_chat_template`, on the committed conversations of
//! src/text/testdata/qwen3_5/cases.json (written by scripts/qwen36/template/render_jinja2.py):
//! tools, tool calls with every argument type, tool results, reasoning, thinking on/off,
//! multi-part content, and the template's own errors.

use gateway::text::{ChatTemplate, RenderInput};
use serde_json::Value;

const TEMPLATE: &str = include_str!("../src/text/testdata/qwen3_5.jinja");
const CASES: &str = include_str!("../src/text/testdata/qwen3_5/cases.json");

fn first_difference(a: &str, b: &str) -> String {
    let at = a.bytes().zip(b.bytes()).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
    let from = at.saturating_sub(60);
    let around = |s: &str| String::from_utf8_lossy(&s.as_bytes()[from.min(s.len())..(at + 60).min(s.len())]).into_owned();
    format!("at byte {at}:\n  got:  {:?}\n  want: {:?}", around(a), around(b))
}

#[test]
fn qwen_template_renders_every_case_byte_identically_to_jinja2() {
    let template = ChatTemplate::new(TEMPLATE, "", "<|im_end|>").expect("template compiles");
    let doc: Value = serde_json::from_str(CASES).expect("cases.json");
    let cases = doc["cases"].as_array().expect("cases");
    assert!(cases.len() >= 25, "{} cases", cases.len());
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let input = RenderInput {
            messages: case["messages"].clone(),
            tools: case.get("tools").cloned(),
            extra: case["kwargs"].as_object().cloned().unwrap_or_default(),
        };
        let got = template.render(&input);
        match (got, case.get("expected").and_then(Value::as_str), case.get("error").and_then(Value::as_str)) {
            (Ok(got), Some(want), _) if got == want => {}
            (Ok(got), Some(want), _) => failures.push(format!("{name}: {}", first_difference(&got, want))),
            (Err(e), _, Some(want)) if e.to_string() == want => {}
            (Err(e), _, Some(want)) => failures.push(format!("{name}: error {e:?}, want {want:?}")),
            (Ok(got), None, want) => failures.push(format!("{name}: rendered {got:?}, want error {want:?}")),
            (Err(e), want, None) => failures.push(format!("{name}: error {e}, want {want:?}")),
        }
    }
    assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
}
