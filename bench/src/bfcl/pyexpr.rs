//! The part of Python that the official harness's text-call parser leans on: it builds
//! `dict(<args>)`, runs `ast.parse(.., mode="eval")`, takes each keyword's value through
//! `ast.literal_eval` (falling back to `ast.unparse`) and the result through `json.dumps` /
//! `json.loads`.
//!
//! Contract: `keyword_arguments(args)` returns `Parsed::Args` (keyword name → JSON value, later
//! keywords win, as in the harness's loop), `Parsed::NotACall` when the expression parses but
//! is not a call (the harness then gives `{}`), or `Parsed::SyntaxError` (the harness then gives
//! `{"_raw": args}`). Covered: literals (ints in every base, floats, strings with prefixes,
//! escapes, triple quotes and implicit concatenation, True/False/None/...), lists, tuples, sets,
//! dicts, names, attributes, calls, subscripts and slices, unary, binary, comparison, boolean
//! and conditional operators, comments and line continuations. Not covered, read as a syntax
//! error (a divergence, listed in docs/bench.md): lambdas, comprehensions, starred items in
//! displays, f-strings, walrus, await/yield. Values `json.dumps` cannot encode (bytes, complex,
//! sets, NaN/infinity) are `Unencodable`: the harness raises there, we score 0.

use serde_json::{Map, Number, Value};

#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    Args(Map<String, Value>),
    NotACall,
    SyntaxError,
    /// A keyword value the harness's `json.dumps` raises on.
    Unencodable,
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Name(String),
    Int(i128),
    Float(f64),
    Imag,
    Str { text: String, bytes: bool, fstring: bool },
    Op(&'static str),
}

const OPS: &[&str] = &[
    "**=", "//=", ">>=", "<<=", "...", "->", ":=", "**", "//", "<<", ">>", "<=", ">=", "==", "!=", "+=", "-=", "*=",
    "/=", "%=", "&=", "|=", "^=", "@=", "(", ")", "[", "]", "{", "}", ",", ":", ".", ";", "@", "=", "+", "-", "*",
    "/", "%", "&", "|", "^", "~", "<", ">",
];

fn is_id_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_id_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

struct Lexer<'a> {
    s: &'a [char],
    i: usize,
}

impl Lexer<'_> {
    fn peek(&self, k: usize) -> Option<char> {
        self.s.get(self.i + k).copied()
    }

    fn tokens(mut self) -> Option<Vec<Tok>> {
        let mut out = Vec::new();
        while let Some(c) = self.peek(0) {
            if c == '#' {
                while self.peek(0).is_some_and(|c| c != '\n') {
                    self.i += 1;
                }
            } else if c == '\\' && self.peek(1) == Some('\n') {
                self.i += 2;
            } else if c.is_whitespace() {
                self.i += 1;
            } else if c.is_ascii_digit() || (c == '.' && self.peek(1).is_some_and(|d| d.is_ascii_digit())) {
                out.push(self.number()?);
            } else if is_id_start(c) {
                let start = self.i;
                while self.peek(0).is_some_and(is_id_char) {
                    self.i += 1;
                }
                let word: String = self.s[start..self.i].iter().collect();
                let lower = word.to_ascii_lowercase();
                let is_prefix = matches!(lower.as_str(), "r" | "u" | "b" | "f" | "br" | "rb" | "fr" | "rf");
                if is_prefix && matches!(self.peek(0), Some('\'' | '"')) {
                    out.push(self.string(&lower)?);
                } else {
                    out.push(Tok::Name(word));
                }
            } else if c == '\'' || c == '"' {
                out.push(self.string("")?);
            } else {
                let rest: String = self.s[self.i..(self.i + 3).min(self.s.len())].iter().collect();
                let op = OPS.iter().find(|op| rest.starts_with(**op))?;
                self.i += op.chars().count();
                out.push(Tok::Op(op));
            }
        }
        Some(out)
    }

    fn number(&mut self) -> Option<Tok> {
        let start = self.i;
        while self.peek(0).is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
            // An exponent sign belongs to the number.
            if matches!(self.peek(0), Some('e' | 'E'))
                && matches!(self.peek(1), Some('+' | '-'))
                && !self.s[start..self.i].iter().any(|c| matches!(c, 'x' | 'X'))
            {
                self.i += 1;
            }
            self.i += 1;
        }
        let raw: String = self.s[start..self.i].iter().collect();
        if raw.contains("__") || raw.ends_with('_') {
            return None;
        }
        let t = raw.replace('_', "");
        let lower = t.to_ascii_lowercase();
        if lower.ends_with('j') {
            return lower[..lower.len() - 1].parse::<f64>().ok().map(|_| Tok::Imag);
        }
        for (prefix, radix) in [("0x", 16), ("0o", 8), ("0b", 2)] {
            if let Some(digits) = lower.strip_prefix(prefix) {
                return i128::from_str_radix(digits, radix).ok().map(Tok::Int);
            }
        }
        if lower.bytes().all(|b| b.is_ascii_digit()) {
            // "0123" is a syntax error; "000" is zero.
            if lower.len() > 1 && lower.starts_with('0') && lower.bytes().any(|b| b != b'0') {
                return None;
            }
            return lower.parse::<i128>().ok().map(Tok::Int).or_else(|| lower.parse::<f64>().ok().map(Tok::Float));
        }
        let valid = lower.bytes().all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'+' | b'-'));
        if !valid {
            return None;
        }
        lower.parse::<f64>().ok().map(Tok::Float)
    }

    fn string(&mut self, prefix: &str) -> Option<Tok> {
        let raw = prefix.contains('r');
        let q = self.peek(0)?;
        let triple = self.peek(1) == Some(q) && self.peek(2) == Some(q);
        self.i += if triple { 3 } else { 1 };
        let mut text = String::new();
        loop {
            let c = self.peek(0)?;
            if triple && c == q && self.peek(1) == Some(q) && self.peek(2) == Some(q) {
                self.i += 3;
                break;
            }
            if !triple && c == q {
                self.i += 1;
                break;
            }
            if !triple && c == '\n' {
                return None;
            }
            if c == '\\' {
                let n = self.peek(1)?;
                self.i += 2;
                if raw {
                    text.push('\\');
                    text.push(n);
                    continue;
                }
                match n {
                    '\n' => {}
                    '\\' | '\'' | '"' => text.push(n),
                    'a' => text.push('\x07'),
                    'b' => text.push('\x08'),
                    'f' => text.push('\x0c'),
                    'n' => text.push('\n'),
                    'r' => text.push('\r'),
                    't' => text.push('\t'),
                    'v' => text.push('\x0b'),
                    '0'..='7' => {
                        let mut v = n.to_digit(8)?;
                        for _ in 0..2 {
                            match self.peek(0).and_then(|d| d.to_digit(8)) {
                                Some(d) => {
                                    v = v * 8 + d;
                                    self.i += 1;
                                }
                                None => break,
                            }
                        }
                        text.push(char::from_u32(v)?);
                    }
                    'x' | 'u' | 'U' if !(prefix.contains('b') && n != 'x') => {
                        let len = match n {
                            'x' => 2,
                            'u' => 4,
                            _ => 8,
                        };
                        let hex: String = self.s.get(self.i..self.i + len)?.iter().collect();
                        self.i += len;
                        text.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                    }
                    // \N{NAME} needs the Unicode name table: not covered.
                    'N' if !prefix.contains('b') => return None,
                    other => {
                        text.push('\\');
                        text.push(other);
                    }
                }
                continue;
            }
            text.push(c);
            self.i += 1;
        }
        Some(Tok::Str { text, bytes: prefix.contains('b'), fstring: prefix.contains('f') })
    }
}

/// The expression tree, as far as the harness's path needs it.
#[derive(Debug, Clone)]
enum Expr {
    Name(String),
    Int(i128),
    Float(f64),
    Imag,
    Str(String),
    Bytes,
    FString,
    True,
    False,
    NoneLit,
    Ellipsis,
    List(Vec<Expr>),
    Tuple(Vec<Expr>),
    Set(Vec<Expr>),
    Dict(Vec<(Option<Expr>, Expr)>),
    Attr(Box<Expr>, String),
    Call(Box<Expr>, Vec<Arg>),
    Subscript(Box<Expr>, Box<Expr>),
    Slice(Option<Box<Expr>>, Option<Box<Expr>>, Option<Box<Expr>>),
    Unary(&'static str, Box<Expr>),
    Binary(&'static str, Box<Expr>, Box<Expr>),
    Compare(Box<Expr>, Vec<(&'static str, Expr)>),
    BoolOp(&'static str, Vec<Expr>),
    IfExp(Box<Expr>, Box<Expr>, Box<Expr>),
}

#[derive(Debug, Clone)]
enum Arg {
    Pos(Expr),
    Star(Expr),
    Kw(String, Expr),
    DoubleStar(Expr),
}

// Python's unparse precedences (ast._Precedence), low to high.
const P_TUPLE: u8 = 1;
const P_TEST: u8 = 3;
const P_OR: u8 = 4;
const P_AND: u8 = 5;
const P_NOT: u8 = 6;
const P_CMP: u8 = 7;
const P_EXPR: u8 = 8;
const P_BOR: u8 = 9;
const P_BXOR: u8 = 10;
const P_BAND: u8 = 11;
const P_SHIFT: u8 = 12;
const P_ARITH: u8 = 13;
const P_TERM: u8 = 14;
const P_FACTOR: u8 = 15;
const P_POWER: u8 = 16;
const P_ATOM: u8 = 18;

fn binop_prec(op: &str) -> Option<u8> {
    Some(match op {
        "|" => P_BOR,
        "^" => P_BXOR,
        "&" => P_BAND,
        "<<" | ">>" => P_SHIFT,
        "+" | "-" => P_ARITH,
        "*" | "/" | "//" | "%" | "@" => P_TERM,
        "**" => P_POWER,
        _ => return None,
    })
}

struct Parser {
    toks: Vec<Tok>,
    i: usize,
}

type PResult<T> = Result<T, ()>;

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.i)
    }

    fn is_op(&self, op: &str) -> bool {
        matches!(self.peek(), Some(Tok::Op(o)) if *o == op)
    }

    fn is_kw(&self, kw: &str) -> bool {
        matches!(self.peek(), Some(Tok::Name(n)) if n == kw)
    }

    fn eat_op(&mut self, op: &str) -> bool {
        let hit = self.is_op(op);
        self.i += usize::from(hit);
        hit
    }

    fn eat_kw(&mut self, kw: &str) -> bool {
        let hit = self.is_kw(kw);
        self.i += usize::from(hit);
        hit
    }

    fn expect(&mut self, op: &str) -> PResult<()> {
        if self.eat_op(op) { Ok(()) } else { Err(()) }
    }

    /// `test`: a conditional expression or below.
    fn test(&mut self) -> PResult<Expr> {
        if self.is_kw("lambda") || self.is_kw("yield") || self.is_kw("await") {
            return Err(());
        }
        let body = self.or_test()?;
        if self.eat_kw("if") {
            let cond = self.or_test()?;
            if !self.eat_kw("else") {
                return Err(());
            }
            let orelse = self.test()?;
            return Ok(Expr::IfExp(Box::new(body), Box::new(cond), Box::new(orelse)));
        }
        if self.is_op(":=") || self.is_kw("for") || self.is_kw("async") {
            return Err(());
        }
        Ok(body)
    }

    fn or_test(&mut self) -> PResult<Expr> {
        self.bool_chain("or")
    }

    fn bool_chain(&mut self, kw: &'static str) -> PResult<Expr> {
        let mut items = vec![if kw == "or" { self.bool_chain("and")? } else { self.not_test()? }];
        while self.eat_kw(kw) {
            items.push(if kw == "or" { self.bool_chain("and")? } else { self.not_test()? });
        }
        Ok(if items.len() == 1 { items.remove(0) } else { Expr::BoolOp(kw, items) })
    }

    fn not_test(&mut self) -> PResult<Expr> {
        if self.eat_kw("not") {
            return Ok(Expr::Unary("not", Box::new(self.not_test()?)));
        }
        self.comparison()
    }

    fn comparison(&mut self) -> PResult<Expr> {
        let left = self.binary(P_BOR)?;
        let mut rest = Vec::new();
        loop {
            let op: &'static str = if self.eat_op("<") {
                "<"
            } else if self.eat_op(">") {
                ">"
            } else if self.eat_op("==") {
                "=="
            } else if self.eat_op(">=") {
                ">="
            } else if self.eat_op("<=") {
                "<="
            } else if self.eat_op("!=") {
                "!="
            } else if self.eat_kw("in") {
                "in"
            } else if self.is_kw("not") && matches!(self.toks.get(self.i + 1), Some(Tok::Name(n)) if n == "in") {
                self.i += 2;
                "not in"
            } else if self.eat_kw("is") {
                if self.eat_kw("not") { "is not" } else { "is" }
            } else {
                break;
            };
            rest.push((op, self.binary(P_BOR)?));
        }
        Ok(if rest.is_empty() { left } else { Expr::Compare(Box::new(left), rest) })
    }

    /// Binary operators from precedence `min` up (all left-associative except `**`).
    fn binary(&mut self, min: u8) -> PResult<Expr> {
        if min >= P_FACTOR {
            return self.factor();
        }
        let mut left = self.binary(min + 1)?;
        loop {
            let Some(Tok::Op(op)) = self.peek().cloned() else { break };
            if binop_prec(op) != Some(min) {
                break;
            }
            self.i += 1;
            let right = self.binary(min + 1)?;
            left = Expr::Binary(op, Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn factor(&mut self) -> PResult<Expr> {
        for op in ["-", "+", "~"] {
            if self.eat_op(op) {
                let op: &'static str = match op {
                    "-" => "-",
                    "+" => "+",
                    _ => "~",
                };
                return Ok(Expr::Unary(op, Box::new(self.factor()?)));
            }
        }
        let base = self.primary()?;
        if self.eat_op("**") {
            let exp = self.factor()?;
            return Ok(Expr::Binary("**", Box::new(base), Box::new(exp)));
        }
        Ok(base)
    }

    fn primary(&mut self) -> PResult<Expr> {
        let mut e = self.atom()?;
        loop {
            if self.eat_op(".") {
                match self.peek().cloned() {
                    Some(Tok::Name(n)) => {
                        self.i += 1;
                        e = Expr::Attr(Box::new(e), n);
                    }
                    _ => return Err(()),
                }
            } else if self.eat_op("(") {
                e = Expr::Call(Box::new(e), self.call_args()?);
            } else if self.eat_op("[") {
                let idx = self.subscript()?;
                e = Expr::Subscript(Box::new(e), Box::new(idx));
            } else {
                return Ok(e);
            }
        }
    }

    fn call_args(&mut self) -> PResult<Vec<Arg>> {
        let mut args = Vec::new();
        let (mut seen_kw, mut seen_dstar) = (false, false);
        while !self.eat_op(")") {
            if self.eat_op("**") {
                args.push(Arg::DoubleStar(self.test()?));
                seen_dstar = true;
            } else if self.eat_op("*") {
                if seen_dstar {
                    return Err(());
                }
                args.push(Arg::Star(self.test()?));
            } else if matches!((self.peek(), self.toks.get(self.i + 1)), (Some(Tok::Name(_)), Some(Tok::Op("="))))
            {
                let Some(Tok::Name(n)) = self.peek().cloned() else { return Err(()) };
                if is_keyword(&n) {
                    return Err(());
                }
                self.i += 2;
                args.push(Arg::Kw(n, self.test()?));
                seen_kw = true;
            } else {
                if seen_kw || seen_dstar {
                    return Err(());
                }
                args.push(Arg::Pos(self.test()?));
            }
            if !self.eat_op(",") {
                self.expect(")")?;
                break;
            }
        }
        Ok(args)
    }

    fn subscript(&mut self) -> PResult<Expr> {
        let mut items = Vec::new();
        let mut trailing = false;
        while !self.eat_op("]") {
            items.push(self.slice_item()?);
            trailing = self.eat_op(",");
            if !trailing {
                self.expect("]")?;
                break;
            }
        }
        match (items.len(), trailing) {
            (0, _) => Err(()),
            (1, false) => Ok(items.remove(0)),
            _ => Ok(Expr::Tuple(items)),
        }
    }

    fn slice_item(&mut self) -> PResult<Expr> {
        let ends = |p: &Parser| p.is_op(":") || p.is_op("]") || p.is_op(",");
        let lower = if ends(self) { None } else { Some(Box::new(self.test()?)) };
        if !self.eat_op(":") {
            return lower.map(|b| *b).ok_or(());
        }
        let upper = if ends(self) { None } else { Some(Box::new(self.test()?)) };
        let step = if self.eat_op(":") && !ends(self) { Some(Box::new(self.test()?)) } else { None };
        Ok(Expr::Slice(lower, upper, step))
    }

    /// Items of a display up to `close`; returns them and whether a comma was seen.
    fn items(&mut self, close: &str) -> PResult<(Vec<Expr>, bool)> {
        let mut items = Vec::new();
        let mut comma = false;
        while !self.eat_op(close) {
            if self.is_op("*") {
                return Err(());
            }
            items.push(self.test()?);
            if self.eat_op(",") {
                comma = true;
            } else {
                self.expect(close)?;
                break;
            }
        }
        Ok((items, comma))
    }

    fn atom(&mut self) -> PResult<Expr> {
        let tok = self.peek().cloned().ok_or(())?;
        self.i += 1;
        match tok {
            Tok::Int(v) => Ok(Expr::Int(v)),
            Tok::Float(v) => Ok(Expr::Float(v)),
            Tok::Imag => Ok(Expr::Imag),
            Tok::Str { text, bytes, fstring } => {
                let (mut text, mut bytes, mut fstring) = (text, bytes, fstring);
                // Adjacent literals concatenate; mixing bytes and str is a syntax error.
                while let Some(Tok::Str { text: t, bytes: b, fstring: f }) = self.peek().cloned() {
                    if b != bytes {
                        return Err(());
                    }
                    self.i += 1;
                    text.push_str(&t);
                    bytes |= b;
                    fstring |= f;
                }
                Ok(if fstring {
                    Expr::FString
                } else if bytes {
                    Expr::Bytes
                } else {
                    Expr::Str(text)
                })
            }
            Tok::Name(n) => match n.as_str() {
                "True" => Ok(Expr::True),
                "False" => Ok(Expr::False),
                "None" => Ok(Expr::NoneLit),
                _ if is_keyword(&n) => Err(()),
                _ => Ok(Expr::Name(n)),
            },
            Tok::Op("...") => Ok(Expr::Ellipsis),
            Tok::Op("(") => {
                if self.eat_op(")") {
                    return Ok(Expr::Tuple(Vec::new()));
                }
                let (mut items, comma) = self.items(")")?;
                Ok(if items.len() == 1 && !comma { items.remove(0) } else { Expr::Tuple(items) })
            }
            Tok::Op("[") => Ok(Expr::List(self.items("]")?.0)),
            Tok::Op("{") => self.brace(),
            _ => Err(()),
        }
    }

    fn brace(&mut self) -> PResult<Expr> {
        if self.eat_op("}") {
            return Ok(Expr::Dict(Vec::new()));
        }
        if self.eat_op("**") {
            let first = self.binary(P_BOR)?;
            return self.dict_rest(vec![(None, first)]);
        }
        if self.is_op("*") {
            return Err(());
        }
        let first = self.test()?;
        if self.eat_op(":") {
            let v = self.test()?;
            return self.dict_rest(vec![(Some(first), v)]);
        }
        let mut items = vec![first];
        if self.eat_op(",") {
            items.extend(self.items("}")?.0);
        } else {
            self.expect("}")?;
        }
        Ok(Expr::Set(items))
    }

    fn dict_rest(&mut self, mut pairs: Vec<(Option<Expr>, Expr)>) -> PResult<Expr> {
        loop {
            if !self.eat_op(",") {
                self.expect("}")?;
                return Ok(Expr::Dict(pairs));
            }
            if self.eat_op("}") {
                return Ok(Expr::Dict(pairs));
            }
            if self.eat_op("**") {
                pairs.push((None, self.binary(P_BOR)?));
                continue;
            }
            let k = self.test()?;
            self.expect(":")?;
            pairs.push((Some(k), self.test()?));
        }
    }
}

fn is_keyword(n: &str) -> bool {
    matches!(
        n,
        "False" | "None" | "True" | "and" | "as" | "assert" | "async" | "await" | "break" | "class" | "continue"
            | "def" | "del" | "elif" | "else" | "except" | "finally" | "for" | "from" | "global" | "if" | "import"
            | "in" | "is" | "lambda" | "nonlocal" | "not" | "or" | "pass" | "raise" | "return" | "try" | "while"
            | "with" | "yield"
    )
}

/// What `ast.literal_eval` then `json.dumps` make of one node.
enum Lit {
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

fn literal(e: &Expr) -> Lit {
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
fn unparse(e: &Expr, ctx: u8) -> String {
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

/// The keyword arguments of `dict(<args>)`, as the harness's `_parse_arguments_string` finds them.
pub fn keyword_arguments(args: &str) -> Parsed {
    let src: Vec<char> = format!("dict({args})").chars().collect();
    let Some(toks) = (Lexer { s: &src, i: 0 }).tokens() else { return Parsed::SyntaxError };
    let mut p = Parser { toks, i: 0 };
    let Ok(body) = p.test() else { return Parsed::SyntaxError };
    // A top-level tuple (`dict(a), b`) is still an expression, not a call.
    let body = if p.eat_op(",") {
        let mut items = vec![body];
        while p.peek().is_some() {
            let Ok(e) = p.test() else { return Parsed::SyntaxError };
            items.push(e);
            if !p.eat_op(",") {
                break;
            }
        }
        Expr::Tuple(items)
    } else {
        body
    };
    if p.peek().is_some() {
        return Parsed::SyntaxError;
    }
    let Expr::Call(_, call_args) = body else { return Parsed::NotACall };
    let mut out = Map::new();
    for a in call_args {
        if let Arg::Kw(k, v) = a {
            let value = match literal(&v) {
                Lit::Val(v) => v,
                Lit::NotLiteral => Value::String(unparse(&v, P_TEST)),
                Lit::Unencodable => return Parsed::Unencodable,
            };
            out.insert(k, value);
        }
    }
    Parsed::Args(out)
}

#[cfg(test)]
#[path = "pyexpr_tests.rs"]
mod tests;
