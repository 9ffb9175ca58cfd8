//! Java / JavaScript literal parsing for the BFCL checker (spec 5.5, step 4).
//!
//! Contract: `convert(text, bfcl_type, item_type, language)` turns the string a model gave for
//! a Java/JS parameter into a JSON value of the schema's type (numbers with `L`/`f`/`d`/`n`
//! suffixes, `true`/`false`, quoted strings, `[..]`, `{..}`, `new T[]{..}`, `Arrays.asList(..)`,
//! `List.of(..)`, `Map.of(..)`, `new HashMap<>() {{ put(k, v); }}`, JS object literals). Text it
//! cannot convert is returned unchanged as a string, which the checker then treats as a
//! variable name, as BFCL does. This is our own parser, not a line-by-line copy of BFCL's
//! converters; surrounding quotes of string values are stripped.

use serde_json::{Map, Number, Value};

use super::checker::Language;

fn unquote(s: &str) -> Option<&str> {
    let s = s.trim();
    let b = s.as_bytes();
    (b.len() >= 2 && (b[0] == b'"' || b[0] == b'\'') && b[b.len() - 1] == b[0]).then(|| &s[1..s.len() - 1])
}

/// Split at top-level `sep` (outside quotes and brackets).
pub(crate) fn split_top(s: &str, sep: char) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut quote, mut start) = (0i32, None::<char>, 0usize);
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' | '`' => quote = Some(c),
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            _ if c == sep && depth == 0 => {
                out.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

fn int(s: &str) -> Option<Value> {
    let t = s.trim().trim_end_matches(['L', 'l', 'n']);
    t.parse::<i64>().ok().map(Value::from)
}

fn float(s: &str) -> Option<Value> {
    let t = s.trim().trim_end_matches(['f', 'F', 'd', 'D']);
    if t.is_empty() || !t.bytes().any(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse::<f64>().ok().and_then(Number::from_f64).map(Value::Number)
}

/// Elements of a list literal, or None when `s` is not one.
fn list_items(s: &str) -> Option<Vec<&str>> {
    let s = s.trim();
    let inner = if s.starts_with('[') && s.ends_with(']') {
        &s[1..s.len() - 1]
    } else if s.ends_with('}') && s.contains('{') && !s.contains("put(") {
        let open = s.find('{')?;
        &s[open + 1..s.len() - 1]
    } else if s.ends_with(')') && s.contains('(') {
        let open = s.find('(')?;
        let head = &s[..open];
        if !(head.contains("asList")
            || head.contains("List.of")
            || head.contains("ArrayList")
            || head.contains("Set.of"))
        {
            return None;
        }
        let inner = &s[open + 1..s.len() - 1];
        // new ArrayList<>(Arrays.asList(a, b)) → recurse into the wrapped call.
        if inner.trim().ends_with(')') && inner.contains('(') && split_top(inner, ',').len() == 1 {
            return list_items(inner);
        }
        inner
    } else {
        return None;
    };
    Some(split_top(inner, ','))
}

/// (key, value) pairs of a map literal, or None.
fn map_pairs(s: &str) -> Option<Vec<(String, &str)>> {
    let s = s.trim();
    let key = |k: &str| unquote(k).unwrap_or(k.trim()).to_string();
    if s.contains("put(") {
        let mut pairs = Vec::new();
        for part in s.split("put(").skip(1) {
            let end = part.rfind(')')?;
            let args = split_top(&part[..end], ',');
            if args.len() != 2 {
                return None;
            }
            pairs.push((key(args[0]), args[1]));
        }
        return Some(pairs);
    }
    if let Some(rest) = s.strip_prefix("Map.of(").and_then(|r| r.strip_suffix(')')) {
        let args = split_top(rest, ',');
        if !args.len().is_multiple_of(2) {
            return None;
        }
        return Some(args.chunks(2).map(|kv| (key(kv[0]), kv[1])).collect());
    }
    let inner = s.strip_prefix('{')?.strip_suffix('}')?;
    split_top(inner, ',')
        .into_iter()
        .map(|kv| {
            let parts = split_top(kv, ':');
            let (k, v) = kv.split_at(parts.first()?.len());
            Some((key(k), v.strip_prefix(':')?))
        })
        .collect()
}

/// A literal of unknown type.
fn auto(s: &str) -> Value {
    let t = s.trim();
    if let Some(q) = unquote(t) {
        return Value::String(q.to_string());
    }
    match t {
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        "null" | "undefined" => return Value::Null,
        _ => {}
    }
    if let Some(v) = int(t).or_else(|| float(t)) {
        return v;
    }
    if t.starts_with('{')
        && let Some(pairs) = map_pairs(t)
    {
        return Value::Object(pairs.into_iter().map(|(k, v)| (k, auto(v))).collect::<Map<_, _>>());
    }
    if let Some(items) = list_items(t) {
        return Value::Array(items.into_iter().map(auto).collect());
    }
    Value::String(t.to_string())
}

/// Convert one model-given string to the BFCL type `ty` (items of type `item` for lists).
pub fn convert(text: &str, ty: &str, item: Option<&str>, lang: Language) -> Value {
    let raw = || Value::String(text.to_string());
    let t = text.trim();
    match (lang, ty) {
        (_, "byte" | "short" | "integer" | "long" | "Bigint") => int(t).unwrap_or_else(raw),
        (_, "float" | "double") => float(t).or_else(|| int(t).and_then(|v| float(&v.to_string()))).unwrap_or_else(raw),
        (_, "boolean" | "Boolean") => match t {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => raw(),
        },
        (_, "Array" | "ArrayList" | "array" | "Set" | "Queue" | "Stack") => match list_items(t) {
            Some(items) => Value::Array(
                items
                    .into_iter()
                    .map(|e| match item {
                        // Items typed "any" keep their literal type (42 stays a number).
                        Some(it) if it != "any" => convert(e, it, None, lang),
                        _ => auto(e),
                    })
                    .collect(),
            ),
            None => raw(),
        },
        (_, "HashMap" | "Hashtable" | "dict") => match map_pairs(t) {
            Some(pairs) => Value::Object(pairs.into_iter().map(|(k, v)| (k, auto(v))).collect()),
            None => raw(),
        },
        (_, "char") => Value::String(unquote(t).unwrap_or(t).to_string()),
        _ => Value::String(unquote(t).unwrap_or(t).to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const J: Language = Language::Java;

    #[test]
    fn scalars() {
        assert_eq!(convert("42", "integer", None, J), json!(42));
        assert_eq!(convert("42L", "long", None, J), json!(42));
        assert_eq!(convert("1.5f", "float", None, J), json!(1.5));
        assert_eq!(convert("3", "double", None, J), json!(3.0));
        assert_eq!(convert("true", "boolean", None, J), json!(true));
        assert_eq!(convert("\"abc\"", "String", None, J), json!("abc"));
        assert_eq!(convert("myVar", "integer", None, J), json!("myVar"));
    }

    #[test]
    fn collections() {
        assert_eq!(convert("new int[]{1, 2}", "Array", Some("integer"), J), json!([1, 2]));
        assert_eq!(convert("Arrays.asList(\"a\", \"b\")", "ArrayList", Some("String"), J), json!(["a", "b"]));
        assert_eq!(convert("new ArrayList<>(Arrays.asList(\"a\"))", "ArrayList", Some("String"), J), json!(["a"]));
        assert_eq!(convert("['x', 'y, z']", "array", Some("String"), Language::JavaScript), json!(["x", "y, z"]));
        assert_eq!(
            convert(
                "new HashMap<String, Integer>() {{ put(\"limit\", 50); put(\"s\", \"public\"); }}",
                "HashMap",
                None,
                J
            ),
            json!({"limit": 50, "s": "public"})
        );
        assert_eq!(convert("Map.of(\"a\", 1)", "HashMap", None, J), json!({"a": 1}));
        assert_eq!(
            convert("{method: 'GET', n: 2, f: [1, 2]}", "dict", None, Language::JavaScript),
            json!({"method": "GET", "n": 2, "f": [1, 2]})
        );
    }
}
