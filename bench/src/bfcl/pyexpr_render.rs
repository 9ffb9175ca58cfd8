//! `ast.literal_eval` + `json.dumps` (what a keyword value becomes) and `ast.unparse` (what a
//! non-literal becomes), over `pyexpr`'s tree.

use serde_json::{Map, Number, Value};

use super::{Arg, Expr, P_AND, P_ARITH, P_ATOM, P_CMP, P_EXPR, P_FACTOR, P_NOT, P_OR, P_TEST, P_TUPLE, binop_prec};

/// What `ast.literal_eval` then `json.dumps` make of one node.
pub(super) enum Lit {
    Val(Value),
    /// A literal `json.dumps` raises on (bytes, complex, set, Ellipsis, huge ints, inf).
    Unencodable,
    /// Not a literal: the harness unparses it.
    NotLiteral,
}

fn number(e: &Expr, negate: bool) -> Option<Lit> {
    let v = match e {
        Expr::Int(v) => int_value(if negate { -v } else { *v }),
        Expr::Float(v) => Number::from_f64(if negate { -v } else { *v }).map(Value::Number),
        Expr::Imag => return Some(Lit::Unencodable),
        _ => return None,
    };
    Some(v.map_or(Lit::Unencodable, Lit::Val))
}

/// Combines item results the way `literal_eval` (all items first) then `json.dumps` do.
fn all_items<'a>(items: impl Iterator<Item = &'a Expr>) -> Result<Vec<Value>, Lit> {
    let mut out = Vec::new();
    let mut unencodable = false;
    for it in items {
        match literal(it) {
            Lit::Val(v) => out.push(v),
            Lit::Unencodable => unencodable = true,
            Lit::NotLiteral => return Err(Lit::NotLiteral),
        }
    }
    if unencodable { Err(Lit::Unencodable) } else { Ok(out) }
}

pub(super) fn literal(e: &Expr) -> Lit {
    match e {
        Expr::Int(_) | Expr::Float(_) | Expr::Imag => number(e, false).unwrap_or(Lit::NotLiteral),
        Expr::Str(s) => Lit::Val(Value::String(s.clone())),
        Expr::Bytes | Expr::Ellipsis => Lit::Unencodable,
        Expr::True => Lit::Val(Value::Bool(true)),
        Expr::False => Lit::Val(Value::Bool(false)),
        Expr::NoneLit => Lit::Val(Value::Null),
        Expr::Unary(op @ ("-" | "+"), inner) => number(inner, *op == "-").unwrap_or(Lit::NotLiteral),
        // A signed number plus or minus an imaginary literal is a complex literal.
        Expr::Binary("+" | "-", l, r) if matches!(r.as_ref(), Expr::Imag) => {
            let signed = matches!(l.as_ref(), Expr::Int(_) | Expr::Float(_) | Expr::Imag)
                || matches!(l.as_ref(), Expr::Unary("-" | "+", x) if matches!(x.as_ref(), Expr::Int(_) | Expr::Float(_) | Expr::Imag));
            if signed { Lit::Unencodable } else { Lit::NotLiteral }
        }
        Expr::List(items) | Expr::Tuple(items) => match all_items(items.iter()) {
            Ok(v) => Lit::Val(Value::Array(v)),
            Err(l) => l,
        },
        Expr::Set(items) => match all_items(items.iter()) {
            Err(Lit::NotLiteral) => Lit::NotLiteral,
            _ => Lit::Unencodable,
        },
        Expr::Call(f, args) if args.is_empty() && matches!(f.as_ref(), Expr::Name(n) if n == "set") => Lit::Unencodable,
        Expr::Dict(pairs) => {
            if pairs.iter().any(|(k, _)| k.is_none()) {
                return Lit::NotLiteral;
            }
            let keys = all_items(pairs.iter().filter_map(|(k, _)| k.as_ref()));
            let values = all_items(pairs.iter().map(|(_, v)| v));
            match (keys, values) {
                (Err(Lit::NotLiteral), _) | (_, Err(Lit::NotLiteral)) => Lit::NotLiteral,
                (Ok(keys), Ok(values)) => {
                    let mut m = Map::new();
                    for (k, v) in keys.iter().zip(values) {
                        match json_key(k) {
                            Some(k) => {
                                m.insert(k, v);
                            }
                            None => return Lit::Unencodable,
                        }
                    }
                    Lit::Val(Value::Object(m))
                }
                _ => Lit::Unencodable,
            }
        }
        _ => Lit::NotLiteral,
    }
}

fn int_value(v: i128) -> Option<Value> {
    // Python keeps any integer exactly; beyond 64 bits serde_json cannot (Unencodable).
    i64::try_from(v).map(Value::from).ok().or_else(|| u64::try_from(v).map(Value::from).ok())
}

/// `json.dumps` of a dict key: strings stay, numbers, booleans and None become text.
fn json_key(k: &Value) -> Option<String> {
    Some(match k {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "null".into(),
        Value::Number(n) if n.is_f64() => py_float_repr(n.as_f64().unwrap_or(0.0)),
        Value::Number(n) => n.to_string(),
        _ => return None,
    })
}

/// Python's `repr(float)`: shortest round-trip digits, exponent form below 1e-4 or from 1e16.
pub fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    let sci = format!("{:e}", x.abs());
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mant.chars().filter(char::is_ascii_digit).collect();
    let sign = if x < 0.0 { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let point = exp + 1;
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!("{}.{}", &digits[..point as usize], &digits[point as usize..])
        };
        format!("{sign}{body}")
    } else {
        let m = if digits.len() > 1 { format!("{}.{}", &digits[..1], &digits[1..]) } else { digits };
        format!("{sign}{m}e{}{:02}", if exp < 0 { "-" } else { "+" }, exp.abs())
    }
}

/// Python's `repr(str)`.
pub fn py_str_repr(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::from(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() || (c.is_whitespace() && c != ' ') => {
                let v = c as u32;
                out.push_str(&if v < 0x100 {
                    format!("\\x{v:02x}")
                } else if v < 0x10000 {
                    format!("\\u{v:04x}")
                } else {
                    format!("\\U{v:08x}")
                });
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// `ast.unparse`, with its parenthesisation by precedence.
pub(super) fn unparse(e: &Expr, ctx: u8) -> String {
    let wrap = |own: u8, s: String| if ctx > own { format!("({s})") } else { s };
    let join = |items: &[Expr]| items.iter().map(|x| unparse(x, P_TEST)).collect::<Vec<_>>().join(", ");
    match e {
        Expr::Name(n) => n.clone(),
        Expr::Int(v) => v.to_string(),
        Expr::Float(v) => py_float_repr(*v).replace("inf", "1e309"),
        Expr::Imag => "1j".into(),
        Expr::Str(s) => py_str_repr(s),
        Expr::Bytes => "b''".into(),
        Expr::FString => "f''".into(),
        Expr::True => "True".into(),
        Expr::False => "False".into(),
        Expr::NoneLit => "None".into(),
        Expr::Ellipsis => "...".into(),
        Expr::List(items) => format!("[{}]", join(items)),
        Expr::Tuple(items) => {
            let inner = if items.len() == 1 { format!("{},", unparse(&items[0], P_TEST)) } else { join(items) };
            if items.is_empty() || ctx > P_TUPLE { format!("({inner})") } else { inner }
        }
        Expr::Set(items) => format!("{{{}}}", join(items)),
        Expr::Dict(pairs) => {
            let parts: Vec<String> = pairs
                .iter()
                .map(|(k, v)| match k {
                    Some(k) => format!("{}: {}", unparse(k, P_TEST), unparse(v, P_TEST)),
                    None => format!("**{}", unparse(v, P_EXPR)),
                })
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        Expr::Attr(v, name) => {
            let base = unparse(v, P_ATOM);
            let sep = if matches!(v.as_ref(), Expr::Int(_)) { " ." } else { "." };
            format!("{base}{sep}{name}")
        }
        Expr::Call(f, args) => {
            let parts: Vec<String> = args
                .iter()
                .map(|a| match a {
                    Arg::Pos(x) => unparse(x, P_TEST),
                    Arg::Star(x) => format!("*{}", unparse(x, P_EXPR)),
                    Arg::Kw(k, x) => format!("{k}={}", unparse(x, P_TEST)),
                    Arg::DoubleStar(x) => format!("**{}", unparse(x, P_TEST)),
                })
                .collect();
            format!("{}({})", unparse(f, P_ATOM), parts.join(", "))
        }
        Expr::Subscript(v, idx) => {
            let inner = match idx.as_ref() {
                Expr::Tuple(items) if !items.is_empty() => {
                    let s = items.iter().map(|x| unparse(x, P_TEST)).collect::<Vec<_>>().join(", ");
                    if items.len() == 1 { format!("{s},") } else { s }
                }
                other => unparse(other, P_TUPLE),
            };
            format!("{}[{inner}]", unparse(v, P_ATOM))
        }
        Expr::Slice(a, b, c) => {
            let part = |x: &Option<Box<Expr>>| x.as_ref().map_or(String::new(), |x| unparse(x, P_TEST));
            let mut s = format!("{}:{}", part(a), part(b));
            if c.is_some() {
                s.push(':');
                s.push_str(&part(c));
            }
            s
        }
        Expr::Unary(op, x) => {
            if *op == "not" {
                wrap(P_NOT, format!("not {}", unparse(x, P_NOT)))
            } else {
                wrap(P_FACTOR, format!("{op}{}", unparse(x, P_FACTOR)))
            }
        }
        Expr::Binary(op, l, r) => {
            let p = binop_prec(op).unwrap_or(P_ARITH);
            let (lp, rp) = if *op == "**" { (p + 1, p) } else { (p, p + 1) };
            wrap(p, format!("{} {op} {}", unparse(l, lp), unparse(r, rp)))
        }
        Expr::Compare(l, rest) => {
            let mut s = unparse(l, P_CMP + 1);
            for (op, x) in rest {
                s.push_str(&format!(" {op} {}", unparse(x, P_CMP + 1)));
            }
            wrap(P_CMP, s)
        }
        Expr::BoolOp(op, items) => {
            let p = if *op == "or" { P_OR } else { P_AND };
            let s = items.iter().map(|x| unparse(x, p + 1)).collect::<Vec<_>>().join(&format!(" {op} "));
            wrap(p, s)
        }
        Expr::IfExp(body, cond, orelse) => wrap(
            P_TEST,
            format!("{} if {} else {}", unparse(body, P_TEST + 1), unparse(cond, P_TEST + 1), unparse(orelse, P_TEST)),
        ),
    }
}
