//! The model behind the server, split the way requests use it: a [`Preparer`] (chat template and
//! tokenizer, shared by all request tasks) and one scheduler engine per device (the forward pass
//! and the readout, owned by its engine thread).

use std::sync::Arc;
use std::time::Instant;

use ::metrics::histogram;
use anyhow::{anyhow, ensure, Context};
use instinct_kernels::backend::VisionBackend;
use instinct_kernels::cuda::{CudaBackend, CudaOptions};
use instinct_kernels::{Backend, CpuBackend, KernelError};
use instinct_model::chat::ChatTemplate;
use instinct_model::decider::{
    load_text_starting, read_multimodal, Decider, ImagePrompt, LoadedText, MultimodalHost, Prompt,
    QuestionSegment,
};
use instinct_model::forward::{BatchLimits, OverLimits};
use instinct_model::image::preprocess;
use instinct_model::mrope::{expand_image_placeholders, rope_index};
use instinct_model::prefix::{PrefixState, SnapshotCost};
use instinct_model::prompt::SYSTEM_PROMPT;
use instinct_model::source::{Device, Devices, ModelSource};
use instinct_model::tokenizer::{EncodedPrefix, Tokenizer};
use instinct_model::values::Values;
use instinct_model::vision::VisionTower;
use instinct_scheduler::{Batch, Bucket, ChunkInput, Engine, FatalEngineError, Question, SeqInput};
use rayon::prelude::*;

use crate::image_cache::{key_of, EncodedImage, ImageCache};
use crate::metrics as m;
use crate::prefix_reuse::{self, Planned, PrefixReuse, TEXT_NAMESPACE};
use crate::screenshot::Screenshot;
use crate::tower_batcher::{Tower, TowerBatcher};

/// Renders and tokenizes prompts, and encodes screenshots. Shared by all request tasks: every
/// method takes `&self`.
pub struct Preparer {
    tokenizer: Tokenizer,
    chat: ChatTemplate,
    /// The ids of the system turn every chat starts with, encoded once.
    prefix: EncodedPrefix,
    vision: Option<VisionSide>,
    /// What a prefix-state snapshot of the text model costs (the state a chunked question holds
    /// between its chunks); `None` for a preparer built without a model.
    snapshot_cost: Option<SnapshotCost>,
    /// Whether the engines keep prefix states in device memory (else in host memory).
    states_on_device: bool,
    /// Whether prefix reuse runs the prefix a request's questions share once (see
    /// [`Preparer::keep_shared_prompts_whole`]).
    shares_prefixes: bool,
}

/// Encodes one preprocessed screenshot into the language model's image features: the vision
/// tower, on whichever backend it was loaded.
pub trait ImageEncoder: Send + Sync {
    /// The features of an image (its resized RGB bytes and grid, as preprocessing leaves them),
    /// where the tower computed them (device memory on a GPU).
    fn encode(&self, rgb: Vec<u8>, grid_thw: [u32; 3]) -> anyhow::Result<Values>;
    /// From now on, features on the host (language copies on several devices read them).
    fn features_to_host(&self);
}

/// Concurrent requests' screenshots share tower passes (one pass at a time: a GPU backend's ops
/// share scratch buffers on one stream; the CPU ops spread one pass over every core anyway).
impl<T: Tower> ImageEncoder for TowerBatcher<T> {
    fn encode(&self, rgb: Vec<u8>, grid_thw: [u32; 3]) -> anyhow::Result<Values> {
        TowerBatcher::encode(self, rgb, grid_thw)
    }
    fn features_to_host(&self) {
        TowerBatcher::features_to_host(self)
    }
}

/// What screenshot questions need before the language model.
pub struct VisionSide {
    encoder: Box<dyn ImageEncoder>,
    image_token_id: u32,
    merge: u32,
    cache: ImageCache,
}

/// For each question, the longest prefix of ids it shares with another question of the slice.
/// (Sorted, each question's longest shared prefix is with a neighbour.)
fn longest_shared_prefixes(questions: &[Question]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..questions.len()).collect();
    order.sort_by(|&a, &b| questions[a].ids.cmp(&questions[b].ids));
    let common = |a: usize, b: usize| {
        let (a, b) = (&questions[a].ids, &questions[b].ids);
        a.iter().zip(b).take_while(|(x, y)| x == y).count()
    };
    let mut shared = vec![0; questions.len()];
    for pair in order.windows(2) {
        let n = common(pair[0], pair[1]);
        shared[pair[0]] = shared[pair[0]].max(n);
        shared[pair[1]] = shared[pair[1]].max(n);
    }
    shared
}

/// A screenshot request's questions, ready for the scheduler, and whether the image was cached.
pub struct ScreenshotQuestions {
    pub questions: Vec<Question>,
    pub cache_hit: bool,
}

impl Preparer {
    /// A preparer for text questions only (no vision tower), as a text-only server has.
    pub fn text_only(tokenizer: Tokenizer, chat: ChatTemplate) -> Self {
        Self::new(tokenizer, chat, None, None, false)
    }

    fn new(
        tokenizer: Tokenizer,
        chat: ChatTemplate,
        vision: Option<VisionSide>,
        snapshot_cost: Option<SnapshotCost>,
        states_on_device: bool,
    ) -> Self {
        // Without a prefix every chat is encoded whole: the same ids, a little slower.
        let prefix = chat
            .fixed_prefix(SYSTEM_PROMPT)
            .and_then(|text| tokenizer.encode_prefix(&text))
            .unwrap_or_else(|e| {
                tracing::warn!("the system turn's ids are not cached: {e:#}");
                EncodedPrefix::default()
            });
        Self {
            tokenizer,
            chat,
            prefix,
            vision,
            snapshot_cost,
            states_on_device,
            shares_prefixes: false,
        }
    }

    /// Sets whether prefix reuse runs a request's shared prefix once.
    fn sharing_prefixes(self, shares_prefixes: bool) -> Self {
        Self {
            shares_prefixes,
            ..self
        }
    }

    /// Where prefix reuse is on, marks the questions that share more than half of their prompt
    /// with another question of the request (goal-less questions over one state) as not to be
    /// run in chunks, if they can run whole (at most `longest_whole` tokens): whole, in one
    /// batch, their shared prefix is computed once, while in chunks each question would compute
    /// it again.
    pub fn keep_shared_prompts_whole(&self, questions: &mut [Question], longest_whole: usize) {
        if !self.shares_prefixes {
            return;
        }
        let shared = longest_shared_prefixes(questions);
        for (q, shared) in questions.iter_mut().zip(shared) {
            if 2 * shared > q.ids.len() && q.ids.len() <= longest_whole {
                q.resumable = false;
            }
        }
    }

    /// Bytes the prefix states of `questions` may hold at once while those for which
    /// `runs_in_chunks` holds run as chunks: per chunked question, the state before its last
    /// chunk and the one before that (an engine holds both while it runs a chunk), each of at
    /// most all but its last token (the scheduler cuts chunks to the room a batch leaves, so a
    /// boundary may fall anywhere before it). 0 without chunking.
    pub fn chunk_state_bytes(
        &self,
        questions: &[Question],
        runs_in_chunks: impl Fn(&Question) -> bool,
    ) -> usize {
        let Some(cost) = self.snapshot_cost else {
            return 0;
        };
        questions
            .iter()
            .filter(|q| runs_in_chunks(q))
            .map(|q| 2 * cost.bytes(q.ids.len() - 1))
            .sum()
    }

    /// Whether the engines keep chunked questions' prefix states in device memory (so they are
    /// budgeted by `--max-chunk-state-mib`, not `--max-inflight-mib`).
    pub fn chunk_states_on_device(&self) -> bool {
        self.states_on_device
    }

    /// From now on, encoded images' features are read back to the host (for engines on other
    /// devices than the tower's); by default they stay where the tower computed them.
    pub fn image_features_to_host(&self) {
        if let Some(vision) = &self.vision {
            vision.encoder.features_to_host();
        }
    }

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
            let started = Instant::now();
            let pre = preprocess(&image.bytes, image.format.mime())
                .map_err(|e| ScreenshotError::Image(e.to_string()))?;
            let preprocessed = Instant::now();
            histogram!(m::IMAGE_PREPROCESS_SECONDS).record((preprocessed - started).as_secs_f64());
            let features = vision
                .encoder
                .encode(pre.image.pixels, pre.grid_thw)
                .map_err(ScreenshotError::Internal)?;
            histogram!(m::IMAGE_ENCODE_SECONDS).record(preprocessed.elapsed().as_secs_f64());
            Ok(EncodedImage {
                features,
                grid_thw: pre.grid_thw,
            })
        })?;
        let grids = [encoded.grid_thw];
        // Named once per request, not per question per batch.
        let namespace: Arc<str> = prefix_reuse::screenshot_namespace(&key).into();
        // Each question is independent: in parallel, as text questions are.
        let questions = users
            .par_iter()
            .map(|&(user, n_options)| {
                let chat = self.chat.render_with_image(SYSTEM_PROMPT, user)?;
                let ids = self.tokenize(&chat)?;
                let ids =
                    expand_image_placeholders(&ids, vision.image_token_id, &grids, vision.merge)?;
                let positions = rope_index(&ids, vision.image_token_id, &grids, vision.merge)?;
                let context = ScreenshotContext {
                    image: ImagePrompt::new(
                        vision.image_token_id,
                        encoded.features.clone(),
                        positions,
                    ),
                    namespace: namespace.clone(),
                };
                Ok(Question {
                    ids,
                    n_options,
                    context: Some(Arc::new(context)),
                    // Not chunked (prefix reuse resumes them after their image instead).
                    resumable: false,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()
            .map_err(ScreenshotError::Internal)?;
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

    /// Encodes a rendered chat string (special-token text becomes the special token; no BOS),
    /// the system turn's ids taken from the cache.
    pub fn tokenize(&self, chat: &str) -> anyhow::Result<Vec<u32>> {
        self.tokenizer.encode_with_prefix(&self.prefix, chat)
    }
}

/// The deciders of one device, driven by the scheduler's engine thread: the language model with
/// the text adapter merged, and, when screenshots are served, a second copy with the multimodal
/// adapter's language part merged (the two adapters differ in every language module).
pub struct DeciderEngine<B: Backend> {
    decider: Decider<B>,
    multimodal: Option<Decider<B>>,
    /// Prefix reuse for text questions, shared with the device's other engines.
    reuse: Arc<PrefixReuse>,
}

impl<B: Backend> DeciderEngine<B> {
    /// The shape allocated for batches of `bucket`. Today one shape, allocated at load for the
    /// scheduler's batch capacity, serves every bucket; a bucket it does not hold is refused.
    fn shape_for(&self, bucket: Bucket) -> Result<BatchLimits, OverLimits> {
        let shape = self.decider.limits();
        shape.check(bucket.tokens, bucket.seqs)?;
        Ok(shape)
    }
}

impl<B> Engine for DeciderEngine<B>
where
    B: Backend + Send + 'static,
    B::Buf: Send,
    B::Idx: Send,
{
    /// Runs the batch as planned: whole, in the shape of its bucket. A batch over its bucket, or
    /// a bucket over the allocated shape, is an error, never split. A device lost to a sticky
    /// error is reported as a [`FatalEngineError`], which retires this engine.
    fn run_batch(&mut self, batch: &Batch<'_>) -> anyhow::Result<Vec<Vec<f32>>> {
        self.run(batch).map_err(|error| {
            let lost = error
                .chain()
                .any(|c| matches!(c.downcast_ref(), Some(KernelError::DeviceLost(_))));
            if lost {
                anyhow::Error::new(FatalEngineError(format!("{error:#}")))
            } else {
                error
            }
        })
    }

    fn device(&self) -> String {
        self.decider.backend().name()
    }
}

impl<B: Backend> DeciderEngine<B> {
    fn run(&mut self, batch: &Batch<'_>) -> anyhow::Result<Vec<Vec<f32>>> {
        ensure!(
            batch.fits_its_bucket(),
            "a batch of {} tokens in {} sequences does not fit its bucket {:?}",
            batch.tokens,
            batch.seqs.len(),
            batch.bucket
        );
        self.shape_for(batch.bucket)?;
        // Text and screenshot questions run on different weights: one pass each (both within the
        // batch's shape), answers put back in order.
        let mut text = Vec::new();
        let mut shots = Vec::new();
        let mut chunks = Vec::new();
        for (i, s) in batch.seqs.iter().enumerate() {
            if let Some(chunk) = s.chunk {
                chunks.push((i, s, chunk));
                continue;
            }
            match s.context {
                None => text.push((i, Prompt::text(s.ids, s.n_options))),
                Some(context) => {
                    let shot = context
                        .downcast_ref::<ScreenshotContext>()
                        .ok_or_else(|| anyhow::anyhow!("unknown sequence context"))?;
                    shots.push((
                        i,
                        Prompt {
                            ids: s.ids,
                            n_options: s.n_options,
                            image: Some(&shot.image),
                        },
                        shot,
                    ));
                }
            }
        }
        let mut answers = vec![Vec::new(); batch.seqs.len()];
        // Chunks of long text prompts ride in the text questions' pass: one pass for both.
        let chunk_seqs: Vec<_> = chunks.iter().map(|(_, s, c)| (*s, *c)).collect();
        let resumed = self.resume_chunks(&chunk_seqs)?;
        let riders = chunk_segments(&chunk_seqs, &resumed);
        let prompts: Vec<Prompt> = text.iter().map(|(_, p)| *p).collect();
        let (decided, chunk_outputs) = prefix_reuse::decide_with_riders(
            &mut self.decider,
            &self.reuse,
            TEXT_NAMESPACE,
            &prompts,
            &riders,
        )?;
        for ((i, _), a) in text.iter().zip(decided) {
            answers[*i] = a;
        }
        for ((i, _, chunk), out) in chunks.iter().zip(chunk_outputs) {
            if chunk.last {
                answers[*i] = out
                    .probabilities
                    .context("a last chunk without its answer")?;
            } else {
                let snapshot = out.snapshot.context("a chunk without its snapshot")?;
                chunk.carry.put(Box::new(snapshot));
            }
        }
        if !shots.is_empty() {
            let decider = self
                .multimodal
                .as_mut()
                .ok_or_else(|| anyhow::anyhow!("screenshot question without a multimodal model"))?;
            let prompts: Vec<Prompt> = shots.iter().map(|(_, p, _)| *p).collect();
            // Snapshots over a screenshot are kept per image; the system turn and the image
            // are every question's anchor.
            let planned: Vec<Planned> = shots
                .iter()
                .map(|(_, p, shot)| Planned {
                    namespace: &shot.namespace,
                    ids: p.ids,
                    anchor: prefix_reuse::image_anchor(
                        p.ids,
                        shot.image.image_token_id,
                        self.reuse.grid(),
                    ),
                })
                .collect();
            let decided = prefix_reuse::decide_mixed(decider, &self.reuse, &planned, &prompts)?;
            for ((i, _, _), a) in shots.iter().zip(decided) {
                answers[*i] = a;
            }
        }
        Ok(answers)
    }

    /// Where each chunk of a long text question (chunked prefill) resumes: the prefix state its
    /// question's previous chunk left in its carry, or, for a first chunk, the longest cached
    /// prefix of its ids (the system turn, a prefix another request left). Per chunk: the state
    /// and where its own tokens start in its ids. The states stay where the backend keeps them.
    fn resume_chunks(
        &self,
        seqs: &[(&SeqInput<'_>, ChunkInput<'_>)],
    ) -> anyhow::Result<Vec<(Option<Arc<PrefixState>>, usize)>> {
        let mut resumed = Vec::with_capacity(seqs.len());
        for (s, chunk) in seqs {
            ensure!(s.context.is_none(), "only text questions run in chunks");
            let state = match chunk.carry.take() {
                Some(state) => {
                    Some(Arc::new(*state.downcast::<PrefixState>().map_err(
                        |_| anyhow::anyhow!("a chunk's carry holds no prefix state"),
                    )?))
                }
                None => None,
            };
            let held = state.as_ref().map_or(0, |s| s.tokens());
            ensure!(
                held == chunk.start,
                "a chunk starting at token {} found a state of {held} tokens",
                chunk.start
            );
            if state.is_none() {
                if let Some(hit) = self.reuse.lookup(TEXT_NAMESPACE, s.ids) {
                    resumed.push((Some(hit.state), hit.tokens));
                    continue;
                }
            }
            resumed.push((state, 0));
        }
        Ok(resumed)
    }
}

/// The segments of chunks resumed as [`DeciderEngine::resume_chunks`] says: a last chunk answers,
/// the others leave the state their question's next chunk resumes from.
fn chunk_segments<'a>(
    seqs: &[(&'a SeqInput<'_>, ChunkInput<'_>)],
    resumed: &'a [(Option<Arc<PrefixState>>, usize)],
) -> Vec<QuestionSegment<'a>> {
    seqs.iter()
        .zip(resumed)
        .map(|((s, chunk), (state, from))| {
            let (ids, state) = (&s.ids[*from..], state.as_deref());
            if chunk.last {
                QuestionSegment::answer(Prompt::text(ids, s.n_options), state)
            } else {
                QuestionSegment::prefix(ids, state)
            }
        })
        .collect()
}

/// What a screenshot question carries to its engine: its image prompt, and where the snapshots
/// taken over its image are kept ([`prefix_reuse::screenshot_namespace`] of the image's SHA-256).
#[derive(Debug)]
pub struct ScreenshotContext {
    pub image: ImagePrompt,
    pub namespace: Arc<str>,
}

/// Bytes the prepared questions of one request hold until answered: their token ids, and for
/// screenshot questions their 3-D positions and the image features (counted once per image, as
/// the questions share them; wherever they are held: on a GPU in its memory, which this bounds
/// too).
pub fn held_bytes(questions: &[Question]) -> usize {
    let mut images: Vec<&Values> = Vec::new();
    let mut bytes = 0;
    for q in questions {
        bytes += std::mem::size_of_val(q.ids.as_slice());
        let Some(image) = q
            .context
            .as_ref()
            .and_then(|c| c.downcast_ref::<ScreenshotContext>())
            .map(|shot| &shot.image)
        else {
            continue;
        };
        bytes += std::mem::size_of_val(image.positions.as_slice());
        if !images.iter().any(|held| held.shares(&image.features)) {
            images.push(&image.features);
            bytes += 4 * image.features.len();
        }
    }
    bytes
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
    /// Prefix reuse of each device's engines, in device order (off where the backend does not
    /// carry states).
    pub prefix_reuse: Vec<Arc<PrefixReuse>>,
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
    /// Read the captured passes' counts at scrape time, one per language copy that captures
    /// (none with `--cuda-graphs off`).
    pub graphs: Vec<instinct_kernels::cuda::GraphProbe>,
}

/// The engines' batch limits: the largest batch the scheduler plans
/// ([`instinct_scheduler::Config::batch_capacity`]), so that the scheduler's buckets are the one
/// source of batch shape.
pub fn batch_limits(capacity: Bucket) -> BatchLimits {
    BatchLimits::new(capacity.tokens, capacity.seqs)
}

/// What [`load`] needs besides the device, the source and the limits.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Engine threads on the CPU, each with its own copy of the weights. A GPU runs one engine.
    pub cpu_engines: usize,
    /// Byte budget of the encoded-screenshot cache.
    pub image_cache_bytes: usize,
    /// Byte budget of the prefix-state cache of each device (0: no prefix reuse; `None`: the
    /// device's default, [`ServingBackend::default_prefix_cache_bytes`]).
    pub prefix_cache_bytes: Option<usize>,
    /// `--max-chunk-tokens` (checked against the backend's resume grid).
    pub max_chunk_tokens: Option<usize>,
    /// `--batch-invariant` (GPUs; the CPU is invariant anyway).
    pub batch_invariant: bool,
    /// `--cuda-graphs` (GPUs).
    pub cuda_graphs: bool,
    /// `--screenshot-cuda-graphs` (GPUs, with `cuda_graphs`).
    pub screenshot_cuda_graphs: bool,
    /// `--snapshots-within` (`None`: on, [`PrefixReuse`]'s default on every backend; the snapshot
    /// taken inside a pass is the prefix's own, bit for bit on the GPU too:
    /// docs/benchmarks/gpu-calls/2026-12-06-1fe910d-h100).
    pub snapshots_within: Option<bool>,
    /// `--cuda-pool-keep-mib`, in bytes (GPUs; `None`: the driver's default).
    pub cuda_pool_keep_bytes: Option<u64>,
    /// `--carry-arena-prefix-tokens`: the prefix rows a captured pass may resume from (GPUs).
    pub carry_arena_prefix_tokens: usize,
    /// `--screenshot-carry-arena-prefix-tokens`: the same for the screenshot copy.
    pub screenshot_carry_arena_prefix_tokens: usize,
}

/// `--screenshot-carry-arena-prefix-tokens`' default: four questions about one 1024×1024
/// screenshot resume from 4 × 1,088 prefix rows, which a power-of-two arena holds from 8,192.
pub const SCREENSHOT_CARRY_ARENA_PREFIX_TOKENS: usize = 8192;

impl Default for LoadOptions {
    /// `instinct serve`'s defaults, but with no image cache (a loader's caller sizes it).
    fn default() -> Self {
        Self {
            cpu_engines: 1,
            image_cache_bytes: 0,
            prefix_cache_bytes: None,
            max_chunk_tokens: None,
            batch_invariant: true,
            cuda_graphs: true,
            screenshot_cuda_graphs: true,
            snapshots_within: None,
            cuda_pool_keep_bytes: None,
            carry_arena_prefix_tokens: instinct_kernels::backend::CAPTURED_MAX_PREFIX_ROWS,
            screenshot_carry_arena_prefix_tokens: SCREENSHOT_CARRY_ARENA_PREFIX_TOKENS,
        }
    }
}

/// Loads `source` onto `device`: the text model with the text adapter on every engine, and, when
/// the source has a multimodal adapter, the screenshot path (a second language copy and the
/// vision tower). A device that lacks a part the source asks for is refused with the part named;
/// the built-in demo's multimodal adapter, which nobody asked for, is skipped with a warning.
pub fn load(
    device: Device,
    source: &ModelSource,
    limits: BatchLimits,
    options: LoadOptions,
) -> anyhow::Result<Loaded> {
    match device {
        Device::Cpu => {
            let start = || Ok(CpuBackend::new());
            let starts = Starts {
                text: start,
                screenshots: start,
            };
            let parts = load_engines(device, starts, options, source, limits)?;
            let weights_bytes = parts.weights_bytes;
            Ok(parts.into_loaded(weights_bytes, Vec::new()))
        }
        Device::Cuda(ordinal) => {
            if options.cpu_engines > 1 {
                tracing::warn!(
                    engines = options.cpu_engines,
                    "--engines applies to the CPU backend; {device} runs one engine"
                );
            }
            let options = LoadOptions {
                cpu_engines: 1,
                ..options
            };
            let start = |cuda_graphs| {
                move || {
                    Ok(CudaBackend::new(CudaOptions {
                        ordinal,
                        batch_invariant: options.batch_invariant,
                        cuda_graphs,
                        pool_keep_bytes: options.cuda_pool_keep_bytes,
                        ..CudaOptions::default()
                    })?)
                }
            };
            // `--screenshot-cuda-graphs off` keeps the screenshot copy's passes as launched.
            let starts = Starts {
                text: start(options.cuda_graphs),
                screenshots: start(options.cuda_graphs && options.screenshot_cuda_graphs),
            };
            let mut parts = load_engines(device, starts, options, source, limits)?;
            // GEMM algorithms are timed once per row bucket (`Backend::warm_rows`): do it now,
            // not on requests.
            let t0 = Instant::now();
            let mut warmed = Vec::new();
            for engine in &mut parts.engines {
                warmed = engine.decider.warm_shapes()?;
                if let Some(multimodal) = &mut engine.multimodal {
                    multimodal.warm_shapes()?;
                }
            }
            tracing::info!(
                row_counts = ?warmed,
                ms = t0.elapsed().as_secs_f64() * 1e3,
                "warm-up forwards run (the limit, and each row bucket without stored GEMM picks)"
            );
            // Every language copy (text, screenshots) and tower on the device. A backend's count
            // holds every buffer it allocated (one dropped is not taken off it), read here before
            // any request: a carry arena is counted where it was reserved, nothing where not.
            let (mut weights_bytes, mut activations_bytes) = parts.tower_bytes;
            let mut graphs = Vec::new();
            for engine in &parts.engines {
                for decider in std::iter::once(&engine.decider).chain(&engine.multimodal) {
                    let (w, a) = decider.backend().allocated_bytes();
                    weights_bytes += w;
                    activations_bytes += a;
                    graphs.extend(decider.backend().graph_probe());
                }
            }
            let backend = parts.engines[0].decider.backend();
            if !graphs.is_empty() {
                tracing::info!(
                    max_rows = instinct_kernels::backend::CAPTURED_MAX_ROWS,
                    "captured passes on: a pass pads to its shape, whose first batch runs as \
                     launched and is captured; later batches replay it"
                );
            }
            let memory = DeviceMemory {
                device: backend.name(),
                weights_bytes,
                activations_bytes,
                probe: backend.memory_probe(),
                graphs,
            };
            Ok(parts.into_loaded(weights_bytes, vec![memory]))
        }
    }
}

/// Loads `source` onto every device of `devices`, in order: on the CPU `options.cpu_engines`
/// engines, on each GPU entry one engine with its own weights (a GPU named twice runs two). The
/// engines are returned in device order; the preparer is the first device's (every device loads
/// the same tokenizer and template).
pub fn load_on(
    devices: &[Device],
    source: &ModelSource,
    limits: BatchLimits,
    options: LoadOptions,
) -> anyhow::Result<Loaded> {
    let mut all: Option<Loaded> = None;
    for &device in devices {
        let t0 = Instant::now();
        let loaded = load(device, source, limits, options)
            .with_context(|| format!("loading the model onto {device}"))?;
        tracing::info!(%device, ms = t0.elapsed().as_secs_f64() * 1e3, "engine loaded");
        match &mut all {
            None => all = Some(loaded),
            Some(all) => {
                all.engines.extend(loaded.engines);
                all.weights_bytes += loaded.weights_bytes;
                all.devices.extend(loaded.devices);
                all.prefix_reuse.extend(loaded.prefix_reuse);
            }
        }
    }
    let all = all.context("no device to load onto")?;
    // The preparer's tower is the first device's: engines on another read its features from the
    // host.
    if devices.iter().any(|d| *d != devices[0]) {
        all.preparer.image_features_to_host();
    }
    Ok(all)
}

/// What the loader needs of a backend beyond its ops (every serving backend has the vision ops
/// and resumes from prefix states).
trait ServingBackend: VisionBackend + Sized + Send + Sync + 'static {
    /// Token boundaries at which a resumed sequence computes what the whole prompt does: prefix
    /// snapshots and prefill chunks are cut only at multiples of it.
    const RESUME_GRID: usize;
    /// Whether its prefix states live in device memory (not the host's).
    const STATES_ON_DEVICE: bool;
    /// The prefix cache's budget when none is asked for, once the model is loaded on `backend`.
    fn default_prefix_cache_bytes(backend: &Self) -> usize;
    /// Device memory it allocated: (weights, activations and scratch); none on the host.
    fn device_bytes(&self) -> (u64, u64);
}

/// Where the backends serving `devices` resume a prompt exactly: the scheduler starts chunks
/// only there ([`instinct_scheduler::Config::chunk_grid`]).
pub fn resume_grid(devices: &Devices) -> usize {
    match devices {
        Devices::Cpu => CpuBackend::RESUME_GRID,
        Devices::Cuda(_) | Devices::AllCuda => CudaBackend::RESUME_GRID,
    }
}

/// The CPU backend's default prefix-cache budget.
const CPU_PREFIX_CACHE_BYTES: usize = 256 << 20;
/// The most a GPU's default prefix-cache budget takes (a Qwen3.5-4B snapshot is ~50 MB plus
/// 64 KiB per token: 8 GiB holds the system turn and ~40 snapshots of 2,000-token prefixes).
const GPU_PREFIX_CACHE_MAX_BYTES: usize = 8 << 30;

impl ServingBackend for CpuBackend {
    // f32 throughout, one token at a time: exact at any boundary.
    const RESUME_GRID: usize = 1;
    const STATES_ON_DEVICE: bool = false;
    fn default_prefix_cache_bytes(_: &Self) -> usize {
        CPU_PREFIX_CACHE_BYTES
    }
    fn device_bytes(&self) -> (u64, u64) {
        (0, 0)
    }
}

impl ServingBackend for CudaBackend {
    // The delta rule runs by 64-token chunks from a sequence's first token; resumed at a multiple
    // of 64 its chunks are the whole prompt's, and its attention rows are the whole prompt's bit
    // for bit (kernels/tests/cuda_carried.rs). Off the grid, served answers moved by up to 0.097
    // on the seeded real-shape checkpoint (docs/benchmarks/prefix-reuse-gpu/).
    const RESUME_GRID: usize = instinct_kernels::cuda::DELTA_CHUNK_TOKENS;
    const STATES_ON_DEVICE: bool = true;
    /// A quarter of the device memory free once the model, its activation buffers and the carry
    /// arenas are allocated, at most [`GPU_PREFIX_CACHE_MAX_BYTES`], in whole MiB (read before
    /// the warm-up's scratch and the captured passes' graphs).
    fn default_prefix_cache_bytes(backend: &Self) -> usize {
        match backend.memory_info() {
            Ok((free, _)) => (free / 4).min(GPU_PREFIX_CACHE_MAX_BYTES) >> 20 << 20,
            Err(e) => {
                tracing::warn!("no free-memory reading ({e}): prefix reuse off");
                0
            }
        }
    }
    fn device_bytes(&self) -> (u64, u64) {
        self.allocated_bytes()
    }
}

/// One engine's screenshot path: the multimodal language copy and the vision tower.
struct ScreenshotPath<B: Backend> {
    decider: Decider<B>,
    encoder: Box<dyn ImageEncoder>,
    /// The tower's device memory (weights, buffers), read at load.
    tower_bytes: (u64, u64),
    image_token_id: u32,
    merge: u32,
}

/// The screenshot path on any backend with the vision ops, from its weights read on the host.
fn screenshot_path<B>(
    start: &dyn Fn() -> anyhow::Result<B>,
    host: MultimodalHost,
    limits: BatchLimits,
) -> anyhow::Result<ScreenshotPath<B>>
where
    B: ServingBackend,
    VisionTower<B>: Send + Sync,
{
    let loaded = host.upload(start()?, start()?, limits)?;
    Ok(ScreenshotPath {
        tower_bytes: loaded.vision.backend().device_bytes(),
        merge: loaded.vision.config().spatial_merge_size as u32,
        encoder: Box::new(TowerBatcher::new(loaded.vision)),
        decider: loaded.decider,
        image_token_id: loaded.image_token_id,
    })
}

/// Engines of one device before they are handed to the scheduler.
struct EngineParts<B: Backend> {
    preparer: Preparer,
    engines: Vec<DeciderEngine<B>>,
    reuse: Arc<PrefixReuse>,
    /// Bytes of f32 weights read for all engines (a screenshot path counts one more language
    /// copy; the small vision tower is not counted).
    weights_bytes: u64,
    /// The vision towers' device memory (weights, buffers), read at load: their scratch grows
    /// on the first images after it.
    tower_bytes: (u64, u64),
}

impl<B> EngineParts<B>
where
    B: Backend + Send + 'static,
    B::Buf: Send,
    B::Idx: Send,
{
    fn into_loaded(self, weights_bytes: u64, devices: Vec<DeviceMemory>) -> Loaded {
        Loaded {
            preparer: self.preparer,
            engines: self
                .engines
                .into_iter()
                .map(|e| Box::new(e) as Box<dyn Engine>)
                .collect(),
            weights_bytes,
            devices,
            prefix_reuse: vec![self.reuse],
        }
    }
}

/// The prefix reuse of `device`'s engines: off where the budget is 0; boundaries on the
/// backend's resume grid.
fn prefix_reuse_for<B: ServingBackend>(
    device: Device,
    text: &LoadedText<B>,
    options: LoadOptions,
) -> anyhow::Result<PrefixReuse> {
    let budget = options
        .prefix_cache_bytes
        .unwrap_or_else(|| B::default_prefix_cache_bytes(text.decider.backend()));
    if budget == 0 {
        return Ok(PrefixReuse::off());
    }
    let system = prefix_reuse::system_prefix_ids(&text.tokenizer, &text.chat)?;
    let mut reuse = PrefixReuse::new(budget, system).on_grid(B::RESUME_GRID);
    if let Some(within) = options.snapshots_within {
        reuse = reuse.snapshots_within(within);
    }
    tracing::info!(
        %device,
        budget_mib = budget >> 20,
        grid = B::RESUME_GRID,
        snapshots_within = reuse.takes_snapshots_within(),
        system_tokens = reuse.system_ids().len(),
        "prefix reuse on"
    );
    Ok(reuse)
}

/// Refuses a prefill chunk size off `B`'s resume grid: its chunks would not compute what the
/// whole prompt does.
fn check_chunk_size<B: ServingBackend>(device: Device, options: LoadOptions) -> anyhow::Result<()> {
    if let Some(chunk) = options.max_chunk_tokens {
        ensure!(
            chunk.is_multiple_of(B::RESUME_GRID),
            "--max-chunk-tokens {chunk} is not a multiple of {}: on {device} a prompt is resumed \
             exactly only at multiples of the delta rule's {}-token chunk",
            B::RESUME_GRID,
            B::RESUME_GRID
        );
    }
    Ok(())
}

/// How `load_engines` starts a backend: for the text copy, and for the screenshot path (its
/// language copy and its tower).
struct Starts<T, S> {
    text: T,
    screenshots: S,
}

/// Loads `options.cpu_engines` engines, each on its own backends from `starts`: the same parts
/// on every device.
fn load_engines<B: ServingBackend>(
    device: Device,
    starts: Starts<impl Fn() -> anyhow::Result<B> + Sync, impl Fn() -> anyhow::Result<B> + Sync>,
    options: LoadOptions,
    source: &ModelSource,
    limits: BatchLimits,
) -> anyhow::Result<EngineParts<B>>
where
    // The screenshot path is loaded on a thread of its own.
    B::Buf: Send,
    B::Idx: Send,
{
    ensure!(options.cpu_engines >= 1, "at least one engine is needed");
    check_chunk_size::<B>(device, options)?;
    let mut engines = Vec::with_capacity(options.cpu_engines);
    let mut preparer: Option<Preparer> = None;
    let mut reuse: Option<Arc<PrefixReuse>> = None;
    let mut weights_bytes = 0;
    let mut tower_bytes = (0, 0);
    for _ in 0..options.cpu_engines {
        // The screenshot copy's weights are read, merged and uploaded beside the text copy's
        // (two reads of the snapshot and two uploads at once, not one after the other).
        let (mut text, path) = std::thread::scope(|scope| {
            let path = source.multimodal_adapter.as_deref().map(|dir| {
                scope.spawn(|| {
                    let host = read_multimodal(&source.model_dir, dir)?;
                    screenshot_path(&starts.screenshots, host, limits)
                })
            });
            let text = load_text_starting(
                &starts.text,
                &source.model_dir,
                source.text_adapter.as_deref(),
                limits,
            );
            let path = path
                .map(|h| {
                    h.join()
                        .map_err(|_| anyhow!("loading the screenshot path panicked"))?
                })
                .transpose();
            anyhow::Ok((text?, path?))
        })?;
        weights_bytes += text.weights_bytes;
        if path.is_some() {
            weights_bytes += text.weights_bytes;
        }
        let (mut multimodal, vision) = match path {
            Some(p) => {
                tower_bytes.0 += p.tower_bytes.0;
                tower_bytes.1 += p.tower_bytes.1;
                (
                    Some(p.decider),
                    Some(VisionSide {
                        encoder: p.encoder,
                        image_token_id: p.image_token_id,
                        merge: p.merge,
                        cache: ImageCache::new(options.image_cache_bytes),
                    }),
                )
            }
            None => (None, None),
        };
        // Passes carry states only with prefix reuse or chunks: only then does a language copy
        // whose backend captures passes get the arena its captured carried passes stage them in
        // (about 1 GB for Qwen3.5-4B). Chunks are text questions: the screenshot copy needs it for
        // prefix reuse only. Reserved before the prefix-cache budget is read (so the default
        // budget is taken from what the arenas leave), before the warm-up captures any pass and
        // before serving; the activations metric, read after the warm-up, counts it where it is.
        let reuse_asked = reuse
            .as_ref()
            .map_or(options.prefix_cache_bytes != Some(0), |r| r.enabled());
        let mut reserved = 0;
        if reuse_asked || options.max_chunk_tokens.is_some() {
            reserved += text
                .decider
                .reserve_carry_arena_for(options.carry_arena_prefix_tokens)
                .context("the text copy")?;
        }
        if let (true, Some(m)) = (reuse_asked, &mut multimodal) {
            reserved += m
                .reserve_carry_arena_for(options.screenshot_carry_arena_prefix_tokens)
                .context("the screenshot copy")?;
        }
        if reserved > 0 {
            tracing::info!(
                %device,
                mib = reserved >> 20,
                "carry arena reserved: prefix reuse or chunking is on"
            );
        }
        // One cache for the device's engines: they hold the same weights.
        let reuse = match &reuse {
            Some(reuse) => reuse.clone(),
            None => {
                let r = Arc::new(prefix_reuse_for::<B>(device, &text, options)?);
                reuse = Some(r.clone());
                r
            }
        };
        // Every engine loads the same files; one preparer (tokenizer, template, tower) serves all.
        if preparer.is_none() {
            preparer = Some(
                Preparer::new(
                    text.tokenizer,
                    text.chat,
                    vision,
                    Some(text.decider.snapshot_cost()),
                    B::STATES_ON_DEVICE,
                )
                .sharing_prefixes(reuse.enabled()),
            );
        }
        engines.push(DeciderEngine {
            decider: text.decider,
            multimodal,
            reuse,
        });
    }
    Ok(EngineParts {
        preparer: preparer.expect("at least one engine was loaded"),
        reuse: reuse.expect("at least one engine was loaded"),
        engines,
        weights_bytes,
        tower_bytes,
    })
}

#[cfg(test)]
mod tests {
    use instinct_scheduler::{ChunkCarry, SeqInput};

    use super::*;

    /// `source` on one engine of `device`, allocated for at most 64 tokens in 2 sequences.
    fn load_small(device: Device, source: &ModelSource) -> anyhow::Result<Loaded> {
        let options = LoadOptions {
            image_cache_bytes: 1 << 20,
            prefix_cache_bytes: Some(0),
            ..LoadOptions::default()
        };
        load(device, source, BatchLimits::new(64, 2), options)
    }

    #[test]
    fn a_chunk_size_off_the_gpu_resume_grid_is_refused_and_the_cpu_takes_any() {
        let with_chunk = |chunk| LoadOptions {
            max_chunk_tokens: chunk,
            ..LoadOptions::default()
        };
        let cuda = Device::Cuda(0);
        for ok in [None, Some(64), Some(1024)] {
            check_chunk_size::<CudaBackend>(cuda, with_chunk(ok)).unwrap();
        }
        let e = check_chunk_size::<CudaBackend>(cuda, with_chunk(Some(1000)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--max-chunk-tokens 1000 is not a multiple of 64"),
            "{e}"
        );
        check_chunk_size::<CpuBackend>(Device::Cpu, with_chunk(Some(1000))).unwrap();
    }

    /// The demo model (both adapters) on a CPU backend that pads passes as captured ones are:
    /// the prefix rows each language copy's carry arena was reserved for under `options`.
    fn arena_rows(options: LoadOptions) -> (Option<usize>, Option<usize>) {
        let source = ModelSource::resolve(None, None, None).unwrap();
        let start = || Ok(CpuBackend::padding_passes());
        let starts = Starts {
            text: start,
            screenshots: start,
        };
        let limits = BatchLimits::new(64, 2);
        let parts = load_engines(Device::Cpu, starts, options, &source, limits).unwrap();
        let engine = &parts.engines[0];
        let multimodal = engine
            .multimodal
            .as_ref()
            .expect("the demo's screenshot copy");
        (
            engine.decider.carry_arena_prefix_rows(),
            multimodal.carry_arena_prefix_rows(),
        )
    }

    /// The text copy's arena holds 2,048 prefix rows and the screenshot copy's 8,192 unless told
    /// otherwise: four questions about a 1024×1024 screenshot resume from 4 × 1,088.
    #[test]
    fn each_language_copy_gets_the_arena_its_flag_sizes() {
        assert_eq!(arena_rows(LoadOptions::default()), (Some(2048), Some(8192)));
        let options = LoadOptions {
            carry_arena_prefix_tokens: 4096,
            screenshot_carry_arena_prefix_tokens: 1024,
            ..LoadOptions::default()
        };
        assert_eq!(arena_rows(options), (Some(4096), Some(1024)));
    }

    /// Whether each language copy's carry arena is reserved under `options`.
    fn arenas_reserved(options: LoadOptions) -> (bool, bool) {
        let (text, multimodal) = arena_rows(options);
        (text.is_some(), multimodal.is_some())
    }

    #[test]
    fn carry_arenas_are_reserved_where_prefix_reuse_or_chunks_can_carry_states() {
        let options = |cache: usize, chunk: Option<usize>| LoadOptions {
            prefix_cache_bytes: Some(cache),
            max_chunk_tokens: chunk,
            ..LoadOptions::default()
        };
        assert_eq!(
            arenas_reserved(options(0, None)),
            (false, false),
            "both off"
        );
        assert_eq!(
            arenas_reserved(options(1 << 20, None)),
            (true, true),
            "reuse"
        );
        // Screenshot questions are never chunked.
        assert_eq!(
            arenas_reserved(options(0, Some(32))),
            (true, false),
            "chunks"
        );
    }

    /// The demo model on one CPU engine, with or without its screenshot path.
    fn demo_engine(multimodal: bool) -> Loaded {
        let mut source = ModelSource::resolve(None, None, None).unwrap();
        if !multimodal {
            source.multimodal_adapter = None;
        }
        load_small(Device::Cpu, &source).unwrap()
    }

    /// The screenshot path is read on its own thread beside the text copy: its failure still
    /// fails the load, with its reason.
    #[test]
    fn a_screenshot_path_that_cannot_be_read_fails_the_load_with_its_reason() {
        let mut source = ModelSource::resolve(None, None, None).unwrap();
        source.multimodal_adapter = Some(std::env::temp_dir().join("instinct-no-such-adapter"));
        let err = load_small(Device::Cpu, &source)
            .err()
            .expect("a missing adapter fails the load");
        assert!(
            format!("{err:#}").contains("instinct-no-such-adapter"),
            "{err:#}"
        );
    }

    /// Runs text questions of two options as one batch planned for `bucket`; the answer count.
    fn run(engine: &mut dyn Engine, ids: &[Vec<u32>], bucket: Bucket) -> anyhow::Result<usize> {
        let seqs: Vec<SeqInput> = ids
            .iter()
            .map(|ids| SeqInput {
                ids,
                n_options: 2,
                context: None,
                chunk: None,
            })
            .collect();
        let batch = Batch {
            seqs: &seqs,
            bucket,
            tokens: ids.iter().map(Vec::len).sum(),
        };
        Ok(engine.run_batch(&batch)?.len())
    }

    #[test]
    fn the_engine_runs_a_batch_that_fits_its_shape_whole() {
        let mut loaded = demo_engine(false);
        let ids = vec![vec![1, 2, 3], vec![4, 5]];
        let answers = run(loaded.engines[0].as_mut(), &ids, Bucket::new(64, 2)).unwrap();
        assert_eq!(answers, 2);
    }

    #[test]
    fn the_engine_refuses_a_batch_over_its_shape_instead_of_splitting_it() {
        let mut loaded = demo_engine(false);
        let engine = loaded.engines[0].as_mut();
        // Three sequences for an engine allocated for two: the scheduler would never plan it.
        let ids = vec![vec![1], vec![2], vec![3]];
        let e = run(engine, &ids, Bucket::new(64, 4)).unwrap_err();
        let over = e.downcast_ref::<OverLimits>().expect("a shape error");
        assert_eq!((over.tokens, over.seqs), (64, 4));
        assert!(e.to_string().contains("never split"), "{e}");
        // Too many tokens for the allocated shape.
        let ids = vec![vec![1; 40], vec![2; 40]];
        let e = run(engine, &ids, Bucket::new(128, 2)).unwrap_err();
        assert!(e.downcast_ref::<OverLimits>().is_some(), "{e}");
        // A batch over the bucket it was planned for.
        let ids = vec![vec![1; 10], vec![2; 10]];
        let e = run(engine, &ids, Bucket::new(16, 2)).unwrap_err();
        assert!(e.to_string().contains("does not fit its bucket"), "{e}");
    }

    #[test]
    fn each_question_shares_its_longest_prefix_with_a_neighbour_in_order() {
        let q = |ids: &[u32]| Question::text(ids.to_vec(), 2);
        let questions = [
            q(&[1, 2, 3, 4]),
            q(&[1, 2, 3, 5]),
            q(&[1, 9]),
            q(&[1, 2, 3, 4, 6]),
            q(&[7]),
        ];
        assert_eq!(longest_shared_prefixes(&questions), [4, 3, 1, 4, 0]);
        assert_eq!(longest_shared_prefixes(&questions[..1]), [0]);
        assert!(longest_shared_prefixes(&[]).is_empty());
        // Two equal prompts share all of it.
        assert_eq!(longest_shared_prefixes(&[q(&[5, 6]), q(&[5, 6])]), [2, 2]);
    }

    /// The chunk of a question carrying its state in `carry`, from `start`.
    fn chunk_of(carry: &ChunkCarry, start: usize, last: bool) -> Option<ChunkInput<'_>> {
        Some(ChunkInput { start, last, carry })
    }

    /// A batch holding a long question's chunk and a short question runs one pass: the chunk
    /// rides in the question's; both answer as they do whole (within 1e-5).
    #[test]
    fn a_chunk_rides_in_the_pass_of_the_questions_beside_it() {
        let source = ModelSource::resolve(None, None, None).unwrap();
        let options = LoadOptions {
            prefix_cache_bytes: Some(64 << 20),
            max_chunk_tokens: Some(64),
            ..LoadOptions::default()
        };
        let mut loaded = load(Device::Cpu, &source, BatchLimits::new(256, 4), options).unwrap();
        let reuse = loaded.prefix_reuse[0].clone();
        let engine = loaded.engines[0].as_mut();
        let long: Vec<u32> = (0..150).map(|i| 100 + (i * 37) % 900).collect();
        let short: Vec<u32> = (0..40).map(|i| 50 + (i * 11) % 700).collect();
        let seq = |ids, chunk| SeqInput {
            ids,
            n_options: 3,
            context: None,
            chunk,
        };
        let run_one = |engine: &mut dyn Engine, seqs: &[SeqInput<'_>]| {
            let tokens = seqs.iter().map(|s| s.ids.len()).sum();
            let batch = Batch {
                seqs,
                bucket: Bucket::new(256, 4),
                tokens,
            };
            engine.run_batch(&batch).unwrap()
        };
        let whole_long = run_one(engine, &[seq(&long, None)]).remove(0);
        let whole_short = run_one(engine, &[seq(&short, None)]).remove(0);
        let carry = ChunkCarry::default();
        let chunk = |start, last| chunk_of(&carry, start, last);
        let before = reuse.stats();
        let first = run_one(
            engine,
            &[seq(&long[..64], chunk(0, false)), seq(&short, None)],
        );
        let after = reuse.stats();
        assert_eq!(after.passes - before.passes, 1, "{after:?}");
        assert_eq!(after.computed_tokens - before.computed_tokens, 64 + 40);
        assert!(
            first[0].is_empty(),
            "a chunk that is not the last answers nothing"
        );
        let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5);
        assert!(
            close(&first[1], &whole_short),
            "{:?} {whole_short:?}",
            first[1]
        );
        let last = run_one(
            engine,
            &[seq(&short, None), seq(&long[64..], chunk(64, true))],
        );
        assert_eq!(reuse.stats().passes - after.passes, 1);
        assert!(close(&last[1], &whole_long), "{:?} {whole_long:?}", last[1]);
        assert!(close(&last[0], &whole_short));
        // The chunk did resume from its predecessor: without it the tail answers otherwise.
        let alone = run_one(engine, &[seq(&long[64..], None)]).remove(0);
        assert!(!close(&alone, &whole_long));
        // A chunk cut short to the room the short question leaves (the CPU resumes at any
        // token): 0..64, 64..101 beside it, then 101..150, still the whole question's answer.
        let cut_carry = ChunkCarry::default();
        let cut = |start, last| chunk_of(&cut_carry, start, last);
        run_one(engine, &[seq(&long[..64], cut(0, false))]);
        let beside = run_one(
            engine,
            &[seq(&short, None), seq(&long[64..101], cut(64, false))],
        );
        assert!(close(&beside[0], &whole_short));
        let rest = run_one(engine, &[seq(&long[101..], cut(101, true))]).remove(0);
        assert!(close(&rest, &whole_long), "{rest:?} {whole_long:?}");
    }

    #[test]
    fn snapshots_within_follow_the_flag_and_default_to_on() {
        let source = ModelSource::resolve(None, None, None).unwrap();
        for (flag, want) in [(None, true), (Some(false), false), (Some(true), true)] {
            let options = LoadOptions {
                prefix_cache_bytes: Some(1 << 20),
                snapshots_within: flag,
                ..LoadOptions::default()
            };
            let loaded = load(Device::Cpu, &source, BatchLimits::new(64, 2), options).unwrap();
            assert_eq!(
                loaded.prefix_reuse[0].takes_snapshots_within(),
                want,
                "{flag:?}"
            );
        }
    }

    #[test]
    fn the_cpu_loads_the_screenshot_path_when_asked() {
        assert!(demo_engine(true).preparer.serves_screenshots());
        assert!(!demo_engine(false).preparer.serves_screenshots());
    }

    /// Text and screenshot questions take the system turn's ids from the cache, and their ids
    /// are those of encoding the whole chat (Hugging Face `encode`), image placeholders expanded.
    #[test]
    fn prepared_ids_equal_the_whole_chats_encoding() {
        let loaded = demo_engine(true);
        let preparer = &loaded.preparer;
        assert!(preparer.tokenizer.uses_fast_path());
        assert!(preparer.prefix.text().ends_with("<|im_start|>"));
        assert!(!preparer.prefix.ids().is_empty());
        let users = [
            (
                "Goal: x\n\nApp: Mail\n\nOptions:\nA. Button \"Send\" -> click",
                1,
            ),
            (
                "  \n\n<|im_start|>user\n<|im_end|> 1234567890 日本 e\u{301} 's  ",
                2,
            ),
            ("<|vision_end|><|vision_start|>\u{301}x\t\n", 3),
        ];
        let whole = |chat: &str| preparer.tokenizer.encode_reference(chat).unwrap();
        for (user, _) in users {
            let chat = preparer.render(user).unwrap();
            assert_eq!(preparer.tokenize(&chat).unwrap(), whole(&chat), "{user:?}");
        }

        let path = "../model/tests/data/images/png_rgb_320x240.png";
        let image = Screenshot {
            format: crate::screenshot::ImageFormat::Png,
            bytes: std::fs::read(path).unwrap(),
        };
        let vision = preparer.vision.as_ref().unwrap();
        let grids = [preprocess(&image.bytes, "image/png").unwrap().grid_thw];
        let prepared = preparer.screenshot_questions(&image, &users).unwrap();
        for (question, (user, n_options)) in prepared.questions.iter().zip(users) {
            let chat = preparer
                .chat
                .render_with_image(SYSTEM_PROMPT, user)
                .unwrap();
            let expected = expand_image_placeholders(
                &whole(&chat),
                vision.image_token_id,
                &grids,
                vision.merge,
            )
            .unwrap();
            assert_eq!(question.ids, expected, "{user:?}");
            assert_eq!(question.n_options, n_options);
        }
    }

    #[test]
    fn batch_limits_are_the_schedulers_capacity() {
        let limits = batch_limits(Bucket::new(4096, 8));
        assert_eq!(limits, BatchLimits::new(4096, 8));
    }
}
