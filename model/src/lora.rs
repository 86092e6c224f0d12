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

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};

pub use adapter_config::{AdapterConfig, TargetModules};
pub use target::{AdapterKeyLayout, LoraTarget, TextLinear, VisionLinear};

use crate::checkpoint::Snapshot;
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

    /// Adds `scale · B · A` to `rows`, whole rows of the `[out, in]` weight from row `first_row`
    /// on: what [`merge_into`](Self::merge_into) does to those rows, in the same order, so a weight
    /// merged in parts (as it is decoded) equals one merged whole, bit for bit. The caller checked
    /// the weight's shape ([`check_shape`](Self::check_shape)).
    pub fn merge_into_rows(&self, first_row: usize, rows: &mut [f32]) {
        let [_, inputs] = self.weight_shape();
        let mut delta = vec![0f32; inputs];
        let r = self.a.shape[0];
        add_rows(
            rows,
            first_row,
            inputs,
            (&self.b.data, &self.a.data, r),
            self.scale,
            &mut delta,
        );
    }

    fn check_weight_shape(&self, weight: &HostTensor) -> Result<()> {
        self.check_shape(&weight.shape)
    }

    /// Whether this module fits a base weight of `shape` (and its A and B share a rank).
    pub fn check_shape(&self, shape: &[usize]) -> Result<()> {
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
            shape == self.weight_shape(),
            "adapter module `{}` (lora_B {:?}, lora_A {:?}) needs a base weight of shape {:?}, but {} has shape {:?}",
            self.key,
            self.b.shape,
            self.a.shape,
            self.weight_shape(),
            self.target,
            shape
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

    /// Reads `snapshot`'s text weights with every text module merged into its Linear as the
    /// Linear is decoded (one pass over the weights instead of two): the same values as
    /// [`Snapshot::load_text_weights`] then [`merge_into_text`](Self::merge_into_text) (or
    /// [`merge_into_text_only`](Self::merge_into_text_only) with `text_only`, which refuses an
    /// adapter that targets the vision tower before anything is read), and the same errors.
    pub fn read_merged_into_text(
        &self,
        snapshot: &Snapshot,
        text_only: bool,
    ) -> Result<(TextWeights, MergeReport)> {
        if text_only {
            self.refuse_vision()?;
        }
        let text: HashMap<(usize, TextLinear), &LoraModule> = self
            .text_modules()
            .map(|(m, layer, linear)| ((layer, linear), m))
            .collect();
        if text.len() != self.text_modules().count() {
            // Two keys on one Linear: merged one after the other, as the separate merge does.
            let mut weights = snapshot.load_text_weights()?;
            let report = self.merge_into_text(&mut weights)?;
            return Ok((weights, report));
        }
        let merged = Cell::new(0usize);
        let lookup = |layer, linear| {
            let module = text.get(&(layer, linear)).copied();
            merged.set(merged.get() + usize::from(module.is_some()));
            module
        };
        let mut weights = snapshot
            .load_text_weights_merging(&lookup)
            .with_context(|| format!("merging LoRA adapter {}", self.dir.display()))?;
        if merged.get() != text.len() {
            // A module whose Linear the model lacks: the error the separate merge gives.
            for (module, layer, linear) in self.text_modules() {
                text_weight_mut(&mut weights, layer, linear)
                    .with_context(|| format!("adapter module `{}`", module.key))
                    .with_context(|| format!("merging LoRA adapter {}", self.dir.display()))?;
            }
            bail!(
                "internal: {} of {} adapter modules merged",
                merged.get(),
                text.len()
            );
        }
        let report = MergeReport {
            merged: self.text_modules().map(|(m, _, _)| m.target).collect(),
            vision: self.vision_modules().cloned().collect(),
        };
        Ok((weights, report))
    }

    fn text_modules(&self) -> impl Iterator<Item = (&LoraModule, usize, TextLinear)> {
        self.modules.iter().filter_map(|m| match m.target {
            LoraTarget::Text { layer, linear } => Some((m, layer, linear)),
            LoraTarget::Vision(_) => None,
        })
    }

    /// As [`merge_into_text`](Self::merge_into_text), for a server without a vision tower: an
    /// adapter that also targets the vision tower is refused before anything is merged.
    pub fn merge_into_text_only(&self, weights: &mut TextWeights) -> Result<MergeReport> {
        self.refuse_vision()?;
        self.merge_into_text(weights)
    }

    fn refuse_vision(&self) -> Result<()> {
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
        Ok(())
    }

    fn merge_inner(&self, weights: &mut TextWeights) -> Result<MergeReport> {
        // Validate everything first so a bad key leaves the weights as they were.
        for (module, layer, linear) in self.text_modules() {
            let weight = text_weight_mut(weights, layer, linear)
                .with_context(|| format!("adapter module `{}`", module.key))?;
            module.check_weight_shape(weight)?;
        }
        let mut merged = Vec::new();
        for (module, layer, linear) in self.text_modules() {
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
                add_rows(w_chunk, first_row, inputs, (b, a, r), scale, &mut delta);
            });
        }
    });
}

/// `w_rows` (whole rows of `inputs` values, the first being row `first_row`) += `scale · B · A`
/// for those rows, with `(b, a, r)` = B `[out, r]`, A `[r, in]`, the rank. Each row's product is
/// summed over the rank in order into `delta`, then added: the one order every merge uses.
fn add_rows(
    w_rows: &mut [f32],
    first_row: usize,
    inputs: usize,
    (b, a, r): (&[f32], &[f32], usize),
    scale: f32,
    delta: &mut [f32],
) {
    for (row_offset, w_row) in w_rows.chunks_exact_mut(inputs).enumerate() {
        let b_row = &b[(first_row + row_offset) * r..][..r];
        delta.fill(0.0);
        for (k, &b_ok) in b_row.iter().enumerate() {
            let a_row = &a[k * inputs..][..inputs];
            for (d, &a_ki) in delta.iter_mut().zip(a_row) {
                *d += b_ok * a_ki;
            }
        }
        for (w_oi, d) in w_row.iter_mut().zip(delta.iter()) {
            *w_oi += scale * d;
        }
    }
}
