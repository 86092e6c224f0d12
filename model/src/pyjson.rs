//! Strict JSON for request bodies, and Python's `json.dumps(value, ensure_ascii=False)`.
//!
//! The prompt of a structured `state`, goal or label is the text Python's `json.dumps` writes, so
//! the parsed value must keep what Python keeps: object keys in request order, integers of any
//! size exactly as written, and floats as the `f64` nearest to their literal (Python's `float`).
//! `serde_json::Value` cannot do that without `arbitrary_precision` (integers beyond `u64` become
//! floats, and its default float parsing is not always correctly rounded), so this module has its
//! own small parser.
//!
//! [`parse`] rejects everything the upstream contract answers with a 400: invalid UTF-8 or JSON,
//! a byte order mark, trailing bytes, `NaN`/`Infinity`, numbers beyond the `f64` range (`1e400`,
//! and integers too large for an `f64` too, as the upstream native worker does, although Python
//! itself would keep them), lone surrogate escapes, a key repeated in any object, and nesting
//! deeper than [`MAX_DEPTH`].

use std::collections::HashSet;
use std::fmt::{self, Write as _};

/// The deepest nesting accepted. A level is one array or object: `{}` is 1 level, `{"a": []}` is 2.
/// 127 levels parse; a container opened at level 128 is "recursion limit exceeded". That is
/// exactly where `serde_json`'s own default limit triggers (it starts with a budget of 128 and
/// fails when the budget reaches 0, on the 128th nested container), and what the upstream
/// native worker enforces.
pub const MAX_DEPTH: usize = 127;

/// A JSON value as Python's `json.loads` sees it, with object keys in document order.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Value>),
    Object(Object),
}

/// A JSON number: a Python `int` (a literal without fraction or exponent, kept exactly) or a
/// Python `float` (the nearest `f64`).
#[derive(Debug, Clone, PartialEq)]
pub struct Number(NumberRepr);

#[derive(Debug, Clone, PartialEq)]
enum NumberRepr {
    /// The canonical decimal text of the integer: no leading zeros, `-` only when non-zero.
    Int(Box<str>),
    Float(f64),
}

/// A JSON object: keys unique (the parser rejects repeats), in document order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Object {
    entries: Vec<(String, Value)>,
}

/// Why a body is not acceptable JSON, with the 1-based line and column (in characters) where
/// the parser stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub message: String,
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at line {} column {}",
            self.message, self.line, self.column
        )
    }
}

impl std::error::Error for ParseError {}

impl Value {
    /// Python's type name, for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&Object> {
        match self {
            Value::Object(o) => Some(o),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }
}

impl Number {
    /// An integer from its decimal text, or `None` when the text is not `-?[0-9]+`.
    pub fn int(text: &str) -> Option<Number> {
        let digits = text.strip_prefix('-').unwrap_or(text);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let magnitude = digits.trim_start_matches('0');
        Some(Number(NumberRepr::Int(
            match (magnitude.is_empty(), text.starts_with('-')) {
                (true, _) => "0".into(),
                (false, true) => format!("-{magnitude}").into(),
                (false, false) => magnitude.into(),
            },
        )))
    }

    /// A float; `None` for NaN and infinities, which JSON cannot carry.
    pub fn float(x: f64) -> Option<Number> {
        x.is_finite().then_some(Number(NumberRepr::Float(x)))
    }

    pub fn is_integer(&self) -> bool {
        matches!(self.0, NumberRepr::Int(_))
    }

    /// The value as an `f64` (rounded for integers beyond 2^53).
    pub fn as_f64(&self) -> f64 {
        match &self.0 {
            NumberRepr::Int(text) => text.parse().unwrap_or(f64::NAN),
            NumberRepr::Float(x) => *x,
        }
    }
}

/// Python's `repr` of the number: the integer's digits, or [`float_repr`].
impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            NumberRepr::Int(text) => f.write_str(text),
            NumberRepr::Float(x) => f.write_str(&float_repr(*x)),
        }
    }
}

impl Object {
    pub fn new() -> Object {
        Object::default()
    }

    /// Appends a member; `false` (and no change) when the key is already present.
    pub fn insert(&mut self, key: impl Into<String>, value: Value) -> bool {
        let key = key.into();
        if self.get(&key).is_some() {
            return false;
        }
        self.entries.push((key, value));
        true
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }
}

/// Parses one JSON document (any value at the top) strictly; see the module documentation.
pub fn parse(bytes: &[u8]) -> Result<Value, ParseError> {
    let text = match std::str::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let valid = std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default();
            return Err(error_at(valid, valid.len(), "invalid UTF-8"));
        }
    };
    if text.starts_with('\u{feff}') {
        return Err(error_at(text, 0, "byte order mark is not allowed"));
    }
    let mut parser = Parser { text, pos: 0 };
    parser.skip_whitespace();
    let value = parser.value(0)?;
    parser.skip_whitespace();
    if parser.pos != text.len() {
        return Err(parser.error("trailing characters"));
    }
    Ok(value)
}

fn error_at(text: &str, pos: usize, message: &str) -> ParseError {
    let before = &text[..pos];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    ParseError {
        message: message.to_string(),
        line,
        column: before[line_start..].chars().count() + 1,
    }
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
}

/// From this many members on, an object checks for repeated keys with a hash set instead of a
/// scan.
const HASHED_KEYS_FROM: usize = 16;

impl Parser<'_> {
    fn error(&self, message: &str) -> ParseError {
        error_at(self.text, self.pos, message)
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn expect_literal(&mut self, literal: &str) -> Result<(), ParseError> {
        if self.text[self.pos..].starts_with(literal) {
            self.pos += literal.len();
            Ok(())
        } else {
            Err(self.error("expected value"))
        }
    }

    /// One value; `depth` is the number of containers already open around it.
    fn value(&mut self, depth: usize) -> Result<Value, ParseError> {
        match self.peek() {
            None => Err(self.error("EOF while parsing a value")),
            Some(b'n') => self.expect_literal("null").map(|()| Value::Null),
            Some(b't') => self.expect_literal("true").map(|()| Value::Bool(true)),
            Some(b'f') => self.expect_literal("false").map(|()| Value::Bool(false)),
            Some(b'"') => self.string().map(Value::String),
            Some(b'-' | b'0'..=b'9') => self.number().map(Value::Number),
            Some(b'[' | b'{') if depth >= MAX_DEPTH => Err(self.error("recursion limit exceeded")),
            Some(b'[') => self.array(depth + 1),
            Some(b'{') => self.object(depth + 1),
            Some(_) => Err(self.error("expected value")),
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, ParseError> {
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_whitespace();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            self.skip_whitespace();
            items.push(self.value(depth)?);
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                None => return Err(self.error("EOF while parsing a list")),
                Some(_) => return Err(self.error("expected `,` or `]`")),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, ParseError> {
        self.pos += 1;
        let mut entries: Vec<(String, Value)> = Vec::new();
        let mut hashed: Option<HashSet<String>> = None;
        self.skip_whitespace();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(Object { entries }));
        }
        loop {
            self.skip_whitespace();
            match self.peek() {
                Some(b'"') => {}
                None => return Err(self.error("EOF while parsing an object")),
                Some(_) => return Err(self.error("key must be a string")),
            }
            let key_start = self.pos;
            let key = self.string()?;
            let repeated = match &mut hashed {
                Some(set) => !set.insert(key.clone()),
                None => entries.iter().any(|(k, _)| *k == key),
            };
            if repeated {
                let message = format!("duplicate key {}", dumps_str(&key));
                return Err(error_at(self.text, key_start, &message));
            }
            self.skip_whitespace();
            match self.peek() {
                Some(b':') => self.pos += 1,
                None => return Err(self.error("EOF while parsing an object")),
                Some(_) => return Err(self.error("expected `:`")),
            }
            self.skip_whitespace();
            let value = self.value(depth)?;
            if hashed.is_none() && entries.len() + 1 >= HASHED_KEYS_FROM {
                let mut set: HashSet<String> = entries.iter().map(|(k, _)| k.clone()).collect();
                set.insert(key.clone());
                hashed = Some(set);
            }
            entries.push((key, value));
            self.skip_whitespace();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(Object { entries }));
                }
                None => return Err(self.error("EOF while parsing an object")),
                Some(_) => return Err(self.error("expected `,` or `}`")),
            }
        }
    }

    /// A string starting at the opening quote.
    fn string(&mut self) -> Result<String, ParseError> {
        self.pos += 1;
        let mut out = String::new();
        loop {
            let run_start = self.pos;
            self.pos += plain_run(&self.text.as_bytes()[self.pos..]);
            // The run ends at an ASCII byte (or the end), so it is a whole-character slice.
            out.push_str(&self.text[run_start..self.pos]);
            match self.peek() {
                None => return Err(self.error("EOF while parsing a string")),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    self.escape(&mut out)?;
                }
                Some(_) => {
                    return Err(self
                        .error("control character (\\u0000-\\u001F) found while parsing a string"))
                }
            }
        }
    }

    /// One escape sequence, after its backslash.
    fn escape(&mut self, out: &mut String) -> Result<(), ParseError> {
        let Some(b) = self.peek() else {
            return Err(self.error("EOF while parsing a string"));
        };
        self.pos += 1;
        let c = match b {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => self.unicode_escape()?,
            _ => {
                self.pos -= 1;
                return Err(self.error("invalid escape"));
            }
        };
        out.push(c);
        Ok(())
    }

    /// The character of a `\uXXXX` escape (after the `u`), joining a surrogate pair.
    fn unicode_escape(&mut self) -> Result<char, ParseError> {
        let first = self.hex4()?;
        match first {
            0xD800..=0xDBFF => {
                if !self.text[self.pos..].starts_with("\\u") {
                    return Err(self.error("lone leading surrogate in hex escape"));
                }
                self.pos += 2;
                let second = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return Err(self.error("lone leading surrogate in hex escape"));
                }
                let code = 0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00);
                char::from_u32(code).ok_or_else(|| self.error("invalid unicode code point"))
            }
            0xDC00..=0xDFFF => Err(self.error("lone trailing surrogate in hex escape")),
            _ => char::from_u32(first).ok_or_else(|| self.error("invalid unicode code point")),
        }
    }

    fn hex4(&mut self) -> Result<u32, ParseError> {
        let digits = self.text.as_bytes().get(self.pos..self.pos + 4);
        let value = digits.and_then(|d| {
            d.iter().try_fold(0u32, |acc, &b| {
                (b as char).to_digit(16).map(|digit| acc * 16 + digit)
            })
        });
        match value {
            Some(v) => {
                self.pos += 4;
                Ok(v)
            }
            None => Err(self.error("invalid escape")),
        }
    }

    /// A number per the JSON grammar `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, which is
    /// also what Python's decoder matches.
    fn number(&mut self) -> Result<Number, ParseError> {
        let start = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.error("invalid number")),
        }
        let mut is_float = false;
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.error("invalid number"));
            }
            self.digits();
            is_float = true;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.error("invalid number"));
            }
            self.digits();
            is_float = true;
        }
        let literal = &self.text[start..self.pos];
        // Rust's float parsing is correctly rounded, like Python's `float(literal)`.
        let as_float: f64 = literal
            .parse()
            .map_err(|_| error_at(self.text, start, "invalid number"))?;
        if !as_float.is_finite() {
            return Err(error_at(self.text, start, "number out of range"));
        }
        let number = if is_float {
            Number::float(as_float)
        } else {
            Number::int(literal)
        };
        number.ok_or_else(|| error_at(self.text, start, "invalid number"))
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }
}

/// `json.dumps(value, ensure_ascii=False)`: separators `", "` and `": "`, keys in order, strings
/// escaped as Python does, integers exactly, floats as `repr`.
pub fn dumps(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

/// `json.dumps(s, ensure_ascii=False)` of one string, quotes included.
pub fn dumps_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    write_str(&mut out, s);
    out
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(s) => write_str(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(object) => {
            out.push('{');
            for (i, (key, item)) in object.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_str(out, key);
                out.push_str(": ");
                write_value(out, item);
            }
            out.push('}');
        }
    }
}

/// Python's `encode_basestring`: `"` and `\` escaped, `\n \r \t \b \f` by name, other characters
/// below U+0020 as `\u00xx` (lower-case hex); everything else as is (DEL and U+2028 included).
fn write_str(out: &mut String, s: &str) {
    out.push('"');
    let mut run_start = 0;
    for (i, b) in s.bytes().enumerate() {
        let escaped = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0x00..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[run_start..i]);
        if escaped.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(escaped);
        }
        run_start = i + 1;
    }
    out.push_str(&s[run_start..]);
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that read back as the same `f64`, in positional
/// notation when the decimal exponent is in -4..16 and in scientific notation (`1e-05`,
/// `1e+16`, at least two exponent digits) otherwise. Finite values only.
pub fn float_repr(x: f64) -> String {
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    let (digits, exponent) = shortest_digits(x.abs());
    let mut out = String::new();
    if x.is_sign_negative() {
        out.push('-');
    }
    if !(-4..16).contains(&exponent) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let sign = if exponent < 0 { '-' } else { '+' };
        let _ = write!(out, "e{sign}{:02}", exponent.unsigned_abs());
    } else if exponent < 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-exponent - 1) as usize));
        out.push_str(&digits);
    } else {
        let int_len = exponent as usize + 1;
        if digits.len() <= int_len {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', int_len - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..int_len]);
            out.push('.');
            out.push_str(&digits[int_len..]);
        }
    }
    out
}

/// The shortest significant digits that read back as `x` (positive, finite), and the decimal
/// exponent of the first one. Rust's `{:e}` finds the shortest length and, among those, the
/// closest candidate, like Python's `repr`; when two candidates are exactly as close, Python takes
/// the one with an even last digit, which Rust's correctly rounded fixed-precision formatting
/// (round half to even) gives.
fn shortest_digits(x: f64) -> (String, i32) {
    let split = |scientific: &str| {
        let (mantissa, exponent) = scientific
            .split_once('e')
            .expect("`{:e}` always writes an exponent");
        let exponent: i32 = exponent.parse().expect("`{:e}` writes an integer exponent");
        let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
        (digits, exponent)
    };
    let shortest = split(&format!("{x:e}"));
    let rounded = format!("{x:.prec$e}", prec = shortest.0.len() - 1);
    // Where the nearest same-length decimal does not read back as `x` (next to a power of two),
    // the shortest one is the only candidate.
    if rounded.parse::<f64>() == Ok(x) {
        split(&rounded)
    } else {
        shortest
    }
}

/// How many bytes at the start of `rest` a string takes as they are: up to the first quote,
/// backslash or control character (U+0000-U+001F), or all of them. A screenshot's data URL is a
/// string of half a megabyte: quotes and backslashes are found by memchr's vector search, then
/// the run is checked for control characters 64 bytes at a time without branches (which the
/// compiler vectorizes); byte by byte, the scan took 0.3 ms of such a request's preparation.
fn plain_run(rest: &[u8]) -> usize {
    let stop = memchr::memchr2(b'"', b'\\', rest).unwrap_or(rest.len());
    for (i, chunk) in rest[..stop].chunks(64).enumerate() {
        if chunk.iter().fold(false, |found, &b| found | (b < 0x20)) {
            let at = chunk.iter().position(|&b| b < 0x20).expect("found above");
            return i * 64 + at;
        }
    }
    stop
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_are_canonical() {
        assert_eq!(Number::int("-0").unwrap().to_string(), "0");
        assert_eq!(Number::int("007").unwrap().to_string(), "7");
        assert_eq!(Number::int("-12").unwrap().to_string(), "-12");
        assert!(Number::int("1.0").is_none());
        assert!(Number::int("-").is_none());
    }

    /// The plain run byte by byte, as the parser scanned before `plain_run`.
    fn plain_run_bytewise(rest: &[u8]) -> usize {
        rest.iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
            .unwrap_or(rest.len())
    }

    #[test]
    fn the_plain_run_stops_where_the_bytewise_scan_stops() {
        // Stops at every position around the 64-byte chunks, in runs of several lengths.
        for len in [0, 1, 63, 64, 65, 127, 128, 129, 1000] {
            let plain: Vec<u8> = (0..len).map(|i| b"aZ09+/= \xc3\xa9"[i % 10]).collect();
            assert_eq!(plain_run(&plain), len);
            for at in [0, 1, 62, 63, 64, 65, 127, 128, 999] {
                if at >= len {
                    continue;
                }
                for stop in [b'"', b'\\', 0x00, 0x0a, 0x1f] {
                    let mut bytes = plain.clone();
                    bytes[at] = stop;
                    // Another stop later never moves the first.
                    bytes.push(0x01);
                    assert_eq!(plain_run(&bytes), at, "len {len}, {stop:#x} at {at}");
                    assert_eq!(plain_run(&bytes), plain_run_bytewise(&bytes));
                }
            }
        }
        // 0x20 and 0x7f are plain; a control character before a quote stops first.
        assert_eq!(plain_run(b" \x7f\""), 2);
        assert_eq!(plain_run(b"ab\x1fcd\""), 2);
    }

    #[test]
    fn a_long_string_with_a_control_character_is_refused_where_it_is() {
        let mut body = String::from("{\"image\": \"");
        body.push_str(&"A".repeat(100_000));
        let ok = format!("{body}\"}}");
        match parse(ok.as_bytes()).unwrap() {
            Value::Object(o) => assert_eq!(o.entries[0].1, Value::String("A".repeat(100_000))),
            other => panic!("{other:?}"),
        }
        let bad = format!("{body}\tB\"}}");
        let err = parse(bad.as_bytes()).unwrap_err();
        assert!(err.message.starts_with("control character"), "{err}");
        // `{"image": "` is 11 characters: the tab is the 100,012th.
        assert_eq!((err.line, err.column), (1, 11 + 100_000 + 1));
    }

    #[test]
    fn float_constructor_refuses_non_finite() {
        assert!(Number::float(f64::NAN).is_none());
        assert!(Number::float(f64::INFINITY).is_none());
        assert_eq!(Number::float(2.5).unwrap().as_f64(), 2.5);
    }
}
