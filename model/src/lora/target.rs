//! Which base-model Linear a PEFT module path names, for both Qwen3.5 key layouts.

use std::fmt;

use anyhow::{bail, Context, Result};

use crate::config::LayerKind;

/// A Linear of a text decoder layer that LoRA can adapt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TextLinear {
    QProj,
    KProj,
    VProj,
    OProj,
    InProjQkv,
    InProjZ,
    InProjB,
    InProjA,
    OutProj,
    GateProj,
    UpProj,
    DownProj,
}

impl TextLinear {
    const ALL: [TextLinear; 12] = [
        TextLinear::QProj,
        TextLinear::KProj,
        TextLinear::VProj,
        TextLinear::OProj,
        TextLinear::InProjQkv,
        TextLinear::InProjZ,
        TextLinear::InProjB,
        TextLinear::InProjA,
        TextLinear::OutProj,
        TextLinear::GateProj,
        TextLinear::UpProj,
        TextLinear::DownProj,
    ];

    /// Module path inside a decoder layer.
    pub fn path(self) -> &'static str {
        match self {
            TextLinear::QProj => "self_attn.q_proj",
            TextLinear::KProj => "self_attn.k_proj",
            TextLinear::VProj => "self_attn.v_proj",
            TextLinear::OProj => "self_attn.o_proj",
            TextLinear::InProjQkv => "linear_attn.in_proj_qkv",
            TextLinear::InProjZ => "linear_attn.in_proj_z",
            TextLinear::InProjB => "linear_attn.in_proj_b",
            TextLinear::InProjA => "linear_attn.in_proj_a",
            TextLinear::OutProj => "linear_attn.out_proj",
            TextLinear::GateProj => "mlp.gate_proj",
            TextLinear::UpProj => "mlp.up_proj",
            TextLinear::DownProj => "mlp.down_proj",
        }
    }

    /// The layer kind this module exists in; `None` for the MLP, which every layer has.
    pub fn required_layer_kind(self) -> Option<LayerKind> {
        match self {
            TextLinear::QProj | TextLinear::KProj | TextLinear::VProj | TextLinear::OProj => {
                Some(LayerKind::FullAttention)
            }
            TextLinear::InProjQkv
            | TextLinear::InProjZ
            | TextLinear::InProjB
            | TextLinear::InProjA
            | TextLinear::OutProj => Some(LayerKind::LinearAttention),
            TextLinear::GateProj | TextLinear::UpProj | TextLinear::DownProj => None,
        }
    }

    pub(crate) fn from_path(path: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.path() == path)
    }
}

/// A Linear of the vision tower that LoRA can adapt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum VisionLinear {
    /// `blocks.{block}.attn.qkv`
    BlockQkv { block: usize },
    /// `blocks.{block}.attn.proj`
    BlockProj { block: usize },
    /// `blocks.{block}.mlp.linear_fc1`
    BlockFc1 { block: usize },
    /// `blocks.{block}.mlp.linear_fc2`
    BlockFc2 { block: usize },
    /// `merger.linear_fc1`
    MergerFc1,
    /// `merger.linear_fc2`
    MergerFc2,
}

impl VisionLinear {
    fn parse(path: &str) -> Option<Self> {
        match path {
            "merger.linear_fc1" => return Some(VisionLinear::MergerFc1),
            "merger.linear_fc2" => return Some(VisionLinear::MergerFc2),
            _ => {}
        }
        let rest = path.strip_prefix("blocks.")?;
        let (index, module) = rest.split_once('.')?;
        let block = parse_index(index)?;
        Some(match module {
            "attn.qkv" => VisionLinear::BlockQkv { block },
            "attn.proj" => VisionLinear::BlockProj { block },
            "mlp.linear_fc1" => VisionLinear::BlockFc1 { block },
            "mlp.linear_fc2" => VisionLinear::BlockFc2 { block },
            _ => return None,
        })
    }

    /// Weight name relative to the vision tower (`model.visual.` + this).
    pub fn weight_name(self) -> String {
        match self {
            VisionLinear::BlockQkv { block } => format!("blocks.{block}.attn.qkv.weight"),
            VisionLinear::BlockProj { block } => format!("blocks.{block}.attn.proj.weight"),
            VisionLinear::BlockFc1 { block } => format!("blocks.{block}.mlp.linear_fc1.weight"),
            VisionLinear::BlockFc2 { block } => format!("blocks.{block}.mlp.linear_fc2.weight"),
            VisionLinear::MergerFc1 => "merger.linear_fc1.weight".to_string(),
            VisionLinear::MergerFc2 => "merger.linear_fc2.weight".to_string(),
        }
    }
}

/// Which key layout an adapter was saved from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterKeyLayout {
    /// `base_model.model.model.layers.N.…` (trained on `Qwen3_5ForCausalLM`).
    CausalLm,
    /// `base_model.model.model.language_model.layers.N.…` (trained on
    /// `Qwen3_5ForConditionalGeneration`).
    ConditionalGeneration,
}

/// The base-model Linear an adapter module adapts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LoraTarget {
    Text { layer: usize, linear: TextLinear },
    Vision(VisionLinear),
}

impl fmt::Display for LoraTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoraTarget::Text { layer, linear } => write!(f, "layers.{layer}.{}", linear.path()),
            LoraTarget::Vision(v) => {
                let name = v.weight_name();
                write!(f, "visual.{}", name.trim_end_matches(".weight"))
            }
        }
    }
}

/// Prefix PEFT puts before the base model's own module path.
pub const PEFT_PREFIX: &str = "base_model.model.";

/// Parses a PEFT module path (the key without `.lora_A.weight`/`.lora_B.weight`). Returns the
/// target, the text key layout if it is a text module, and the base-model module path.
pub fn parse_module_path(module: &str) -> Result<(LoraTarget, Option<AdapterKeyLayout>, &str)> {
    let base_path = module
        .strip_prefix(PEFT_PREFIX)
        .with_context(|| format!("does not start with `{PEFT_PREFIX}`"))?;
    if let Some(vision) = base_path.strip_prefix("model.visual.") {
        let Some(linear) = VisionLinear::parse(vision) else {
            bail!("`{vision}` is not an adaptable Linear of the vision tower");
        };
        return Ok((LoraTarget::Vision(linear), None, base_path));
    }
    let (layout, in_layers) =
        if let Some(rest) = base_path.strip_prefix("model.language_model.layers.") {
            (AdapterKeyLayout::ConditionalGeneration, rest)
        } else if let Some(rest) = base_path.strip_prefix("model.layers.") {
            (AdapterKeyLayout::CausalLm, rest)
        } else {
            bail!("`{base_path}` is not a decoder-layer or vision-tower module of Qwen3.5");
        };
    let parsed = in_layers
        .split_once('.')
        .and_then(|(i, m)| Some((parse_index(i)?, TextLinear::from_path(m)?)));
    let Some((layer, linear)) = parsed else {
        bail!("`{base_path}` is not an adaptable Linear of a Qwen3.5 decoder layer");
    };
    Ok((LoraTarget::Text { layer, linear }, Some(layout), base_path))
}

/// A decimal index without sign or leading zeros (as PyTorch module names are written).
fn parse_index(s: &str) -> Option<usize> {
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    canonical.then(|| s.parse().ok()).flatten()
}
