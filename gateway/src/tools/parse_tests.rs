//! Tests of the incremental tool-call parser.

use super::*;
use serde_json::json;

/// A call assembled from its events.
struct ParsedCall {
    name: String,
    arguments: String,
}

fn tools() -> Vec<Value> {
    vec![json!({"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}})]
}

/// Feeds `text` in pieces of `step` bytes (on char boundaries) and collects the events.
fn run(format: ToolFormat, text: &str, step: usize, parallel: bool) -> Vec<ToolEvent> {
    let mut p = ToolParser::new(format, tools(), parallel);
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let mut j = (i + step).min(text.len());
        while !text.is_char_boundary(j) {
            j += 1;
        }
        out.extend(p.push(&text[i..j]));
        i = j;
    }
    out.extend(p.finish());
    merge(out)
}

/// Joins adjacent content events and assembles calls (ids checked, then blanked).
fn merge(events: Vec<ToolEvent>) -> Vec<ToolEvent> {
    let mut out: Vec<ToolEvent> = Vec::new();
    let mut calls: Vec<ParsedCall> = Vec::new();
    for e in events {
        match e {
            ToolEvent::Content(b) => match out.last_mut() {
                Some(ToolEvent::Content(a)) => a.push_str(&b),
                _ => out.push(ToolEvent::Content(b)),
            },
            ToolEvent::CallStart { index, id, name } => {
                assert!(id.starts_with("call_"));
                assert_eq!(index as usize, calls.len());
                calls.push(ParsedCall { name, arguments: String::new() });
                out.push(ToolEvent::CallStart { index, id: String::new(), name: String::new() });
            }
            ToolEvent::CallArgs { index, fragment } => {
                calls[index as usize].arguments.push_str(&fragment);
            }
        }
    }
    out.into_iter()
        .map(|e| match e {
            ToolEvent::CallStart { index, .. } => {
                let c = &calls[index as usize];
                call(index, &c.name, serde_json::from_str(&c.arguments).expect("arguments JSON"))
            }
            e => e,
        })
        .collect()
}

/// A whole call, as `merge` shows it.
fn call(index: u32, name: &str, arguments: Value) -> ToolEvent {
    ToolEvent::CallArgs { index, fragment: format!("{name}{arguments}") }
}

fn content(s: &str) -> ToolEvent {
    ToolEvent::Content(s.into())
}

#[test]
fn json_form_calls_are_parsed_at_any_chunking() {
    let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}\n</tool_call>";
    for step in [1, 2, 3, 7, 1000] {
        assert_eq!(
            run(ToolFormat::Json, text, step, true),
            vec![
                content("Let me check."),
                call(0, "get_weather", json!({"city": "Paris"})),
                call(1, "get_weather", json!({"city": "Oslo"})),
            ],
            "step {step}"
        );
    }
    let first_only = run(ToolFormat::Json, text, 5, false);
    assert_eq!(first_only.len(), 2);
}

#[test]
fn json_form_arguments_stream_as_they_arrive() {
    let mut p = ToolParser::new(ToolFormat::Json, tools(), true);
    assert_eq!(p.push("<tool_call>\n{\"name\": \"get_weather\", \"argu"), vec![]);
    let started = p.push("ments\": {\"city\": \"Pa");
    assert!(matches!(&started[0], ToolEvent::CallStart { index: 0, name, .. } if name == "get_weather"));
    assert_eq!(started[1], ToolEvent::CallArgs { index: 0, fragment: "{\"city\": \"Pa".into() });
    // Braces inside strings do not close the arguments; the outer `}` is not sent.
    assert_eq!(
        p.push("ris {x}\", \"days\": 3}}\n</tool_call>"),
        vec![ToolEvent::CallArgs { index: 0, fragment: "ris {x}\", \"days\": 3}".into() }]
    );
    assert_eq!(p.finish(), vec![]);
    // Cut short inside a string value: closed so the arguments stay JSON.
    let text = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Os";
    for step in [1, 3, 1000] {
        assert_eq!(
            run(ToolFormat::Json, text, step, true),
            vec![call(0, "get_weather", json!({"city": "Os"}))],
            "step {step}"
        );
    }
    // Multi-byte characters are never split across fragments.
    let text = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich 日本\"}}</tool_call>";
    for step in [1, 2, 5] {
        assert_eq!(
            run(ToolFormat::Json, text, step, true),
            vec![call(0, "get_weather", json!({"city": "Zürich 日本"}))]
        );
    }
}

#[test]
fn xml_form_values_follow_the_schema() {
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=extra>\n{\"a\": [1]}\n</parameter>\n</function>\n</tool_call>";
    for step in [1, 4, 1000] {
        assert_eq!(
            run(ToolFormat::Xml, text, step, true),
            vec![call(0, "get_weather", json!({"city": "42", "days": 3, "extra": {"a": [1]}}))],
            "step {step}"
        );
    }
    // Multi-line string values keep their inner newlines; a missing close is tolerated.
    let text =
        "Sure.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan\nFrancisco\n</parameter>\n</function>\n";
    assert_eq!(
        run(ToolFormat::Xml, text, 3, true),
        vec![content("Sure."), call(0, "get_weather", json!({"city": "San\nFrancisco"}))]
    );
}

#[test]
fn xml_calls_stream_the_name_first_then_one_fragment_per_parameter() {
    let mut p = ToolParser::new(ToolFormat::Xml, tools(), true);
    assert_eq!(p.push("<tool_call>\n<function=get_wea"), vec![]);
    let start = p.push("ther>\n<parameter=city>\nPar");
    assert!(matches!(&start[..], [ToolEvent::CallStart { index: 0, name, .. }] if name == "get_weather"), "{start:?}");
    let frag = |f: &str| ToolEvent::CallArgs { index: 0, fragment: f.into() };
    assert_eq!(p.push("is\n</parameter>\n<parameter=days>\n"), vec![frag("{\"city\":\"Paris\"")]);
    assert_eq!(p.push("2\n</parameter>\n</function>\n</tool"), vec![frag(",\"days\":2")]);
    assert_eq!(p.push("_call>"), vec![frag("}")]);
    assert_eq!(p.finish(), vec![]);
    // A second call is muted when parallel calls are off.
    let two = "<tool_call>\n<function=get_weather>\n</function>\n</tool_call><tool_call>\n<function=get_weather>\n<parameter=city>\nX\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(run(ToolFormat::Xml, two, 3, false), vec![call(0, "get_weather", json!({}))]);
    assert_eq!(run(ToolFormat::Xml, two, 3, true).len(), 2);
}

#[test]
fn text_without_calls_passes_through_and_broken_blocks_stay_content() {
    let plain = "a < b and <tool is not <tool_call";
    assert_eq!(run(ToolFormat::Json, plain, 2, true), vec![content(plain)]);
    let broken = "x <tool_call>not json</tool_call> y";
    assert_eq!(run(ToolFormat::Json, broken, 3, true), vec![content(broken)]);
    // Content is released before the end when it cannot start a tag.
    let mut p = ToolParser::new(ToolFormat::Json, tools(), true);
    assert_eq!(p.push("hello <tool"), vec![content("hello")]);
    assert_eq!(p.push("box"), vec![content(" <toolbox")]);
}

#[test]
fn generic_format_reads_bare_json_calls_of_offered_tools() {
    let bare = "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n```";
    // Any step, one byte included: a leading "`" or "\n" is held until it shows what it starts.
    for text in [bare, &format!("\n{}", &bare[8..bare.len() - 4])] {
        for step in [1, 2, 4, 1000] {
            assert_eq!(
                run(ToolFormat::Generic, text, step, true),
                vec![call(0, "get_weather", json!({"city": "Rome"}))],
                "step {step}: {text}"
            );
        }
    }
    assert_eq!(run(ToolFormat::Generic, "  ``", 1, true), vec![content("  ``")]);
    let unknown = "{\"name\": \"launch\", \"arguments\": {}}";
    assert_eq!(run(ToolFormat::Generic, unknown, 4, true), vec![content(unknown)]);
    let tagged = "<tool_call>{\"name\": \"get_weather\"}</tool_call>";
    assert_eq!(run(ToolFormat::Generic, tagged, 4, true), vec![call(0, "get_weather", json!({}))]);
    assert_eq!(run(ToolFormat::Generic, "It is sunny.", 4, true), vec![content("It is sunny.")]);
}

#[test]
fn generic_format_streams_a_fence_of_another_language_at_once() {
    // Held while it may still be a ```json call...
    let mut p = ToolParser::new(ToolFormat::Generic, tools(), true);
    assert_eq!(p.push("```"), vec![]);
    assert_eq!(p.push("js"), vec![]);
    assert_eq!(p.push("on\n{\"name\""), vec![]);
    let mut p = ToolParser::new(ToolFormat::Generic, tools(), true);
    assert_eq!(p.push(" ```\n"), vec![]);
    assert_eq!(p.push("[{"), vec![]);
    // ...released as soon as it cannot be one, and streamed from then on.
    let mut p = ToolParser::new(ToolFormat::Generic, tools(), true);
    assert_eq!(p.push("```"), vec![]);
    assert_eq!(p.push("python\n"), vec![content("```python")]);
    assert_eq!(p.push("print(1)"), vec![content("\nprint(1)")]);
    assert_eq!(p.finish(), vec![]);
    let mut p = ToolParser::new(ToolFormat::Generic, tools(), true);
    assert_eq!(p.push("```json\nnot json"), vec![content("```json\nnot json")]);
    let code = "```python\nprint({\"name\": 1})\n```";
    assert_eq!(run(ToolFormat::Generic, code, 3, true), vec![content(code)]);
}

/// Found by the tool_parsers fuzz target: arguments that never close, and a step that ends
/// inside the closing tag (`</tool_call` without `>`), scanned the tag's first bytes as
/// arguments and then sliced backwards (a panic) once the `>` arrived. The arguments here are
/// not JSON (the model broke them), so the calls are compared as raw text.
#[test]
fn a_closing_tag_split_across_steps_is_not_scanned_as_arguments() {
    let text = "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Z\u{fc}r<to\", \"days : 6}}ity\": \n</tool_call>";
    let raw_calls = |pieces: &[&str]| {
        let mut p = ToolParser::new(ToolFormat::Json, tools(), true);
        let mut events: Vec<ToolEvent> = pieces.iter().flat_map(|piece| p.push(piece)).collect();
        events.extend(p.finish());
        let mut calls: Vec<(String, String)> = Vec::new();
        for e in events {
            match e {
                ToolEvent::CallStart { name, .. } => calls.push((name, String::new())),
                ToolEvent::CallArgs { index, fragment } => calls[index as usize].1.push_str(&fragment),
                ToolEvent::Content(_) => {}
            }
        }
        calls
    };
    let whole = raw_calls(&[text]);
    assert_eq!(whole.len(), 1);
    assert!(!whole[0].1.contains("</tool_call"), "{whole:?}");
    let cut = text.len() - 1;
    assert_eq!(raw_calls(&[&text[..cut], &text[cut..]]), whole);
    for split in (1..CLOSE.len()).map(|k| text.len() - k) {
        assert_eq!(raw_calls(&[&text[..split], &text[split..]]), whole, "split at {split}");
    }
}

/// Found by the tool_parsers fuzz target: an XML parameter the model never closed, ending in
/// whitespace other than a newline, read as "\u{b}" when the call had streamed and as "" in
/// one piece.
#[test]
fn an_unclosed_xml_parameter_reads_the_same_streamed_or_whole() {
    let text =
        "ity\": me check.\n\n<tool_call>\n<function=get_weath>r\ne<parameter=raeter=er=/paraetion>\u{b}</tool_call>";
    let args = |pieces: &[&str]| {
        let mut p = ToolParser::new(ToolFormat::Xml, tools(), true);
        let mut events: Vec<ToolEvent> = pieces.iter().flat_map(|piece| p.push(piece)).collect();
        events.extend(p.finish());
        events
            .into_iter()
            .filter_map(|e| match e {
                ToolEvent::CallArgs { fragment, .. } => Some(fragment),
                _ => None,
            })
            .collect::<String>()
    };
    let whole = args(&[text]);
    for split in 1..text.len() {
        if text.is_char_boundary(split) {
            assert_eq!(args(&[&text[..split], &text[split..]]), whole, "split at {split}");
        }
    }
}

/// Found by the tool_parsers fuzz target: a parameter written twice was sent twice when the
/// call streamed (`{"city":"a","city":"b"}`) and once, with the last value, in one piece.
/// Both paths now keep the first value.
#[test]
fn a_repeated_xml_parameter_keeps_its_first_value_streamed_or_whole() {
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n\
                <parameter=days>\n2\n</parameter>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>";
    let expected = vec![call(0, "get_weather", json!({"city": "Paris", "days": 2}))];
    for step in [1, 3, 7, text.len()] {
        let events = run(ToolFormat::Xml, text, step, true);
        assert_eq!(events, expected, "step {step}");
    }
    // The raw arguments text, not only its parse, holds the key once.
    let mut p = ToolParser::new(ToolFormat::Xml, tools(), true);
    let mut events: Vec<ToolEvent> = text.split_inclusive('\n').flat_map(|piece| p.push(piece)).collect();
    events.extend(p.finish());
    let raw: String = events
        .into_iter()
        .filter_map(|e| match e {
            ToolEvent::CallArgs { fragment, .. } => Some(fragment),
            _ => None,
        })
        .collect();
    assert_eq!(raw, r#"{"city":"Paris","days":2}"#);
}
