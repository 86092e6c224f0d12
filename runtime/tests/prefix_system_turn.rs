//! The system-turn boundary prefix reuse snapshots, found with the real Qwen3.5 tokenizer and
//! Cua-S1's template, is a prefix of all 60 real Cua-S1 prompts' ids: so every real text prompt
//! resumes from that one snapshot.
//!
//! Needs the vocabulary (`tools/fetch-qwen-vocab.sh`; `$INSTINCT_QWEN_VOCAB` overrides the path)
//! and the fixtures (`$INSTINCT_FIXTURES` overrides the path).

use std::path::PathBuf;

use instinct::prefix_reuse::system_prefix_ids;
use instinct_model::chat::ChatTemplate;
use instinct_model::checkout;
use instinct_model::tokenizer::{build_qwen35_tokenizer, Tokenizer};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn the_system_turn_is_a_prefix_of_every_real_prompt() {
    let vocab = checkout::qwen_vocab(&repo_root()).unwrap();
    let tokenizer = Tokenizer::new(build_qwen35_tokenizer(&vocab).unwrap()).unwrap();
    let system = system_prefix_ids(&tokenizer, &ChatTemplate::builtin()).unwrap();

    let path = checkout::text_fixtures(&repo_root());
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let prompts: Vec<Vec<u32>> = file["fixtures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| serde_json::from_value(f["input_ids"].clone()).unwrap())
        .collect();
    assert_eq!(prompts.len(), 60);
    let common = prompts
        .iter()
        .map(|p| {
            p.iter()
                .zip(&prompts[0])
                .take_while(|(a, b)| a == b)
                .count()
        })
        .min()
        .unwrap();
    // 78 ids: the system turn through `<|im_start|>user\n` (the fixtures all have a goal, so
    // they share `Goal:` too: 80).
    assert_eq!(system.len(), 78);
    assert_eq!(system[75..], [248045, 846, 198], "<|im_start|>user\n");
    assert_eq!(common, 80);
    assert!(prompts.iter().all(|p| p.starts_with(&system)));
}
