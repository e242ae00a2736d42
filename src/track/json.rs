//! A minimal JSON writer for the report exports (no serde: the crate keeps its dependencies few).
//!
//! Strings are escaped per RFC 8259: `"` and `\` are escaped, control characters become `\n`,
//! `\t`, `\r`, `\b`, `\f` or `\u00XX`; everything else (all of Unicode) is written as UTF-8.

use std::fmt::Write as _;

/// Append `s` to `out` as a JSON string literal, quotes included.
pub fn push_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `s` as a JSON string literal.
pub fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    push_str(&mut out, s);
    out
}

/// A finite float as a JSON number that always reads back as a float (`1048576.0`); NaN and
/// infinities (which JSON cannot express) become `0.0`.
pub fn float(f: f64) -> String {
    if f.is_finite() {
        let s = format!("{f:?}");
        if s.contains(['.', 'e', 'E']) {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        "0.0".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_escaped() {
        assert_eq!(string("a\"b\\c\nd\u{1}é"), "\"a\\\"b\\\\c\\nd\\u0001é\"");
    }

    #[test]
    fn floats_keep_a_point() {
        assert_eq!(float(1048576.0), "1048576.0");
        assert_eq!(float(0.5), "0.5");
        assert_eq!(float(f64::NAN), "0.0");
    }
}
