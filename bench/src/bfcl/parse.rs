//! Turning a model reply into BFCL calls (spec 5.4).
//!
//! Contract: `reply_calls(reply, text_fallback)` returns the structured `tool_calls` when there
//! are any (arguments JSON-decoded; undecodable or non-object → `{}`); otherwise, only when
//! `text_fallback` (AST subsets, never hallucination subsets), it parses (a) a JSON array of
//! `{name, arguments}` objects in the text, then (b) Python-style `name(k=v, …)` calls,
//! skipping common non-function names and signature-like argument lists.

use serde_json::{Map, Value};

use super::checker::Call;
use super::literal;
use crate::client::Reply;

const SKIP_NAMES: &[&str] =
    &["print", "len", "str", "int", "float", "list", "dict", "range", "The", "the", "type", "e.g", "i.e"];

fn decode_args(v: Option<&Value>) -> Map<String, Value> {
    match v {
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        },
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    }
}

fn json_calls(text: &str) -> Option<Vec<Call>> {
    let t = text.trim().trim_start_matches("```json").trim_start_matches("```").trim_end_matches("```").trim();
    let start = t.find(['[', '{'])?;
    let end = t.rfind([']', '}'])?;
    let v: Value = serde_json::from_str(t.get(start..=end)?).ok()?;
    let items = match v {
        Value::Array(a) => a,
        obj @ Value::Object(_) => vec![obj],
        _ => return None,
    };
    let calls: Vec<Call> = items
        .iter()
        .filter_map(|it| {
            let name = it.get("name")?.as_str()?.to_string();
            let args = decode_args(it.get("arguments").or_else(|| it.get("parameters")));
            Some(Call { name, args })
        })
        .collect();
    (!calls.is_empty()).then_some(calls)
}

fn python_value(s: &str) -> Value {
    match s.trim() {
        "True" => Value::Bool(true),
        "False" => Value::Bool(false),
        "None" => Value::Null,
        other => {
            // Python literals are close enough to JSON / JS literals for the checker's needs.
            let v = literal::convert(other, "any", None, super::checker::Language::JavaScript);
            match (other.starts_with(['[', '{', '(']), v) {
                (true, _) => auto_py(other),
                (false, Value::String(x)) if x == other => number_or_string(other),
                (false, v) => v,
            }
        }
    }
}

fn number_or_string(s: &str) -> Value {
    if let Ok(i) = s.parse::<i64>() {
        return Value::from(i);
    }
    if let Ok(f) = s.parse::<f64>() {
        return serde_json::json!(f);
    }
    Value::String(s.to_string())
}

fn auto_py(s: &str) -> Value {
    let t = s.trim();
    let json_like = t.replace("True", "true").replace("False", "false").replace("None", "null").replace('\'', "\"");
    let json_like = if t.starts_with('(') && t.ends_with(')') {
        format!("[{}]", &json_like[1..json_like.len() - 1])
    } else {
        json_like
    };
    serde_json::from_str(&json_like).unwrap_or_else(|_| Value::String(t.to_string()))
}

/// `name(k=v, ...)` calls found in the text.
fn text_calls(text: &str) -> Vec<Call> {
    let mut calls = Vec::new();
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let mut i = 0;
    while i < chars.len() {
        let (pos, c) = chars[i];
        if !(c.is_alphabetic() || c == '_')
            || (i > 0 && (chars[i - 1].1.is_alphanumeric() || chars[i - 1].1 == '_' || chars[i - 1].1 == '.'))
        {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < chars.len() && (chars[j].1.is_alphanumeric() || chars[j].1 == '_' || chars[j].1 == '.') {
            j += 1;
        }
        let name_end = chars.get(j).map_or(text.len(), |x| x.0);
        let name = &text[pos..name_end];
        if chars.get(j).map(|x| x.1) != Some('(') || SKIP_NAMES.contains(&name) {
            i = j.max(i + 1);
            continue;
        }
        // Find the matching ')'.
        let (mut depth, mut k, mut quote) = (0i32, j, None::<char>);
        while k < chars.len() {
            let ch = chars[k].1;
            match quote {
                Some(q) if ch == q => quote = None,
                Some(_) => {}
                None if ch == '"' || ch == '\'' => quote = Some(ch),
                None if ch == '(' => depth += 1,
                None if ch == ')' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                None => {}
            }
            k += 1;
        }
        if k >= chars.len() {
            break;
        }
        let inner = &text[chars[j].0 + 1..chars[k].0];
        let mut args = Map::new();
        let mut ok = true;
        for part in literal::split_top(inner, ',') {
            match part.split_once('=') {
                Some((key, v))
                    if key.trim().chars().all(|c| c.is_alphanumeric() || c == '_') && !key.trim().is_empty() =>
                {
                    args.insert(key.trim().to_string(), python_value(v));
                }
                _ => {
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            calls.push(Call { name: name.to_string(), args });
        }
        i = k + 1;
    }
    calls
}

pub fn reply_calls(reply: &Reply, text_fallback: bool) -> Vec<Call> {
    if !reply.tool_calls.is_empty() {
        return reply
            .tool_calls
            .iter()
            .map(|c| Call { name: c.name.clone(), args: decode_args(Some(&Value::String(c.arguments.clone()))) })
            .collect();
    }
    if !text_fallback {
        return Vec::new();
    }
    json_calls(&reply.content).unwrap_or_else(|| text_calls(&reply.content))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ToolCall;
    use serde_json::json;

    #[test]
    fn structured_calls_win_over_text() {
        let r = Reply {
            content: "f(a=1)".into(),
            tool_calls: vec![
                ToolCall { id: "x".into(), name: "g".into(), arguments: "{\"b\": 2}".into() },
                ToolCall { id: "y".into(), name: "h".into(), arguments: "{bad".into() },
            ],
            ..Reply::default()
        };
        let calls = reply_calls(&r, true);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].args["b"], json!(2));
        assert!(calls[1].args.is_empty());
    }

    #[test]
    fn text_fallbacks() {
        let r = Reply { content: "[{\"name\": \"f\", \"arguments\": {\"x\": 1}}]".into(), ..Reply::default() };
        assert_eq!(reply_calls(&r, true)[0].name, "f");
        assert!(reply_calls(&r, false).is_empty());
        let r =
            Reply { content: "Sure: math.hypot(x=4, y=5.5, flag=True, s='a, b', l=[1, 2])".into(), ..Reply::default() };
        let c = reply_calls(&r, true);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].name, "math.hypot");
        assert_eq!(c[0].args["x"], json!(4));
        assert_eq!(c[0].args["y"], json!(5.5));
        assert_eq!(c[0].args["flag"], json!(true));
        assert_eq!(c[0].args["s"], json!("a, b"));
        assert_eq!(c[0].args["l"], json!([1, 2]));
        // Signature-like and skipped names are not calls.
        let r = Reply { content: "print(x=1) and def f(a, b)".into(), ..Reply::default() };
        assert!(reply_calls(&r, true).is_empty());
    }
}
