//! A loaded decision model: the forward pass plus the letter readout, fed with token ids, and the
//! tokenizer and chat template that make those ids from a prompt.

use std::path::Path;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use instinct_kernels::backend::VisionBackend;
use instinct_kernels::{Backend, CpuBackend};

use crate::chat::ChatTemplate;
use crate::checkpoint::Snapshot;
use crate::forward::{BatchLimits, EmbeddingOverride, SequenceInput, TextModel};
use crate::lora::LoraAdapter;
use crate::readout::LetterReadout;
use crate::tokenizer::{Tokenizer, MAX_LETTERS};
use crate::vision::{VisionConfig, VisionTower, VisionWeights};

/// One question for the model: its prompt ids and how many letters it offers.
#[derive(Clone, Copy, Debug)]
pub struct Prompt<'a> {
    pub ids: &'a [u32],
    pub n_options: usize,
    /// For a screenshot question: the image features and the 3-D positions.
    pub image: Option<&'a ImagePrompt>,
}

impl<'a> Prompt<'a> {
    /// A text question.
    pub fn text(ids: &'a [u32], n_options: usize) -> Self {
        Self {
            ids,
            n_options,
            image: None,
        }
    }
}

/// What a screenshot question adds to its ids: the encoded image, placed at the positions that
/// hold `image_token_id` (in order), and the M-RoPE positions of every token.
#[derive(Debug)]
pub struct ImagePrompt {
    pub image_token_id: u32,
    /// `[image tokens, hidden]`, shared by every question about the same image.
    pub features: std::sync::Arc<Vec<f32>>,
    /// One `[t, h, w]` per token of the prompt.
    pub positions: Vec<[u32; 3]>,
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

    /// The backend the model runs on.
    pub fn backend(&self) -> &B {
        self.model.backend()
    }

    /// See [`TextModel::warm_shapes`].
    pub fn warm_shapes(&mut self) -> Result<Vec<usize>> {
        self.model.warm_shapes()
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
            let inputs: Vec<SequenceInput> = batch
                .iter()
                .map(|p| SequenceInput {
                    token_ids: p.ids,
                    positions: p.image.map(|i| i.positions.as_slice()),
                })
                .collect();
            let overrides: Vec<Option<EmbeddingOverride>> = batch
                .iter()
                .map(|p| {
                    p.image.map(|i| EmbeddingOverride {
                        token_id: i.image_token_id,
                        rows: i.features.as_slice(),
                    })
                })
                .collect();
            let hidden = self
                .model
                .forward_last_with_embeddings(&inputs, &overrides)?;
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
    load_text(CpuBackend::new(), model_dir, text_adapter, limits)
}

/// Milliseconds since `t0`, for the load-phase log lines.
fn ms_since(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

/// Loads a snapshot (and optionally a text adapter merged at load, in f32) onto `backend`.
pub fn load_text<B: Backend>(
    backend: B,
    model_dir: &Path,
    text_adapter: Option<&Path>,
    limits: BatchLimits,
) -> Result<LoadedText<B>> {
    // Each phase is logged with its time: loading is slow enough (seconds) that an operator
    // should see where it goes.
    let t0 = Instant::now();
    let snapshot = Snapshot::open(model_dir)
        .with_context(|| format!("opening snapshot {}", model_dir.display()))?;
    let mut weights = snapshot.load_text_weights()?;
    tracing::info!(
        values = weights.element_count(),
        ms = ms_since(t0),
        "text weights read (f32 on the host)"
    );
    if let Some(dir) = text_adapter {
        let t0 = Instant::now();
        let adapter =
            LoraAdapter::open(dir).with_context(|| format!("opening adapter {}", dir.display()))?;
        let report = adapter.merge_into_text_only(&mut weights)?;
        tracing::info!(
            modules = report.merged.len(),
            ms = ms_since(t0),
            "text adapter merged"
        );
    }
    let tokenizer = Tokenizer::from_snapshot(model_dir)?;
    let chat = ChatTemplate::from_snapshot(model_dir)?;
    let letter_ids = tokenizer.letter_ids(MAX_LETTERS)?;
    let readout = LetterReadout::from_embedding(&weights.embed_tokens, letter_ids)?;
    let weights_bytes = 4 * weights.element_count() as u64;
    ensure!(limits.max_tokens > 0, "max batch tokens must be positive");
    let t0 = Instant::now();
    let backend_name = backend.name();
    let model = TextModel::new(backend, &snapshot.config().text, &weights, limits)?;
    tracing::info!(
        backend = backend_name,
        ms = ms_since(t0),
        "weights uploaded and activations allocated"
    );
    Ok(LoadedText {
        tokenizer,
        chat,
        decider: Decider::new(model, readout),
        weights_bytes,
    })
}

/// The screenshot path loaded from a snapshot: the language model with the multimodal adapter's
/// language modules merged, and the vision tower with its vision modules merged.
pub struct LoadedMultimodal<B: VisionBackend> {
    pub decider: Decider<B>,
    pub vision: VisionTower<B>,
    /// Id of `<|image_pad|>` in the prompt (from the config).
    pub image_token_id: u32,
}

/// Loads the screenshot path onto the CPU reference backend. Every key of the adapter must land
/// on a language or a vision weight.
pub fn load_multimodal_cpu(
    model_dir: &Path,
    adapter_dir: &Path,
    limits: BatchLimits,
) -> Result<LoadedMultimodal<CpuBackend>> {
    let snapshot = Snapshot::open(model_dir)
        .with_context(|| format!("opening snapshot {}", model_dir.display()))?;
    let config = snapshot.config();
    let vision_json = config
        .vision
        .as_ref()
        .context("the snapshot has no vision_config: it cannot answer screenshot questions")?;
    let image_token_id = config
        .image_token_id
        .context("config.json has no image_token_id")?;
    let vision_config = VisionConfig::from_json(vision_json)?;
    let mut weights = snapshot.load_text_weights()?;
    let adapter = LoraAdapter::open(adapter_dir)
        .with_context(|| format!("opening adapter {}", adapter_dir.display()))?;
    let report = adapter.merge_into_text(&mut weights)?;
    let mut vision_weights = VisionWeights::load(&snapshot, &vision_config)?;
    let merged_vision = vision_weights.merge_lora(&report.vision)?;
    tracing::info!(
        language = report.merged.len(),
        vision = merged_vision,
        "multimodal adapter merged"
    );
    let tokenizer = Tokenizer::from_snapshot(model_dir)?;
    let readout =
        LetterReadout::from_embedding(&weights.embed_tokens, tokenizer.letter_ids(MAX_LETTERS)?)?;
    let model = TextModel::new(CpuBackend::new(), &config.text, &weights, limits)?;
    let vision = VisionTower::new(CpuBackend::new(), &vision_config, &vision_weights)?;
    Ok(LoadedMultimodal {
        decider: Decider::new(model, readout),
        vision,
        image_token_id,
    })
}
