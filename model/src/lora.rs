//! PEFT LoRA adapters (`adapter_config.json` + `adapter_model.safetensors`) merged into the f32
//! base weights at load: `W' = W + scale · B · A`, with A `[r, in]`, B `[out, r]` and scale
//! alpha/r (alpha/√r with rsLoRA).
//!
//! Stricter than PEFT, which only warns: every key must be a `lora_A`/`lora_B` weight with its
//! partner, of rank `r`, and must land on an existing Linear of matching shape; anything else is
//! an error naming the key. Nothing is modified unless the whole merge is valid.
//!
//! Vision-tower modules (`model.visual.*`, in the Cua-S1 `multimodal/` adapter) cannot be merged
//! here; [`LoraAdapter::merge_into_text`] hands them back in [`MergeReport::vision`] for the
//! vision loader, and [`LoraAdapter::merge_into_text_only`] refuses such an adapter up front.

mod adapter_config;
mod target;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};

pub use adapter_config::{AdapterConfig, TargetModules};
pub use target::{AdapterKeyLayout, LoraTarget, TextLinear, VisionLinear};

use crate::config::LayerKind;
use crate::tensor_store::TensorStore;
use crate::weights::{HostTensor, MixerWeights, TextWeights};

/// File names inside an adapter directory.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";

const A_SUFFIX: &str = ".lora_A.weight";
const B_SUFFIX: &str = ".lora_B.weight";

/// One adapted Linear: its A/B pair and the scale to merge it with.
#[derive(Clone, Debug)]
pub struct LoraModule {
    /// The module's key as stored, without `.lora_{A,B}.weight`; used in messages.
    pub key: String,
    pub target: LoraTarget,
    /// `[r, in]`
    pub a: HostTensor,
    /// `[out, r]`
    pub b: HostTensor,
    pub scale: f32,
}

impl LoraModule {
    /// `[out, in]` of the Linear this module adapts.
    pub fn weight_shape(&self) -> [usize; 2] {
        let dim = |t: &HostTensor, axis: usize| t.shape.get(axis).copied().unwrap_or(0);
        [dim(&self.b, 0), dim(&self.a, 1)]
    }

    /// Adds `scale · B · A` to `weight`, which must be `[out, in]`.
    pub fn merge_into(&self, weight: &mut HostTensor) -> Result<()> {
        self.check_weight_shape(weight)?;
        let [out, inputs] = self.weight_shape();
        add_scaled_product(
            &mut weight.data,
            out,
            inputs,
            &self.b.data,
            &self.a.data,
            self.a.shape[0],
            self.scale,
        );
        Ok(())
    }

    fn check_weight_shape(&self, weight: &HostTensor) -> Result<()> {
        // The fields are public, so a hand-built module is re-checked before indexing with it.
        ensure!(
            self.a.shape.len() == 2
                && self.b.shape.len() == 2
                && self.a.shape[0] == self.b.shape[1],
            "adapter module `{}`: lora_A {:?} and lora_B {:?} do not share a rank",
            self.key,
            self.a.shape,
            self.b.shape
        );
        ensure!(
            weight.shape == self.weight_shape(),
            "adapter module `{}` (lora_B {:?}, lora_A {:?}) needs a base weight of shape {:?}, but {} has shape {:?}",
            self.key,
            self.b.shape,
            self.a.shape,
            self.weight_shape(),
            self.target,
            weight.shape
        );
        Ok(())
    }
}

/// What a text merge did.
#[derive(Debug)]
pub struct MergeReport {
    /// Text modules merged, in the adapter's key order.
    pub merged: Vec<LoraTarget>,
    /// Vision-tower modules not merged (the caller owns them now: merge them into the vision
    /// weights with [`LoraModule::merge_into`], or refuse the adapter).
    pub vision: Vec<LoraModule>,
}

/// A loaded LoRA adapter.
#[derive(Debug)]
pub struct LoraAdapter {
    dir: PathBuf,
    config: AdapterConfig,
    key_layout: Option<AdapterKeyLayout>,
    modules: Vec<LoraModule>,
}

impl LoraAdapter {
    /// Reads `dir/adapter_config.json` and `dir/adapter_model.safetensors`, pairs every A with
    /// its B and resolves every module to a base-model Linear.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        Self::open_inner(&dir).with_context(|| format!("LoRA adapter {}", dir.display()))
    }

    fn open_inner(dir: &Path) -> Result<Self> {
        let config_path = dir.join(ADAPTER_CONFIG_FILE);
        let text = std::fs::read_to_string(&config_path)
            .with_context(|| format!("reading {}", config_path.display()))?;
        let config = AdapterConfig::from_json(&text).context(ADAPTER_CONFIG_FILE)?;

        let weights_path = dir.join(ADAPTER_WEIGHTS_FILE);
        if !weights_path.is_file() && dir.join("adapter_model.bin").is_file() {
            bail!("only {ADAPTER_WEIGHTS_FILE} is supported, found a pickled adapter_model.bin");
        }
        let store = TensorStore::open_file(&weights_path)?;
        ensure!(!store.is_empty(), "{ADAPTER_WEIGHTS_FILE} holds no tensors");

        let pairs = pair_keys(&store)?;
        let scale = config.scale() as f32;
        let mut key_layout = None;
        let mut modules = Vec::with_capacity(pairs.len());
        for (key, (a_name, b_name)) in pairs {
            let (target, layout, base_path) = target::parse_module_path(&key)
                .with_context(|| format!("adapter key `{a_name}`"))?;
            if let Some(layout) = layout {
                match key_layout {
                    None => key_layout = Some(layout),
                    Some(seen) => ensure!(
                        seen == layout,
                        "adapter key `{a_name}` uses the {layout:?} layout but earlier keys use {seen:?}"
                    ),
                }
            }
            ensure!(
                config.selects(base_path),
                "adapter key `{a_name}` adapts `{base_path}`, which target_modules {:?} (minus exclude_modules) does not select",
                config.target_modules
            );
            if let (Some(layers), LoraTarget::Text { layer, .. }) =
                (&config.layers_to_transform, target)
            {
                ensure!(
                    layers.contains(&layer),
                    "adapter key `{a_name}` is for layer {layer}, outside layers_to_transform {layers:?}"
                );
            }
            let a = store.read_f32(&a_name)?;
            let b = store.read_f32(&b_name)?;
            let rank_ok = a.shape.len() == 2
                && b.shape.len() == 2
                && a.shape[0] == config.r
                && b.shape[1] == config.r;
            ensure!(
                rank_ok,
                "adapter module `{key}`: lora_A has shape {:?} and lora_B {:?}; expected [r, in] and [out, r] with r = {}",
                a.shape,
                b.shape,
                config.r
            );
            modules.push(LoraModule {
                key,
                target,
                a,
                b,
                scale,
            });
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            config,
            key_layout,
            modules,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &AdapterConfig {
        &self.config
    }

    /// The text key layout (`None` if the adapter has no text module).
    pub fn key_layout(&self) -> Option<AdapterKeyLayout> {
        self.key_layout
    }

    /// All adapted modules, sorted by key.
    pub fn modules(&self) -> &[LoraModule] {
        &self.modules
    }

    /// Whether any module adapts the vision tower.
    pub fn targets_vision(&self) -> bool {
        self.vision_modules().next().is_some()
    }

    fn vision_modules(&self) -> impl Iterator<Item = &LoraModule> {
        self.modules
            .iter()
            .filter(|m| matches!(m.target, LoraTarget::Vision(_)))
    }

    /// Merges every text module into `weights` and returns the vision modules untouched.
    /// All modules are checked (existence of the Linear, shape) before any weight changes.
    pub fn merge_into_text(&self, weights: &mut TextWeights) -> Result<MergeReport> {
        self.merge_inner(weights)
            .with_context(|| format!("merging LoRA adapter {}", self.dir.display()))
    }

    /// As [`merge_into_text`](Self::merge_into_text), for a server without a vision tower: an
    /// adapter that also targets the vision tower is refused before anything is merged.
    pub fn merge_into_text_only(&self, weights: &mut TextWeights) -> Result<MergeReport> {
        let vision: Vec<String> = self
            .vision_modules()
            .map(|m| m.target.to_string())
            .collect();
        ensure!(
            vision.is_empty(),
            "LoRA adapter {}: this adapter targets the vision tower ({} modules, e.g. {}); screenshot serving is not supported yet, use the text adapter",
            self.dir.display(),
            vision.len(),
            vision[0]
        );
        self.merge_into_text(weights)
    }

    fn merge_inner(&self, weights: &mut TextWeights) -> Result<MergeReport> {
        let text_modules = || {
            self.modules.iter().filter_map(|m| match m.target {
                LoraTarget::Text { layer, linear } => Some((m, layer, linear)),
                LoraTarget::Vision(_) => None,
            })
        };
        // Validate everything first so a bad key leaves the weights as they were.
        for (module, layer, linear) in text_modules() {
            let weight = text_weight_mut(weights, layer, linear)
                .with_context(|| format!("adapter module `{}`", module.key))?;
            module.check_weight_shape(weight)?;
        }
        let mut merged = Vec::new();
        for (module, layer, linear) in text_modules() {
            module.merge_into(text_weight_mut(weights, layer, linear)?)?;
            merged.push(module.target);
        }
        Ok(MergeReport {
            merged,
            vision: self.vision_modules().cloned().collect(),
        })
    }
}

/// Groups the stored keys into (module → (A name, B name)).
fn pair_keys(store: &TensorStore) -> Result<BTreeMap<String, (String, String)>> {
    let mut halves: BTreeMap<String, (Option<String>, Option<String>)> = BTreeMap::new();
    for name in store.names() {
        if let Some(module) = name.strip_suffix(A_SUFFIX) {
            halves.entry(module.to_string()).or_default().0 = Some(name.to_string());
        } else if let Some(module) = name.strip_suffix(B_SUFFIX) {
            halves.entry(module.to_string()).or_default().1 = Some(name.to_string());
        } else {
            bail!("adapter key `{name}` is not a lora_A/lora_B weight (embedding LoRA, biases, magnitudes and saved modules are not supported)");
        }
    }
    halves
        .into_iter()
        .map(|(module, pair)| match pair {
            (Some(a), Some(b)) => Ok((module, (a, b))),
            (Some(a), None) => bail!("adapter key `{a}` has no partner `{module}{B_SUFFIX}`"),
            (None, Some(b)) => bail!("adapter key `{b}` has no partner `{module}{A_SUFFIX}`"),
            (None, None) => unreachable!("a map entry is created with one half"),
        })
        .collect()
}

/// The base weight a text module adapts, or why the model has no such Linear.
fn text_weight_mut(
    weights: &mut TextWeights,
    layer: usize,
    linear: TextLinear,
) -> Result<&mut HostTensor> {
    let layer_count = weights.layers.len();
    let Some(layer_weights) = weights.layers.get_mut(layer) else {
        bail!("layer {layer} does not exist (the model has {layer_count} layers)");
    };
    let kind = match layer_weights.mixer {
        MixerWeights::Linear(_) => LayerKind::LinearAttention,
        MixerWeights::Full(_) => LayerKind::FullAttention,
    };
    let missing = || {
        let kind = match kind {
            LayerKind::LinearAttention => "linear_attention (Gated DeltaNet)",
            LayerKind::FullAttention => "full_attention",
        };
        anyhow::anyhow!(
            "layer {layer} is a {kind} layer and has no `{}`",
            linear.path()
        )
    };
    let mlp = &mut layer_weights.mlp;
    Ok(match (linear, &mut layer_weights.mixer) {
        (TextLinear::GateProj, _) => &mut mlp.gate_proj,
        (TextLinear::UpProj, _) => &mut mlp.up_proj,
        (TextLinear::DownProj, _) => &mut mlp.down_proj,
        (TextLinear::QProj, MixerWeights::Full(att)) => &mut att.q_proj,
        (TextLinear::KProj, MixerWeights::Full(att)) => &mut att.k_proj,
        (TextLinear::VProj, MixerWeights::Full(att)) => &mut att.v_proj,
        (TextLinear::OProj, MixerWeights::Full(att)) => &mut att.o_proj,
        (TextLinear::InProjQkv, MixerWeights::Linear(dn)) => &mut dn.in_proj_qkv,
        (TextLinear::InProjZ, MixerWeights::Linear(dn)) => &mut dn.in_proj_z,
        (TextLinear::InProjB, MixerWeights::Linear(dn)) => &mut dn.in_proj_b,
        (TextLinear::InProjA, MixerWeights::Linear(dn)) => &mut dn.in_proj_a,
        (TextLinear::OutProj, MixerWeights::Linear(dn)) => &mut dn.out_proj,
        _ => return Err(missing()),
    })
}

/// `w[out, in] += scale · b[out, r] · a[r, in]`, rows split over the available cores (the real
/// adapters touch ~2.5 G weights, 16 products each). Each row's product is summed in f32 before
/// the scaled add, as PEFT forms `(B @ A) · scale` before adding it.
fn add_scaled_product(
    w: &mut [f32],
    out: usize,
    inputs: usize,
    b: &[f32],
    a: &[f32],
    r: usize,
    scale: f32,
) {
    debug_assert_eq!(w.len(), out * inputs);
    if out == 0 || inputs == 0 {
        return;
    }
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Small tensors are not worth a thread.
    let threads = threads.min((out * inputs * r / (1 << 20)).max(1));
    let rows_per_chunk = out.div_ceil(threads);
    std::thread::scope(|scope| {
        for (chunk_index, w_chunk) in w.chunks_mut(rows_per_chunk * inputs).enumerate() {
            let first_row = chunk_index * rows_per_chunk;
            scope.spawn(move || {
                let mut delta = vec![0f32; inputs];
                for (row_offset, w_row) in w_chunk.chunks_exact_mut(inputs).enumerate() {
                    let b_row = &b[(first_row + row_offset) * r..][..r];
                    delta.fill(0.0);
                    for (k, &b_ok) in b_row.iter().enumerate() {
                        let a_row = &a[k * inputs..][..inputs];
                        for (d, &a_ki) in delta.iter_mut().zip(a_row) {
                            *d += b_ok * a_ki;
                        }
                    }
                    for (w_oi, d) in w_row.iter_mut().zip(&delta) {
                        *w_oi += scale * d;
                    }
                }
            });
        }
    });
}
