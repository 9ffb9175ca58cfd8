//! Expected values were produced by Python 3.11's `ast` + `json` (the harness's own code path).

use serde_json::{Value, json};

use super::*;

fn args(s: &str) -> Value {
    match keyword_arguments(s) {
        Parsed::Args(m) => Value::Object(m),
        Parsed::NotACall => json!({}),
        Parsed::SyntaxError => json!({"_raw": s}),
        Parsed::Unencodable => json!("unencodable"),
    }
}

#[test]
fn literals_keep_their_python_types() {
    assert_eq!(
        args("x=4, y=5.5, flag=True, s='a, b', l=[1, 2]"),
        json!({"x": 4, "y": 5.5, "flag": true, "s": "a, b", "l": [1, 2]})
    );
    assert_eq!(args("t=(1, 2), d={'k': None, 1: 2.5}"), json!({"t": [1, 2], "d": {"k": null, "1": 2.5}}));
    assert_eq!(args("x=-3, y=+2.0, z=0x1F, w=1_000"), json!({"x": -3, "y": 2.0, "z": 31, "w": 1000}));
    assert_eq!(args("s='''multi\nline''' 'x'"), json!({"s": "multi\nlinex"}));
    assert_eq!(args("n=None, e=[]"), json!({"n": null, "e": []}));
    assert_eq!(args(r"s=r'\d+'"), json!({"s": r"\d+"}));
    assert_eq!(args("q=\"it's\""), json!({"q": "it's"}));
    assert!(py_type_is_float(&args("y=+2.0")["y"]));
}

fn py_type_is_float(v: &Value) -> bool {
    v.as_number().is_some_and(serde_json::Number::is_f64)
}

#[test]
fn non_literals_are_unparsed_like_ast_unparse() {
    assert_eq!(args("unit=cm"), json!({"unit": "cm"}));
    assert_eq!(args("f=math.pi * 2"), json!({"f": "math.pi * 2"}));
    assert_eq!(args("a=foo('b', c=[1])"), json!({"a": "foo('b', c=[1])"}));
    assert_eq!(args("v=a if b else c"), json!({"v": "a if b else c"}));
    assert_eq!(args("v=not a"), json!({"v": "not a"}));
    assert_eq!(args("v=-a ** 2"), json!({"v": "-a ** 2"}));
    assert_eq!(args("k=x[1:2]"), json!({"k": "x[1:2]"}));
    assert_eq!(args("k=obj.attr.sub"), json!({"k": "obj.attr.sub"}));
}

#[test]
fn syntax_and_shape_follow_the_python_parser() {
    // Later keywords win; positional after keyword and prose are syntax errors.
    assert_eq!(args("a=1, a=2"), json!({"a": 2}));
    assert_eq!(args("a=1, 2"), json!({"_raw": "a=1, 2"}));
    assert_eq!(args("in cm"), json!({"_raw": "in cm"}));
    // `dict(x=1)(y=2)` is a call of a call: its own keywords count.
    assert_eq!(args("x=1)(y=2"), json!({"y": 2}));
    assert_eq!(args("x=1), (2"), json!({}));
    assert_eq!(args("b=b'x'"), json!("unencodable"));
    assert_eq!(args("c=1+2j"), json!("unencodable"));
    assert_eq!(args("s={1, 2}"), json!("unencodable"));
}

#[test]
fn float_and_string_reprs_match_python() {
    assert_eq!(py_float_repr(1e16), "1e+16");
    assert_eq!(py_float_repr(1e-5), "1e-05");
    assert_eq!(py_float_repr(0.0001), "0.0001");
    assert_eq!(py_float_repr(123456789012345678.0), "1.2345678901234568e+17");
    assert_eq!(py_float_repr(2.0), "2.0");
    assert_eq!(py_str_repr("it's"), "\"it's\"");
    assert_eq!(py_str_repr("a\nb'\""), "'a\\nb\\'\"'");
}
