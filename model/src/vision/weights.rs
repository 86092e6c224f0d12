//! Vision-tower weights (`model.visual.*`) in f32 on the host, and the merge of an adapter's
//! vision LoRA modules into them.

use anyhow::{anyhow, ensure, Context, Result};

use super::config::VisionConfig;
use crate::checkpoint::{Snapshot, VISION_PREFIX};
use crate::lora::{LoraModule, LoraTarget, VisionLinear};
use crate::weights::HostTensor;

/// A Linear with bias: weight `[out, in]`, bias `[out]`.
#[derive(Clone, Debug)]
pub struct LinearWeights {
    pub weight: HostTensor,
    pub bias: HostTensor,
}

/// A LayerNorm's weight and bias, `[dim]` each.
#[derive(Clone, Debug)]
pub struct NormWeights {
    pub weight: HostTensor,
    pub bias: HostTensor,
}

/// One pre-LN ViT block.
#[derive(Clone, Debug)]
pub struct VisionBlockWeights {
    pub norm1: NormWeights,
    /// `[3·hidden, hidden]`: q rows, then k, then v.
    pub qkv: LinearWeights,
    pub proj: LinearWeights,
    pub norm2: NormWeights,
    pub fc1: LinearWeights,
    pub fc2: LinearWeights,
}

/// Every vision-tower weight.
#[derive(Clone, Debug)]
pub struct VisionWeights {
    /// The Conv3d patch embedding as a Linear: weight `[hidden, patch_dim]` (the conv kernel
    /// flattened in (channel, frame, row, col) order, like a `pixel_values` row).
    pub patch_embed: LinearWeights,
    /// `[num_position_embeddings, hidden]`, a square table in row-major (row, col) order.
    pub pos_embed: HostTensor,
    pub blocks: Vec<VisionBlockWeights>,
    pub merger_norm: NormWeights,
    /// `[merged_width, merged_width]`.
    pub merger_fc1: LinearWeights,
    /// `[out_hidden, merged_width]`.
    pub merger_fc2: LinearWeights,
}

fn read(snapshot: &Snapshot, name: &str, shape: &[usize]) -> Result<HostTensor> {
    let full = format!("{VISION_PREFIX}{name}");
    let t = snapshot.read_tensor_f32(&full)?;
    ensure!(
        t.data.len() == shape.iter().product::<usize>(),
        "{full}: shape {:?}, expected {shape:?}",
        t.shape
    );
    // The conv kernel is stored 5-D; every other tensor must already have the expected shape.
    ensure!(
        t.shape == shape || name == "patch_embed.proj.weight",
        "{full}: shape {:?}, expected {shape:?}",
        t.shape
    );
    Ok(HostTensor::new(shape.to_vec(), t.data))
}

fn linear(snapshot: &Snapshot, prefix: &str, out: usize, inp: usize) -> Result<LinearWeights> {
    Ok(LinearWeights {
        weight: read(snapshot, &format!("{prefix}.weight"), &[out, inp])?,
        bias: read(snapshot, &format!("{prefix}.bias"), &[out])?,
    })
}

fn norm(snapshot: &Snapshot, prefix: &str, dim: usize) -> Result<NormWeights> {
    Ok(NormWeights {
        weight: read(snapshot, &format!("{prefix}.weight"), &[dim])?,
        bias: read(snapshot, &format!("{prefix}.bias"), &[dim])?,
    })
}

impl VisionWeights {
    /// Reads every `model.visual.*` tensor the tower uses, checking shapes against `cfg`.
    pub fn load(snapshot: &Snapshot, cfg: &VisionConfig) -> Result<Self> {
        Self::load_inner(snapshot, cfg).context("loading the vision tower")
    }

    fn load_inner(snapshot: &Snapshot, cfg: &VisionConfig) -> Result<Self> {
        let (h, inter, m) = (cfg.hidden_size, cfg.intermediate_size, cfg.merged_width());
        let patch_shape = [
            h,
            cfg.in_channels,
            cfg.temporal_patch_size,
            cfg.patch_size,
            cfg.patch_size,
        ];
        let conv = snapshot.read_tensor_f32(&format!("{VISION_PREFIX}patch_embed.proj.weight"))?;
        ensure!(
            conv.shape == patch_shape,
            "{VISION_PREFIX}patch_embed.proj.weight: shape {:?}, expected {patch_shape:?}",
            conv.shape
        );
        let patch_embed = LinearWeights {
            weight: HostTensor::new(vec![h, cfg.patch_dim()], conv.data),
            bias: read(snapshot, "patch_embed.proj.bias", &[h])?,
        };
        let pos_embed = read(
            snapshot,
            "pos_embed.weight",
            &[cfg.num_position_embeddings, h],
        )?;
        let blocks = (0..cfg.depth)
            .map(|i| {
                let p = format!("blocks.{i}");
                Ok(VisionBlockWeights {
                    norm1: norm(snapshot, &format!("{p}.norm1"), h)?,
                    qkv: linear(snapshot, &format!("{p}.attn.qkv"), 3 * h, h)?,
                    proj: linear(snapshot, &format!("{p}.attn.proj"), h, h)?,
                    norm2: norm(snapshot, &format!("{p}.norm2"), h)?,
                    fc1: linear(snapshot, &format!("{p}.mlp.linear_fc1"), inter, h)?,
                    fc2: linear(snapshot, &format!("{p}.mlp.linear_fc2"), h, inter)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            patch_embed,
            pos_embed,
            blocks,
            merger_norm: norm(snapshot, "merger.norm", h)?,
            merger_fc1: linear(snapshot, "merger.linear_fc1", m, m)?,
            merger_fc2: linear(snapshot, "merger.linear_fc2", cfg.out_hidden_size, m)?,
        })
    }

    fn linear_weight_mut(&mut self, target: VisionLinear) -> Option<&mut HostTensor> {
        Some(match target {
            VisionLinear::BlockQkv { block } => &mut self.blocks.get_mut(block)?.qkv.weight,
            VisionLinear::BlockProj { block } => &mut self.blocks.get_mut(block)?.proj.weight,
            VisionLinear::BlockFc1 { block } => &mut self.blocks.get_mut(block)?.fc1.weight,
            VisionLinear::BlockFc2 { block } => &mut self.blocks.get_mut(block)?.fc2.weight,
            VisionLinear::MergerFc1 => &mut self.merger_fc1.weight,
            VisionLinear::MergerFc2 => &mut self.merger_fc2.weight,
        })
    }

    /// Merges the vision modules an adapter handed back (`MergeReport::vision`) into these
    /// weights: `W += scale · B · A`. Every module must be a vision module naming an existing
    /// Linear of matching shape; all are checked before any weight changes. Returns how many
    /// were merged.
    pub fn merge_lora(&mut self, modules: &[LoraModule]) -> Result<usize> {
        let target_of = |m: &LoraModule| match m.target {
            LoraTarget::Vision(v) => Ok(v),
            other => Err(anyhow!(
                "adapter module `{}` targets {other}, not the vision tower",
                m.key
            )),
        };
        for m in modules {
            let target = target_of(m)?;
            let depth = self.blocks.len();
            let weight = self.linear_weight_mut(target).ok_or_else(|| {
                anyhow!(
                    "adapter module `{}`: the vision tower has no {} (depth {depth})",
                    m.key,
                    target.weight_name()
                )
            })?;
            ensure!(
                weight.shape == m.weight_shape(),
                "adapter module `{}` needs a base weight of shape {:?}, but {} has shape {:?}",
                m.key,
                m.weight_shape(),
                target.weight_name(),
                weight.shape
            );
        }
        for m in modules {
            let weight = self
                .linear_weight_mut(target_of(m)?)
                .ok_or_else(|| anyhow!("adapter module `{}` vanished", m.key))?;
            m.merge_into(weight)
                .with_context(|| format!("merging adapter module `{}`", m.key))?;
        }
        Ok(modules.len())
    }
}
