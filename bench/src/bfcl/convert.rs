//! Port of bfcl-eval's Java and JavaScript type converters
//! (`eval_checker/ast_eval/type_convertor/{java,js}_type_converter.py`, bfcl-eval 2026.3.23).
//!
//! Contract: `java(value, type, item_type)` / `js(value, type, item_type)` turn the string a
//! model gave for a Java/JS parameter into the value the checker compares, with the same
//! regexes (Python `re` semantics: `match` anchors at the start only, `$` also matches before a
//! final newline, `.` never matches a newline unless DOTALL), the same lazy quantifiers and the
//! same fall-backs (text that does not convert stays a string; the JS array/dict parsers give
//! the input back on any failure). `Err(Unsupported)` where bfcl-eval raises (Java `Set`,
//! `Hashtable`, `Queue`, `Stack`, unknown types): the harness's scoring stops there.
//! Known gaps: Python's `int()`/`float()` accept non-ASCII digits and unbounded integers; here
//! digits are ASCII and integers 64-bit (larger ones become floats); NaN/infinity become null.

use std::sync::LazyLock;

use fancy_regex::Regex;
use serde_json::{Map, Number, Value};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bfcl-eval raises on type {0}")]
pub struct Unsupported(pub String);

/// A Python-`re` pattern compiled for fancy-regex: `$` becomes "end or before a final newline".
fn py_re(pattern: &str) -> Regex {
    Regex::new(&pattern.replace('$', r"(?=\n?\z)")).expect("valid regex")
}

macro_rules! re {
    ($name:ident, $pat:expr) => {
        static $name: LazyLock<Regex> = LazyLock::new(|| py_re($pat));
    };
}

re!(INT, r"\A-?\d+$");
re!(JAVA_FLOAT, r"\A-?\d+(\.\d+)?([eE][+-]?\d+)?[fF]$");
re!(JAVA_DOUBLE, r"\A-?\d+(\.\d+)?([eE][+-]?\d+)?$");
re!(JAVA_LONG, r"\A-?\d+[lL]$");
re!(AS_LIST, r"new\s+ArrayList<\w*>\(Arrays\.asList\((.+?)\)\)");
re!(ADD_BLOCK, r"(?s)new\s+ArrayList<\w*>\(\)\s*\{\{\s*(.+?)\s*\}\}");
re!(ADD_CALL, r"add\((.+?)\)");
re!(EMPTY_LIST, r"new\s+ArrayList<\w*>\(\)");
re!(ARRAY, r"new\s+\w+\[\]\s*\{(.*?)\}");
re!(HASHMAP, r"(?s)new\s+HashMap<.*?>\s*\(\)\s*\{\s*\{?\s*(.*?)\s*\}?\s*\}");
re!(PUT_CALL, r#"put\("(.*?)",\s*(.*?)\)"#);
re!(EMPTY_MAP, r"new\s+HashMap<.*?>\s*\(\)");
re!(JS_FLOAT, r"\A-?\d+(\.\d+)?$");
re!(JS_BIGINT, r"\A-?\d+n$");
re!(JS_ARRAY_2D, r"\A(?:\[\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\]|\bnew\s+Array\(\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\))");
re!(JS_INNER, r"\[(.*?)\]");
re!(JS_ARRAY, r"\A(?:\[(.*?)\]|\bnew\s+Array\((.*?)\))");
re!(JS_DICT, r"\A\{(.*?)\}");
re!(JS_PAIR, r"([^:]+):\s*(.*?)(?:,\s*(?=[^,]+:)|$)");

fn is_match(re: &Regex, s: &str) -> bool {
    re.is_match(s).unwrap_or(false)
}

/// Python's `s[1:-1]`.
fn inner(s: &str) -> String {
    let c: Vec<char> = s.chars().collect();
    if c.len() < 2 { String::new() } else { c[1..c.len() - 1].iter().collect() }
}

fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\x1c'..='\x1f').contains(&c))
}

/// Python `int(s)`: surrounding whitespace, a sign, digits with single underscores between.
pub fn py_int(s: &str) -> Option<Value> {
    let t = py_strip(s);
    let body = t.strip_prefix(['+', '-']).unwrap_or(t);
    let ok = !body.is_empty()
        && !body.starts_with('_')
        && !body.ends_with('_')
        && !body.contains("__")
        && body.bytes().all(|b| b.is_ascii_digit() || b == b'_');
    if !ok {
        return None;
    }
    let clean: String = t.chars().filter(|&c| c != '_').collect();
    let clean = clean.strip_prefix('+').unwrap_or(&clean);
    clean
        .parse::<i64>()
        .map(Value::from)
        .ok()
        .or_else(|| clean.parse::<u64>().map(Value::from).ok())
        .or_else(|| clean.parse::<f64>().ok().and_then(Number::from_f64).map(Value::Number))
}

/// Python `float(s)`; NaN and infinity (which JSON values cannot hold) become null.
pub fn py_float(s: &str) -> Option<Value> {
    let t = py_strip(s);
    let body = t.strip_prefix(['+', '-']).unwrap_or(t).to_ascii_lowercase();
    if matches!(body.as_str(), "inf" | "infinity" | "nan") {
        return Some(Value::Null);
    }
    let ok = !body.is_empty()
        && body.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'+' | b'-' | b'_'))
        && body.bytes().any(|b| b.is_ascii_digit());
    if !ok || body.contains("__") || body.starts_with('_') || body.ends_with('_') {
        return None;
    }
    // Underscores only between digits.
    let b = body.as_bytes();
    if (1..b.len())
        .any(|i| b[i] == b'_' && !(b[i - 1].is_ascii_digit() && b.get(i + 1).is_some_and(u8::is_ascii_digit)))
    {
        return None;
    }
    let clean: String = t.chars().filter(|&c| c != '_').collect();
    let v: f64 = clean.parse().ok()?;
    Some(Number::from_f64(v).map_or(Value::Null, Value::Number))
}

fn float_value(s: &str) -> Value {
    py_float(s).unwrap_or_else(|| Value::String(s.to_string()))
}

fn int_value(s: &str) -> Value {
    py_int(s).unwrap_or_else(|| Value::String(s.to_string()))
}

/// `java_type_converter`.
pub fn java(value: &str, ty: &str, item: Option<&str>) -> Result<Value, Unsupported> {
    let s = || Value::String(value.to_string());
    Ok(match ty {
        "byte" | "short" | "integer" => {
            if is_match(&INT, value) {
                int_value(value)
            } else {
                s()
            }
        }
        "float" => {
            if is_match(&JAVA_FLOAT, value) {
                float_value(&strip_last(value))
            } else {
                s()
            }
        }
        "double" => {
            if is_match(&JAVA_DOUBLE, value) {
                float_value(value)
            } else {
                s()
            }
        }
        "long" => {
            if is_match(&JAVA_LONG, value) {
                int_value(&strip_last(value))
            } else {
                s()
            }
        }
        "boolean" => match value {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => s(),
        },
        // `^\'.$\'` can never match: a char is always given back as the text.
        "char" | "String" | "any" => s(),
        "ArrayList" => arraylist(value, item)?,
        "Array" => array(value, item)?,
        "HashMap" => hashmap(value),
        other => return Err(Unsupported(other.to_string())),
    })
}

/// `re.sub(r"[fF]$", "", v)` / `v[:-1]` for the suffixed literals that passed their regex.
fn strip_last(v: &str) -> String {
    let mut c: Vec<char> = v.chars().collect();
    // `$` may have matched before a final newline: the suffix is the last non-newline char.
    if c.last() == Some(&'\n') {
        c.pop();
        c.pop();
        c.push('\n');
    } else {
        c.pop();
    }
    c.into_iter().collect()
}

fn java_item(e: &str, item: Option<&str>) -> Result<Value, Unsupported> {
    Ok(match item {
        Some("char" | "String") => Value::String(inner(e)),
        Some(t) => java(e, t, None)?,
        None => java_value(e),
    })
}

fn arraylist(value: &str, item: Option<&str>) -> Result<Value, Unsupported> {
    if let Ok(Some(c)) = AS_LIST.captures(value) {
        let group = c.get(1).map_or("", |m| m.as_str());
        let items: Result<Vec<Value>, _> = group.split(',').map(|e| java_item(py_strip(e), item)).collect();
        return Ok(Value::Array(items?));
    }
    if let Ok(Some(c)) = ADD_BLOCK.captures(value) {
        let block = c.get(1).map_or("", |m| m.as_str());
        let mut out = Vec::new();
        for m in ADD_CALL.captures_iter(block).flatten() {
            out.push(java_item(py_strip(m.get(1).map_or("", |g| g.as_str())), item)?);
        }
        return Ok(Value::Array(out));
    }
    if is_match(&EMPTY_LIST, value) {
        return Ok(Value::Array(Vec::new()));
    }
    Ok(Value::String(value.to_string()))
}

fn array(value: &str, item: Option<&str>) -> Result<Value, Unsupported> {
    let Ok(Some(c)) = ARRAY.captures(value) else { return Ok(Value::String(value.to_string())) };
    let group = c.get(1).map_or("", |m| m.as_str());
    let mut out = Vec::new();
    for x in group.split(',').filter(|x| !py_strip(x).is_empty()) {
        out.push(match item {
            Some(t) => java(py_strip(x), t, None)?,
            None => java_value(py_strip(x)),
        });
    }
    Ok(Value::Array(out))
}

fn hashmap(value: &str) -> Value {
    if let Ok(Some(c)) = HASHMAP.captures(value) {
        let puts = c.get(1).map_or("", |m| m.as_str());
        let mut m = Map::new();
        if !py_strip(puts).is_empty() {
            for cap in PUT_CALL.captures_iter(puts).flatten() {
                let k = cap.get(1).map_or("", |g| g.as_str()).to_string();
                m.insert(k, java_value(py_strip(cap.get(2).map_or("", |g| g.as_str()))));
            }
        }
        return Value::Object(m);
    }
    if is_match(&EMPTY_MAP, value) {
        return Value::Object(Map::new());
    }
    Value::String(value.to_string())
}

/// `parse_java_value`.
fn java_value(v: &str) -> Value {
    match v {
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        _ => {}
    }
    if v.starts_with('"') && v.ends_with('"') {
        return Value::String(inner(v));
    }
    if is_match(&JAVA_LONG, v) {
        let mut c: Vec<char> = v.chars().collect();
        c.pop();
        return int_value(&c.into_iter().collect::<String>());
    }
    if is_match(&JAVA_FLOAT, v) {
        return float_value(&strip_last(v));
    }
    py_int(v).or_else(|| py_float(v)).unwrap_or_else(|| Value::String(v.to_string()))
}

/// `js_type_converter`.
pub fn js(value: &str, ty: &str, item: Option<&str>) -> Result<Value, Unsupported> {
    let s = || Value::String(value.to_string());
    Ok(match ty {
        "String" => {
            let quoted =
                (value.starts_with('"') && value.ends_with('"')) || (value.starts_with('\'') && value.ends_with('\''));
            if quoted { Value::String(inner(value)) } else { s() }
        }
        "integer" => {
            if is_match(&INT, value) {
                int_value(value)
            } else {
                s()
            }
        }
        "float" => {
            if is_match(&JS_FLOAT, value) {
                float_value(value)
            } else {
                s()
            }
        }
        "Bigint" => {
            if is_match(&JS_BIGINT, value) {
                let mut c: Vec<char> = value.chars().collect();
                c.pop();
                int_value(&c.into_iter().collect::<String>())
            } else {
                s()
            }
        }
        "Boolean" => match value {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => s(),
        },
        "dict" => js_dict(py_strip(value)),
        "array" => js_array(py_strip(value), item),
        "any" => s(),
        other => return Err(Unsupported(other.to_string())),
    })
}

fn js_array(code: &str, item: Option<&str>) -> Value {
    let back = || Value::String(code.to_string());
    if let Ok(Some(m)) = JS_ARRAY_2D.find(code) {
        let mut rows = Vec::new();
        for (idx, cap) in JS_INNER.captures_iter(m.as_str()).flatten().enumerate() {
            let mut row = py_strip(cap.get(1).map_or("", |g| g.as_str())).to_string();
            if idx == 0 && row.starts_with('[') {
                row.remove(0);
            }
            rows.push(Value::Array(row.split(',').map(|e| js_value(py_strip(e))).collect()));
        }
        return Value::Array(rows);
    }
    let Ok(Some(c)) = JS_ARRAY.captures(code) else { return back() };
    let group = c.get(1).or_else(|| c.get(2)).map_or("", |g| py_strip(g.as_str()));
    let elements: Vec<&str> = if group.is_empty() { Vec::new() } else { group.split(',').collect() };
    let mut out = Vec::new();
    for e in elements {
        let e = py_strip(e);
        let v = match item {
            // Any exception inside the array parser gives the input back.
            Some(t) => match js(e, t, (e.starts_with('\'') || e.starts_with('"')).then_some("String")) {
                Ok(v) => v,
                Err(_) => return back(),
            },
            None => js_value(e),
        };
        out.push(v);
    }
    Value::Array(out)
}

fn js_dict(code: &str) -> Value {
    if code == "{}" {
        return Value::Object(Map::new());
    }
    let Ok(Some(c)) = JS_DICT.captures(code) else { return Value::String(code.to_string()) };
    let content = c.get(1).map_or("", |g| g.as_str());
    let mut m = Map::new();
    for cap in JS_PAIR.captures_iter(content).flatten() {
        let key = py_strip(cap.get(1).map_or("", |g| g.as_str())).trim_matches(['\'', '"']).to_string();
        let value = py_strip(cap.get(2).map_or("", |g| g.as_str()));
        let v = if value.starts_with('[') && value.ends_with(']') {
            js_array(value, None)
        } else if value.starts_with('{') && value.ends_with('}') {
            js_dict(value)
        } else {
            js_value(value.trim_matches(['\'', '"']))
        };
        m.insert(key, v);
    }
    Value::Object(m)
}

/// `parse_js_value`.
fn js_value(v: &str) -> Value {
    let v = py_strip(v);
    match v {
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        _ => {}
    }
    if (v.starts_with('"') && v.ends_with('"')) || (v.starts_with('\'') && v.ends_with('\'')) {
        return Value::String(inner(v));
    }
    py_int(v).or_else(|| py_float(v)).unwrap_or_else(|| Value::String(v.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn java_scalars_follow_the_bfcl_regexes() {
        assert_eq!(java("42", "integer", None), Ok(json!(42)));
        assert_eq!(java("42L", "long", None), Ok(json!(42)));
        assert_eq!(java("42", "long", None), Ok(json!("42")));
        assert_eq!(java("1.5f", "float", None), Ok(json!(1.5)));
        assert_eq!(java("1.5", "float", None), Ok(json!("1.5")));
        assert_eq!(java("3", "double", None), Ok(json!(3.0)));
        assert_eq!(java("true", "boolean", None), Ok(json!(true)));
        // Strings keep their quotes: bfcl-eval returns `str(value)`.
        assert_eq!(java("\"abc\"", "String", None), Ok(json!("\"abc\"")));
        assert_eq!(java("'a'", "char", None), Ok(json!("'a'")));
        assert!(java("x", "Set", None).is_err());
    }

    #[test]
    fn java_collections() {
        assert_eq!(java("new int[]{1, 2}", "Array", Some("integer")), Ok(json!([1, 2])));
        assert_eq!(java("new String[]{\"a\", \"b\"}", "Array", Some("String")), Ok(json!(["\"a\"", "\"b\""])));
        assert_eq!(
            java("new ArrayList<>(Arrays.asList(\"a\", \"b\"))", "ArrayList", Some("String")),
            Ok(json!(["a", "b"]))
        );
        assert_eq!(java("new ArrayList<>(Arrays.asList(1L, 2))", "ArrayList", Some("long")), Ok(json!([1, "2"])));
        assert_eq!(java("Arrays.asList(1, 2)", "ArrayList", Some("integer")), Ok(json!("Arrays.asList(1, 2)")));
        assert_eq!(
            java("new HashMap<String, Integer>() {{ put(\"limit\", 50); put(\"s\", \"public\"); }}", "HashMap", None),
            Ok(json!({"limit": 50, "s": "public"}))
        );
        assert_eq!(java("new HashMap<>()", "HashMap", None), Ok(json!({})));
    }

    #[test]
    fn js_values() {
        assert_eq!(js("'abc'", "String", None), Ok(json!("abc")));
        assert_eq!(js("abc", "String", None), Ok(json!("abc")));
        assert_eq!(js("10n", "Bigint", None), Ok(json!(10)));
        assert_eq!(js("1.5", "float", None), Ok(json!(1.5)));
        assert_eq!(js("1e3", "float", None), Ok(json!("1e3")));
        assert_eq!(js("['x', 'y']", "array", Some("String")), Ok(json!(["x", "y"])));
        assert_eq!(js("[1, 2]", "array", Some("integer")), Ok(json!([1, 2])));
        assert_eq!(js("[[1, 2], [3]]", "array", None), Ok(json!([[1, 2], [3]])));
        assert_eq!(
            js("{method: 'GET', n: 2, f: [1, 2]}", "dict", None),
            Ok(json!({"method": "GET", "n": 2, "f": [1, 2]}))
        );
        assert_eq!(js("{}", "dict", None), Ok(json!({})));
        assert_eq!(js("nope", "dict", None), Ok(json!("nope")));
    }

    #[test]
    fn python_number_parsing() {
        assert_eq!(py_int(" 1_000 "), Some(json!(1000)));
        assert_eq!(py_int("1__0"), None);
        assert_eq!(py_int("+7"), Some(json!(7)));
        assert_eq!(py_float("1e3"), Some(json!(1000.0)));
        assert_eq!(py_float("inf"), Some(Value::Null));
        assert_eq!(py_float("abc"), None);
    }
}
