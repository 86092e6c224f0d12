//! The model behind the server, split the way requests use it: a [`Preparer`] (chat template and
//! tokenizer, shared by all request tasks) and one scheduler engine per device (the forward pass
//! and the readout, owned by its engine thread).

use std::path::Path;

use instinct_kernels::{Backend, CpuBackend};
use instinct_model::chat::ChatTemplate;
use instinct_model::decider::{load_text_cpu, Decider, ImagePrompt, Prompt};
use instinct_model::forward::BatchLimits;
use instinct_model::prompt::SYSTEM_PROMPT;
use instinct_model::tokenizer::Tokenizer;
use instinct_scheduler::{Batch, Engine};

/// Renders and tokenizes prompts. Cheap to share: every method takes `&self`.
pub struct Preparer {
    tokenizer: Tokenizer,
    chat: ChatTemplate,
}

impl Preparer {
    /// The chat string of a Cua-S1 question (system prompt + `user`), with the checkpoint's own
    /// template.
    pub fn render(&self, user: &str) -> anyhow::Result<String> {
        self.chat.render(SYSTEM_PROMPT, user)
    }

    /// Encodes a rendered chat string (special-token text becomes the special token; no BOS).
    pub fn tokenize(&self, chat: &str) -> anyhow::Result<Vec<u32>> {
        self.tokenizer.encode(chat)
    }
}

/// The deciders of one device, driven by the scheduler's engine thread: the language model with
/// the text adapter merged, and, when screenshots are served, a second copy with the multimodal
/// adapter's language part merged (the two adapters differ in every language module).
pub struct DeciderEngine<B: Backend> {
    decider: Decider<B>,
    multimodal: Option<Decider<B>>,
}

impl<B> Engine for DeciderEngine<B>
where
    B: Backend + Send + 'static,
    B::Buf: Send,
    B::Idx: Send,
{
    fn run_batch(&mut self, batch: &Batch<'_>) -> anyhow::Result<Vec<Vec<f32>>> {
        // Text and screenshot questions run on different weights: split, run, put back in order.
        let mut text = Vec::new();
        let mut shots = Vec::new();
        for (i, s) in batch.seqs.iter().enumerate() {
            match s.context {
                None => text.push((i, Prompt::text(s.ids, s.n_options))),
                Some(context) => {
                    let image = context
                        .downcast_ref::<ImagePrompt>()
                        .ok_or_else(|| anyhow::anyhow!("unknown sequence context"))?;
                    shots.push((
                        i,
                        Prompt {
                            ids: s.ids,
                            n_options: s.n_options,
                            image: Some(image),
                        },
                    ));
                }
            }
        }
        let mut answers = vec![Vec::new(); batch.seqs.len()];
        if !text.is_empty() {
            let prompts: Vec<Prompt> = text.iter().map(|(_, p)| *p).collect();
            for ((i, _), a) in text.iter().zip(self.decider.decide(&prompts)?) {
                answers[*i] = a;
            }
        }
        if !shots.is_empty() {
            let decider = self
                .multimodal
                .as_mut()
                .ok_or_else(|| anyhow::anyhow!("screenshot question without a multimodal model"))?;
            let prompts: Vec<Prompt> = shots.iter().map(|(_, p)| *p).collect();
            for ((i, _), a) in shots.iter().zip(decider.decide(&prompts)?) {
                answers[*i] = a;
            }
        }
        Ok(answers)
    }
}

/// A loaded model: its preparer and its device engines.
pub struct Loaded {
    pub preparer: Preparer,
    pub engines: Vec<Box<dyn Engine>>,
    /// Bytes of weights the engines hold (f32 on the CPU backend).
    pub weights_bytes: u64,
}

/// Loads a snapshot (and optionally a text adapter, merged at load) onto `cpu_engines` CPU engine
/// threads, each with its own copy of the weights and activation buffers for `limits`.
pub fn load_cpu(
    model_dir: &Path,
    text_adapter: Option<&Path>,
    limits: BatchLimits,
    cpu_engines: usize,
) -> anyhow::Result<Loaded> {
    anyhow::ensure!(cpu_engines >= 1, "at least one engine is needed");
    let mut engines: Vec<Box<dyn Engine>> = Vec::with_capacity(cpu_engines);
    let mut preparer = None;
    let mut weights_bytes = 0;
    for _ in 0..cpu_engines {
        let loaded = load_text_cpu(model_dir, text_adapter, limits)?;
        weights_bytes += loaded.weights_bytes;
        preparer.get_or_insert(Preparer {
            tokenizer: loaded.tokenizer,
            chat: loaded.chat,
        });
        engines.push(Box::new(DeciderEngine::<CpuBackend> {
            decider: loaded.decider,
            multimodal: None,
        }));
    }
    Ok(Loaded {
        preparer: preparer.expect("at least one engine was loaded"),
        engines,
        weights_bytes,
    })
}
