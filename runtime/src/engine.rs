//! What the HTTP layer needs from a loaded model: prompt rendering, tokenization and decisions.
//! The server is written against [`Engine`] so the same code serves the CPU reference and, later,
//! the GPU backend.

use std::path::Path;

use instinct_kernels::CpuBackend;
use instinct_model::chat::ChatTemplate;
use instinct_model::decider::{load_text_cpu, Decider, Prompt};
use instinct_model::forward::BatchLimits;
use instinct_model::prompt::SYSTEM_PROMPT;
use instinct_model::tokenizer::Tokenizer;
use parking_lot::Mutex;

/// One question ready for the model: its prompt token ids and how many options it offers.
#[derive(Clone, Debug)]
pub struct PromptInput {
    pub ids: Vec<u32>,
    pub n_options: usize,
}

/// A loaded decision model.
pub trait Engine: Send + Sync + 'static {
    /// The chat string of a Cua-S1 question (system prompt + `user`), with the checkpoint's own
    /// template.
    fn render(&self, user: &str) -> anyhow::Result<String>;

    /// Encodes a rendered chat string (special-token text becomes the special token; no BOS).
    fn tokenize(&self, chat: &str) -> anyhow::Result<Vec<u32>>;

    /// Runs one forward pass per prompt and returns, per prompt, the probabilities of its first
    /// `n_options` letters (f32, summing to 1).
    fn decide(&self, prompts: &[PromptInput]) -> anyhow::Result<Vec<Vec<f32>>>;
}

/// The text model on the CPU reference backend. Decisions are serialized: the backend's
/// activation buffers are allocated once and reused by every pass.
pub struct CpuEngine {
    tokenizer: Tokenizer,
    chat: ChatTemplate,
    decider: Mutex<Decider<CpuBackend>>,
}

impl CpuEngine {
    pub fn load(
        model_dir: &Path,
        text_adapter: Option<&Path>,
        limits: BatchLimits,
    ) -> anyhow::Result<Self> {
        let loaded = load_text_cpu(model_dir, text_adapter, limits)?;
        Ok(Self {
            tokenizer: loaded.tokenizer,
            chat: loaded.chat,
            decider: Mutex::new(loaded.decider),
        })
    }
}

impl Engine for CpuEngine {
    fn render(&self, user: &str) -> anyhow::Result<String> {
        self.chat.render(SYSTEM_PROMPT, user)
    }

    fn tokenize(&self, chat: &str) -> anyhow::Result<Vec<u32>> {
        self.tokenizer.encode(chat)
    }

    fn decide(&self, prompts: &[PromptInput]) -> anyhow::Result<Vec<Vec<f32>>> {
        let prompts: Vec<Prompt> = prompts
            .iter()
            .map(|p| Prompt {
                ids: &p.ids,
                n_options: p.n_options,
            })
            .collect();
        self.decider.lock().decide(&prompts)
    }
}
