//! Tests of the BFCL phase against the real data (shipped in `bench/data/bfcl-v4`).

use std::path::Path;

use serde_json::{Map, Value, json};

use super::checker::{Call, Language, ast_check};
use super::*;
use crate::client::{Reply, ToolCall};

fn all() -> Vec<Sample> {
    load(Path::new(crate::DEFAULT_BFCL_DIR), &[]).expect("bfcl data loads")
}

/// A value as the literal text a Java/JS model would write.
fn literal_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => {
            let items: Vec<String> = a
                .iter()
                .map(|x| match x {
                    Value::String(s) => format!("\"{s}\""),
                    other => literal_text(other),
                })
                .collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(m) => {
            // Dict answers hold lists of acceptable values per key: take the first.
            let items: Vec<String> = m
                .iter()
                .map(|(k, vals)| {
                    let first = vals.as_array().and_then(|a| a.first()).cloned().unwrap_or(Value::Null);
                    let text = match &first {
                        Value::String(s) => format!("\"{s}\""),
                        other => literal_text(other),
                    };
                    format!("\"{k}\": {text}")
                })
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// Dict answers hold `{key: [acceptable…]}`; a model would send `{key: first}`.
fn first_dict(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, vals)| (k.clone(), vals.as_array().and_then(|a| a.first()).cloned().unwrap_or(Value::Null)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(first_dict).collect()),
        other => other.clone(),
    }
}

fn answer_calls(s: &Sample) -> Vec<Call> {
    s.answer
        .iter()
        .filter_map(|entry| {
            let (name, params) = entry.as_object()?.iter().next()?;
            let mut args = Map::new();
            let func = s.functions.iter().find(|f| f.get("name").and_then(Value::as_str) == Some(name.as_str()));
            let params_schema = func.and_then(|f| f.pointer("/parameters")).cloned().unwrap_or(Value::Null);
            let required: Vec<&str> = params_schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for (k, vals) in params.as_object()? {
                // A few answers list params the schema lacks: a model could not send them.
                if params_schema.pointer(&format!("/properties/{k}")).is_none() {
                    continue;
                }
                // The first acceptable value; "" first means a model would omit an optional param.
                let vals = vals.as_array()?;
                let first = if required.contains(&k.as_str()) {
                    vals.iter().find(|x| x.as_str() != Some(""))
                } else {
                    vals.first().filter(|x| x.as_str() != Some(""))
                };
                let Some(first) = first else { continue };
                let v = match s.language() {
                    Language::Python => first_dict(first),
                    _ => Value::String(literal_text(first)),
                };
                args.insert(k.clone(), v);
            }
            Some(Call { name: name.replace('.', "_"), args })
        })
        .collect()
}

#[test]
fn selects_the_995_gated_samples() {
    let s = all();
    assert_eq!(s.len(), 995);
    let count = |name: &str| s.iter().filter(|x| x.subset == name).count();
    assert_eq!(count("simple_python"), 248);
    assert_eq!(count("simple_java"), 62);
    assert_eq!(count("live_multiple"), 105);
    assert_eq!(count("live_irrelevance"), 88);
    assert_eq!(NON_LIVE.iter().map(|n| count(n)).sum::<usize>(), 713);
    assert!(s.iter().filter(|x| !x.is_hallucination()).all(|x| !x.answer.is_empty()));
    assert!(load(Path::new(crate::DEFAULT_BFCL_DIR), &["nope".into()]).is_err());
    assert_eq!(load(Path::new(crate::DEFAULT_BFCL_DIR), &["parallel".into()]).unwrap().len(), 124);
}

#[test]
fn possible_answers_pass_their_own_check() {
    let samples = all();
    let mut failures = Vec::new();
    for s in samples.iter().filter(|s| !s.is_hallucination()) {
        let calls = answer_calls(s);
        if let Err(e) = ast_check(&s.functions, &calls, &s.answer, s.language(), &s.subset) {
            failures.push(format!("{} {e}", s.id));
        }
    }
    assert!(failures.is_empty(), "{} failures: {:?}", failures.len(), &failures[..failures.len().min(20)]);
}

fn sample0() -> Sample {
    all().into_iter().find(|s| s.id == "simple_python_0").expect("simple_python_0")
}

fn call(name: &str, args: Value) -> Call {
    Call { name: name.into(), args: args.as_object().cloned().unwrap_or_default() }
}

#[test]
fn wrong_calls_fail_with_the_right_reason() {
    let s = sample0();
    let check = |c: Vec<Call>| ast_check(&s.functions, &c, &s.answer, Language::Python, &s.subset);
    assert_eq!(check(vec![call("calculate_triangle_area", json!({"base": 10, "height": 5}))]), Ok(()));
    assert_eq!(check(vec![call("calculate_triangle_area", json!({"base": 10, "height": 5, "unit": "Units"}))]), Ok(()));
    assert_eq!(
        check(vec![call("area", json!({"base": 10, "height": 5}))]),
        Err("simple_function_checker:wrong_func_name")
    );
    assert_eq!(
        check(vec![call("calculate_triangle_area", json!({"base": 10}))]),
        Err("simple_function_checker:missing_required")
    );
    assert_eq!(
        check(vec![call("calculate_triangle_area", json!({"base": 10, "height": 5, "color": "red"}))]),
        Err("simple_function_checker:unexpected_param")
    );
    assert_eq!(
        check(vec![call("calculate_triangle_area", json!({"base": "10", "height": 5}))]),
        Err("type_error:simple")
    );
    assert_eq!(
        check(vec![call("calculate_triangle_area", json!({"base": 11, "height": 5}))]),
        Err("value_error:others")
    );
    assert_eq!(
        check(vec![call("calculate_triangle_area", json!({"base": 10, "height": 5, "unit": "cm"}))]),
        Err("value_error")
    );
    assert_eq!(check(vec![]), Err("simple_function_checker:wrong_count"));
}

#[test]
fn parallel_needs_the_right_count_in_any_order() {
    let samples = all();
    let s = samples.iter().find(|s| s.subset == "parallel" && s.answer.len() >= 2).expect("a parallel sample");
    let mut calls = answer_calls(s);
    calls.reverse();
    assert_eq!(ast_check(&s.functions, &calls, &s.answer, Language::Python, &s.subset), Ok(()));
    calls.pop();
    assert_eq!(
        ast_check(&s.functions, &calls, &s.answer, Language::Python, &s.subset),
        Err("parallel_function_checker_no_order:wrong_count")
    );
}

#[test]
fn java_values_must_be_strings() {
    let samples = all();
    let s = samples.iter().find(|s| s.id == "simple_java_1").expect("simple_java_1");
    let mut calls = answer_calls(s);
    assert_eq!(ast_check(&s.functions, &calls, &s.answer, Language::Java, &s.subset), Ok(()));
    calls[0].args.insert("useShortName".into(), json!(true));
    assert_eq!(ast_check(&s.functions, &calls, &s.answer, Language::Java, &s.subset), Err("type_error:java_js_string"));
}

#[test]
fn hallucination_scores_one_only_without_tool_calls() {
    let samples = all();
    let s = samples.iter().find(|s| s.subset == "irrelevance").expect("irrelevance");
    assert_eq!(score_sample(s, &Reply { content: "f(x=1)".into(), ..Reply::default() }).0, 1.0);
    let with_call =
        Reply { tool_calls: vec![ToolCall { name: "f".into(), ..ToolCall::default() }], ..Reply::default() };
    assert_eq!(score_sample(s, &with_call).0, 0.0);
}

#[test]
fn tools_follow_convert_to_tool() {
    let f = json!([{"name": "math.hypot", "description": "d", "parameters": {"type": "dict",
        "properties": {"x": {"type": "float", "description": "x"}, "l": {"type": "tuple", "items": {"type": "float"}},
                       "m": {"type": "HashMap"}, "q": {"type": "weird"}}, "required": ["x"]}}]);
    let t = to_tools(f.as_array().unwrap());
    let fun = &t[0]["function"];
    assert_eq!(t[0]["type"], "function");
    assert_eq!(fun["name"], "math_hypot");
    assert_eq!(fun["parameters"]["type"], "object");
    assert_eq!(fun["parameters"]["properties"]["x"]["type"], "number");
    assert_eq!(fun["parameters"]["properties"]["x"]["format"], "float");
    assert_eq!(fun["parameters"]["properties"]["x"]["description"], "x This is a float type value.");
    assert_eq!(fun["parameters"]["properties"]["l"]["type"], "array");
    assert_eq!(fun["parameters"]["properties"]["l"]["items"]["type"], "number");
    assert_eq!(fun["parameters"]["properties"]["m"]["type"], "object");
    assert_eq!(fun["parameters"]["properties"]["q"]["type"], "string");
    let s = Sample {
        id: "a".into(),
        subset: "live_simple".into(),
        question: vec![json!({"role": "system", "content": null}), json!({"role": "user", "content": "hi"})],
        functions: f.as_array().unwrap().clone(),
        answer: vec![],
    };
    let o = BfclOptions {
        model: "m".into(),
        max_completion_tokens: 1024,
        send_max_tokens: false,
        temperature: 0.0,
        seed: 42,
    };
    let b = request_body(&s, &o);
    assert_eq!(b["messages"][0]["content"], "");
    assert_eq!(b["messages"].as_array().unwrap().len(), 2);
    assert_eq!(b["tool_choice"], "auto");
    assert_eq!(b["seed"], 42);
}

#[test]
fn aggregation_and_gate() {
    let mut r: Vec<(String, Option<f64>)> = Vec::new();
    r.extend((0..4).map(|i| ("simple_python".to_string(), Some(if i < 3 { 1.0 } else { 0.0 }))));
    r.extend((0..2).map(|_| ("multiple".to_string(), Some(1.0))));
    r.push(("live_simple".to_string(), None));
    r.push(("live_multiple".to_string(), Some(1.0)));
    r.push(("irrelevance".to_string(), Some(1.0)));
    let a = aggregate(&r);
    // non_live = mean(0.75 simple, 1.0 multiple) = 87.5; live = 50; hallucination = 100.
    assert_eq!(a.category_scores["non_live"], 87.5);
    assert_eq!(a.category_scores["live"], 50.0);
    assert_eq!(a.category_scores["hallucination"], 100.0);
    assert_eq!(a.overall_accuracy, 77.78);
    assert_eq!(a.normalized_single_turn_score, 79.17);
    assert_eq!(a.issued_samples, 8);
    assert!(!a.gate_passed);
    assert!((a.gate_overall - 83.6431).abs() < 1e-9);
}
