//! The preparer (chat template, then the tokenizer with the system turn's ids cached) gives the
//! `input_ids` of all 60 real Cua-S1 fixtures, with the built-in rendering and with the tiny
//! checkpoint's Jinja template.
//!
//! Needs the vocabulary (`tools/fetch-qwen-vocab.sh`; `$INSTINCT_QWEN_VOCAB` overrides the path)
//! and the fixtures (`$INSTINCT_FIXTURES` overrides the path).

use std::path::PathBuf;

use instinct::engine::Preparer;
use instinct_model::chat::ChatTemplate;
use instinct_model::checkout;
use instinct_model::prompt::SYSTEM_PROMPT;
use instinct_model::tokenizer::{build_qwen35_tokenizer, Tokenizer};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_preparer_gives_every_fixtures_input_ids() {
    let vocab = checkout::qwen_vocab(&repo_root()).unwrap();
    let tokenizer = Tokenizer::new(build_qwen35_tokenizer(&vocab).unwrap()).unwrap();
    let path = checkout::text_fixtures(&repo_root());
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let fixtures = file["fixtures"].as_array().unwrap();
    assert_eq!(fixtures.len(), 60);
    let head = format!("<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n");
    let tiny = repo_root().join("model/assets/tiny/chat_template.jinja");
    let templates = [
        ChatTemplate::builtin(),
        ChatTemplate::from_jinja(&std::fs::read_to_string(tiny).unwrap()).unwrap(),
    ];
    for chat in templates {
        let preparer = Preparer::text_only(tokenizer.clone(), chat);
        for f in fixtures {
            let user = f["chat"]
                .as_str()
                .and_then(|c| c.strip_prefix(&head))
                .and_then(|c| c.strip_suffix("<|im_end|>\n<|im_start|>assistant\n<think>\n"))
                .unwrap();
            let expected: Vec<u32> = serde_json::from_value(f["input_ids"].clone()).unwrap();
            let ids = preparer.tokenize(&preparer.render(user).unwrap()).unwrap();
            assert_eq!(ids, expected, "{}", f["id"]);
        }
    }
}
