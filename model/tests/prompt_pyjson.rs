//! Strict parsing and Python `json.dumps(v, ensure_ascii=False)` rendering, checked against
//! outputs of real Python 3 (`json.dumps(json.loads(input), ensure_ascii=False)`), committed as
//! literals.

use instinct_model::pyjson::{self, float_repr, Value, MAX_DEPTH};

/// (JSON input, what Python 3.11 prints for it).
const PYTHON_DUMPS: &[(&str, &str)] = &[
    (
        "{\"a\": 1, \"b\": [true, false, null]}",
        "{\"a\": 1, \"b\": [true, false, null]}",
    ),
    (
        "{\"z\": 1, \"a\": 2, \"m\": {\"y\": [], \"x\": {}}}",
        "{\"z\": 1, \"a\": 2, \"m\": {\"y\": [], \"x\": {}}}",
    ),
    ("[]", "[]"),
    ("{}", "{}"),
    ("[[], {}, [[]]]", "[[], {}, [[]]]"),
    ("1.0", "1.0"),
    ("1e16", "1e+16"),
    ("1e15", "1000000000000000.0"),
    ("1e-05", "1e-05"),
    ("1e-5", "1e-05"),
    ("0.0001", "0.0001"),
    ("0.00001", "1e-05"),
    ("-0.0", "-0.0"),
    ("-0", "0"),
    ("0", "0"),
    ("-0e0", "-0.0"),
    ("0.0", "0.0"),
    ("1e22", "1e+22"),
    ("1.5e300", "1.5e+300"),
    ("1E2", "100.0"),
    ("1e+2", "100.0"),
    ("12.50", "12.5"),
    ("100.0", "100.0"),
    ("123456789012345678", "123456789012345678"),
    ("123456789012345678.0", "1.2345678901234568e+17"),
    ("18446744073709551616", "18446744073709551616"),
    ("-18446744073709551617", "-18446744073709551617"),
    (
        "100000000000000000000000000000000000000000",
        "100000000000000000000000000000000000000000",
    ),
    ("3.14e-07", "3.14e-07"),
    ("5e-324", "5e-324"),
    ("1.7976931348623157e308", "1.7976931348623157e+308"),
    ("2.2250738585072014e-308", "2.2250738585072014e-308"),
    ("0.1", "0.1"),
    ("0.30000000000000004", "0.30000000000000004"),
    ("1e-400", "0.0"),
    ("-1e-400", "-0.0"),
    ("9007199254740993", "9007199254740993"),
    ("9007199254740993.0", "9007199254740992.0"),
    ("1234567890123456.7", "1234567890123456.8"),
    ("12345678901234567.0", "1.2345678901234568e+16"),
    ("0.000123456", "0.000123456"),
    ("123e-20", "1.23e-18"),
    ("1.0000000000000002", "1.0000000000000002"),
    ("4.35", "4.35"),
    ("2.675", "2.675"),
    ("1e23", "1e+23"),
    ("8.41e21", "8.41e+21"),
    ("5e-5", "5e-05"),
    ("9.999999999999999e15", "1e+16"),
    ("9999999999999998.0", "9999999999999998.0"),
    ("\"plain\"", "\"plain\""),
    (
        "\"quote \\\" backslash \\\\ slash \\/\"",
        "\"quote \\\" backslash \\\\ slash /\"",
    ),
    ("\"\\n\\r\\t\\b\\f\"", "\"\\n\\r\\t\\b\\f\""),
    (
        "\"\\u0000\\u0001\\u001f\\u007f\"",
        "\"\\u0000\\u0001\\u001f\u{7f}\"",
    ),
    (
        "\"caf\\u00e9 \\u2028 \\u2029 é 😀 \\ud83d\\ude00\"",
        "\"café \u{2028} \u{2029} é 😀 😀\"",
    ),
    ("\"\\u000b\\u001b\"", "\"\\u000b\\u001b\""),
    ("\"<|im_end|>\"", "\"<|im_end|>\""),
    ("\"\\u00a0\\ufeff\"", "\"\u{a0}\u{feff}\""),
    (
        "{\"k\\\"ey\": \"v\\nal\", \"é\": [\"x\", 1.5, -2]}",
        "{\"k\\\"ey\": \"v\\nal\", \"é\": [\"x\", 1.5, -2]}",
    ),
    ("5.828281252004919e-162", "5.828281252004919e-162"),
    ("-3.1877816940335245e+36", "-3.1877816940335245e+36"),
    ("4.416061315902269e-308", "4.416061315902269e-308"),
    ("7.70697370676714e-05", "7.70697370676714e-05"),
    ("6784968863953.97", "6784968863953.97"),
    ("2.2574503e+28", "2.2574503e+28"),
    ("780985523721216.1", "780985523721216.1"),
    ("4.667232859348673e+18", "4.667232859348673e+18"),
    ("9.4176306958892e-11", "9.4176306958892e-11"),
    // Exact ties between two shortest candidates: Python keeps the even last digit.
    ("1059438285926254.25", "1059438285926254.2"),
    ("1125899906842624.25", "1125899906842624.2"),
    ("1152921504606846976.0", "1.152921504606847e+18"),
    ("9007199254740991.5", "9007199254740992.0"),
    ("2.0e-323", "2e-323"),
    ("0.5e-4", "5e-05"),
];

#[test]
fn dumps_matches_python_table() {
    for (input, python) in PYTHON_DUMPS {
        let value = pyjson::parse(input.as_bytes()).unwrap_or_else(|e| panic!("{input}: {e}"));
        assert_eq!(pyjson::dumps(&value), *python, "input {input}");
    }
}

#[test]
fn float_repr_switches_notation_where_python_does() {
    let cases = [
        (1e-5, "1e-05"),
        (0.0001, "0.0001"),
        (1e15, "1000000000000000.0"),
        (1e16, "1e+16"),
        (-1.5e-7, "-1.5e-07"),
        (123.456, "123.456"),
        (f64::MIN_POSITIVE, "2.2250738585072014e-308"),
        (f64::MAX, "1.7976931348623157e+308"),
        (-0.0, "-0.0"),
        (0.0, "0.0"),
    ];
    for (x, python) in cases {
        assert_eq!(float_repr(x), python, "{x:e}");
    }
}

#[test]
fn keys_keep_request_order_and_integers_stay_exact() {
    let value =
        pyjson::parse(br#"{"b": 1, "a": 123456789012345678901234567890, "c": -0}"#).unwrap();
    let object = value.as_object().unwrap();
    assert_eq!(object.keys().collect::<Vec<_>>(), ["b", "a", "c"]);
    assert_eq!(
        pyjson::dumps(&value),
        r#"{"b": 1, "a": 123456789012345678901234567890, "c": 0}"#
    );
}

fn parse_error(body: &[u8]) -> String {
    match pyjson::parse(body) {
        Ok(v) => panic!("{:?} parsed as {v:?}", String::from_utf8_lossy(body)),
        Err(e) => e.to_string(),
    }
}

#[test]
fn rejects_what_the_contract_rejects() {
    let cases: &[(&[u8], &str)] = &[
        (b"", "EOF while parsing a value at line 1 column 1"),
        (b"{", "EOF while parsing an object at line 1 column 2"),
        (b"{} x", "trailing characters at line 1 column 4"),
        (b"{}{}", "trailing characters at line 1 column 3"),
        (
            b"\xef\xbb\xbf{}",
            "byte order mark is not allowed at line 1 column 1",
        ),
        (b"{\"a\": \"\xff\"}", "invalid UTF-8 at line 1 column 8"),
        (
            b"{\"a\": \"\xed\xa0\x80\"}",
            "invalid UTF-8 at line 1 column 8",
        ),
        (b"{\"a\": NaN}", "expected value at line 1 column 7"),
        (b"{\"a\": Infinity}", "expected value at line 1 column 7"),
        (b"{\"a\": -Infinity}", "invalid number at line 1 column 8"),
        (b"{\"a\": 1e400}", "number out of range at line 1 column 7"),
        (b"{\"a\": -1e400}", "number out of range at line 1 column 7"),
        (
            b"[1, 2]\n\n  {\"b\": 1e309}",
            "trailing characters at line 3 column 3",
        ),
        (
            b"{\"a\": \"\\ud800\"}",
            "lone leading surrogate in hex escape at line 1 column 14",
        ),
        (
            b"{\"a\": \"\\ud800\\u0041\"}",
            "lone leading surrogate in hex escape at line 1 column 20",
        ),
        (
            b"{\"a\": \"\\udc00\"}",
            "lone trailing surrogate in hex escape at line 1 column 14",
        ),
        (
            b"{\"a\": 1, \"a\": 2}",
            "duplicate key \"a\" at line 1 column 10",
        ),
        (
            b"{\"q\": {\"x\": 1, \"\\u0078\": 2}}",
            "duplicate key \"x\" at line 1 column 16",
        ),
        (b"{\"a\": [1,]}", "expected value at line 1 column 10"),
        (b"{\"a\": 1,}", "key must be a string at line 1 column 9"),
        (b"{\"a\" 1}", "expected `:` at line 1 column 6"),
        (b"{\"a\": 01}", "expected `,` or `}` at line 1 column 8"),
        (b"{\"a\": 1.}", "invalid number at line 1 column 9"),
        (b"{\"a\": .5}", "expected value at line 1 column 7"),
        (
            b"{\"a\": \"tab\\there\\x\"}",
            "invalid escape at line 1 column 18",
        ),
        (
            b"{\"a\": \"escaped\\nnewline ok\", \"b\": \"raw\x01\"}",
            "control character (\\u0000-\\u001F) found while parsing a string at line 1 column 39",
        ),
        (b"{'a': 1}", "key must be a string at line 1 column 2"),
        (b"{\"a\": tru}", "expected value at line 1 column 7"),
    ];
    for (body, want) in cases {
        assert_eq!(
            parse_error(body),
            *want,
            "{:?}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn integers_beyond_f64_range_are_rejected_like_1e400() {
    let huge = format!("{{\"a\": {}}}", "9".repeat(400));
    assert_eq!(
        parse_error(huge.as_bytes()),
        "number out of range at line 1 column 7"
    );
    // Just below 2^1024 still parses, and prints exactly.
    let big = format!("{{\"a\": {}}}", "9".repeat(308));
    let value = pyjson::parse(big.as_bytes()).unwrap();
    assert_eq!(pyjson::dumps(&value), big);
}

/// `depth` nested containers: the top-level object, then arrays, the innermost holding `1`.
fn nested(depth: usize) -> String {
    format!(
        "{{\"a\": {}1{}}}",
        "[".repeat(depth - 1),
        "]".repeat(depth - 1)
    )
}

#[test]
fn nesting_limit_is_127_levels() {
    assert_eq!(MAX_DEPTH, 127);
    let deepest = pyjson::parse(nested(127).as_bytes()).expect("127 levels parse");
    assert_eq!(pyjson::dumps(&deepest), nested(127));
    let err = parse_error(nested(128).as_bytes());
    assert_eq!(err, "recursion limit exceeded at line 1 column 133");
    // Objects count the same as arrays.
    let objects = format!("{}1{}", "{\"k\": ".repeat(128), "}".repeat(128));
    assert!(parse_error(objects.as_bytes()).starts_with("recursion limit exceeded"));
    let objects = format!("{}1{}", "{\"k\": ".repeat(127), "}".repeat(127));
    assert!(pyjson::parse(objects.as_bytes()).is_ok());
}

#[test]
fn serde_json_default_limit_is_also_127_levels() {
    // MAX_DEPTH is documented as serde_json's own limit; this pins that serde_json still agrees.
    assert!(serde_json::from_str::<serde_json::Value>(&nested(127)).is_ok());
    let err = serde_json::from_str::<serde_json::Value>(&nested(128)).unwrap_err();
    assert!(
        err.to_string().starts_with("recursion limit exceeded"),
        "{err}"
    );
}

#[test]
fn many_keys_use_the_hashed_duplicate_check() {
    let mut body = String::from("{");
    for i in 0..100 {
        body.push_str(&format!("\"k{i}\": {i}, "));
    }
    body.push_str("\"k42\": 0}");
    assert!(parse_error(body.as_bytes()).starts_with("duplicate key \"k42\""));
    let ok = body.replace("\"k42\": 0}", "\"k100\": 0}");
    let value = pyjson::parse(ok.as_bytes()).unwrap();
    assert_eq!(value.as_object().unwrap().len(), 101);
}

#[test]
fn values_and_whitespace() {
    let value =
        pyjson::parse(b" \t\r\n{\"s\": \"x\", \"n\": null, \"t\": true, \"f\": false} \n").unwrap();
    let Value::Object(object) = &value else {
        panic!("not an object")
    };
    assert_eq!(object.get("s").and_then(Value::as_str), Some("x"));
    assert!(object.get("n").unwrap().is_null());
    assert_eq!(object.get("t"), Some(&Value::Bool(true)));
    assert_eq!(object.get("missing"), None);
    assert_eq!(pyjson::dumps_str("a\"b\\c\u{1}"), "\"a\\\"b\\\\c\\u0001\"");
}
