//! A Hugging Face snapshot directory of Qwen3.5 (`config.json` + safetensors weights) and the
//! loading of its text model into f32 [`TextWeights`].
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use instinct_model::checkpoint::Snapshot;
//! use instinct_model::lora::LoraAdapter;
//!
//! let snapshot = Snapshot::open("/models/Qwen3.5-4B")?;
//! let mut weights = snapshot.load_text_weights()?;
//! let adapter = LoraAdapter::open("/models/cua-s1-4b-0.2/text")?;
//! let report = adapter.merge_into_text_only(&mut weights)?;
//! assert_eq!(report.merged.len(), adapter.modules().len());
//! # Ok(()) }
//! ```
//!
//! Two tensor-name layouts are accepted, as transformers writes them:
//! `model.language_model.*` (`Qwen3_5ForConditionalGeneration`, the layout of the published
//! Qwen3.5-4B snapshot, with the vision tower under `model.visual.*`) and `model.*`
//! (`Qwen3_5ForCausalLM`). `mtp.*` (multi-token prediction head) is never loaded, as in
//! transformers. Every shape is derived from `config.json`; the file's shape must match it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};

use crate::config::{LayerKind, ModelConfig, TextConfig};
use crate::lora::{LoraModule, TextLinear};
use crate::tensor_store::TensorStore;
use crate::weights::{
    AttentionWeights, DeltaNetWeights, HostTensor, LayerWeights, MixerWeights, MlpWeights,
    TextWeights,
};

/// Prefix of the vision tower's tensors (not loaded by the text loader).
pub const VISION_PREFIX: &str = "model.visual.";
/// Prefix of the multi-token-prediction head's tensors (never loaded).
pub const MTP_PREFIX: &str = "mtp.";
/// Name of an untied LM head.
pub const LM_HEAD: &str = "lm_head.weight";

/// Which model class saved the snapshot, told apart by where the text model's tensors live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotLayout {
    /// `Qwen3_5ForConditionalGeneration`: text model under `model.language_model.`.
    ConditionalGeneration,
    /// `Qwen3_5ForCausalLM`: text model under `model.`.
    CausalLm,
}

impl SnapshotLayout {
    /// Prefix of every text-model tensor name.
    pub fn text_prefix(self) -> &'static str {
        match self {
            SnapshotLayout::ConditionalGeneration => "model.language_model.",
            SnapshotLayout::CausalLm => "model.",
        }
    }
}

/// An opened snapshot: parsed config and the index of its (memory-mapped) tensors. Nothing is
/// read into memory until a load call.
pub struct Snapshot {
    dir: PathBuf,
    config: ModelConfig,
    store: TensorStore,
    layout: SnapshotLayout,
}

impl Snapshot {
    /// Reads `dir/config.json` and maps `dir/model.safetensors` or the shards of
    /// `dir/model.safetensors.index.json`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let config_path = dir.join("config.json");
        let config_text = std::fs::read_to_string(&config_path)
            .with_context(|| format!("reading {}", config_path.display()))?;
        let config = ModelConfig::from_json(&config_text)
            .with_context(|| format!("parsing {}", config_path.display()))?;
        let store = TensorStore::open_snapshot_dir(&dir)?;
        let layout = detect_layout(&store).with_context(|| format!("{}", dir.display()))?;
        let snapshot = Self {
            dir,
            config,
            store,
            layout,
        };
        snapshot.check_no_foreign_tensors()?;
        Ok(snapshot)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn layout(&self) -> SnapshotLayout {
        self.layout
    }

    /// The raw tensor index (names, stored shapes and dtypes).
    pub fn tensors(&self) -> &TensorStore {
        &self.store
    }

    /// Reads one tensor by its full name, as stored, converted to f32 (for the vision loader
    /// and tools).
    pub fn read_tensor_f32(&self, name: &str) -> Result<HostTensor> {
        self.store
            .read_f32(name)
            .with_context(|| format!("snapshot {}", self.dir.display()))
    }

    /// Loads every text-model weight in f32, checking each shape against `config.json`. The
    /// embedding doubles as the LM head, so `tie_word_embeddings` must be true.
    pub fn load_text_weights(&self) -> Result<TextWeights> {
        self.load_text_weights_merging(&|_, _| None)
    }

    /// As [`load_text_weights`](Self::load_text_weights), with the LoRA module `merge(layer,
    /// linear)` names (if any) merged into each Linear as it is decoded: one pass over the weights
    /// instead of a second one to merge, the same values as
    /// [`LoraModule::merge_into`] after the load.
    pub fn load_text_weights_merging<'m>(
        &self,
        merge: &dyn Fn(usize, TextLinear) -> Option<&'m LoraModule>,
    ) -> Result<TextWeights> {
        self.load_text_weights_inner(merge)
            .with_context(|| format!("loading text weights from {}", self.dir.display()))
    }

    fn load_text_weights_inner<'m>(
        &self,
        merge: &dyn Fn(usize, TextLinear) -> Option<&'m LoraModule>,
    ) -> Result<TextWeights> {
        let has_head = self.store.contains(LM_HEAD);
        if !self.config.tie_word_embeddings {
            bail!(
                "tie_word_embeddings is false{}: an untied LM head is not supported (Qwen3.5-4B ties it)",
                if has_head { " and the checkpoint has lm_head.weight" } else { "" }
            );
        }
        if has_head {
            // transformers ties the head to the embedding and never reads this tensor.
            tracing::warn!(
                "{LM_HEAD} present with tied embeddings; it is ignored, as in transformers"
            );
        }
        let text = &self.config.text;
        let names = TextTensorNames::new(self.layout.text_prefix());
        self.check_no_unexpected_text_tensors(&names, text)?;

        let read = |name: &str, shape: &[usize]| self.store.read_f32_expect(name, shape);
        let hidden = text.hidden_size;
        let embed_tokens = read(
            &names.global("embed_tokens.weight"),
            &[text.vocab_size, hidden],
        )?;
        let norm = read(&names.global("norm.weight"), &[hidden])?;
        let layers = (0..text.num_hidden_layers)
            .map(|i| self.load_layer(&names, text, i, merge))
            .collect::<Result<Vec<_>>>()?;
        Ok(TextWeights {
            embed_tokens,
            norm,
            layers,
        })
    }

    fn load_layer<'m>(
        &self,
        names: &TextTensorNames,
        text: &TextConfig,
        i: usize,
        merge: &dyn Fn(usize, TextLinear) -> Option<&'m LoraModule>,
    ) -> Result<LayerWeights> {
        let read = |suffix: &str, shape: &[usize]| {
            let name = names.layer(i, suffix);
            let module = suffix
                .strip_suffix(".weight")
                .and_then(TextLinear::from_path)
                .and_then(|linear| merge(i, linear));
            match module {
                Some(m) => {
                    m.check_shape(shape)?;
                    self.store.read_f32_expect_then(&name, shape, &|row, rows| {
                        m.merge_into_rows(row, rows)
                    })
                }
                None => self.store.read_f32_expect(&name, shape),
            }
        };
        let hidden = text.hidden_size;
        let inter = text.intermediate_size;
        let mixer = match text.layer_types[i] {
            LayerKind::LinearAttention => {
                let qkv = text.linear_qkv_dim();
                let hv = text.linear_num_value_heads;
                let value_dim = hv * text.linear_value_head_dim;
                let kernel = text.linear_conv_kernel_dim;
                let conv = read("linear_attn.conv1d.weight", &[qkv, 1, kernel])?;
                MixerWeights::Linear(DeltaNetWeights {
                    in_proj_qkv: read("linear_attn.in_proj_qkv.weight", &[qkv, hidden])?,
                    in_proj_z: read("linear_attn.in_proj_z.weight", &[value_dim, hidden])?,
                    in_proj_b: read("linear_attn.in_proj_b.weight", &[hv, hidden])?,
                    in_proj_a: read("linear_attn.in_proj_a.weight", &[hv, hidden])?,
                    // Depthwise Conv1d weight [channels, 1, kernel]: drop the unit axis.
                    conv1d: HostTensor::new(vec![qkv, kernel], conv.data),
                    dt_bias: read("linear_attn.dt_bias", &[hv])?,
                    a_log: read("linear_attn.A_log", &[hv])?,
                    norm: read("linear_attn.norm.weight", &[text.linear_value_head_dim])?,
                    out_proj: read("linear_attn.out_proj.weight", &[hidden, value_dim])?,
                })
            }
            LayerKind::FullAttention => {
                let d = text.head_dim;
                let q_width = text.num_attention_heads * d;
                let kv_width = text.num_key_value_heads * d;
                MixerWeights::Full(AttentionWeights {
                    // Query and output-gate rows interleaved per head, hence twice the width.
                    q_proj: read("self_attn.q_proj.weight", &[2 * q_width, hidden])?,
                    k_proj: read("self_attn.k_proj.weight", &[kv_width, hidden])?,
                    v_proj: read("self_attn.v_proj.weight", &[kv_width, hidden])?,
                    o_proj: read("self_attn.o_proj.weight", &[hidden, q_width])?,
                    q_norm: read("self_attn.q_norm.weight", &[d])?,
                    k_norm: read("self_attn.k_norm.weight", &[d])?,
                })
            }
        };
        Ok(LayerWeights {
            input_layernorm: read("input_layernorm.weight", &[hidden])?,
            post_attention_layernorm: read("post_attention_layernorm.weight", &[hidden])?,
            mixer,
            mlp: MlpWeights {
                gate_proj: read("mlp.gate_proj.weight", &[inter, hidden])?,
                up_proj: read("mlp.up_proj.weight", &[inter, hidden])?,
                down_proj: read("mlp.down_proj.weight", &[hidden, inter])?,
            },
        })
    }

    /// Every tensor must belong to the text model, the vision tower, the MTP head or be the LM
    /// head; anything else means this is not a Qwen3.5 snapshot of a layout we know.
    fn check_no_foreign_tensors(&self) -> Result<()> {
        let prefix = self.layout.text_prefix();
        let foreign: Vec<&str> = self
            .store
            .names()
            .filter(|n| {
                !(n.starts_with(VISION_PREFIX)
                    || n.starts_with(MTP_PREFIX)
                    || *n == LM_HEAD
                    || n.starts_with(prefix))
            })
            .collect();
        ensure!(
            foreign.is_empty(),
            "{}: {} tensor(s) outside the known Qwen3.5 prefixes ({prefix}, {VISION_PREFIX}, {MTP_PREFIX}, {LM_HEAD}), e.g. {}",
            self.dir.display(),
            foreign.len(),
            sample(&foreign)
        );
        Ok(())
    }

    /// A text tensor this loader does not know (a bias, an extra layer) would otherwise be
    /// silently dropped and the forward pass would differ from transformers'.
    fn check_no_unexpected_text_tensors(
        &self,
        names: &TextTensorNames,
        text: &TextConfig,
    ) -> Result<()> {
        let expected = expected_text_tensor_names(names, text);
        let unexpected: Vec<&str> = self
            .store
            .names()
            .filter(|n| n.starts_with(names.prefix) && !n.starts_with(VISION_PREFIX))
            .filter(|n| !expected.contains(*n))
            .collect();
        ensure!(
            unexpected.is_empty(),
            "{} text tensor(s) that config.json does not account for, e.g. {}",
            unexpected.len(),
            sample(&unexpected)
        );
        Ok(())
    }
}

/// Full tensor names of the text model under one prefix.
struct TextTensorNames {
    prefix: &'static str,
}

impl TextTensorNames {
    fn new(prefix: &'static str) -> Self {
        Self { prefix }
    }

    fn global(&self, suffix: &str) -> String {
        format!("{}{suffix}", self.prefix)
    }

    fn layer(&self, i: usize, suffix: &str) -> String {
        format!("{}layers.{i}.{suffix}", self.prefix)
    }
}

const LAYER_COMMON: &[&str] = &[
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
];
const DELTANET_TENSORS: &[&str] = &[
    "linear_attn.in_proj_qkv.weight",
    "linear_attn.in_proj_z.weight",
    "linear_attn.in_proj_b.weight",
    "linear_attn.in_proj_a.weight",
    "linear_attn.conv1d.weight",
    "linear_attn.dt_bias",
    "linear_attn.A_log",
    "linear_attn.norm.weight",
    "linear_attn.out_proj.weight",
];
const ATTENTION_TENSORS: &[&str] = &[
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
];

fn expected_text_tensor_names(names: &TextTensorNames, text: &TextConfig) -> BTreeSet<String> {
    let mut set = BTreeSet::new();
    set.insert(names.global("embed_tokens.weight"));
    set.insert(names.global("norm.weight"));
    for (i, kind) in text.layer_types.iter().enumerate() {
        let mixer = match kind {
            LayerKind::LinearAttention => DELTANET_TENSORS,
            LayerKind::FullAttention => ATTENTION_TENSORS,
        };
        for suffix in LAYER_COMMON.iter().chain(mixer) {
            set.insert(names.layer(i, suffix));
        }
    }
    set
}

/// The layout is decided by where the embedding is; both at once is ambiguous.
fn detect_layout(store: &TensorStore) -> Result<SnapshotLayout> {
    let has = |layout: SnapshotLayout| {
        store.contains(&format!("{}embed_tokens.weight", layout.text_prefix()))
    };
    match (
        has(SnapshotLayout::ConditionalGeneration),
        has(SnapshotLayout::CausalLm),
    ) {
        (true, false) => Ok(SnapshotLayout::ConditionalGeneration),
        (false, true) => Ok(SnapshotLayout::CausalLm),
        (true, true) => bail!(
            "both model.language_model.embed_tokens.weight and model.embed_tokens.weight are present: ambiguous layout"
        ),
        (false, false) => bail!(
            "tensor `model.language_model.embed_tokens.weight` (or `model.embed_tokens.weight`) is missing: not a Qwen3.5 text checkpoint"
        ),
    }
}

/// Up to five names for an error message.
fn sample(names: &[&str]) -> String {
    let mut s = names
        .iter()
        .take(5)
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > 5 {
        s.push_str(", ...");
    }
    s
}
