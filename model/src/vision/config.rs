//! `vision_config` of a Qwen3.5 checkpoint, parsed and checked.

use anyhow::{ensure, Context, Result};
use serde::Deserialize;

/// The vision tower's sizes.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionConfig {
    pub depth: usize,
    pub hidden_size: usize,
    pub num_heads: usize,
    pub intermediate_size: usize,
    pub in_channels: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub spatial_merge_size: usize,
    pub out_hidden_size: usize,
    pub num_position_embeddings: usize,
    pub rope_theta: f32,
}

#[derive(Deserialize)]
struct RawRope {
    rope_theta: Option<f64>,
    rope_type: Option<String>,
}

#[derive(Deserialize)]
struct Raw {
    depth: usize,
    hidden_size: usize,
    num_heads: usize,
    intermediate_size: usize,
    #[serde(default = "three")]
    in_channels: usize,
    patch_size: usize,
    temporal_patch_size: usize,
    spatial_merge_size: usize,
    out_hidden_size: usize,
    num_position_embeddings: usize,
    hidden_act: Option<String>,
    #[serde(default)]
    deepstack_visual_indexes: Vec<usize>,
    rope_parameters: Option<RawRope>,
}

fn three() -> usize {
    3
}

/// LayerNorm epsilon of every vision norm (fixed in transformers).
pub const VISION_LAYER_NORM_EPS: f32 = 1e-6;

impl VisionConfig {
    /// Parses `vision_config` (as kept raw in [`crate::config::ModelConfig::vision`]).
    pub fn from_json(value: &serde_json::Value) -> Result<Self> {
        let raw: Raw = serde_json::from_value(value.clone()).context("vision_config")?;
        if let Some(act) = &raw.hidden_act {
            ensure!(
                act == "gelu_pytorch_tanh",
                "vision_config.hidden_act {act:?} is not supported (only gelu_pytorch_tanh)"
            );
        }
        ensure!(
            raw.deepstack_visual_indexes.is_empty(),
            "vision_config.deepstack_visual_indexes is not supported (Qwen3.5 has none)"
        );
        let rope_theta = match &raw.rope_parameters {
            Some(r) => {
                if let Some(kind) = &r.rope_type {
                    ensure!(
                        kind == "axial",
                        "vision rope_type {kind:?} is not supported (only axial)"
                    );
                }
                r.rope_theta.unwrap_or(10000.0)
            }
            None => 10000.0,
        } as f32;
        let cfg = Self {
            depth: raw.depth,
            hidden_size: raw.hidden_size,
            num_heads: raw.num_heads,
            intermediate_size: raw.intermediate_size,
            in_channels: raw.in_channels,
            patch_size: raw.patch_size,
            temporal_patch_size: raw.temporal_patch_size,
            spatial_merge_size: raw.spatial_merge_size,
            out_hidden_size: raw.out_hidden_size,
            num_position_embeddings: raw.num_position_embeddings,
            rope_theta,
        };
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<()> {
        ensure!(
            self.num_heads > 0 && self.hidden_size.is_multiple_of(self.num_heads),
            "vision hidden_size {} is not a multiple of num_heads {}",
            self.hidden_size,
            self.num_heads
        );
        ensure!(
            self.head_dim().is_multiple_of(4),
            "vision head_dim {} must be a multiple of 4 (2-D rotary)",
            self.head_dim()
        );
        let side = self.grid_side();
        ensure!(
            side >= 1 && side * side == self.num_position_embeddings,
            "vision num_position_embeddings {} is not a square",
            self.num_position_embeddings
        );
        ensure!(
            self.spatial_merge_size > 0
                && self.patch_size > 0
                && self.temporal_patch_size > 0
                && self.depth > 0,
            "vision sizes must be positive"
        );
        Ok(())
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Values per patch row of `pixel_values`: channels × temporal × patch × patch.
    pub fn patch_dim(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Side of the square learned position table.
    pub fn grid_side(&self) -> usize {
        (self.num_position_embeddings as f64).sqrt().round() as usize
    }

    /// Patches per merged (LLM) token.
    pub fn merge_unit(&self) -> usize {
        self.spatial_merge_size * self.spatial_merge_size
    }

    /// Width of a merger input row.
    pub fn merged_width(&self) -> usize {
        self.hidden_size * self.merge_unit()
    }
}
