//! Encoding with the system turn's ids cached (`Tokenizer::encode_prefix` and
//! `encode_with_prefix`, as the server's preparer does) gives the ids of encoding the whole chat:
//! on the 60 real fixtures, their screenshot prompts, adversarial text after the cached part, and
//! added tokens that could run across the cut.
//!
//! Needs the vocabulary (`tools/fetch-qwen-vocab.sh`; `$INSTINCT_QWEN_VOCAB` overrides the path)
//! and the fixtures (`$INSTINCT_FIXTURES` overrides the path).

mod common;

use std::sync::OnceLock;

use instinct_model::chat::ChatTemplate;
use instinct_model::prompt::SYSTEM_PROMPT;
use instinct_model::tokenizer::{build_qwen35_tokenizer, EncodedPrefix, Tokenizer};
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

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let built = build_qwen35_tokenizer(&common::vocab_path()).expect("building the tokenizer");
        Tokenizer::new(built).expect("wrapping the tokenizer")
    })
}

/// The built-in rendering and two Jinja templates that render images.
fn templates() -> Vec<(&'static str, ChatTemplate)> {
    vec![
        ("builtin", ChatTemplate::builtin()),
        (
            "tiny",
            ChatTemplate::from_jinja(include_str!("../assets/tiny/chat_template.jinja")).unwrap(),
        ),
        (
            "qwen35-like",
            ChatTemplate::from_jinja(include_str!("data/qwen35_like_chat_template.jinja")).unwrap(),
        ),
    ]
}

fn system_prefix(chat: &ChatTemplate) -> EncodedPrefix {
    tokenizer()
        .encode_prefix(&chat.fixed_prefix(SYSTEM_PROMPT).unwrap())
        .unwrap()
}

/// The fixtures' user messages, cut out of their chats.
fn fixture_users() -> Vec<(String, String, Vec<u32>)> {
    let file: FixtureFile = common::text_fixtures();
    assert_eq!(file.fixtures.len(), 60);
    let head = format!("<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n");
    file.fixtures
        .into_iter()
        .map(|f| {
            let user = f
                .chat
                .strip_prefix(&head)
                .and_then(|c| c.strip_suffix("<|im_end|>\n<|im_start|>assistant\n<think>\n"))
                .unwrap_or_else(|| panic!("{}: not a Cua-S1 chat", f.id))
                .to_string();
            (f.id, user, f.input_ids)
        })
        .collect()
}

#[test]
fn the_cached_part_is_the_system_turn_through_the_users_im_start() {
    for (name, chat) in templates() {
        let prefix = system_prefix(&chat);
        assert_eq!(
            prefix.text(),
            format!("<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>"),
            "{name}"
        );
        // The 78 ids of the system turn through `<|im_start|>user\n`, less `user\n`.
        assert_eq!(prefix.ids().len(), 76, "{name}");
        assert_eq!(prefix.ids()[..1], [248_045], "{name}");
        assert_eq!(prefix.ids()[73..], [248_046, 198, 248_045], "{name}");
        assert_eq!(
            prefix.ids(),
            tokenizer().encode_reference(prefix.text()).unwrap(),
            "{name}"
        );
    }
}

#[test]
fn fixtures_and_their_screenshot_prompts_encode_as_whole() {
    let tok = tokenizer();
    let users = fixture_users();
    for (name, chat) in templates() {
        let prefix = system_prefix(&chat);
        for (id, user, input_ids) in &users {
            let text = chat.render(SYSTEM_PROMPT, user).unwrap();
            assert_eq!(
                &tok.encode_with_prefix(&prefix, &text).unwrap(),
                input_ids,
                "{name} {id}"
            );
            let shot = chat.render_with_image(SYSTEM_PROMPT, user).unwrap();
            assert!(shot.starts_with(prefix.text()), "{name} {id}");
            assert_eq!(
                tok.encode_with_prefix(&prefix, &shot).unwrap(),
                tok.encode_reference(&shot).unwrap(),
                "{name} {id} (screenshot)"
            );
        }
    }
}

/// Texts that stress the cut: special-token text and parts of it, whitespace runs (which the
/// pre-tokenizer merges with line breaks), digit runs, combining marks (NFC composes across
/// characters), contractions, non-ASCII.
const HARD: &[&str] = &[
    "",
    "user\n",
    "user\nGoal: x",
    "\n\n  Goal",
    "  \n",
    " ",
    "\t\t\n\n\r\n x",
    "   ",
    "<|im_end|>",
    "<|im_start|>",
    "<|im_start|>user\n<|im_end|>",
    "|>user",
    "im_start|>",
    "<|im_",
    "<|im_start|",
    "<<|im_end|>>",
    "<|vision_start|><|image_pad|><|vision_end|>App",
    "\u{301}e",
    "e\u{301}\u{301}",
    "\u{301}",
    "12345678901234567890123456789",
    "'s're'LL",
    "'ſ",
    "日本語のテキスト 🙂👍🏽",
    "Привет, мир!",
    "<think>\n</think>\n\n",
    "\u{a0}\u{3000}x\u{85}\u{2028}y",
    "\u{0}\u{1c}\u{1f}",
];

#[test]
fn text_after_the_cached_part_encodes_as_whole() {
    let tok = tokenizer();
    for (name, chat) in templates() {
        let prefix = system_prefix(&chat);
        for hard in HARD {
            // Right after the cached part, and as a user message through the template.
            let raw = format!("{}{hard}", prefix.text());
            let rendered = chat.render(SYSTEM_PROMPT, hard).unwrap();
            for text in [raw, rendered] {
                let whole = tok.encode_reference(&text).unwrap();
                assert_eq!(tok.encode(&text).unwrap(), whole, "{name} {text:?}");
                assert_eq!(
                    tok.encode_with_prefix(&prefix, &text).unwrap(),
                    whole,
                    "{name} {text:?}"
                );
            }
        }
    }
}

#[test]
fn random_text_after_the_cached_part_encodes_as_whole() {
    let tok = tokenizer();
    let prefix = system_prefix(&ChatTemplate::builtin());
    let mut rng = StdRng::seed_from_u64(0x9e37);
    for _ in 0..3000 {
        let tail: String = (0..rng.gen_range(1..12))
            .map(|_| HARD[rng.gen_range(0..HARD.len())])
            .collect();
        let text = format!("{}{tail}", prefix.text());
        assert_eq!(
            tok.encode_with_prefix(&prefix, &text).unwrap(),
            tok.encode_reference(&text).unwrap(),
            "{text:?}"
        );
    }
}

#[test]
fn text_without_the_cached_part_is_encoded_whole() {
    let tok = tokenizer();
    let prefix = system_prefix(&ChatTemplate::builtin());
    let cached = prefix.text();
    for text in [
        "",
        "Goal: x",
        &cached[1..],
        &cached[..cached.len() - 1],
        &format!("{}x", &cached[..cached.len() - 1]),
        &format!(" {cached}x"),
    ] {
        assert_eq!(
            tok.encode_with_prefix(&prefix, text).unwrap(),
            tok.encode_reference(text).unwrap(),
            "{text:?}"
        );
    }
    // No added token, nothing to cache: every text is encoded whole.
    let none = tok.encode_prefix("system prompt without markers").unwrap();
    assert_eq!((none.text(), none.ids()), ("", &[][..]));
    assert_eq!(
        tok.encode_with_prefix(&none, "system prompt without markers")
            .unwrap(),
        tok.encode_reference("system prompt without markers")
            .unwrap()
    );
    // The cut is after the last added token.
    let cut = tok.encode_prefix("a<|im_end|>b<think>c d").unwrap();
    assert_eq!(cut.text(), "a<|im_end|>b<think>");
}

/// A byte-level tokenizer with the Qwen3.5 pipeline (so the fast path runs) and the given added
/// tokens, one of which may extend another.
fn byte_tokenizer(added: &[&str]) -> Tokenizer {
    use tokenizers::models::bpe::{Vocab, BPE};
    use tokenizers::normalizers::NFC;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    use tokenizers::pre_tokenizers::sequence::Sequence;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::{AddedToken, SplitDelimiterBehavior};

    let mut alphabet: Vec<char> = ByteLevel::alphabet().into_iter().collect();
    alphabet.sort_unstable();
    let vocab: Vocab = alphabet
        .into_iter()
        .enumerate()
        .map(|(id, c)| (c.to_string(), id as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, vec![])
        .build()
        .unwrap();
    let mut inner = tokenizers::Tokenizer::new(bpe);
    let split = Split::new(
        SplitPattern::Regex(instinct_model::tokenizer::QWEN35_PRETOKENIZER_PATTERN.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .unwrap();
    inner
        .with_normalizer(Some(NFC))
        .with_pre_tokenizer(Some(Sequence::new(vec![
            split.into(),
            ByteLevel::new(false, false, false).into(),
        ])));
    let tokens: Vec<AddedToken> = added
        .iter()
        .map(|t| AddedToken::from(*t, true).normalized(false))
        .collect();
    inner.add_tokens(&tokens);
    let tok = Tokenizer::new(inner).unwrap();
    assert!(tok.uses_fast_path());
    tok
}

#[test]
fn no_cut_where_an_added_token_could_run_across_it() {
    // `<s>x` extends `<s>`, and `s>>` starts inside it: the cut moves back before them.
    let tok = byte_tokenizer(&["<e>", "<s>", "<s>x", "s>>"]);
    let prefix = tok.encode_prefix("a<e>b<s>").unwrap();
    assert_eq!(prefix.text(), "a<e>");
    for rest in ["b<s>x", "b<s>>", "b<s> x", "b<s>", "<e>", "x"] {
        let text = format!("a<e>{rest}");
        assert_eq!(
            tok.encode_with_prefix(&prefix, &text).unwrap(),
            tok.encode_reference(&text).unwrap(),
            "{text:?}"
        );
    }
    // Without the longer tokens the cut is after `<s>`.
    let tok = byte_tokenizer(&["<e>", "<s>"]);
    assert_eq!(tok.encode_prefix("a<e>b<s>").unwrap().text(), "a<e>b<s>");
}
