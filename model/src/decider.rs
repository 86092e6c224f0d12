//! A loaded decision model: the forward pass plus the letter readout, fed with token ids, and the
//! tokenizer and chat template that make those ids from a prompt.

use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use instinct_kernels::backend::VisionBackend;
use instinct_kernels::Backend;

use crate::chat::ChatTemplate;
use crate::checkpoint::Snapshot;
use crate::config::{ModelConfig, TextConfig};
use crate::forward::{BatchLimits, EmbeddingOverride, Segment, SequenceInput, TextModel};
use crate::lora::{LoraAdapter, LoraModule, LoraTarget, MergeReport};
use crate::prefix::PrefixState;
use crate::readout::LetterReadout;
use crate::tokenizer::{Tokenizer, MAX_LETTERS};
use crate::values::Values;
use crate::vision::{VisionConfig, VisionTower, VisionWeights};
use crate::weights::TextWeights;

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
    /// `[image tokens, hidden]`, shared by every question about the same image (where the tower
    /// left them: device memory on a GPU).
    pub features: Values,
    /// The row of `features` the prompt's first image token takes (0 for a whole question; a
    /// later part of one, [`Self::part`], starts further in).
    pub first_row: usize,
    /// One `[t, h, w]` per token of the prompt.
    pub positions: Vec<[u32; 3]>,
}

impl ImagePrompt {
    /// A whole question's image: every feature row, from the first.
    pub fn new(image_token_id: u32, features: Values, positions: Vec<[u32; 3]>) -> Self {
        Self {
            image_token_id,
            features,
            first_row: 0,
            positions,
        }
    }

    /// The image of tokens `range` of the prompt whose ids are `ids`, as a prompt of their own
    /// (a prefix or the tail resumed after it): their positions, and the feature rows from the
    /// first image token inside the range.
    pub fn part(&self, ids: &[u32], range: std::ops::Range<usize>) -> Self {
        let before = ids[..range.start]
            .iter()
            .filter(|&&t| t == self.image_token_id)
            .count();
        Self {
            image_token_id: self.image_token_id,
            features: self.features.clone(),
            first_row: self.first_row + before,
            positions: self.positions[range].to_vec(),
        }
    }
}

/// One sequence of a [`Decider::decide_segments`] batch: a whole question, a shared prefix, a
/// chunk of a long prompt or the tail that ends one.
#[derive(Clone, Copy, Debug)]
pub struct QuestionSegment<'a> {
    /// The segment's own ids (and image, whose positions are the segment's own).
    pub prompt: Prompt<'a>,
    /// The prefix this segment continues.
    pub resume: Option<&'a PrefixState>,
    /// Whether to return the state at the segment's end.
    pub snapshot: bool,
    /// With `snapshot`: the state after this many of the segment's own tokens instead, taken in
    /// the same pass (see [`Segment::snapshot_at`]).
    pub snapshot_at: Option<usize>,
    /// Whether to read out `prompt.n_options` letters at the end: a prefix or a middle chunk has
    /// no answer.
    pub answer: bool,
}

impl<'a> QuestionSegment<'a> {
    /// A whole question, or the tail of one resumed from `resume`: read out, no snapshot.
    pub fn answer(prompt: Prompt<'a>, resume: Option<&'a PrefixState>) -> Self {
        Self {
            prompt,
            resume,
            snapshot: false,
            snapshot_at: None,
            answer: true,
        }
    }

    /// A prefix (or a chunk, resumed from `resume`): its snapshot, no readout.
    pub fn prefix(ids: &'a [u32], resume: Option<&'a PrefixState>) -> Self {
        Self {
            prompt: Prompt::text(ids, 0),
            resume,
            snapshot: true,
            snapshot_at: None,
            answer: false,
        }
    }
}

/// What [`Decider::decide_segments`] returns for one segment.
#[derive(Clone, Debug)]
pub struct SegmentAnswer {
    /// The letter probabilities, when the segment asked for its answer.
    pub probabilities: Option<Vec<f32>>,
    /// The snapshot at the segment's end (or its `snapshot_at`), when asked for.
    pub snapshot: Option<PrefixState>,
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

    /// The model, for this crate's tests of its internals.
    #[cfg(test)]
    pub(crate) fn model_mut(&mut self) -> &mut TextModel<B> {
        &mut self.model
    }

    /// The largest batch one forward pass takes.
    pub fn limits(&self) -> BatchLimits {
        self.model.limits()
    }

    /// The backend the model runs on.
    pub fn backend(&self) -> &B {
        self.model.backend()
    }

    /// See [`TextModel::reserve_carry_arena`]; the bytes allocated.
    pub fn reserve_carry_arena(&mut self) -> Result<usize> {
        self.model.reserve_carry_arena()
    }

    /// See [`TextModel::reserve_carry_arena_for`]; the bytes allocated.
    pub fn reserve_carry_arena_for(&mut self, prefix_rows: usize) -> Result<usize> {
        self.model.reserve_carry_arena_for(prefix_rows)
    }

    /// The prefix rows the carry arena was reserved for, if it was.
    pub fn carry_arena_prefix_rows(&self) -> Option<usize> {
        self.model.carry_arena_prefix_rows()
    }

    /// What a prefix-state snapshot of its model costs.
    pub fn snapshot_cost(&self) -> crate::prefix::SnapshotCost {
        self.model.snapshot_cost()
    }

    /// See [`TextModel::snapshot_on_host`].
    pub fn snapshot_on_host(&self, state: &PrefixState) -> Result<PrefixState> {
        self.model.snapshot_on_host(state)
    }

    /// See [`TextModel::warm_shapes`].
    pub fn warm_shapes(&mut self) -> Result<Vec<usize>> {
        self.model.warm_shapes()
    }

    /// Probabilities of each prompt's first `n_options` letters, from one forward pass over all
    /// of `prompts`. A batch over the limits the model was allocated for is refused
    /// ([`OverLimits`](crate::forward::OverLimits)), not split: the caller plans batches that
    /// fit. A prompt's answer does not depend on what else shares its pass.
    pub fn decide(&mut self, prompts: &[Prompt<'_>]) -> Result<Vec<Vec<f32>>> {
        let tokens = prompts.iter().map(|p| p.ids.len()).sum();
        self.model.limits().check(tokens, prompts.len())?;
        let inputs: Vec<SequenceInput> = prompts
            .iter()
            .map(|p| SequenceInput {
                token_ids: p.ids,
                positions: p.image.map(|i| i.positions.as_slice()),
            })
            .collect();
        let overrides = self.overrides(prompts.iter());
        let hidden = self
            .model
            .forward_last_with_embeddings(&inputs, &overrides)?;
        prompts
            .iter()
            .zip(&hidden)
            .map(|(prompt, h)| self.readout.probabilities(h, prompt.n_options))
            .collect()
    }

    /// The image rows each prompt puts in place of its image tokens; none for a prompt without
    /// image tokens (text, or a tail after its image).
    fn overrides<'p>(
        &self,
        prompts: impl Iterator<Item = &'p Prompt<'p>>,
    ) -> Vec<Option<EmbeddingOverride<'p>>> {
        prompts
            .map(|p| {
                let image = p
                    .image
                    .filter(|image| p.ids.contains(&image.image_token_id));
                image.map(|image| EmbeddingOverride {
                    token_id: image.image_token_id,
                    values: &image.features,
                    first_row: image.first_row,
                })
            })
            .collect()
    }

    /// [`Self::decide`] for segments that may continue a [`PrefixState`] and may ask for theirs,
    /// in one forward pass (see [`crate::prefix`]). A segment's probabilities equal those of its
    /// whole prompt (prefix included) run by [`Self::decide`], up to rounding: the delta rule's
    /// chunk grid restarts at each segment, so on a GPU (64-token chunks) only segments that
    /// start on a multiple of 64 compute what the whole prompt does. A screenshot segment's image
    /// is its own part ([`ImagePrompt::part`]).
    pub fn decide_segments(
        &mut self,
        segments: &[QuestionSegment<'_>],
    ) -> Result<Vec<SegmentAnswer>> {
        let tokens = segments.iter().map(|s| s.prompt.ids.len()).sum();
        self.model.limits().check(tokens, segments.len())?;
        let inputs: Vec<Segment> = segments
            .iter()
            .map(|s| Segment {
                input: SequenceInput {
                    token_ids: s.prompt.ids,
                    positions: s.prompt.image.map(|i| i.positions.as_slice()),
                },
                resume: s.resume,
                snapshot: s.snapshot,
                snapshot_at: s.snapshot_at,
            })
            .collect();
        let overrides = self.overrides(segments.iter().map(|s| &s.prompt));
        let outputs = self.model.forward_segments(&inputs, &overrides)?;
        segments
            .iter()
            .zip(outputs)
            .map(|(seg, out)| {
                let probabilities = seg
                    .answer
                    .then(|| {
                        self.readout
                            .probabilities(&out.last_hidden, seg.prompt.n_options)
                    })
                    .transpose()?;
                Ok(SegmentAnswer {
                    probabilities,
                    snapshot: out.snapshot,
                })
            })
            .collect()
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

/// Milliseconds since `t0`, for the load-phase log lines.
fn ms_since(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

fn open_snapshot(model_dir: &Path) -> Result<Snapshot> {
    Snapshot::open(model_dir).with_context(|| format!("opening snapshot {}", model_dir.display()))
}

/// Drops the host copy of uploaded weights on another thread: returning ~17 GB of f32 pages to
/// the system takes a noticeable part of a second that start-up need not wait for.
fn free_in_background(weights: TextWeights) {
    if let Err(e) = std::thread::Builder::new()
        .name("free-weights".into())
        .spawn(move || drop(weights))
    {
        tracing::warn!("freeing the host weights on this thread: {e}");
    }
}

/// How an adapter's modules are merged into the language weights.
#[derive(Clone, Copy)]
enum Merge {
    /// Every module must be a language module (the text adapter).
    TextOnly,
    /// Language modules are merged; vision modules are handed back in the report.
    LanguageAndVision,
}

/// What both paths read before their own parts: the snapshot's language weights with an adapter
/// merged, the tokenizer, and the letter readout. Written once so that the text and the
/// screenshot paths open, merge and read out the same way.
struct Language {
    config: TextConfig,
    weights: TextWeights,
    tokenizer: Tokenizer,
    readout: LetterReadout,
    /// The merge's report (vision modules to merge elsewhere), when an adapter was given.
    report: Option<MergeReport>,
}

impl Language {
    // Each phase is logged with its time: loading is slow enough (seconds) that an operator
    // should see where it goes.
    fn read(
        snapshot: &Snapshot,
        model_dir: &Path,
        adapter: Option<(&Path, Merge)>,
    ) -> Result<Self> {
        // The tokenizer (0.5-0.8 s of parsing and table building on an H100 host) loads beside the
        // weights.
        std::thread::scope(|scope| {
            let tokenizer = scope.spawn(|| {
                let t0 = Instant::now();
                let tokenizer = Tokenizer::from_snapshot(model_dir);
                tracing::info!(ms = ms_since(t0), "tokenizer loaded");
                tokenizer
            });
            let (weights, report) = Self::read_weights(snapshot, adapter)?;
            let tokenizer = tokenizer
                .join()
                .map_err(|_| anyhow!("loading the tokenizer panicked"))??;
            let letter_ids = tokenizer.letter_ids(MAX_LETTERS)?;
            let readout = LetterReadout::from_embedding(&weights.embed_tokens, letter_ids)?;
            Ok(Self {
                config: snapshot.config().text.clone(),
                weights,
                tokenizer,
                readout,
                report,
            })
        })
    }

    /// The text weights with `adapter` merged, and the merge's report.
    fn read_weights(
        snapshot: &Snapshot,
        adapter: Option<(&Path, Merge)>,
    ) -> Result<(TextWeights, Option<MergeReport>)> {
        let Some((dir, merge)) = adapter else {
            let t0 = Instant::now();
            let weights = snapshot.load_text_weights()?;
            tracing::info!(
                values = weights.element_count(),
                ms = ms_since(t0),
                "text weights read (f32 on the host)"
            );
            return Ok((weights, None));
        };
        let t0 = Instant::now();
        let adapter =
            LoraAdapter::open(dir).with_context(|| format!("opening adapter {}", dir.display()))?;
        // Each Linear's modules are merged as it is decoded, while it is still in cache.
        let (weights, report) =
            adapter.read_merged_into_text(snapshot, matches!(merge, Merge::TextOnly))?;
        tracing::info!(
            values = weights.element_count(),
            modules = report.merged.len(),
            ms = ms_since(t0),
            "text weights read (f32 on the host) and the adapter's language modules merged"
        );
        Ok((weights, Some(report)))
    }

    /// Uploads the weights to `backend`, allocates activations for `limits`, and pairs the model
    /// with the readout.
    fn decider<B: Backend>(&self, backend: B, limits: BatchLimits) -> Result<Decider<B>> {
        let t0 = Instant::now();
        let backend_name = backend.name();
        let model = TextModel::new(backend, &self.config, &self.weights, limits)?;
        tracing::info!(
            backend = backend_name,
            ms = ms_since(t0),
            "weights uploaded and activations allocated"
        );
        Ok(Decider::new(model, self.readout.clone()))
    }
}

/// Loads a snapshot (and optionally a text adapter merged at load, in f32) onto `backend`.
pub fn load_text<B: Backend>(
    backend: B,
    model_dir: &Path,
    text_adapter: Option<&Path>,
    limits: BatchLimits,
) -> Result<LoadedText<B>> {
    let language = read_text_language(model_dir, text_adapter)?;
    finish_text(language, backend, model_dir, limits)
}

/// As [`load_text`], with the backend started by `start` on another thread while the weights are
/// read: a GPU backend's start (its context, its kernels loaded; ~0.3 s on an H100 host) then
/// costs no start-up time.
pub fn load_text_starting<B: Backend + Send>(
    start: impl FnOnce() -> Result<B> + Send,
    model_dir: &Path,
    text_adapter: Option<&Path>,
    limits: BatchLimits,
) -> Result<LoadedText<B>> {
    std::thread::scope(|scope| {
        let backend = scope.spawn(start);
        let language = read_text_language(model_dir, text_adapter);
        let backend = backend
            .join()
            .map_err(|_| anyhow!("starting the backend panicked"))?;
        finish_text(language?, backend?, model_dir, limits)
    })
}

fn read_text_language(model_dir: &Path, text_adapter: Option<&Path>) -> Result<Language> {
    Language::read(
        &open_snapshot(model_dir)?,
        model_dir,
        text_adapter.map(|dir| (dir, Merge::TextOnly)),
    )
}

fn finish_text<B: Backend>(
    language: Language,
    backend: B,
    model_dir: &Path,
    limits: BatchLimits,
) -> Result<LoadedText<B>> {
    let chat = ChatTemplate::from_snapshot(model_dir)?;
    let weights_bytes = 4 * language.weights.element_count() as u64;
    let decider = language.decider(backend, limits)?;
    let Language {
        weights, tokenizer, ..
    } = language;
    free_in_background(weights);
    Ok(LoadedText {
        tokenizer,
        chat,
        decider,
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

/// `vision_config` of a snapshot's config, or why it cannot answer screenshot questions.
fn vision_json(config: &ModelConfig) -> Result<&serde_json::Value> {
    config
        .vision
        .as_ref()
        .context("the snapshot has no vision_config: it cannot answer screenshot questions")
}

/// Reads the vision weights (f32 on the host).
fn read_vision(snapshot: &Snapshot, config: &VisionConfig) -> Result<VisionWeights> {
    let t0 = Instant::now();
    let weights = VisionWeights::load(snapshot, config)?;
    tracing::info!(ms = ms_since(t0), "vision weights read (f32 on the host)");
    Ok(weights)
}

/// Merges `modules` (vision modules only) into the vision weights. Shared by the screenshot path
/// and the tower alone.
fn merge_vision(weights: &mut VisionWeights, modules: &[LoraModule]) -> Result<()> {
    let merged_vision = weights.merge_lora(modules)?;
    tracing::info!(vision = merged_vision, "adapter's vision modules merged");
    Ok(())
}

/// Uploads the vision weights to `backend`.
fn upload_tower<B: VisionBackend>(
    backend: B,
    config: &VisionConfig,
    weights: &VisionWeights,
) -> Result<VisionTower<B>> {
    let t0 = Instant::now();
    let backend_name = backend.name();
    let tower = VisionTower::new(backend, config, weights)?;
    tracing::info!(
        backend = backend_name,
        ms = ms_since(t0),
        "vision weights uploaded"
    );
    Ok(tower)
}

/// Loads the vision tower alone onto `backend`, with the vision modules of `adapter_dir` (a
/// multimodal adapter) merged; its language modules go nowhere. The language weights are not
/// read: this is the screenshot path's tower, for timing it apart from the language model.
pub fn load_vision_tower<B: VisionBackend>(
    backend: B,
    model_dir: &Path,
    adapter_dir: Option<&Path>,
) -> Result<VisionTower<B>> {
    let snapshot = open_snapshot(model_dir)?;
    let config = VisionConfig::from_json(vision_json(snapshot.config())?)?;
    let modules: Vec<LoraModule> = match adapter_dir {
        Some(dir) => {
            let t0 = Instant::now();
            let adapter = LoraAdapter::open(dir)
                .with_context(|| format!("opening adapter {}", dir.display()))?;
            let vision: Vec<LoraModule> = adapter
                .modules()
                .iter()
                .filter(|m| matches!(m.target, LoraTarget::Vision(_)))
                .cloned()
                .collect();
            tracing::info!(
                modules = vision.len(),
                ms = ms_since(t0),
                "adapter read (its vision modules kept)"
            );
            vision
        }
        None => Vec::new(),
    };
    let mut weights = read_vision(&snapshot, &config)?;
    merge_vision(&mut weights, &modules)?;
    upload_tower(backend, &config, &weights)
}

/// Loads the screenshot path: the language model onto `language_backend`, the vision tower onto
/// `vision_backend`. Every key of the adapter must land on a language or a vision weight.
pub fn load_multimodal<B: VisionBackend>(
    language_backend: B,
    vision_backend: B,
    model_dir: &Path,
    adapter_dir: &Path,
    limits: BatchLimits,
) -> Result<LoadedMultimodal<B>> {
    read_multimodal(model_dir, adapter_dir)?.upload(language_backend, vision_backend, limits)
}

/// The screenshot path read on the host, not yet on a backend: the language weights with the
/// multimodal adapter's language modules merged, the vision weights with its vision modules
/// merged. Apart from the upload so that a server reads it beside its text copy.
pub struct MultimodalHost {
    language: Language,
    vision: VisionWeights,
    vision_config: VisionConfig,
    image_token_id: u32,
}

/// Reads the screenshot path of `model_dir` with the multimodal adapter of `adapter_dir` merged
/// (see [`load_multimodal`]).
pub fn read_multimodal(model_dir: &Path, adapter_dir: &Path) -> Result<MultimodalHost> {
    // The config is checked before the (slow) weights are read.
    let snapshot = open_snapshot(model_dir)?;
    let config = snapshot.config();
    let vision_json = vision_json(config)?;
    let image_token_id = config
        .image_token_id
        .context("config.json has no image_token_id")?;
    let vision_config = VisionConfig::from_json(vision_json)?;
    // The tower's weights are read beside the language model's (0.7 s on an H100 host that
    // start-up would otherwise wait for after them); the adapter's vision modules, which the
    // language read hands back, are merged into them after.
    let (mut language, mut vision) = std::thread::scope(|scope| {
        let vision = scope.spawn(|| read_vision(&snapshot, &vision_config));
        let language = Language::read(
            &snapshot,
            model_dir,
            Some((adapter_dir, Merge::LanguageAndVision)),
        );
        let vision = vision
            .join()
            .map_err(|_| anyhow!("reading the vision weights panicked"))?;
        anyhow::Ok((language?, vision?))
    })?;
    let vision_modules = language.report.take().map(|r| r.vision).unwrap_or_default();
    merge_vision(&mut vision, &vision_modules)?;
    Ok(MultimodalHost {
        language,
        vision,
        vision_config,
        image_token_id,
    })
}

impl MultimodalHost {
    /// Uploads the language model to `language_backend` and the vision tower to
    /// `vision_backend`.
    pub fn upload<B: VisionBackend>(
        self,
        language_backend: B,
        vision_backend: B,
        limits: BatchLimits,
    ) -> Result<LoadedMultimodal<B>> {
        let vision = upload_tower(vision_backend, &self.vision_config, &self.vision)?;
        let decider = self.language.decider(language_backend, limits)?;
        free_in_background(self.language.weights);
        Ok(LoadedMultimodal {
            decider,
            vision,
            image_token_id: self.image_token_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use instinct_kernels::CpuBackend;

    use super::*;
    use crate::forward::OverLimits;

    /// The backend started beside the weights' reading gives the same answers as one started
    /// first; a start that fails fails the load with its error.
    #[test]
    fn a_backend_started_beside_the_reading_answers_the_same() {
        let limits = BatchLimits::new(64, 2);
        let demo = crate::demo::materialize(&std::env::temp_dir()).unwrap();
        let adapter = Some(demo.text_adapter_dir.as_path());
        let mut first = load_text(CpuBackend::new(), &demo.model_dir, adapter, limits).unwrap();
        let start = || Ok(CpuBackend::new());
        let mut beside = load_text_starting(start, &demo.model_dir, adapter, limits).unwrap();
        let prompts = [Prompt::text(&[1, 2, 3, 4], 3), Prompt::text(&[5, 6], 2)];
        assert_eq!(
            first.decider.decide(&prompts).unwrap(),
            beside.decider.decide(&prompts).unwrap()
        );
        let failing = || -> Result<CpuBackend> { Err(anyhow!("no device here")) };
        let err = load_text_starting(failing, &demo.model_dir, adapter, limits)
            .err()
            .expect("the start failed");
        assert!(format!("{err:#}").contains("no device here"), "{err:#}");
    }

    #[test]
    fn decide_runs_one_pass_and_refuses_a_batch_over_its_limits() {
        let limits = BatchLimits::new(8, 2);
        let mut loaded = crate::demo::load_text(CpuBackend::new(), limits).unwrap();
        let ids: [&[u32]; 3] = [&[1, 2, 3], &[4, 5], &[6]];
        let prompts: Vec<Prompt> = ids.iter().map(|ids| Prompt::text(ids, 3)).collect();
        let two = loaded.decider.decide(&prompts[..2]).unwrap();
        assert_eq!(two.len(), 2);
        assert!(two.iter().all(|p| p.len() == 3));
        let e = loaded.decider.decide(&prompts).unwrap_err();
        assert_eq!(
            e.downcast_ref::<OverLimits>(),
            Some(&OverLimits {
                tokens: 6,
                seqs: 3,
                limits
            })
        );
        let long = [9u32; 9];
        let e = loaded
            .decider
            .decide(&[Prompt::text(&long, 2)])
            .unwrap_err();
        assert!(e.downcast_ref::<OverLimits>().is_some(), "{e}");
    }

    #[test]
    fn the_screenshot_path_loads_on_a_vision_backend() {
        let demo = crate::demo::materialize(&std::env::temp_dir()).unwrap();
        let limits = BatchLimits::new(64, 1);
        let loaded = load_multimodal(
            CpuBackend::new(),
            CpuBackend::new(),
            &demo.model_dir,
            &demo.multimodal_adapter_dir,
            limits,
        )
        .unwrap();
        assert_eq!(loaded.decider.limits(), limits);
        assert!(loaded.vision.config().spatial_merge_size > 0);
    }

    /// The tower's weights are read beside the language copy's: a tower that cannot be read still
    /// fails the screenshot path with its reason.
    #[test]
    fn a_tower_that_cannot_be_read_fails_the_screenshot_path_with_its_reason() {
        let demo = crate::demo::materialize(&std::env::temp_dir()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(&demo.model_dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
            }
        }
        // One block more than the snapshot holds.
        let config_path = dir.path().join("config.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
        let depth = config["vision_config"]["depth"].as_u64().unwrap();
        config["vision_config"]["depth"] = (depth + 1).into();
        std::fs::write(&config_path, config.to_string()).unwrap();
        let err = read_multimodal(dir.path(), &demo.multimodal_adapter_dir)
            .err()
            .expect("a missing vision block fails the read");
        let err = format!("{err:#}");
        assert!(err.contains(&format!("blocks.{depth}.")), "{err}");
    }

    #[test]
    fn the_tower_alone_is_the_screenshot_paths_tower() {
        let demo = crate::demo::materialize(&std::env::temp_dir()).unwrap();
        let loaded = load_multimodal(
            CpuBackend::new(),
            CpuBackend::new(),
            &demo.model_dir,
            &demo.multimodal_adapter_dir,
            BatchLimits::new(64, 1),
        )
        .unwrap();
        // 4 x 6 patches: a 96x64 image.
        let rgb: Vec<u8> = (0..96 * 64 * 3).map(|i| (i * 7919 % 256) as u8).collect();
        let images = [crate::vision::ImageInput {
            rgb: &rgb,
            grid_thw: [1, 4, 6],
        }];
        let want = loaded.vision.forward(&images).unwrap();
        let adapter = Some(demo.multimodal_adapter_dir.as_path());
        let alone = load_vision_tower(CpuBackend::new(), &demo.model_dir, adapter).unwrap();
        assert_eq!(alone.forward(&images).unwrap(), want);
        // The base tower answers otherwise: the adapter's vision modules were merged.
        let base = load_vision_tower(CpuBackend::new(), &demo.model_dir, None).unwrap();
        assert_ne!(base.forward(&images).unwrap(), want);
    }
}
