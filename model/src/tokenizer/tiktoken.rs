//! A tiktoken-format BPE vocabulary (one `base64(token bytes) rank` pair per line) and the merge
//! list that makes a Hugging Face BPE model behave exactly like tiktoken's rank-ordered BPE.
//!
//! tiktoken has no merge list: it repeatedly merges the adjacent pair whose concatenation is a
//! token of lowest rank (leftmost on ties). Inside any pre-token, the bytes that end up as token `t`
//! go through exactly the merges that rank-ordered BPE makes on `t`'s own bytes, so `t` can only
//! form from the last pair that BPE joins there. One merge per token, that pair, with the priority
//! of `t`'s rank, makes a Hugging Face BPE model behave like tiktoken. Note the pair's parts may
//! rank after `t` itself (this vocabulary is not rank-monotone), so the BPE on `t`'s bytes must use
//! every rank, not only those below `t`'s. Tokens whose bytes BPE does not join into one can never
//! be formed by merging; tiktoken still emits them when a whole pre-token equals them, which the
//! BPE model's `ignore_merges` reproduces.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, ensure, Context, Result};
use base64::Engine as _;

/// The vocabulary: token bytes indexed by rank (ranks are dense, `0..len`).
pub struct TiktokenVocab {
    tokens: Vec<Vec<u8>>,
}

/// One merge: the ranks of the left and right parts and of the token they make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Merge {
    pub left: u32,
    pub right: u32,
    pub merged: u32,
}

/// Rank used for "this pair is not a token".
const NO_RANK: u32 = u32::MAX;

impl TiktokenVocab {
    /// Reads a `.tiktoken` file.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading tiktoken vocabulary {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// Parses `.tiktoken` text. Ranks must be unique and dense from 0, token bytes unique, and every
    /// single byte must be a token (byte-level BPE needs the whole byte alphabet).
    pub fn parse(text: &str) -> Result<Self> {
        let mut by_rank: Vec<Option<Vec<u8>>> = Vec::new();
        let mut count = 0usize;
        for (line_no, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let mut fields = line.split_ascii_whitespace();
            let (Some(encoded), Some(rank), None) = (fields.next(), fields.next(), fields.next())
            else {
                bail!("line {}: expected `<base64> <rank>`", line_no + 1);
            };
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .with_context(|| format!("line {}: invalid base64", line_no + 1))?;
            ensure!(!bytes.is_empty(), "line {}: empty token", line_no + 1);
            let rank: usize = rank
                .parse()
                .with_context(|| format!("line {}: invalid rank {rank:?}", line_no + 1))?;
            ensure!(
                rank < u32::MAX as usize,
                "line {}: rank too large",
                line_no + 1
            );
            if by_rank.len() <= rank {
                by_rank.resize(rank + 1, None);
            }
            ensure!(
                by_rank[rank].is_none(),
                "line {}: rank {rank} appears twice",
                line_no + 1
            );
            by_rank[rank] = Some(bytes);
            count += 1;
        }
        ensure!(count > 0, "empty vocabulary");
        let tokens = by_rank
            .into_iter()
            .enumerate()
            .map(|(rank, t)| {
                t.with_context(|| format!("rank {rank} is missing (ranks must be dense)"))
            })
            .collect::<Result<Vec<_>>>()?;
        let vocab = Self { tokens };
        let index = vocab.rank_index();
        ensure!(index.len() == vocab.tokens.len(), "duplicate token bytes");
        for byte in 0..=255u8 {
            ensure!(
                index.contains_key(&[byte][..]),
                "byte 0x{byte:02x} is not a token"
            );
        }
        Ok(vocab)
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// The bytes of the token of rank `rank`.
    pub fn token(&self, rank: u32) -> &[u8] {
        &self.tokens[rank as usize]
    }

    fn rank_index(&self) -> HashMap<&[u8], u32> {
        self.tokens
            .iter()
            .enumerate()
            .map(|(rank, bytes)| (bytes.as_slice(), rank as u32))
            .collect()
    }

    /// The merge list, ordered by the rank of the merged token (see the module comment). Tokens
    /// that BPE cannot form get no merge.
    pub fn derive_merges(&self) -> Vec<Merge> {
        let index = self.rank_index();
        let mut merges = Vec::with_capacity(self.tokens.len());
        let mut scratch = BpeScratch::default();
        for (rank, bytes) in self.tokens.iter().enumerate() {
            if bytes.len() < 2 {
                continue;
            }
            if let Some(split) = scratch.last_split(&index, bytes) {
                merges.push(Merge {
                    left: index[&bytes[..split]],
                    right: index[&bytes[split..]],
                    merged: rank as u32,
                });
            }
        }
        merges
    }
}

/// Buffers reused across tokens by the merge derivation.
#[derive(Default)]
struct BpeScratch {
    /// Part `i` is `bytes[starts[i]..starts[i + 1]]`; the last entry is `bytes.len()`.
    starts: Vec<usize>,
    /// `pair_ranks[i]`: rank of parts `i` and `i + 1` joined, or `NO_RANK`.
    pair_ranks: Vec<u32>,
}

impl BpeScratch {
    /// Runs rank-ordered BPE on `bytes` (a token, so two parts left always join into it) until
    /// two parts remain and returns where they meet, or `None` when it gets stuck before that.
    fn last_split(&mut self, index: &HashMap<&[u8], u32>, bytes: &[u8]) -> Option<usize> {
        let rank_of =
            |from: usize, to: usize| index.get(&bytes[from..to]).copied().unwrap_or(NO_RANK);
        self.starts.clear();
        self.starts.extend(0..=bytes.len());
        self.pair_ranks.clear();
        self.pair_ranks
            .extend((0..bytes.len() - 1).map(|i| rank_of(i, i + 2)));
        while self.starts.len() > 3 {
            // Lowest rank, leftmost on ties (as tiktoken).
            let (best, &best_rank) = self
                .pair_ranks
                .iter()
                .enumerate()
                .min_by_key(|&(i, &r)| (r, i))?;
            if best_rank == NO_RANK {
                return None;
            }
            self.starts.remove(best + 1);
            self.pair_ranks.remove(best);
            let s = &self.starts;
            if best > 0 {
                self.pair_ranks[best - 1] = rank_of(s[best - 1], s[best + 1]);
            }
            if best + 2 < s.len() {
                self.pair_ranks[best] = rank_of(s[best], s[best + 2]);
            }
        }
        Some(self.starts[1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vocabulary with all 256 bytes at ranks 0..256 (rank = byte) plus `extra` tokens after.
    fn vocab_with(extra: &[&[u8]]) -> TiktokenVocab {
        let engine = base64::engine::general_purpose::STANDARD;
        let mut text = String::new();
        for b in 0..=255u8 {
            text += &format!("{} {b}\n", engine.encode([b]));
        }
        for (i, t) in extra.iter().enumerate() {
            text += &format!("{} {}\n", engine.encode(t), 256 + i);
        }
        TiktokenVocab::parse(&text).unwrap()
    }

    #[test]
    fn merges_follow_rank_order_bpe() {
        // "ab" 256, "bc" 257, "abc" 258, "cd" 259, "abcd" 260. "abc" is (ab, c): ab beats bc.
        // "abcd" goes ab, then abc (258 beats cd 259), so its merge is (abc, d), not (ab, cd).
        let v = vocab_with(&[b"ab", b"bc", b"abc", b"cd", b"abcd"]);
        let m = |l: u32, r: u32, t: u32| Merge {
            left: l,
            right: r,
            merged: t,
        };
        let (a, b, c, d) = (b'a' as u32, b'b' as u32, b'c' as u32, b'd' as u32);
        assert_eq!(
            v.derive_merges(),
            vec![
                m(a, b, 256),
                m(b, c, 257),
                m(256, c, 258),
                m(c, d, 259),
                m(258, d, 260)
            ]
        );
    }

    #[test]
    fn a_part_may_rank_after_the_token_it_forms() {
        // "abc" 256 forms from "ab" 257: its merge comes first, with a part of higher rank.
        let v = vocab_with(&[b"abc", b"ab"]);
        let m = |l: u32, r: u32, t: u32| Merge {
            left: l,
            right: r,
            merged: t,
        };
        let (a, b, c) = (b'a' as u32, b'b' as u32, b'c' as u32);
        assert_eq!(v.derive_merges(), vec![m(257, c, 256), m(a, b, 257)]);
    }

    #[test]
    fn unreachable_token_gets_no_merge() {
        // No pair inside "xyz" is a token, so BPE cannot form it.
        let v = vocab_with(&[b"q1", b"xyz", b"q2"]);
        let merged: Vec<u32> = v.derive_merges().iter().map(|m| m.merged).collect();
        assert_eq!(merged, vec![256, 258]);
    }

    #[test]
    fn rejects_bad_vocabularies() {
        assert!(TiktokenVocab::parse("").is_err());
        assert!(TiktokenVocab::parse("YQ== 0\nYg== 0\n").is_err());
        assert!(TiktokenVocab::parse("YQ== 1\n").is_err());
        assert!(TiktokenVocab::parse("not-base64! 0\n").is_err());
        // Missing most single bytes.
        assert!(TiktokenVocab::parse("YQ== 0\nYg== 1\n").is_err());
    }
}
