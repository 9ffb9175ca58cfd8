//! Tool calls come out the same however the engine chunks its tokens. A speculative step
//! accepts several tokens at once, so a delta may hold half a tag, a whole call, or one call's
//! end and the next one's start. For each parser (Qwen XML, Hermes JSON, generic), replies with
//! text and parallel calls are delivered in seeded random chunks of 1 to 16 tokens, in one
//! chunk, one token at a time, and in a chunking that puts a call's end and the next call's
//! start in one delta; through chat completions, Responses and Messages, streamed. Every API
//! must assemble, at every chunking, exactly what it assembles from the one-chunk delivery, and
//! those calls must be the ones the parser reads from the whole text.

use super::*;
use crate::tools::{ToolEvent, ToolFormat, ToolParser};

/// A ChatML template that renders calls in the Hermes JSON form (`<tool_call>` JSON).
const HERMES: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n{# <tool_call> #}";

const XML_REPLY: &str = "Let me check both.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRio de Janeiro\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>";
const JSON_REPLY: &str = "Checking.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich 日本\", \"days\": 3}}\n</tool_call>";
const GENERIC_FENCED: &str =
    "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"days\": 2}}\n```";

fn tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]}}})
}

/// xorshift64*: seeded chunk sizes without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The reply's token ids (EOS last) cut into chunks of the given sizes.
fn chunked(ids: &[u32], sizes: &[usize]) -> Vec<Result<GenerateResponse, Status>> {
    let mut script = Vec::new();
    let mut rest = ids;
    for &size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let take = size.clamp(1, rest.len());
        script.push(tokens(&rest[..take]));
        rest = &rest[take..];
    }
    script.push(finished(WireFinish::Stop, ids.len() as u32, 0));
    script
}

/// The chunkings to try for `ids`: whole, token by token, seeded random 1..=16, and one whose
/// single chunk runs from inside the first call's closing tag into the second call's opening.
fn chunkings(text: &str, ids: &[u32]) -> Vec<(String, Vec<usize>)> {
    let mut out = vec![("whole".to_owned(), vec![ids.len()]), ("1 token".to_owned(), vec![1])];
    for seed in 1..=6u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let sizes: Vec<usize> = (0..ids.len()).map(|_| 1 + (rng.next() % 16) as usize).collect();
        out.push((format!("seed {seed}"), sizes));
    }
    if let Some(end) = text.find("</tool_call>") {
        // Tokens before the middle of the first closing tag, then one chunk up to past the next
        // opening tag, then the rest.
        let tok = test_tokenizer::tokenizer();
        let before = tok.encode(&text[..end + 5]).unwrap().len().saturating_sub(1);
        let next_open = text[end..].find("<tool_call>").map_or(text.len(), |i| end + i + "<tool_call>".len() + 3);
        let through = tok.encode(&text[..next_open.min(text.len())]).unwrap().len();
        let mut sizes = vec![1; before];
        sizes.push(through.saturating_sub(before).max(1));
        sizes.push(ids.len());
        out.push(("a call's end and the next start in one delta".to_owned(), sizes));
    }
    out
}

/// What an API's stream assembled: all text, and each call's name and arguments text.
#[derive(Debug, PartialEq)]
struct Assembled {
    text: String,
    calls: Vec<(String, String)>,
}

fn chat_assembled(body: &str) -> Assembled {
    let mut text = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for payload in sse_payloads(body) {
        let Some(delta) = payload.get("choices").and_then(|c| c.get(0)).map(|c| &c["delta"]) else { continue };
        if let Some(t) = delta["content"].as_str() {
            text.push_str(t);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap() as usize;
            if let Some(name) = call["function"]["name"].as_str() {
                assert_eq!(index, calls.len(), "calls start in order: {body}");
                calls.push((name.to_owned(), String::new()));
            }
            if let Some(args) = call["function"]["arguments"].as_str() {
                calls[index].1.push_str(args);
            }
        }
    }
    Assembled { text, calls }
}

fn responses_assembled(body: &str) -> Assembled {
    let mut text = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    let mut call_at: Vec<u64> = Vec::new();
    for (name, data) in named_events(body) {
        match name.as_str() {
            "response.output_text.delta" => text.push_str(data["delta"].as_str().unwrap()),
            "response.output_item.added" if data["item"]["type"] == "function_call" => {
                call_at.push(data["output_index"].as_u64().unwrap());
                calls.push((data["item"]["name"].as_str().unwrap().to_owned(), String::new()));
            }
            "response.function_call_arguments.delta" => {
                let at = data["output_index"].as_u64().unwrap();
                let i = call_at.iter().position(|&o| o == at).expect("arguments of an added call");
                calls[i].1.push_str(data["delta"].as_str().unwrap());
            }
            "response.completed" => {
                // The final object agrees with the deltas.
                let items = data["response"]["output"].as_array().unwrap();
                let final_calls: Vec<(String, String)> = items
                    .iter()
                    .filter(|i| i["type"] == "function_call")
                    .map(|i| (i["name"].as_str().unwrap().to_owned(), i["arguments"].as_str().unwrap().to_owned()))
                    .collect();
                assert_eq!(final_calls, calls, "{body}");
            }
            _ => {}
        }
    }
    Assembled { text, calls }
}

fn messages_assembled(body: &str) -> Assembled {
    let mut text = String::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    for (name, data) in named_events(body) {
        match (name.as_str(), data["delta"]["type"].as_str()) {
            ("content_block_start", _) if data["content_block"]["type"] == "tool_use" => {
                calls.push((data["content_block"]["name"].as_str().unwrap().to_owned(), String::new()));
            }
            ("content_block_delta", Some("text_delta")) => text.push_str(data["delta"]["text"].as_str().unwrap()),
            ("content_block_delta", Some("input_json_delta")) => {
                calls.last_mut().unwrap().1.push_str(data["delta"]["partial_json"].as_str().unwrap());
            }
            _ => {}
        }
    }
    Assembled { text, calls }
}

/// Streams `reply` chunked as `sizes` through `api` (served through `template`).
async fn stream_through(api: &str, template: &str, ids: &[u32], sizes: &[usize]) -> Assembled {
    let (state, _) = start_engine_templated(chunked(ids, sizes), template).await;
    let user = json!([{"role": "user", "content": "Weather in Paris and Rio?"}]);
    let function = &tool()["function"];
    let (path, body) = match api {
        "chat" => ("/v1/chat/completions", json!({"messages": user, "tools": [tool()], "stream": true})),
        "responses" => (
            "/v1/responses",
            json!({"input": user, "stream": true, "tools": [{"type": "function", "name": function["name"],
                "parameters": function["parameters"]}]}),
        ),
        _ => (
            "/v1/messages",
            json!({"messages": user, "stream": true, "max_tokens": 200, "tools": [{"name": function["name"],
                "input_schema": function["parameters"]}]}),
        ),
    };
    let req =
        Request::post(path).header("content-type", "application/json").body(Body::from(body.to_string())).unwrap();
    let (status, text) = call(&state, req).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    match api {
        "chat" => chat_assembled(&text),
        "responses" => responses_assembled(&text),
        _ => messages_assembled(&text),
    }
}

/// The calls the parser reads from the whole text at once: `(name, arguments as JSON)`.
fn parsed_whole(format: ToolFormat, text: &str) -> Vec<(String, Value)> {
    let mut parser = ToolParser::new(format, vec![tool()], true);
    let mut events = parser.push(text);
    events.extend(parser.finish());
    let mut calls: Vec<(String, String)> = Vec::new();
    for e in events {
        match e {
            ToolEvent::CallStart { name, .. } => calls.push((name, String::new())),
            ToolEvent::CallArgs { index, fragment } => calls[index as usize].1.push_str(&fragment),
            ToolEvent::Content(_) => {}
        }
    }
    calls.into_iter().map(|(n, a)| (n, serde_json::from_str(&a).expect("arguments JSON"))).collect()
}

#[tokio::test]
async fn every_parser_gives_the_same_calls_at_any_chunking_on_every_api() {
    let tok = test_tokenizer::tokenizer();
    for (template, reply, want_calls) in
        [(QWEN_TEMPLATE, XML_REPLY, 2), (HERMES, JSON_REPLY, 2), (CHATML, JSON_REPLY, 2), (CHATML, GENERIC_FENCED, 1)]
    {
        let format = ToolFormat::detect(template);
        let expected = parsed_whole(format, reply);
        assert_eq!(expected.len(), want_calls, "{format:?}: the fixture must hold its calls");
        let mut ids = tok.encode(reply).unwrap();
        ids.push(IM_END);
        for api in ["chat", "responses", "messages"] {
            let reference = stream_through(api, template, &ids, &[ids.len()]).await;
            let got: Vec<(String, Value)> =
                reference.calls.iter().map(|(n, a)| (n.clone(), serde_json::from_str(a).unwrap())).collect();
            assert_eq!(got, expected, "{format:?} {api}: calls of the one-chunk delivery");
            for (label, sizes) in chunkings(reply, &ids) {
                let assembled = stream_through(api, template, &ids, &sizes).await;
                assert_eq!(assembled, reference, "{format:?} {api}, chunking {label}: {sizes:?}");
            }
        }
    }
}
