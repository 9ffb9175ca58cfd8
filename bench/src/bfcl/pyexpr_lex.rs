//! The tokenizer of `pyexpr`: Python tokens as far as one expression needs them (names,
//! numbers in every base, string literals with prefixes, escapes and triple quotes, operators;
//! comments and line continuations skipped). `None` is a tokenizer error (a syntax error).

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Name(String),
    Int(i128),
    Float(f64),
    Imag,
    Str { text: String, bytes: bool, fstring: bool },
    Op(&'static str),
}

const OPS: &[&str] = &[
    "**=", "//=", ">>=", "<<=", "...", "->", ":=", "**", "//", "<<", ">>", "<=", ">=", "==", "!=", "+=", "-=", "*=",
    "/=", "%=", "&=", "|=", "^=", "@=", "(", ")", "[", "]", "{", "}", ",", ":", ".", ";", "@", "=", "+", "-", "*", "/",
    "%", "&", "|", "^", "~", "<", ">",
];

fn is_id_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

fn is_id_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

pub(super) struct Lexer<'a> {
    pub(super) s: &'a [char],
    pub(super) i: usize,
}

impl Lexer<'_> {
    fn peek(&self, k: usize) -> Option<char> {
        self.s.get(self.i + k).copied()
    }

    pub(super) fn tokens(mut self) -> Option<Vec<Tok>> {
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
