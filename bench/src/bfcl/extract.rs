//! A reply as the official harness scores it (mlcommons/endpoints `BFCLv4Scorer` with
//! `FunctionCallExtractor`, read at commit ea332753; the port is line for line where it matters).
//!
//! Contract: `scoring_output(reply)` is the text the harness scores: the merged structured tool
//! calls serialised as JSON when there are any, else reasoning then content, concatenated.
//! `makes_tool_call(text)` is the hallucination rule (the text parses as a serialised
//! `tool_calls` list, whatever produced it). `calls(text)` is the AST path: (1) a serialised
//! `tool_calls` list, (2) a bare JSON array of `{"name", "arguments"}` objects (the whole text,
//! no code fence, no prose; a lone object is not an array; `"parameters"` is not read), (3) the
//! last-resort text calls `name(k=v)` found by the harness's regex, with Python keyword parsing
//! (`pyexpr`). Every call's arguments go through `json.loads` once more when they are a string,
//! `{}` when that fails, as `_score_ast` does.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value, json};

use super::checker::Call;
use super::pyexpr::{self, Parsed};
use crate::client::Reply;

const SKIP_NAMES: &[&str] = &[
    "print",
    "return",
    "if",
    "for",
    "while",
    "def",
    "class",
    "import",
    "from",
    "with",
    "assert",
    "raise",
    "try",
    "except",
    "len",
    "str",
    "int",
    "float",
    "list",
    "dict",
    "set",
    "tuple",
    "type",
    "isinstance",
    "range",
    "enumerate",
    "zip",
    "map",
    "filter",
    "Note",
    "Example",
    "Here",
    "This",
    "The",
    "For",
];

static FUNC_START: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\b([A-Za-z_]\w*)\s*\(").expect("valid regex"));
static SIGNATURE_PART: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\A(?:[A-Za-z_]\w*(?:\s*:\s*\w+)?)\z").expect("valid regex"));

/// The harness's `get_scoring_outputs`: structured calls win, prose is then ignored.
pub fn scoring_output(reply: &Reply) -> String {
    if reply.tool_calls.is_empty() {
        return format!("{}{}", reply.reasoning, reply.content);
    }
    let calls: Vec<Value> = reply
        .tool_calls
        .iter()
        .map(|c| {
            let mut f = Map::new();
            if !c.name.is_empty() {
                f.insert("name".into(), json!(c.name));
            }
            f.insert("arguments".into(), json!(c.arguments));
            json!({"id": c.id, "type": "function", "function": f})
        })
        .collect();
    Value::Array(calls).to_string()
}

/// `FunctionCallExtractor.has_native_tool_calls`.
pub fn makes_tool_call(text: &str) -> bool {
    tool_calls_json(text).is_some()
}

/// `_try_parse_tool_calls_json`: a non-empty JSON list whose every item has a `function` object.
fn tool_calls_json(text: &str) -> Option<Vec<(Value, Value)>> {
    let Ok(Value::Array(items)) = serde_json::from_str::<Value>(text) else { return None };
    let mut calls = Vec::new();
    for item in &items {
        let f = item.as_object()?.get("function")?.as_object()?;
        let name = f.get("name").cloned().unwrap_or_else(|| json!(""));
        let mut args = f.get("arguments").cloned().unwrap_or_else(|| json!("{}"));
        if let Value::String(s) = &args
            && let Ok(v) = serde_json::from_str::<Value>(s)
        {
            args = v;
        }
        calls.push((name, args));
    }
    (!calls.is_empty()).then_some(calls)
}

/// `_try_parse_function_array`: a non-empty JSON list whose every item is an object with `name`.
fn function_array(text: &str) -> Option<Vec<(Value, Value)>> {
    let Ok(Value::Array(items)) = serde_json::from_str::<Value>(text) else { return None };
    let mut calls = Vec::new();
    for item in &items {
        let obj = item.as_object()?;
        let name = obj.get("name")?.clone();
        calls.push((name, obj.get("arguments").cloned().unwrap_or_else(|| json!({}))));
    }
    (!calls.is_empty()).then_some(calls)
}

/// `_find_balanced_parens` over code points: only `(`/`)` count, quotes hide them, a backslash
/// inside quotes skips the next character.
fn balanced_close(text: &[char], start: usize) -> Option<usize> {
    let (mut depth, mut i, mut single, mut double) = (0i64, start, false, false);
    while i < text.len() {
        let c = text[i];
        if c == '\\' && (single || double) {
            i += 2;
            continue;
        }
        if c == '\'' && !double {
            single = !single;
        } else if c == '"' && !single {
            double = !double;
        } else if !single && !double {
            if c == '(' {
                depth += 1;
            } else if c == ')' {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
        }
        i += 1;
    }
    None
}

fn looks_like_signature(args: &str) -> bool {
    args.split(',').map(str::trim).filter(|p| !p.is_empty()).all(|p| SIGNATURE_PART.is_match(p))
}

/// `_parse_arguments_string`; `None` when the harness would raise (an unencodable value).
fn parse_arguments(args: &str) -> Option<Value> {
    if args.is_empty() {
        return Some(json!({}));
    }
    match pyexpr::keyword_arguments(args) {
        Parsed::Args(m) => Some(Value::Object(m)),
        Parsed::NotACall => Some(json!({})),
        Parsed::SyntaxError => Some(json!({"_raw": args})),
        Parsed::Unencodable => None,
    }
}

/// Python's `str.strip()`.
fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\x1c'..='\x1f').contains(&c))
}

/// `_try_parse_text_function_calls`. `Err(())` when the harness would raise.
fn text_calls(text: &str) -> Result<Option<Vec<(Value, Value)>>, ()> {
    let chars: Vec<char> = text.chars().collect();
    let char_at: Vec<usize> = {
        // Byte offset -> code point index, for the regex's byte positions.
        let mut v = vec![0; text.len() + 1];
        for (ci, (bi, _)) in text.char_indices().enumerate() {
            v[bi] = ci;
        }
        v[text.len()] = chars.len();
        v
    };
    let mut calls = Vec::new();
    let mut consumed: Vec<(usize, usize)> = Vec::new();
    for m in FUNC_START.captures_iter(text) {
        let (Some(all), Some(name)) = (m.get(0), m.get(1)) else { continue };
        let start = char_at[all.start()];
        if consumed.iter().any(|&(s, e)| s <= start && start < e) {
            continue;
        }
        if SKIP_NAMES.contains(&name.as_str()) {
            continue;
        }
        let open = char_at[all.end()] - 1;
        let Some(close) = balanced_close(&chars, open) else { continue };
        consumed.push((open, close + 1));
        let inner: String = chars[open + 1..close].iter().collect();
        let args = py_strip(&inner);
        if !args.is_empty() && looks_like_signature(args) {
            continue;
        }
        calls.push((json!(name.as_str()), parse_arguments(args).ok_or(())?));
    }
    Ok((!calls.is_empty()).then_some(calls))
}

/// A reply the official harness raises on (its scoring stops; we score the sample 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the official harness raises on this reply: {0}")]
pub struct HarnessRaises(pub &'static str);

/// What the AST checker receives for one reply text.
pub fn calls(text: &str) -> Result<Vec<Call>, HarnessRaises> {
    let t = py_strip(text);
    if t.is_empty() {
        return Ok(Vec::new());
    }
    let raw = match tool_calls_json(t).or_else(|| function_array(t)) {
        Some(c) => c,
        None => text_calls(t).map_err(|()| HarnessRaises("json.dumps of an argument value"))?.unwrap_or_default(),
    };
    raw.into_iter()
        .map(|(name, args)| to_call(name, args).map_err(|()| HarnessRaises("unhashable function name")))
        .collect()
}

/// `_score_ast`'s conversion to `{name: args}`: string arguments decoded once more (or `{}`).
fn to_call(name: Value, args: Value) -> Result<Call, ()> {
    if matches!(name, Value::Array(_) | Value::Object(_)) {
        // An unhashable dict key: the harness raises.
        return Err(());
    }
    let args = match args {
        Value::String(s) => serde_json::from_str::<Value>(&s).unwrap_or_else(|_| json!({})),
        other => other,
    };
    Ok(Call { name: name.as_str().map(str::to_string), args })
}

#[cfg(test)]
#[path = "extract_tests.rs"]
mod tests;
