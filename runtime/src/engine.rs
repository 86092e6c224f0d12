//! The model behind the server, split the way requests use it: a [`Preparer`] (chat template and
//! tokenizer, shared by all request tasks) and one scheduler engine per device (the forward pass
//! and the readout, owned by its engine thread).

use std::path::Path;

use instinct_kernels::{Backend, CpuBackend};
use instinct_model::chat::ChatTemplate;
use std::sync::Arc;

use instinct_model::decider::{load_multimodal_cpu, load_text_cpu, Decider, ImagePrompt, Prompt};
use instinct_model::image::preprocess;
use instinct_model::mrope::{expand_image_placeholders, rope_index};
use instinct_model::vision::{ImageInput, VisionTower};
use instinct_scheduler::Question;

use crate::image_cache::{key_of, EncodedImage, ImageCache};
use crate::screenshot::Screenshot;
use instinct_model::forward::BatchLimits;
use instinct_model::prompt::SYSTEM_PROMPT;
use instinct_model::tokenizer::Tokenizer;
use instinct_scheduler::{Batch, Engine};

/// Renders and tokenizes prompts, and encodes screenshots. Shared by all request tasks: every
/// method takes `&self`.
pub struct Preparer {
    tokenizer: Tokenizer,
    chat: ChatTemplate,
    vision: Option<VisionSide>,
}

/// What screenshot questions need before the language model.
pub struct VisionSide {
    tower: VisionTower<CpuBackend>,
    image_token_id: u32,
    merge: u32,
    cache: ImageCache,
}

/// A screenshot request's questions, ready for the scheduler, and whether the image was cached.
pub struct ScreenshotQuestions {
    pub questions: Vec<Question>,
    pub cache_hit: bool,
}

impl Preparer {
    /// Whether screenshot questions are served.
    pub fn serves_screenshots(&self) -> bool {
        self.vision.is_some()
    }

    /// Decodes, preprocesses and encodes `image` (or takes it from the cache), then builds each
    /// question's ids (image placeholder expanded), M-RoPE positions and features. `users` are
    /// the questions' user messages; the problem string is the client-facing reason an image
    /// was refused.
    pub fn screenshot_questions(
        &self,
        image: &Screenshot,
        users: &[(&str, usize)],
    ) -> Result<ScreenshotQuestions, ScreenshotError> {
        let vision = self
            .vision
            .as_ref()
            .ok_or_else(|| ScreenshotError::Internal(anyhow::anyhow!("no vision tower loaded")))?;
        let key = key_of(&image.bytes);
        let mut hit = true;
        let encoded = vision.cache.get_or_encode(key, || {
            hit = false;
            let pre = preprocess(&image.bytes, image.format.mime())
                .map_err(|e| ScreenshotError::Image(e.to_string()))?;
            let features = vision
                .tower
                .forward(&[ImageInput {
                    pixel_values: &pre.pixel_values,
                    grid_thw: pre.grid_thw,
                }])
                .map_err(ScreenshotError::Internal)?
                .pop()
                .ok_or_else(|| ScreenshotError::Internal(anyhow::anyhow!("no features")))?;
            Ok(EncodedImage {
                features: Arc::new(features),
                grid_thw: pre.grid_thw,
            })
        })?;
        let grids = [encoded.grid_thw];
        let mut questions = Vec::with_capacity(users.len());
        for &(user, n_options) in users {
            let chat = self
                .chat
                .render_with_image(SYSTEM_PROMPT, user)
                .map_err(ScreenshotError::Internal)?;
            let ids = self
                .tokenizer
                .encode(&chat)
                .map_err(ScreenshotError::Internal)?;
            let ids = expand_image_placeholders(&ids, vision.image_token_id, &grids, vision.merge)
                .map_err(ScreenshotError::Internal)?;
            let positions = rope_index(&ids, vision.image_token_id, &grids, vision.merge)
                .map_err(ScreenshotError::Internal)?;
            let context = ImagePrompt {
                image_token_id: vision.image_token_id,
                features: encoded.features.clone(),
                positions,
            };
            questions.push(Question {
                ids,
                n_options,
                context: Some(Arc::new(context)),
            });
        }
        Ok(ScreenshotQuestions {
            questions,
            cache_hit: hit,
        })
    }

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

/// Why a screenshot could not be prepared.
#[derive(Debug)]
pub enum ScreenshotError {
    /// The image breaks a limit or does not decode: the client's problem (422).
    Image(String),
    /// Our failure (500).
    Internal(anyhow::Error),
}

/// A loaded model: its preparer and its device engines.
pub struct Loaded {
    pub preparer: Preparer,
    pub engines: Vec<Box<dyn Engine>>,
    /// Bytes of weights the engines hold (f32 on the CPU backend).
    pub weights_bytes: u64,
    /// The GPUs the engines run on, if any.
    pub devices: Vec<DeviceMemory>,
}

/// Memory of one GPU an engine runs on, for metrics.
#[derive(Clone)]
pub struct DeviceMemory {
    /// `cuda:N`.
    pub device: String,
    /// Bytes of weights uploaded.
    pub weights_bytes: u64,
    /// Bytes of activation buffers, GEMM workspace and scratch, allocated once at load.
    pub activations_bytes: u64,
    /// Reads (free, total) at scrape time.
    pub probe: instinct_kernels::cuda::MemoryProbe,
}

/// Loads a snapshot (and optionally a text adapter, merged at load) onto `cpu_engines` CPU engine
/// threads, each with its own copy of the weights and activation buffers for `limits`.
pub fn load_cpu(
    model_dir: &Path,
    text_adapter: Option<&Path>,
    multimodal_adapter: Option<&Path>,
    limits: BatchLimits,
    cpu_engines: usize,
    image_cache_bytes: usize,
) -> anyhow::Result<Loaded> {
    anyhow::ensure!(cpu_engines >= 1, "at least one engine is needed");
    let mut engines: Vec<Box<dyn Engine>> = Vec::with_capacity(cpu_engines);
    let mut preparer: Option<Preparer> = None;
    let mut weights_bytes = 0;
    for _ in 0..cpu_engines {
        let loaded = load_text_cpu(model_dir, text_adapter, limits)?;
        weights_bytes += loaded.weights_bytes;
        let multimodal = match multimodal_adapter {
            Some(dir) => Some(load_multimodal_cpu(model_dir, dir, limits)?),
            None => None,
        };
        let (mm_decider, vision) = match multimodal {
            Some(m) => {
                let merge = m.vision.config().spatial_merge_size as u32;
                let side = VisionSide {
                    tower: m.vision,
                    image_token_id: m.image_token_id,
                    merge,
                    cache: ImageCache::new(image_cache_bytes),
                };
                // The second language copy is the text model's size; the (small) vision tower's
                // weights are not counted.
                weights_bytes += loaded.weights_bytes;
                (Some(m.decider), Some(side))
            }
            None => (None, None),
        };
        if preparer.is_none() {
            preparer = Some(Preparer {
                tokenizer: loaded.tokenizer,
                chat: loaded.chat,
                vision,
            });
        }
        engines.push(Box::new(DeciderEngine::<CpuBackend> {
            decider: loaded.decider,
            multimodal: mm_decider,
        }));
    }
    Ok(Loaded {
        preparer: preparer.expect("at least one engine was loaded"),
        engines,
        weights_bytes,
        devices: Vec::new(),
    })
}

/// Loads the text model onto `cuda:ordinal`, one engine. Screenshots are not served on the GPU
/// yet (the vision tower has CPU kernels only).
pub fn load_cuda(
    ordinal: usize,
    model_dir: &Path,
    text_adapter: Option<&Path>,
    limits: BatchLimits,
) -> anyhow::Result<Loaded> {
    use instinct_kernels::cuda::{CudaBackend, CudaOptions};
    let backend = CudaBackend::new(CudaOptions {
        ordinal,
        ..CudaOptions::default()
    })?;
    let name = backend.name();
    let probe = backend.memory_probe();
    let mut loaded = instinct_model::decider::load_text(backend, model_dir, text_adapter, limits)?;
    // GEMM algorithms are timed once per row bucket (`Backend::warm_rows`): do it now, not on
    // requests.
    let t0 = std::time::Instant::now();
    let warmed = loaded.decider.warm_shapes()?;
    tracing::info!(
        row_counts = ?warmed,
        ms = t0.elapsed().as_secs_f64() * 1e3,
        "warmed every batch size bucket"
    );
    let (weights_bytes, activations_bytes) = loaded.decider.backend().allocated_bytes();
    Ok(Loaded {
        preparer: Preparer {
            tokenizer: loaded.tokenizer,
            chat: loaded.chat,
            vision: None,
        },
        engines: vec![Box::new(DeciderEngine {
            decider: loaded.decider,
            multimodal: None,
        })],
        weights_bytes,
        devices: vec![DeviceMemory {
            device: name,
            weights_bytes,
            activations_bytes,
            probe,
        }],
    })
}
