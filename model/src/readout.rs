//! The Cua-S1 letter readout: the last hidden state against the (tied) embedding rows of the
//! offered answer letters, softmax over those letters only.
//!
//! The rows are copied out of the f32 embedding at load, so the readout never touches the full
//! vocabulary. Logits are accumulated in f64 and the softmax is computed in f64, then returned as
//! f32 probabilities.

use anyhow::{ensure, Result};

use crate::weights::HostTensor;

/// Qwen3.5 token ids of the single-character tokens `A`..`Z` (each letter encodes to one token;
/// the byte-level vocabulary puts them at 32..=57).
pub const QWEN_LETTER_TOKEN_IDS: [u32; 26] = {
    let mut ids = [0u32; 26];
    let mut i = 0;
    while i < 26 {
        ids[i] = 32 + i as u32;
        i += 1;
    }
    ids
};

/// The readout's answer for one question.
#[derive(Clone, Debug, PartialEq)]
pub struct LetterDecision {
    /// Probability of each offered letter, in order; sums to 1.
    pub probabilities: Vec<f32>,
    /// Index of the first largest probability.
    pub choice: usize,
    /// `max(0, 1 − H(p) / ln n)`, 1 when only one letter is offered.
    pub confidence: f64,
}

/// Letter rows of the embedding, ready to score hidden states.
#[derive(Clone, Debug)]
pub struct LetterReadout {
    hidden: usize,
    /// `[letters, hidden]`
    rows: Vec<f32>,
}

impl LetterReadout {
    /// Copies the rows `letter_ids` (in answer order: A, B, …) out of `embed` (`[vocab, hidden]`).
    pub fn from_embedding(embed: &HostTensor, letter_ids: &[u32]) -> Result<Self> {
        ensure!(
            embed.shape.len() == 2,
            "embedding must be 2-D, got shape {:?}",
            embed.shape
        );
        let (vocab, hidden) = (embed.shape[0], embed.shape[1]);
        ensure!(!letter_ids.is_empty(), "no letter ids");
        let mut rows = Vec::with_capacity(letter_ids.len() * hidden);
        for &id in letter_ids {
            let id = id as usize;
            ensure!(
                id < vocab,
                "letter token id {id} is outside the vocabulary ({vocab})"
            );
            rows.extend_from_slice(&embed.data[id * hidden..(id + 1) * hidden]);
        }
        Ok(Self { hidden, rows })
    }

    /// How many letters can be offered.
    pub fn max_letters(&self) -> usize {
        self.rows.len() / self.hidden.max(1)
    }

    /// Logits of the first `n` letters for one final-normed hidden state, in f64.
    pub fn logits(&self, hidden_state: &[f32], n: usize) -> Result<Vec<f64>> {
        ensure!(
            hidden_state.len() == self.hidden,
            "hidden state has {} values, expected {}",
            hidden_state.len(),
            self.hidden
        );
        ensure!(
            (1..=self.max_letters()).contains(&n),
            "{n} letters offered, the readout has 1..={}",
            self.max_letters()
        );
        Ok(self
            .rows
            .chunks_exact(self.hidden)
            .take(n)
            .map(|row| {
                row.iter()
                    .zip(hidden_state)
                    .map(|(&w, &x)| f64::from(w) * f64::from(x))
                    .sum()
            })
            .collect())
    }

    /// Softmax over the first `n` letters.
    pub fn probabilities(&self, hidden_state: &[f32], n: usize) -> Result<Vec<f32>> {
        let logits = self.logits(hidden_state, n)?;
        ensure!(
            logits.iter().all(|l| l.is_finite()),
            "non-finite letter logits"
        );
        let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let exps: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
        let total: f64 = exps.iter().sum();
        Ok(exps.iter().map(|e| (e / total) as f32).collect())
    }

    /// Probabilities, choice and confidence over the first `n` letters.
    pub fn decide(&self, hidden_state: &[f32], n: usize) -> Result<LetterDecision> {
        let probabilities = self.probabilities(hidden_state, n)?;
        Ok(LetterDecision {
            choice: first_argmax(&probabilities),
            confidence: confidence(&probabilities),
            probabilities,
        })
    }
}

/// Index of the first maximum.
pub fn first_argmax(p: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in p.iter().enumerate() {
        if v > p[best] {
            best = i;
        }
    }
    best
}

/// `max(0, 1 − H(p) / ln n)` in f64 (natural-log entropy); 1 for a single option.
pub fn confidence(p: &[f32]) -> f64 {
    let n = p.len();
    if n <= 1 {
        return 1.0;
    }
    let entropy: f64 = p
        .iter()
        .map(|&x| f64::from(x))
        .filter(|&x| x > 0.0)
        .map(|x| -x * x.ln())
        .sum();
    (1.0 - entropy / (n as f64).ln()).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letter_ids_are_a_to_z() {
        assert_eq!(QWEN_LETTER_TOKEN_IDS[0], 32);
        assert_eq!(QWEN_LETTER_TOKEN_IDS[25], 57);
    }

    #[test]
    fn readout_scores_gathered_rows() {
        // vocab 4, hidden 2; letters are ids 3 and 1.
        let embed = HostTensor::new(vec![4, 2], vec![0., 0., 1., 0., 0., 0., 0., 2.]);
        let r = LetterReadout::from_embedding(&embed, &[3, 1]).unwrap();
        assert_eq!(r.logits(&[0.5, 1.0], 2).unwrap(), vec![2.0, 0.5]);
        let d = r.decide(&[0.5, 1.0], 2).unwrap();
        let e = (1.5f64).exp();
        assert!((d.probabilities[0] as f64 - e / (1.0 + e)).abs() < 1e-7);
        assert_eq!(d.choice, 0);
        assert!(r.decide(&[0.5, 1.0], 3).is_err());
        assert!(r.decide(&[0.5], 1).is_err());
        assert!(LetterReadout::from_embedding(&embed, &[4]).is_err());
        assert_eq!(r.decide(&[0.5, 1.0], 1).unwrap().confidence, 1.0);
    }

    #[test]
    fn confidence_and_ties() {
        assert_eq!(confidence(&[0.25; 4]), 0.0);
        assert_eq!(confidence(&[1.0, 0.0, 0.0]), 1.0);
        let c = confidence(&[0.7, 0.3]);
        let h = -(0.7f64 * 0.7f64.ln() + 0.3 * 0.3f64.ln());
        assert!((c - (1.0 - h / 2f64.ln())).abs() < 1e-6);
        assert_eq!(first_argmax(&[0.4, 0.4, 0.2]), 0);
        assert_eq!(first_argmax(&[0.2, 0.4, 0.4]), 1);
    }
}
