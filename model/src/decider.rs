//! A loaded decision model: the forward pass plus the letter readout, fed with token ids, and the
//! tokenizer and chat template that make those ids from a prompt.

use std::path::Path;

use anyhow::{ensure, Context, Result};
use instinct_kernels::{Backend, CpuBackend};

use crate::chat::ChatTemplate;
use crate::checkpoint::Snapshot;
use crate::forward::{BatchLimits, SequenceInput, TextModel};
use crate::lora::LoraAdapter;
use crate::readout::LetterReadout;
use crate::tokenizer::{Tokenizer, MAX_LETTERS};

/// One question for the model: its prompt ids and how many letters it offers.
#[derive(Clone, Copy, Debug)]
pub struct Prompt<'a> {
    pub ids: &'a [u32],
    pub n_options: usize,
}

/// The forward pass and the readout of one device.
pub struct Decider<B: Backend> {
    model: TextModel<B>,
    readout: LetterReadout,
}

impl<B: Backend> Decider<B> {
    pub fn new(model: TextModel<B>, readout: LetterReadout) -> Self {
        Self { model, readout }
    }

    /// The largest batch one forward pass takes.
    pub fn limits(&self) -> BatchLimits {
        self.model.limits()
    }

    /// Probabilities of each prompt's first `n_options` letters. Prompts are packed into as few
    /// forward passes as the batch limits allow; a prompt's answer does not depend on what else
    /// shares its pass.
    pub fn decide(&mut self, prompts: &[Prompt<'_>]) -> Result<Vec<Vec<f32>>> {
        let limits = self.model.limits();
        let mut answers = Vec::with_capacity(prompts.len());
        let mut start = 0;
        while start < prompts.len() {
            let mut end = start;
            let mut tokens = 0;
            while end < prompts.len()
                && end - start < limits.max_seqs
                && (end == start || tokens + prompts[end].ids.len() <= limits.max_tokens)
            {
                tokens += prompts[end].ids.len();
                end += 1;
            }
            let batch = &prompts[start..end];
            let inputs: Vec<SequenceInput> =
                batch.iter().map(|p| SequenceInput::text(p.ids)).collect();
            let hidden = self.model.forward_last(&inputs)?;
            for (prompt, h) in batch.iter().zip(&hidden) {
                answers.push(self.readout.probabilities(h, prompt.n_options)?);
            }
            start = end;
        }
        Ok(answers)
    }
}

/// Everything loaded from a snapshot for the text path.
pub struct LoadedText<B: Backend> {
    pub tokenizer: Tokenizer,
    pub chat: ChatTemplate,
    pub decider: Decider<B>,
    /// Bytes of the weights as loaded (f32 host tensors before upload).
    pub weights_bytes: u64,
}

/// Loads a snapshot (and optionally a text adapter merged at load) onto the CPU reference
/// backend.
pub fn load_text_cpu(
    model_dir: &Path,
    text_adapter: Option<&Path>,
    limits: BatchLimits,
) -> Result<LoadedText<CpuBackend>> {
    let snapshot = Snapshot::open(model_dir)
        .with_context(|| format!("opening snapshot {}", model_dir.display()))?;
    let mut weights = snapshot.load_text_weights()?;
    if let Some(dir) = text_adapter {
        let adapter =
            LoraAdapter::open(dir).with_context(|| format!("opening adapter {}", dir.display()))?;
        let report = adapter.merge_into_text_only(&mut weights)?;
        tracing::info!(modules = report.merged.len(), "text adapter merged");
    }
    let tokenizer = Tokenizer::from_snapshot(model_dir)?;
    let chat = ChatTemplate::from_snapshot(model_dir)?;
    let letter_ids = tokenizer.letter_ids(MAX_LETTERS)?;
    let readout = LetterReadout::from_embedding(&weights.embed_tokens, letter_ids)?;
    let weights_bytes = 4 * weights.element_count() as u64;
    ensure!(limits.max_tokens > 0, "max batch tokens must be positive");
    let model = TextModel::new(CpuBackend::new(), &snapshot.config().text, &weights, limits)?;
    Ok(LoadedText {
        tokenizer,
        chat,
        decider: Decider::new(model, readout),
        weights_bytes,
    })
}
