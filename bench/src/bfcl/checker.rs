//! Port of BFCL's AST checker (spec 5.5), written from the rules, over `serde_json` values.
//!
//! Contract: `ast_check(functions, calls, answer, language, subset)` returns `Ok(())` when the
//! model calls (`[{name: {arg: value}}]` as `Call`s) match the ground truth, else the BFCL error
//! type (e.g. `simple_function_checker:wrong_func_name`). `functions` is the raw BFCL function
//! list (dotted names, BFCL types); `answer` is the `ground_truth` list. Python equality rules
//! are kept where BFCL relies on them (`1 == 1.0 == True`); type checks are strict like
//! `type(v) == t`. Java/JS values must be strings and go through `literal::convert` first.

use serde_json::{Map, Value};

use super::literal;

/// One model call: name and decoded arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: String,
    pub args: Map<String, Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    Python,
    Java,
    JavaScript,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PyType {
    Str,
    Int,
    Float,
    Bool,
    List,
    Dict,
    None,
}

pub fn py_type(v: &Value) -> PyType {
    match v {
        Value::String(_) => PyType::Str,
        Value::Number(n) if n.is_f64() => PyType::Float,
        Value::Number(_) => PyType::Int,
        Value::Bool(_) => PyType::Bool,
        Value::Array(_) => PyType::List,
        Value::Object(_) => PyType::Dict,
        Value::Null => PyType::None,
    }
}

/// Python `==` on JSON values: numbers and bools compare numerically.
pub fn py_eq(a: &Value, b: &Value) -> bool {
    let num = |v: &Value| match v {
        Value::Number(n) => n.as_f64(),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        _ => None,
    };
    match (a, b) {
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| py_eq(p, q)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| py_eq(v, w)))
        }
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Null, Value::Null) => true,
        _ => match (num(a), num(b)) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        },
    }
}

fn py_in(v: &Value, list: &[Value]) -> bool {
    list.iter().any(|x| py_eq(v, x))
}

/// Type of a BFCL schema type name in a language; unknown names count as strings.
fn type_of(desc: &str, lang: Language) -> PyType {
    match lang {
        Language::Python => match desc {
            "integer" => PyType::Int,
            "float" => PyType::Float,
            "boolean" => PyType::Bool,
            "array" | "tuple" => PyType::List,
            "dict" => PyType::Dict,
            _ => PyType::Str,
        },
        Language::Java => match desc {
            "byte" | "short" | "integer" | "long" => PyType::Int,
            "float" | "double" => PyType::Float,
            "boolean" => PyType::Bool,
            "Array" | "ArrayList" | "Set" | "Queue" | "Stack" => PyType::List,
            "HashMap" | "Hashtable" => PyType::Dict,
            _ => PyType::Str,
        },
        Language::JavaScript => match desc {
            "integer" | "Bigint" => PyType::Int,
            "float" => PyType::Float,
            "Boolean" => PyType::Bool,
            "array" => PyType::List,
            "dict" => PyType::Dict,
            _ => PyType::Str,
        },
    }
}

fn is_nested(desc: &str, lang: Language) -> bool {
    match lang {
        Language::Python => matches!(desc, "array" | "tuple"),
        _ => matches!(desc, "Array" | "ArrayList" | "array"),
    }
}

/// BFCL's string standardisation: drop ` ,./-_*^`, lowercase, `'` → `"`.
pub fn standardize(s: &str) -> String {
    s.chars()
        .filter(|c| !matches!(c, ' ' | ',' | '.' | '/' | '-' | '_' | '*' | '^'))
        .collect::<String>()
        .to_lowercase()
        .replace('\'', "\"")
}

fn std_value(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(standardize(s)),
        other => other.clone(),
    }
}

fn answer_type(acceptable: &[Value]) -> Option<PyType> {
    acceptable.iter().find(|a| a.as_str() != Some("")).map(py_type)
}

/// BFCL `type_checker`: Ok(is_variable) or the error type.
fn type_check(
    value: &Value,
    acceptable: &[Value],
    expected: PyType,
    nested: Option<PyType>,
) -> Result<bool, &'static str> {
    let ans_t = answer_type(acceptable);
    let is_variable = ans_t.is_some_and(|t| t != expected);
    let mut err = "type_error:simple";
    if py_type(value) == expected {
        let Some(nt) = nested else { return Ok(is_variable) };
        let items = value.as_array().map(Vec::as_slice).unwrap_or(&[]);
        for acc in acceptable {
            // A non-list acceptable value ("" for optional) passes trivially, as in BFCL.
            let ok = match acc {
                Value::Array(acc_items) => items.iter().all(|it| type_check(it, acc_items, nt, None).is_ok()),
                _ => true,
            };
            if ok {
                return Ok(is_variable);
            }
        }
        err = "type_error:nested";
    }
    if ans_t.is_some_and(|t| py_type(value) == t) {
        return Ok(true);
    }
    Err(err)
}

fn string_check(value: &str, acceptable: &[Value]) -> bool {
    let v = standardize(value);
    acceptable.iter().filter_map(Value::as_str).any(|a| standardize(a) == v)
}

fn list_check(value: &[Value], acceptable: &[Value]) -> bool {
    let v: Vec<Value> = value.iter().map(std_value).collect();
    acceptable.iter().any(|acc| {
        // Iterating "" in Python yields nothing: an optional marker equals the empty list.
        let items: Vec<Value> = match acc {
            Value::Array(a) => a.iter().map(std_value).collect(),
            Value::String(s) if s.is_empty() => Vec::new(),
            _ => return false,
        };
        py_eq(&Value::Array(v.clone()), &Value::Array(items))
    })
}

fn dict_check(value: &Map<String, Value>, acceptable: &[Value]) -> bool {
    acceptable.iter().filter_map(Value::as_object).any(|acc| {
        let keys_ok = value.iter().all(|(k, v)| {
            let Some(allowed) = acc.get(k).and_then(Value::as_array) else { return false };
            let allowed: Vec<Value> = allowed.iter().map(std_value).collect();
            py_in(&std_value(v), &allowed)
        });
        let missing_ok = acc.iter().all(|(k, allowed)| {
            value.contains_key(k) || allowed.as_array().is_some_and(|a| a.iter().any(|x| x.as_str() == Some("")))
        });
        keys_ok && missing_ok
    })
}

fn list_dict_check(value: &[Value], acceptable: &[Value]) -> bool {
    acceptable.iter().any(|acc| {
        let Some(acc) = acc.as_array() else { return false };
        acc.len() == value.len()
            && value.iter().zip(acc).all(|(v, a)| match v.as_object() {
                Some(m) => dict_check(m, std::slice::from_ref(a)),
                None => false,
            })
    })
}

/// BFCL `simple_function_checker` for one call against one `{name: {param: [values]}}`.
pub fn simple_check(func: &Value, call: &Call, answer: &Value, lang: Language) -> Result<(), &'static str> {
    let expected_name = func.get("name").and_then(Value::as_str).unwrap_or("").replace('.', "_");
    if call.name != expected_name {
        return Err("simple_function_checker:wrong_func_name");
    }
    let empty = Map::new();
    let answer = answer.as_object().and_then(|m| m.values().next()).and_then(Value::as_object).unwrap_or(&empty);
    let props = func.pointer("/parameters/properties").and_then(Value::as_object).unwrap_or(&empty);
    let required = func.pointer("/parameters/required").and_then(Value::as_array).cloned().unwrap_or_default();
    for r in required.iter().filter_map(Value::as_str) {
        if !call.args.contains_key(r) {
            return Err("simple_function_checker:missing_required");
        }
    }
    for (param, value) in &call.args {
        let (Some(details), Some(acceptable)) = (props.get(param), answer.get(param).and_then(Value::as_array)) else {
            return Err("simple_function_checker:unexpected_param");
        };
        let desc = details.get("type").and_then(Value::as_str).unwrap_or("string");
        let expected = type_of(desc, lang);
        let nested_desc = details.pointer("/items/type").and_then(Value::as_str);
        let mut nested = if is_nested(desc, lang) { nested_desc.map(|d| type_of(d, lang)) } else { None };
        let mut value = value.clone();
        if lang != Language::Python {
            let Value::String(s) = &value else { return Err("type_error:java_js_string") };
            value = literal::convert(s, desc, nested_desc, lang);
        } else if !is_nested(desc, lang) {
            nested = None;
        }
        if lang == Language::Python && desc == "float" && py_type(&value) == PyType::Int {
            value = serde_json::json!(value.as_f64().unwrap_or(0.0));
        }
        let is_variable = type_check(&value, acceptable, expected, nested)?;
        if !is_variable {
            let ok = match (expected, &value) {
                (PyType::Dict, Value::Object(m)) => Some(dict_check(m, acceptable)),
                (PyType::List, Value::Array(items)) if nested == Some(PyType::Dict) => {
                    Some(list_dict_check(items, acceptable))
                }
                (PyType::Str, Value::String(s)) => Some(string_check(s, acceptable)),
                (PyType::List, Value::Array(items)) => Some(list_check(items, acceptable)),
                _ => None,
            };
            match ok {
                Some(true) => continue,
                Some(false) => return Err("value_error"),
                None => {}
            }
        }
        if !py_in(&value, acceptable) {
            return Err("value_error:others");
        }
    }
    for (param, acceptable) in answer {
        let optional = acceptable.as_array().is_some_and(|a| a.iter().any(|x| x.as_str() == Some("")));
        if !call.args.contains_key(param) && !optional {
            return Err("simple_function_checker:missing_optional");
        }
    }
    Ok(())
}

fn find_description<'a>(functions: &'a [Value], answer: &Value) -> Option<&'a Value> {
    let name = answer.as_object()?.keys().next()?;
    functions.iter().find(|f| f.get("name").and_then(Value::as_str) == Some(name))
}

/// BFCL `ast_checker`, dispatched on the subset name.
pub fn ast_check(
    functions: &[Value],
    calls: &[Call],
    answer: &[Value],
    lang: Language,
    subset: &str,
) -> Result<(), &'static str> {
    if subset.contains("parallel") {
        if calls.len() != answer.len() {
            return Err("parallel_function_checker_no_order:wrong_count");
        }
        let mut matched = vec![false; calls.len()];
        for ans in answer {
            let func = find_description(functions, ans).ok_or("parallel_function_checker_no_order:no_description")?;
            let hit = (0..calls.len()).find(|&i| !matched[i] && simple_check(func, &calls[i], ans, lang).is_ok());
            match hit {
                Some(i) => matched[i] = true,
                None => return Err("parallel_function_checker_no_order:cannot_find_match"),
            }
        }
        Ok(())
    } else if subset.contains("multiple") {
        if calls.len() != answer.len() || calls.is_empty() {
            return Err("multiple_function_checker:wrong_count");
        }
        let func = find_description(functions, &answer[0]).ok_or("multiple_function_checker:no_description")?;
        simple_check(func, &calls[0], &answer[0], lang)
    } else {
        if calls.len() != 1 || answer.is_empty() || functions.is_empty() {
            return Err("simple_function_checker:wrong_count");
        }
        simple_check(&functions[0], &calls[0], &answer[0], lang)
    }
}
