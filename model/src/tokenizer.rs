//! The tokenizer: a snapshot's `tokenizer.json` loaded with Hugging Face `tokenizers` (the library
//! transformers runs), plus what Cua-S1 needs from it: plain encoding with no added special tokens,
//! the ids of the option letters, and the ids of the vision markers.
//!
//! `build_qwen35_tokenizer` makes the Qwen3.5 `tokenizer.json` from the public vocabulary for
//! checkpoints that come without one.

mod byte_level;
mod fast_encode;
mod piece_cache;
mod qwen35;
mod tiktoken;

use std::path::Path;
use std::sync::Arc;

use anyhow::{anyhow, bail, ensure, Context, Result};

pub use qwen35::{
    build_qwen35_tokenizer, QWEN35_ADDED_TOKENS, QWEN35_FIRST_ADDED_ID, QWEN35_PRETOKENIZER_PATTERN,
};

/// The most options a prompt can letter (A..Z).
pub const MAX_LETTERS: usize = 26;

/// Ids of the chat and vision marker tokens, where the vocabulary has them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MarkerIds {
    pub endoftext: Option<u32>,
    pub im_start: Option<u32>,
    pub im_end: Option<u32>,
    pub vision_start: Option<u32>,
    pub vision_end: Option<u32>,
    pub image_pad: Option<u32>,
    pub video_pad: Option<u32>,
    pub think: Option<u32>,
    pub think_end: Option<u32>,
}

/// A fixed leading text and its ids (see [`Tokenizer::encode_prefix`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EncodedPrefix {
    text: String,
    ids: Vec<u32>,
}

impl EncodedPrefix {
    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}

/// A loaded tokenizer with the option-letter ids resolved.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Set when the pipeline is the Qwen3.5 one; shared by clones (with its piece cache).
    fast: Option<Arc<fast_encode::FastEncoder>>,
    letter_ids: [u32; MAX_LETTERS],
    markers: MarkerIds,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("fast_path", &self.fast.is_some())
            .field("letter_ids", &self.letter_ids)
            .field("markers", &self.markers)
            .finish()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` from a snapshot directory.
    pub fn from_snapshot(dir: &Path) -> Result<Self> {
        Self::from_file(&dir.join("tokenizer.json"))
    }

    /// Loads a `tokenizer.json` file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| anyhow!("loading tokenizer {}: {e}", path.display()))?;
        Self::new(inner).with_context(|| format!("tokenizer {}", path.display()))
    }

    /// Wraps a `tokenizers::Tokenizer`. Fails unless each of "A".."Z" encodes to exactly one
    /// token, since the readout reads one logit per option letter.
    pub fn new(inner: tokenizers::Tokenizer) -> Result<Self> {
        let mut letter_ids = [0u32; MAX_LETTERS];
        for (slot, letter) in letter_ids.iter_mut().zip('A'..='Z') {
            let ids = encode_plain(&inner, &letter.to_string())?;
            let [id] = ids[..] else {
                bail!(
                    "option letter {letter:?} encodes to {} tokens {ids:?}; the readout needs exactly one",
                    ids.len()
                );
            };
            *slot = id;
        }
        let id = |token: &str| inner.token_to_id(token);
        let markers = MarkerIds {
            endoftext: id("<|endoftext|>"),
            im_start: id("<|im_start|>"),
            im_end: id("<|im_end|>"),
            vision_start: id("<|vision_start|>"),
            vision_end: id("<|vision_end|>"),
            image_pad: id("<|image_pad|>"),
            video_pad: id("<|video_pad|>"),
            think: id("<think>"),
            think_end: id("</think>"),
        };
        let fast = match fast_encode::FastEncoder::for_tokenizer(&inner) {
            Ok(fast) => Some(Arc::new(fast)),
            Err(reason) => {
                tracing::info!(
                    "tokenizer: not the Qwen3.5 pipeline, encoding with Hugging Face ({reason})"
                );
                None
            }
        };
        Ok(Self {
            inner,
            fast,
            letter_ids,
            markers,
        })
    }

    /// Token ids of `text`, adding no special tokens. Special-token text inside `text` (for
    /// example `<|im_end|>`) becomes that token, as in transformers.
    ///
    /// For the Qwen3.5 pipeline this runs an exact fast path (see `fast_encode`: the same ids,
    /// some 30x faster on real prompts); other pipelines use Hugging Face `encode`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match self.fast_path() {
            Some((fast, bpe)) => {
                let mut ids = Vec::new();
                fast.encode_into(bpe, text, &mut ids)?;
                Ok(ids)
            }
            None => encode_plain(&self.inner, text),
        }
    }

    /// The leading part of `text` after which encoding restarts, with its ids, for
    /// [`Tokenizer::encode_with_prefix`]: up to the end of the last added token in `text` that no
    /// added token can extend (empty when there is none, or off the fast path, where the rule is
    /// not checked). For a chat, the rendered system turn through the next `<|im_start|>`.
    pub fn encode_prefix(&self, text: &str) -> Result<EncodedPrefix> {
        let Some((fast, _)) = self.fast_path() else {
            return Ok(EncodedPrefix::default());
        };
        let text = &text[..fast.restart_point(text)];
        Ok(EncodedPrefix {
            text: text.to_string(),
            ids: self.encode(text)?,
        })
    }

    /// The ids of `text`, equal to [`Tokenizer::encode`]'s: when `text` starts with `prefix`
    /// (made by this tokenizer's [`Tokenizer::encode_prefix`]), its ids are taken as they are and
    /// only the rest is encoded.
    pub fn encode_with_prefix(&self, prefix: &EncodedPrefix, text: &str) -> Result<Vec<u32>> {
        match (self.fast_path(), text.strip_prefix(prefix.text.as_str())) {
            (Some((fast, bpe)), Some(rest)) if !prefix.text.is_empty() => {
                let mut ids = Vec::with_capacity(prefix.ids.len() + rest.len() / 3 + 1);
                ids.extend_from_slice(&prefix.ids);
                fast.encode_into(bpe, rest, &mut ids)?;
                Ok(ids)
            }
            _ => self.encode(text),
        }
    }

    fn fast_path(&self) -> Option<(&fast_encode::FastEncoder, &tokenizers::models::bpe::BPE)> {
        match (&self.fast, self.inner.get_model()) {
            (Some(fast), tokenizers::models::ModelWrapper::BPE(bpe)) => Some((fast, bpe)),
            _ => None,
        }
    }

    /// Token ids of `text` from Hugging Face `encode`, whatever the pipeline (the reference the
    /// fast path is tested against).
    pub fn encode_reference(&self, text: &str) -> Result<Vec<u32>> {
        encode_plain(&self.inner, text)
    }

    /// Whether `encode` runs the fast path.
    pub fn uses_fast_path(&self) -> bool {
        self.fast.is_some()
    }

    /// Text of `ids`, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| anyhow!("decoding {} ids: {e}", ids.len()))
    }

    /// Ids of the first `n` option letters A, B, … (`n` ≤ 26).
    pub fn letter_ids(&self, n: usize) -> Result<&[u32]> {
        ensure!(
            n <= MAX_LETTERS,
            "{n} options, but only {MAX_LETTERS} letters (A..Z) exist"
        );
        Ok(&self.letter_ids[..n])
    }

    /// Ids of the chat and vision markers.
    pub fn markers(&self) -> &MarkerIds {
        &self.markers
    }

    /// Id of one token given by its text (added tokens by their content, BPE tokens in the
    /// byte-level alphabet).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

fn encode_plain(tokenizer: &tokenizers::Tokenizer, text: &str) -> Result<Vec<u32>> {
    let encoding = tokenizer
        .encode(text, false)
        .map_err(|e| anyhow!("encoding {} bytes of text: {e}", text.len()))?;
    Ok(encoding.get_ids().to_vec())
}
