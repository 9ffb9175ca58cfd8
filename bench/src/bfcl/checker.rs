//! Port of bfcl-eval's AST checker (`eval_checker/ast_eval/ast_checker.py`, bfcl-eval
//! 2026.3.23), over `serde_json` values, as the official harness calls it (`model_name` ending
//! in `-FC`, so dotted function names are compared with `.` replaced by `_`).
//!
//! Contract: `ast_check(functions, calls, answer, language, subset)` returns `Ok(())` when
//! bfcl-eval's `ast_checker` says valid, else its `error_type` (e.g.
//! `simple_function_checker:wrong_func_name`). Python semantics are kept where the verdict
//! depends on them: `1 == 1.0 == True` in comparisons, `type(v) == t` in type checks, the
//! one-level nested type check that fails the parameter when an item has the wrong type, the
//! `""` optional marker read as an empty list. Where bfcl-eval raises (unknown type names, a
//! missing description, arguments that are not an object, Java `Set`/`Queue`/...), the result
//! is an error starting with `harness_raises:`: the official scoring stops there; we score 0.

use serde_json::{Map, Value};

use super::convert;

/// One model call as the checker receives it: `{name: arguments}`. `name` is `None` when the
/// reply gave a non-string name (it can never match); `args` is whatever JSON the reply gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: Option<String>,
    pub args: Value,
}

impl Call {
    pub fn new(name: &str, args: Value) -> Self {
        Call { name: Some(name.to_string()), args }
    }
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

fn is_empty_marker(v: &Value) -> bool {
    v.as_str() == Some("")
}

const RAISES_TYPE: &str = "harness_raises:unknown_type";

/// `PYTHON_TYPE_MAPPING`, `JAVA_TYPE_CONVERSION`, `JS_TYPE_CONVERSION`; `None`: a KeyError there.
fn type_of(desc: &str, lang: Language) -> Option<PyType> {
    Some(match lang {
        Language::Python => match desc {
            "string" | "any" => PyType::Str,
            "integer" => PyType::Int,
            "float" => PyType::Float,
            "boolean" => PyType::Bool,
            "array" | "tuple" => PyType::List,
            "dict" => PyType::Dict,
            _ => return None,
        },
        Language::Java => match desc {
            "byte" | "short" | "integer" | "long" => PyType::Int,
            "float" | "double" => PyType::Float,
            "boolean" => PyType::Bool,
            "char" | "String" | "any" => PyType::Str,
            "Array" | "ArrayList" | "Queue" | "Stack" => PyType::List,
            "HashMap" | "Hashtable" => PyType::Dict,
            // `set`: the converter raises before any comparison.
            _ => return None,
        },
        Language::JavaScript => match desc {
            "String" | "any" => PyType::Str,
            "integer" | "Bigint" => PyType::Int,
            "float" => PyType::Float,
            "Boolean" => PyType::Bool,
            "dict" => PyType::Dict,
            "array" => PyType::List,
            _ => return None,
        },
    })
}

/// `standardize_string`: drop ` ,./-_*^`, lowercase, `'` → `"`.
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

/// `get_possible_answer_type`: the type of the first answer that is not `""`.
fn answer_type(acceptable: &[Value]) -> Option<PyType> {
    acceptable.iter().find(|a| !is_empty_marker(a)).map(py_type)
}

struct TypeCheck {
    valid: bool,
    is_variable: bool,
    error_type: &'static str,
}

/// `type_checker`, including its fall-through: after a failed nested check a value whose type
/// is the answer's type still returns the (invalid) nested result.
fn type_checker(value: &Value, acceptable: &[Value], expected: PyType, nested: Option<PyType>) -> TypeCheck {
    let answer_t = answer_type(acceptable);
    let is_variable = answer_t.is_some_and(|t| t != expected);
    let mut valid = true;
    let mut error_type = "type_error:simple";
    if py_type(value) == expected {
        let Some(nt) = nested else { return TypeCheck { valid: true, is_variable, error_type } };
        let items = value.as_array().map(Vec::as_slice).unwrap_or(&[]);
        for acc in acceptable {
            let flag = match acc {
                Value::Array(acc_items) => items.iter().all(|it| type_checker(it, acc_items, nt, None).valid),
                _ => true,
            };
            if flag {
                return TypeCheck { valid: true, is_variable, error_type };
            }
        }
        valid = false;
        error_type = "type_error:nested";
    }
    if answer_t.is_some_and(|t| py_type(value) == t) {
        return TypeCheck { valid, is_variable: true, error_type };
    }
    TypeCheck { valid: false, is_variable: false, error_type: "type_error:simple" }
}

fn string_check(value: &str, acceptable: &[Value]) -> bool {
    let v = standardize(value);
    acceptable.iter().filter_map(Value::as_str).any(|a| standardize(a) == v)
}

/// `list_checker`: each acceptable answer is iterated like Python iterates it (`""` as nothing,
/// a string as its characters).
fn list_check(value: &[Value], acceptable: &[Value]) -> bool {
    let v = Value::Array(value.iter().map(std_value).collect());
    acceptable.iter().any(|acc| {
        let items: Vec<Value> = match acc {
            Value::Array(a) => a.iter().map(std_value).collect(),
            Value::String(s) => s.chars().map(|c| Value::String(standardize(&c.to_string()))).collect(),
            _ => return false,
        };
        py_eq(&v, &Value::Array(items))
    })
}

fn dict_check(value: &Map<String, Value>, acceptable: &[Value]) -> bool {
    acceptable.iter().filter(|a| !is_empty_marker(a)).any(|acc| {
        let Some(acc) = acc.as_object() else { return false };
        let keys_ok = value.iter().all(|(k, v)| {
            let Some(allowed) = acc.get(k).and_then(Value::as_array) else { return false };
            let allowed: Vec<Value> = allowed.iter().map(std_value).collect();
            py_in(&std_value(v), &allowed)
        });
        let missing_ok = acc.iter().all(|(k, allowed)| {
            value.contains_key(k)
                || match allowed {
                    Value::Array(a) => a.iter().any(is_empty_marker),
                    // `"" in "text"` is always true in Python.
                    Value::String(_) => true,
                    _ => false,
                }
        });
        keys_ok && missing_ok
    })
}

fn list_dict_check(value: &[Value], acceptable: &[Value]) -> bool {
    acceptable.iter().any(|acc| match acc {
        Value::Array(acc) => {
            acc.len() == value.len()
                && value.iter().zip(acc).all(|(v, a)| match v.as_object() {
                    Some(m) => dict_check(m, std::slice::from_ref(a)),
                    None => false,
                })
        }
        // `len("") == 0`: an empty list matches the optional marker.
        Value::String(s) => s.is_empty() && value.is_empty(),
        _ => false,
    })
}

/// `simple_function_checker` for one call against one `{name: {param: [values]}}`.
pub fn simple_check(func: &Value, call: &Call, answer: &Value, lang: Language) -> Result<(), &'static str> {
    let empty = Map::new();
    let answer = answer.as_object().and_then(|m| m.values().next()).and_then(Value::as_object).unwrap_or(&empty);
    let name = func.get("name").and_then(Value::as_str).ok_or("harness_raises:no_description")?;
    let props = func.pointer("/parameters/properties").and_then(Value::as_object).unwrap_or(&empty);
    let required = func.pointer("/parameters/required").and_then(Value::as_array).cloned().unwrap_or_default();
    if call.name.as_deref() != Some(name.replace('.', "_").as_str()) {
        return Err("simple_function_checker:wrong_func_name");
    }
    let Some(args) = call.args.as_object() else { return Err("harness_raises:arguments_not_an_object") };
    for r in required.iter().filter_map(Value::as_str) {
        if !args.contains_key(r) {
            return Err("simple_function_checker:missing_required");
        }
    }
    for (param, value) in args {
        let (Some(details), Some(acceptable)) = (props.get(param), answer.get(param)) else {
            return Err("simple_function_checker:unexpected_param");
        };
        let acceptable = acceptable.as_array().map(Vec::as_slice).unwrap_or(&[]);
        let desc = details.get("type").and_then(Value::as_str).ok_or(RAISES_TYPE)?;
        let expected = type_of(desc, lang).ok_or(RAISES_TYPE)?;
        let item_desc = details.pointer("/items/type").and_then(Value::as_str);
        let mut nested = None;
        let mut value = value.clone();
        match lang {
            Language::Python => {
                if matches!(desc, "array" | "tuple") {
                    nested = Some(type_of(item_desc.ok_or(RAISES_TYPE)?, lang).ok_or(RAISES_TYPE)?);
                }
                if desc == "float"
                    && py_type(&value) == PyType::Int
                    && let Some(f) = value.as_f64()
                {
                    value = serde_json::json!(f);
                }
            }
            Language::Java | Language::JavaScript => {
                let Value::String(text) = &value else {
                    return Err(if lang == Language::Java { "type_error:java" } else { "type_error:js" });
                };
                let item = if matches!(desc, "Array" | "ArrayList" | "array") {
                    let it = item_desc.ok_or(RAISES_TYPE)?;
                    nested = Some(type_of(it, lang).ok_or(RAISES_TYPE)?);
                    Some(it)
                } else {
                    None
                };
                let converted = if lang == Language::Java {
                    convert::java(text, desc, item)
                } else {
                    convert::js(text, desc, item)
                };
                value = converted.map_err(|_| "harness_raises:type_converter")?;
            }
        }
        let tc = type_checker(&value, acceptable, expected, nested);
        if !tc.valid {
            return Err(tc.error_type);
        }
        if !tc.is_variable {
            let ok = match (&value, expected) {
                (Value::Object(m), PyType::Dict) => Some(dict_check(m, acceptable)),
                (Value::Array(items), PyType::List) if nested == Some(PyType::Dict) => {
                    Some(list_dict_check(items, acceptable))
                }
                (Value::String(s), PyType::Str) => Some(string_check(s, acceptable)),
                (Value::Array(items), PyType::List) => Some(list_check(items, acceptable)),
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
        let optional = match acceptable {
            Value::Array(a) => a.iter().any(is_empty_marker),
            Value::String(_) => true,
            _ => false,
        };
        if !args.contains_key(param) && !optional {
            return Err("simple_function_checker:missing_optional");
        }
    }
    Ok(())
}

fn find_description<'a>(functions: &'a [Value], answer: &Value) -> Option<&'a Value> {
    let name = answer.as_object()?.keys().next()?;
    functions.iter().find(|f| f.get("name").and_then(Value::as_str) == Some(name))
}

/// `ast_checker`, dispatched on the subset name.
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
            let func = find_description(functions, ans).ok_or("harness_raises:no_description")?;
            let mut hit = None;
            for (i, c) in calls.iter().enumerate().filter(|(i, _)| !matched[*i]) {
                match simple_check(func, c, ans, lang) {
                    Ok(()) => {
                        hit = Some(i);
                        break;
                    }
                    Err(e) if e.starts_with("harness_raises") => return Err(e),
                    Err(_) => {}
                }
            }
            match hit {
                Some(i) => matched[i] = true,
                None => return Err("parallel_function_checker_no_order:cannot_find_match"),
            }
        }
        Ok(())
    } else if subset.contains("multiple") {
        if calls.len() != answer.len() {
            return Err("multiple_function_checker:wrong_count");
        }
        let first = answer.first().ok_or("harness_raises:no_answer")?;
        let func = find_description(functions, first).ok_or("harness_raises:no_description")?;
        simple_check(func, &calls[0], first, lang)
    } else {
        if calls.len() != 1 {
            return Err("simple_function_checker:wrong_count");
        }
        let (Some(func), Some(ans)) = (functions.first(), answer.first()) else {
            return Err("harness_raises:no_description");
        };
        simple_check(func, &calls[0], ans, lang)
    }
}
