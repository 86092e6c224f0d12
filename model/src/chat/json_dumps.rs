//! Python's `json.dumps` layout for the chat template's `tojson` filter: `", "` and `": "`
//! separators (or `","` at line ends when indenting), optional indentation, key sorting and
//! ASCII escaping, and no HTML escaping (MiniJinja's own `tojson` escapes `<`, `>`, `&`, `'`).

use std::fmt::Write as _;

use serde_json::Value;

/// The `json.dumps` options `tojson` supports.
pub struct Style {
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl Style {
    /// `separators` defaults as in Python: `(", ", ": ")`, or `(",", ": ")` with an indent.
    pub fn new(
        indent: Option<usize>,
        separators: Option<(String, String)>,
        sort_keys: bool,
        ensure_ascii: bool,
    ) -> Self {
        let (item_separator, key_separator) = separators.unwrap_or_else(|| {
            let item = if indent.is_some() { "," } else { ", " };
            (item.to_string(), ": ".to_string())
        });
        Self {
            indent: indent.map(|n| " ".repeat(n)),
            item_separator,
            key_separator,
            sort_keys,
            ensure_ascii,
        }
    }
}

/// `json.dumps(value, …)` with the given style.
pub fn dumps(value: &Value, style: &Style) -> String {
    let mut out = String::new();
    write_value(&mut out, value, style, 0);
    out
}

fn write_value(out: &mut String, value: &Value, style: &Style, depth: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => write_string(out, s, style.ensure_ascii),
        Value::Array(items) => {
            write_container(out, '[', ']', items.iter(), style, depth, |out, item| {
                write_value(out, item, style, depth + 1)
            })
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            write_container(
                out,
                '{',
                '}',
                entries.into_iter(),
                style,
                depth,
                |out, (k, v)| {
                    write_string(out, k, style.ensure_ascii);
                    out.push_str(&style.key_separator);
                    write_value(out, v, style, depth + 1);
                },
            )
        }
    }
}

fn write_container<T>(
    out: &mut String,
    open: char,
    close: char,
    items: impl ExactSizeIterator<Item = T>,
    style: &Style,
    depth: usize,
    mut write_item: impl FnMut(&mut String, T),
) {
    out.push(open);
    if items.len() == 0 {
        out.push(close);
        return;
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(indent) = &style.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
    };
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push_str(&style.item_separator);
        }
        newline(out, depth + 1);
        write_item(out, item);
    }
    newline(out, depth);
    out.push(close);
}

/// A JSON string literal as Python writes it: `"` and `\` escaped, `\n`-style escapes for the
/// usual control characters, `\u00XX` for the others, and with `ensure_ascii` every non-ASCII
/// character as `\uXXXX` (UTF-16 units).
fn write_string(out: &mut String, s: &str, ensure_ascii: bool) {
    if !ensure_ascii {
        // The request renderer already writes exactly this form.
        out.push_str(&crate::pyjson::dumps_str(s));
        return;
    }
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
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn python_layouts() {
        let v = json!({"b": [1, "x<y>&'z'"], "a": {"é": null, "t": true}, "e": []});
        let plain = Style::new(None, None, false, false);
        assert_eq!(
            dumps(&v, &plain),
            r#"{"b": [1, "x<y>&'z'"], "a": {"é": null, "t": true}, "e": []}"#
        );
        // Python sorts keys by code point: "t" before "é".
        let sorted_ascii = Style::new(None, None, true, true);
        assert_eq!(
            dumps(&v, &sorted_ascii),
            r#"{"a": {"t": true, "\u00e9": null}, "b": [1, "x<y>&'z'"], "e": []}"#
        );
        let indented = Style::new(Some(2), None, false, false);
        assert_eq!(
            dumps(&json!({"k": [1, 2], "s": "a\nb\u{1}"}), &indented),
            "{\n  \"k\": [\n    1,\n    2\n  ],\n  \"s\": \"a\\nb\\u0001\"\n}"
        );
        let compact = Style::new(None, Some((",".into(), ":".into())), false, true);
        assert_eq!(
            dumps(&json!({"x": "🙂"}), &compact),
            r#"{"x":"\ud83d\ude42"}"#
        );
    }
}
