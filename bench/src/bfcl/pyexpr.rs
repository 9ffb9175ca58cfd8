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

use serde_json::{Map, Value};

#[path = "pyexpr_lex.rs"]
mod lex;
#[path = "pyexpr_render.rs"]
mod render;

use lex::{Lexer, Tok};
use render::{Lit, literal, unparse};
pub use render::{py_float_repr, py_str_repr};

#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    Args(Map<String, Value>),
    NotACall,
    SyntaxError,
    /// A keyword value the harness's `json.dumps` raises on.
    Unencodable,
}

/// The expression tree, as far as the harness's path needs it.
#[derive(Debug, Clone)]
pub(super) enum Expr {
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
pub(super) enum Arg {
    Pos(Expr),
    Star(Expr),
    Kw(String, Expr),
    DoubleStar(Expr),
}

// Python's unparse precedences (ast._Precedence), low to high.
pub(super) const P_TUPLE: u8 = 1;
pub(super) const P_TEST: u8 = 3;
pub(super) const P_OR: u8 = 4;
pub(super) const P_AND: u8 = 5;
pub(super) const P_NOT: u8 = 6;
pub(super) const P_CMP: u8 = 7;
pub(super) const P_EXPR: u8 = 8;
pub(super) const P_BOR: u8 = 9;
pub(super) const P_BXOR: u8 = 10;
pub(super) const P_BAND: u8 = 11;
pub(super) const P_SHIFT: u8 = 12;
pub(super) const P_ARITH: u8 = 13;
pub(super) const P_TERM: u8 = 14;
pub(super) const P_FACTOR: u8 = 15;
pub(super) const P_POWER: u8 = 16;
pub(super) const P_ATOM: u8 = 18;

pub(super) fn binop_prec(op: &str) -> Option<u8> {
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
        while let Some(Tok::Op(op)) = self.peek().cloned() {
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
            } else if matches!((self.peek(), self.toks.get(self.i + 1)), (Some(Tok::Name(_)), Some(Tok::Op("=")))) {
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
        "False"
            | "None"
            | "True"
            | "and"
            | "as"
            | "assert"
            | "async"
            | "await"
            | "break"
            | "class"
            | "continue"
            | "def"
            | "del"
            | "elif"
            | "else"
            | "except"
            | "finally"
            | "for"
            | "from"
            | "global"
            | "if"
            | "import"
            | "in"
            | "is"
            | "lambda"
            | "nonlocal"
            | "not"
            | "or"
            | "pass"
            | "raise"
            | "return"
            | "try"
            | "while"
            | "with"
            | "yield"
    )
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
