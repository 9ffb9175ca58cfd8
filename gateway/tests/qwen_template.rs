//! The Qwen3.5/3.6 chat template renders byte for byte as Jinja2 does under transformers'
//! `apply_chat_template`, on the committed conversations of
//! src/text/testdata/qwen3_5/cases.json (written by scripts/qwen36/template/render_jinja2.py):
//! tools, tool calls with every argument type, tool results, reasoning, thinking on/off,
//! multi-part content, and the template's own errors.

use gateway::text::{ChatTemplate, RenderInput};
use serde_json::Value;

const TEMPLATE: &str = include_str!("../src/text/testdata/qwen3_5.jinja");
const CASES: &str = include_str!("../src/text/testdata/qwen3_5/cases.json");
/// Request bounds like an engine's over a 32K context (these cases test rendering).
const LIMITS: gateway::validate::Limits = gateway::validate::Limits {
    context_length: 32768,
    max_completion_tokens: 32767,
    max_top_logprobs: 20,
    max_stop_sequences: 16,
    max_speculation_depth: 63,
    max_speculation_top_k: 8,
    max_speculation_nodes: 64,
};

fn first_difference(a: &str, b: &str) -> String {
    let at = a.bytes().zip(b.bytes()).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
    let from = at.saturating_sub(60);
    let around =
        |s: &str| String::from_utf8_lossy(&s.as_bytes()[from.min(s.len())..(at + 60).min(s.len())]).into_owned();
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

/// Cases whose input the OpenAI API cannot carry or that the gateway normalizes differently
/// on purpose; the template itself is checked on them above.
const NOT_THROUGH_THE_API: &[(&str, &str)] = &[
    ("image_and_video_parts_with_vision_ids", "the gateway accepts text parts only"),
    ("tool_call_without_function_wrapper_and_without_arguments", "OpenAI tool calls always have `function`"),
    ("multi_part_text_content", "validate.rs joins text parts with \\n; this template concatenates them"),
    ("tool_response_with_list_content", "validate.rs joins text parts with \\n; this template concatenates them"),
];

/// OpenAI's wire form of a case: tool-call arguments as JSON strings.
fn openai_messages(messages: &Value) -> Value {
    let mut messages = messages.clone();
    for msg in messages.as_array_mut().into_iter().flatten() {
        for call in msg.get_mut("tool_calls").and_then(Value::as_array_mut).into_iter().flatten() {
            if let Some(args) = call.pointer_mut("/function/arguments") {
                *args = Value::String(args.to_string());
            }
        }
    }
    messages
}

#[test]
fn openai_requests_render_through_the_gateway_path_like_jinja2() {
    use gateway::tools::{self, ToolFormat};
    let template = ChatTemplate::new(TEMPLATE, "", "<|im_end|>").expect("template compiles");
    let format = ToolFormat::detect(TEMPLATE);
    let doc: Value = serde_json::from_str(CASES).expect("cases.json");
    let mut failures = Vec::new();
    let mut checked = 0;
    for case in doc["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        if NOT_THROUGH_THE_API.iter().any(|(n, _)| *n == name) {
            continue;
        }
        let mut body = serde_json::json!({"model": "m", "messages": openai_messages(&case["messages"]),
            "chat_template_kwargs": case["kwargs"]});
        if let Some(t) = case.get("tools") {
            body["tools"] = t.clone();
        }
        // As chat.rs does: validate, tool instruction/messages, offered tools, render.
        let rendered = gateway::validate::parse_chat_request(body.to_string().as_bytes(), &LIMITS)
            .map_err(|e| format!("{e:?}"))
            .and_then(|req| {
                let instruction = tools::system_instruction(format, &req.tools);
                let messages = tools::prepare_messages(&req.messages, format, instruction.as_deref());
                let tools =
                    (req.tools.active() && format != ToolFormat::Generic).then(|| Value::Array(req.tools.offered()));
                template.render(&RenderInput { messages, tools, extra: req.template_kwargs }).map_err(|e| e.to_string())
            });
        checked += 1;
        match (rendered, case.get("expected").and_then(Value::as_str)) {
            (Ok(got), Some(want)) if got == want => {}
            (Ok(got), Some(want)) => failures.push(format!("{name}: {}", first_difference(&got, want))),
            (Err(e), Some(_)) => failures.push(format!("{name}: refused: {e}")),
            // Errors may come from validation or from the template; either way no prompt.
            (Err(_), None) => {}
            (Ok(got), None) => failures.push(format!("{name}: rendered {got:?}, want an error")),
        }
    }
    assert!(checked >= 20, "{checked} cases");
    assert!(failures.is_empty(), "{} of {checked} cases differ:\n{}", failures.len(), failures.join("\n"));
}
