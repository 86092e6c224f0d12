//! Shared by the model tests that read the Qwen3.5 vocabulary and the real Cua-S1 fixtures.
#![allow(dead_code)]

use std::path::PathBuf;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Qwen3.5 vocabulary (`tools/fetch-qwen-vocab.sh` installs it; `$INSTINCT_QWEN_VOCAB`
/// overrides the path).
pub fn vocab_path() -> PathBuf {
    instinct_model::checkout::qwen_vocab(&repo_root()).unwrap_or_else(|e| panic!("{e}"))
}

/// The 60 real text fixtures, parsed as `T` (each test reads the fields it needs). From
/// `../shared/fixtures`, or `$INSTINCT_FIXTURES` (the directory or the file).
pub fn text_fixtures<T: serde::de::DeserializeOwned>() -> T {
    let path = instinct_model::checkout::text_fixtures(&repo_root());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "fixtures {}: {e} (set INSTINCT_FIXTURES to the fixtures directory or file)",
            path.display()
        )
    });
    serde_json::from_str(&text).expect("fixture JSON")
}
