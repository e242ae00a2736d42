//! The tokenizer and parser of PyTorch's `PYTORCH_CUDA_ALLOC_CONF` grammar (the module docs of
//! `config`), and the "did you mean" suggestions for a key that is not in the table.

use std::fmt;

use super::keys::{KEY_DEFS, clip};
use crate::error::{Error, Result};

/// A token of the grammar: one of `, : [ ]`, or a word (whitespace already dropped).
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Token {
    Comma,
    Colon,
    Open,
    Close,
    Word(String),
}

impl Token {
    pub(super) fn text(&self) -> &str {
        match self {
            Token::Comma => ",",
            Token::Colon => ":",
            Token::Open => "[",
            Token::Close => "]",
            Token::Word(w) => w,
        }
    }
}

/// PyTorch's `ConfigTokenizer`: separators are tokens of their own, whitespace vanishes.
pub(super) fn tokenize(text: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut word = String::new();
    for ch in text.chars() {
        let sep = match ch {
            ',' => Some(Token::Comma),
            ':' => Some(Token::Colon),
            '[' => Some(Token::Open),
            ']' => Some(Token::Close),
            _ => None,
        };
        match sep {
            Some(t) => {
                if !word.is_empty() {
                    out.push(Token::Word(std::mem::take(&mut word)));
                }
                out.push(t);
            }
            None if ch.is_whitespace() => {}
            None => word.push(ch),
        }
    }
    if !word.is_empty() {
        out.push(Token::Word(word));
    }
    out
}

/// A parsed value: a word, or a list as written (`[a:b,c:d]`, whitespace dropped).
/// A value as written: one word, or a bracketed list kept as its text (`[a:b,c:d]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Scalar(String),
    List(String),
}

impl Value {
    pub fn text(&self) -> &str {
        match self {
            Value::Scalar(s) | Value::List(s) => s,
        }
    }
}

/// The parser: tokens in, `(key, value)` entries out, with errors that say where they came from.
pub(super) struct Parser<'a> {
    pub(super) source: &'a str,
    pub(super) tokens: Vec<Token>,
    pub(super) pos: usize,
}

impl Parser<'_> {
    pub(super) fn err(&self, msg: impl fmt::Display) -> Error {
        Error::Config(format!("{}: {msg}", self.source))
    }

    pub(super) fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    pub(super) fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    pub(super) fn entries(&mut self) -> Result<Vec<(String, Value)>> {
        let mut out = Vec::new();
        while self.peek().is_some() {
            let key = match self.next() {
                Some(Token::Word(k)) => k,
                Some(Token::Comma) => {
                    return Err(self.err(format_args!(
                        "empty entry: expected key:value before ','{}",
                        after_key(out.last())
                    )));
                }
                Some(Token::Colon) => {
                    return Err(self.err(format_args!(
                        "missing key before ':'{}; expected key:value",
                        after_key(out.last())
                    )));
                }
                Some(Token::Close) => {
                    return Err(self.err(format_args!(
                        "unbalanced brackets: ']' without a matching '['{}",
                        after_key(out.last())
                    )));
                }
                Some(Token::Open) => {
                    return Err(self.err(format_args!(
                        "unexpected '[' where a key was expected{}; lists are only values, as in \
                         key:[a:b,c:d]",
                        after_key(out.last())
                    )));
                }
                None => unreachable!("peeked"),
            };
            match self.next() {
                Some(Token::Colon) => {}
                Some(t) => {
                    return Err(self.err(format_args!(
                        "missing ':' after key '{key}' (found '{}'); expected {key}:value",
                        t.text()
                    )));
                }
                None => {
                    return Err(self.err(format_args!(
                        "missing ':' after key '{key}'; expected {key}:value"
                    )));
                }
            }
            let value = match self.next() {
                Some(Token::Word(w)) => Value::Scalar(w),
                Some(Token::Open) => Value::List(self.list(&key)?),
                Some(Token::Close) => {
                    return Err(self.err(format_args!(
                        "unbalanced brackets: ']' without a matching '[' in the value of key '{key}'"
                    )));
                }
                Some(Token::Comma) | None => {
                    return Err(self.err(format_args!(
                        "missing value after '{key}:'; expected {key}:value"
                    )));
                }
                Some(Token::Colon) => {
                    return Err(self.err(format_args!(
                        "missing value between '{key}:' and ':'; expected {key}:value"
                    )));
                }
            };
            match self.next() {
                None | Some(Token::Comma) => {}
                Some(Token::Close) => {
                    return Err(self.err(format_args!(
                        "unbalanced brackets: ']' without a matching '[' after the value '{}' of \
                         key '{key}'",
                        value.text()
                    )));
                }
                Some(t) => {
                    return Err(self.err(format_args!(
                        "unexpected '{}' after the value '{}' of key '{key}'; entries are \
                         separated by ',' as in key:value,key:value",
                        t.text(),
                        value.text()
                    )));
                }
            }
            out.push((key, value));
        }
        Ok(out)
    }

    /// The rest of a list after its `[`: `item (, item)* ]`, returned as written.
    pub(super) fn list(&mut self, key: &str) -> Result<String> {
        let mut text = String::from("[");
        loop {
            match self.next() {
                Some(Token::Close) => {
                    text.push(']');
                    return Ok(text);
                }
                Some(Token::Open) => {
                    return Err(self.err(format_args!(
                        "unbalanced brackets: nested '[' in the value of key '{key}' ('{text}['); \
                         lists are flat, as in {key}:[a:b,c:d]"
                    )));
                }
                Some(t) => text.push_str(t.text()),
                None => {
                    return Err(self.err(format_args!(
                        "unbalanced brackets: '[' opened in the value of key '{key}' ('{text}') is \
                         never closed; expected {key}:[a:b,c:d]"
                    )));
                }
            }
        }
    }
}

/// ` (after key:value)` naming the last good entry, to place an error that has no key of its own.
pub(super) fn after_key(last: Option<&(String, Value)>) -> String {
    match last {
        Some((k, v)) => format!(" (after {}:{})", clip(k), clip(v.text())),
        None => String::new(),
    }
}

/// Levenshtein distance, for "did you mean" suggestions (here and in the `torch-arena` command).
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let sub = diag + usize::from(ca != cb);
            diag = row[j + 1];
            row[j + 1] = sub.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

/// The accepted key closest to `key`, if it is close enough to be a typo.
pub(super) fn suggest(key: &str) -> Option<&'static str> {
    let lower = key.to_ascii_lowercase();
    KEY_DEFS
        .iter()
        .map(|k| (edit_distance(&lower, k.name), k.name))
        .filter(|&(d, name)| d <= 3 && d * 3 <= name.len().max(lower.len()))
        .min_by_key(|&(d, _)| d)
        .map(|(_, name)| name)
}

/// The `key:value` entries of settings text in `PYTORCH_CUDA_ALLOC_CONF`'s grammar (the module
/// docs), in order, unchecked against any key table: for other settings written in the same
/// grammar (the native emulation's `--native-conf`). Errors start with `source: `.
pub fn entries(source: &str, text: &str) -> Result<Vec<(String, Value)>> {
    Parser {
        source,
        tokens: tokenize(text),
        pos: 0,
    }
    .entries()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_matches_pytorch() {
        let t = tokenize(" a : [b:1, c] ,d e:Tr ue ");
        let words: Vec<&str> = t.iter().map(Token::text).collect();
        assert_eq!(
            words,
            [
                "a", ":", "[", "b", ":", "1", ",", "c", "]", ",", "de", ":", "True"
            ]
        );
    }

    #[test]
    fn edit_distance_basics() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("sim_capacty_mb", "sim_capacity_mb"), 1);
        assert_eq!(suggest("Stitch"), Some("stitch"));
        assert_eq!(suggest("zzz"), None);
    }
}
