//! The crate's one JSON writer, for every report it prints (the tracker's exports, the layout;
//! the lab and the command write theirs with serde_json): string escaping, numbers, and an object
//! builder. No serde: the reports are a handful of flat objects and arrays, and the crate keeps
//! its dependencies few.
//!
//! Strings are escaped per RFC 8259: `"` and `\` are escaped, control characters become `\n`,
//! `\t`, `\r`, `\b`, `\f` or `\u00XX`; everything else (all of Unicode) is written as UTF-8.
//!
//! One policy for numbers JSON cannot express: a NaN or an infinity is written as `null` (no
//! value), never as a made-up number. A finite float always reads back as a float (`1048576.0`).

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
/// infinities (which JSON cannot express) become `null`.
pub fn float(f: f64) -> String {
    if f.is_finite() {
        let s = format!("{f:?}");
        if s.contains(['.', 'e', 'E']) {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        "null".to_string()
    }
}

/// A JSON array of items that are already JSON text: `[1, 2]`.
pub fn array(items: impl IntoIterator<Item = String>) -> String {
    let mut out = String::from("[");
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&item);
    }
    out.push(']');
    out
}

/// A JSON object built field by field, in order: `{"a": 1, "b": "x"}`.
pub struct Object(String);

impl Default for Object {
    fn default() -> Self {
        Self::new()
    }
}

impl Object {
    pub fn new() -> Self {
        Object(String::from("{"))
    }

    /// A field whose value is already JSON text (a nested object or array).
    pub fn raw(&mut self, key: &str, value: &str) -> &mut Self {
        if self.0.len() > 1 {
            self.0.push_str(", ");
        }
        push_str(&mut self.0, key);
        self.0.push_str(": ");
        self.0.push_str(value);
        self
    }

    pub fn str(&mut self, key: &str, value: &str) -> &mut Self {
        self.raw(key, &string(value))
    }

    pub fn opt_str(&mut self, key: &str, value: Option<&str>) -> &mut Self {
        match value {
            Some(v) => self.str(key, v),
            None => self.raw(key, "null"),
        }
    }

    pub fn int(&mut self, key: &str, value: i64) -> &mut Self {
        self.raw(key, &value.to_string())
    }

    pub fn num(&mut self, key: &str, value: u64) -> &mut Self {
        self.raw(key, &value.to_string())
    }

    pub fn opt_num(&mut self, key: &str, value: Option<u64>) -> &mut Self {
        match value {
            Some(v) => self.num(key, v),
            None => self.raw(key, "null"),
        }
    }

    /// A float ([`float`]: `null` when not finite).
    pub fn float(&mut self, key: &str, value: f64) -> &mut Self {
        self.raw(key, &float(value))
    }

    pub fn opt_float(&mut self, key: &str, value: Option<f64>) -> &mut Self {
        self.float(key, value.unwrap_or(f64::NAN))
    }

    pub fn bool(&mut self, key: &str, value: bool) -> &mut Self {
        self.raw(key, if value { "true" } else { "false" })
    }

    /// The object's text; the builder is left empty.
    pub fn finish(&mut self) -> String {
        let mut s = std::mem::take(&mut self.0);
        s.push('}');
        s
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
        assert_eq!(float(f64::NAN), "null");
        assert_eq!(float(f64::INFINITY), "null");
    }

    #[test]
    fn objects_keep_field_order_and_escape_keys() {
        let o = Object::new()
            .num("n", 3)
            .str("k\"", "v")
            .opt_num("none", None)
            .float("f", 0.5)
            .bool("b", true)
            .finish();
        assert_eq!(
            o,
            r#"{"n": 3, "k\"": "v", "none": null, "f": 0.5, "b": true}"#
        );
    }
}
