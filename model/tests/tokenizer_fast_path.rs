//! `Tokenizer::encode`'s fast path gives exactly Hugging Face `encode`'s ids: on the 60 real
//! fixture chats (and their `input_ids`), on hand-picked edge cases, and on seeded random text built
//! to hit the pre-tokenizer's, NFC's and the added tokens' corner cases. Pipelines it does not
//! reproduce fall back to Hugging Face `encode`.
//!
//! The Qwen3.5 tests need the vocabulary (`tools/fetch-qwen-vocab.sh`, or `$INSTINCT_QWEN_VOCAB`),
//! as `tokenizer_qwen35.rs` does; the tiny-tokenizer tests need nothing.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use instinct_model::tokenizer::{build_qwen35_tokenizer, Tokenizer, QWEN35_ADDED_TOKENS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;

#[derive(Deserialize)]
struct FixtureFile {
    fixtures: Vec<Fixture>,
}

#[derive(Deserialize)]
struct Fixture {
    id: String,
    chat: String,
    input_ids: Vec<u32>,
}

fn fixtures() -> &'static [Fixture] {
    static FIXTURES: OnceLock<FixtureFile> = OnceLock::new();
    &FIXTURES
        .get_or_init(|| {
            let file: FixtureFile = common::text_fixtures();
            assert_eq!(file.fixtures.len(), 60, "fixture count");
            file
        })
        .fixtures
}

/// The Qwen3.5 tokenizer as a server loads it: saved to `tokenizer.json` and read back.
fn qwen35() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let built = build_qwen35_tokenizer(&common::vocab_path()).expect("building the tokenizer");
        let dir = tempfile::tempdir().unwrap();
        built
            .save(dir.path().join("tokenizer.json"), false)
            .unwrap();
        Tokenizer::from_snapshot(dir.path()).expect("loading the saved tokenizer")
    })
}

fn tiny_json() -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/tiny/tokenizer.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn tokenizer_from_json(json: &serde_json::Value) -> Tokenizer {
    let inner: tokenizers::Tokenizer = serde_json::to_string(json).unwrap().parse().unwrap();
    Tokenizer::new(inner).unwrap()
}

/// Asserts the fast path and Hugging Face agree on every text; returns how many were checked.
fn assert_same_ids<'a>(tok: &Tokenizer, texts: impl IntoIterator<Item = &'a str>) -> usize {
    assert!(tok.uses_fast_path());
    let mut checked = 0;
    for text in texts {
        assert_eq!(
            tok.encode(text).unwrap(),
            tok.encode_reference(text).unwrap(),
            "{text:?}"
        );
        checked += 1;
    }
    checked
}

/// Text that starts the pre-tokenizer's alternatives, NFC's compositions and the added tokens'
/// matching at odd places.
const FRAGMENTS: &[&str] = &[
    "Hello",
    " world",
    "x",
    "the",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\r\n",
    "\r",
    "\n\n",
    " \n",
    "  \n ",
    "\r\r\n",
    "\x0b",
    "\x0c",
    "\u{85}",
    "\u{a0}",
    "\u{2028}",
    "\u{3000}",
    "\u{feff}",
    "\u{200e}",
    "\u{202a}",
    "\u{202c}",
    "'s",
    "'S",
    "'t",
    "'re",
    "'RE",
    "'Ve",
    "'m",
    "'ll",
    "'Ll",
    "'LL",
    "'d",
    "'D",
    "'",
    "''",
    "'x",
    "'ſ",
    "ſ",
    "'r",
    "'l",
    "don't",
    "I'M",
    "0",
    "7",
    "42",
    "12345",
    "3.14",
    "١٢٣",
    "½",
    "Ⅻ",
    "²",
    "e\u{301}",
    "\u{301}",
    "\u{308}",
    "a\u{308}\u{301}",
    "Å",
    "\u{212b}",
    "\u{1100}\u{1161}\u{11a8}",
    "한국어",
    "日本語",
    "のテキスト",
    "Привет",
    "мир",
    "Ünïcödé",
    "नमस्ते",
    "مرحبا",
    "ไทย",
    "🙂",
    "👍🏽",
    "🇫🇷",
    "𝔘𝔫𝔦",
    "\u{1f600}",
    "...",
    "->",
    "—",
    "–",
    "“",
    "”",
    "‘",
    "’",
    "«",
    "»",
    "¶",
    "©",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
    ":",
    ";",
    ",",
    ".",
    "!",
    "?",
    "\"",
    "#",
    "$",
    "%",
    "&",
    "*",
    "+",
    "-",
    "/",
    "<",
    "=",
    ">",
    "@",
    "\\",
    "^",
    "_",
    "`",
    "|",
    "~",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<|endoftext|>",
    "<|image_pad|>",
    "<tool_call>",
    "<|im_",
    "<|",
    "|>",
    "<think",
    "im_end|>",
    "<|im_start|<|im_end|>",
    "\u{f0b7}",
    "\u{0}",
    "ﬁ",
    "İ",
    "ß",
    "K",
];

fn random_fragment_text(rng: &mut StdRng) -> String {
    let count = rng.gen_range(0..24);
    (0..count)
        .map(|_| FRAGMENTS[rng.gen_range(0..FRAGMENTS.len())])
        .collect()
}

/// Characters from anywhere in Unicode, weighted toward ASCII and the ranges with marks, spaces
/// and numbers, so character classes come from every plane.
fn random_char_text(rng: &mut StdRng) -> String {
    let count = rng.gen_range(1..40);
    (0..count)
        .map(|_| loop {
            let code = match rng.gen_range(0..6) {
                0 | 1 => rng.gen_range(0x00..0x80),
                2 => rng.gen_range(0x80..0x800),
                3 => rng.gen_range(0x800..0x3400),
                4 => rng.gen_range(0x3400..0x10000),
                _ => rng.gen_range(0x10000..0x110000),
            };
            if let Some(c) = char::from_u32(code) {
                break c;
            }
        })
        .collect()
}

#[test]
fn qwen35_fast_path_matches_the_fixtures() {
    let tok = qwen35();
    assert!(tok.uses_fast_path(), "{tok:?}");
    for fixture in fixtures() {
        let ids = tok.encode(&fixture.chat).unwrap();
        assert_eq!(ids, fixture.input_ids, "{}", fixture.id);
        assert_eq!(ids, tok.encode_reference(&fixture.chat).unwrap());
        // Again, now from the piece cache.
        assert_eq!(tok.encode(&fixture.chat).unwrap(), fixture.input_ids);
    }
}

#[test]
fn qwen35_fast_path_matches_on_edge_cases() {
    let added: Vec<String> = QWEN35_ADDED_TOKENS
        .iter()
        .flat_map(|&(token, _)| {
            [
                token.to_string(),
                format!("x{token}y"),
                format!(" {token} "),
                format!("{token}{token}"),
                format!("\n{token}\n"),
                token[..token.len() - 1].to_string(),
            ]
        })
        .collect();
    let fixed = [
        "",
        " ",
        "\n",
        "x<|im_end|>y",
        "<|im_start|><|im_end|>",
        "<|im_",
        "<|im_start|>user\nhi<think>\n</think><|image_pad|>",
        "e\u{301}",
        "e\u{301}<|im_end|>\u{301}",
        "\u{301}",
        "caf\u{65}\u{301} 'S 'Ll 'll 'LL's",
        "trailing   ",
        "spaces   \n  before newlines \r\n\r\n  ",
        "a\r\n\r\n\tb",
        "🙂👍🏽 emoji𝔘 and 1234567890",
        "'ſ 'ſt don'ſ Ǆ",
    ];
    let checked = assert_same_ids(
        qwen35(),
        fixed
            .iter()
            .copied()
            .chain(FRAGMENTS.iter().copied())
            .chain(added.iter().map(String::as_str)),
    );
    assert!(checked > 300, "{checked}");
}

#[test]
fn qwen35_fast_path_matches_on_random_text() {
    let mut rng = StdRng::seed_from_u64(0x0071_5335);
    let mut texts: Vec<String> = (0..3000).map(|_| random_fragment_text(&mut rng)).collect();
    texts.extend((0..1500).map(|_| random_char_text(&mut rng)));
    assert_eq!(
        assert_same_ids(qwen35(), texts.iter().map(String::as_str)),
        4500
    );
}

#[test]
fn qwen35_fast_path_is_consistent_across_threads() {
    let tok = qwen35().clone();
    let handles: Vec<_> = (0..4)
        .map(|seed| {
            let tok = tok.clone();
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed);
                for _ in 0..200 {
                    let text = random_fragment_text(&mut rng);
                    assert_eq!(
                        tok.encode(&text).unwrap(),
                        tok.encode_reference(&text).unwrap()
                    );
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
}

/// The tiny demo tokenizer has the Qwen3.5 pipeline with a small vocabulary (and no vocabulary
/// file is needed): the fast path applies and agrees, unknown bytes included.
#[test]
fn tiny_tokenizer_fast_path_matches() {
    let tok = tokenizer_from_json(&tiny_json());
    let mut rng = StdRng::seed_from_u64(7);
    let mut texts: Vec<String> = (0..1000).map(|_| random_fragment_text(&mut rng)).collect();
    texts.extend((0..500).map(|_| random_char_text(&mut rng)));
    assert_eq!(
        assert_same_ids(&tok, texts.iter().map(String::as_str)),
        1500
    );
}

#[test]
fn other_pipelines_fall_back_to_hugging_face() {
    type Edit = fn(&mut serde_json::Value);
    let edits: [(&str, Edit); 6] = [
        ("NFKC normalizer", |j| {
            j["normalizer"] = serde_json::json!({"type": "NFKC"})
        }),
        ("no normalizer", |j| {
            j["normalizer"] = serde_json::Value::Null
        }),
        ("another split pattern", |j| {
            j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\s+|\S+".into()
        }),
        ("byte-level with its own regex", |j| {
            j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true.into()
        }),
        ("an lstrip added token", |j| {
            j["added_tokens"][2]["lstrip"] = true.into()
        }),
        ("a normalized added token", |j| {
            j["added_tokens"][2]["normalized"] = true.into()
        }),
    ];
    let texts = [
        "Hello  world<|im_end|> \u{ff21} e\u{301} 'LL",
        " <|im_end|>x",
        "",
    ];
    for (name, edit) in edits {
        let mut json = tiny_json();
        edit(&mut json);
        let tok = tokenizer_from_json(&json);
        assert!(!tok.uses_fast_path(), "{name}");
        for text in texts {
            assert_eq!(
                tok.encode(text).unwrap(),
                tok.encode_reference(text).unwrap(),
                "{name}: {text:?}"
            );
        }
    }
}
