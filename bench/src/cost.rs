//! The analytic cost of a forward pass (FLOPs, weight bytes) and the measured hardware ceilings
//! that bound it; the conventions are in the crate's documentation.

use std::path::Path;

use anyhow::{Context, Result};
use instinct_model::config::{LayerKind, TextConfig};
use serde_json::{json, Value};

use crate::LETTERS;

/// Analytic work of the text model (see the module doc for the conventions).
#[derive(Clone, Debug)]
pub struct ModelCost {
    hidden: u64,
    /// Multiply-accumulates of the projection matrices per token.
    dense_macs_per_token: u64,
    /// Every text parameter but the embedding table.
    non_embedding_params: u64,
    full_layers: u64,
    linear_layers: u64,
    attn_heads: u64,
    head_dim: u64,
    delta_heads: u64,
    delta_k: u64,
    delta_v: u64,
    vocab_rows: u64,
}

/// FLOPs of one row.
#[derive(Clone, Copy, Debug, Default)]
pub struct Flops {
    pub dense: f64,
    pub readout: f64,
    pub attention: f64,
    pub delta_rule: f64,
}

impl Flops {
    pub fn total(&self) -> f64 {
        self.dense + self.readout + self.attention + self.delta_rule
    }

    pub(crate) fn json(&self) -> Value {
        json!({
            "dense": self.dense, "readout": self.readout, "attention": self.attention,
            "delta_rule": self.delta_rule, "total": self.total(),
        })
    }
}

impl ModelCost {
    pub fn new(c: &TextConfig) -> Self {
        let u = |v: usize| v as u64;
        let (h, inter) = (u(c.hidden_size), u(c.intermediate_size));
        let (hq, hkv, d) = (
            u(c.num_attention_heads),
            u(c.num_key_value_heads),
            u(c.head_dim),
        );
        let (hk, hv, dk, dv) = (
            u(c.linear_num_key_heads),
            u(c.linear_num_value_heads),
            u(c.linear_key_head_dim),
            u(c.linear_value_head_dim),
        );
        let qkv = 2 * hk * dk + hv * dv;
        let value_width = hv * dv;
        let mlp = 3 * h * inter;
        let delta_matrices = qkv * h + value_width * h + 2 * hv * h + h * value_width;
        let attn_matrices = 2 * hq * d * h + 2 * hkv * d * h + h * hq * d;
        let (mut dense, mut params, mut full, mut linear) = (0, h, 0, 0);
        for kind in &c.layer_types {
            dense += mlp;
            params += mlp + 2 * h;
            match kind {
                LayerKind::LinearAttention => {
                    linear += 1;
                    dense += delta_matrices;
                    // + conv, dt_bias, A_log, gated-norm weight
                    params += delta_matrices + qkv * u(c.linear_conv_kernel_dim) + 2 * hv + dv;
                }
                LayerKind::FullAttention => {
                    full += 1;
                    dense += attn_matrices;
                    params += attn_matrices + 2 * d;
                }
            }
        }
        Self {
            hidden: h,
            dense_macs_per_token: dense,
            non_embedding_params: params,
            full_layers: full,
            linear_layers: linear,
            attn_heads: hq,
            head_dim: d,
            delta_heads: hv,
            delta_k: dk,
            delta_v: dv,
            vocab_rows: u(c.vocab_size),
        }
    }

    /// FLOPs of one forward pass over sequences of these lengths, each read over `letters`.
    pub fn flops(&self, lengths: &[usize], letters: usize) -> Flops {
        let tokens: f64 = lengths.iter().map(|&l| l as f64).sum();
        let pairs: f64 = lengths.iter().map(|&l| l as f64 * (l as f64 + 1.0)).sum();
        Flops {
            dense: 2.0 * self.dense_macs_per_token as f64 * tokens,
            readout: 2.0 * (self.hidden * letters as u64) as f64 * lengths.len() as f64,
            attention: 2.0 * (self.full_layers * self.attn_heads * self.head_dim) as f64 * pairs,
            delta_rule: 7.0
                * (self.linear_layers * self.delta_heads * self.delta_k * self.delta_v) as f64
                * tokens,
        }
    }

    /// bf16 bytes of the weights one forward pass reads, gathering `distinct_ids` embedding rows.
    pub fn weight_bytes(&self, distinct_ids: usize) -> u64 {
        2 * (self.non_embedding_params + self.hidden * (distinct_ids as u64 + LETTERS as u64))
    }

    pub(crate) fn json(&self) -> Value {
        json!({
            "hidden": self.hidden,
            "vocab_rows": self.vocab_rows,
            "full_attention_layers": self.full_layers,
            "linear_attention_layers": self.linear_layers,
            "non_embedding_params": self.non_embedding_params,
            "embedding_params": self.vocab_rows * self.hidden,
            "dense_flops_per_token": 2 * self.dense_macs_per_token,
            "non_embedding_bf16_bytes": 2 * self.non_embedding_params,
        })
    }
}

/// The measured hardware rates the rows are bounded by.
#[derive(Clone, Debug)]
pub struct Ceilings {
    /// Device copy rate, read + write bytes per second (GB = 1e9).
    pub copy_gbps: f64,
    /// Square bf16 GEMM rate (TFLOP = 1e12).
    pub gemm_tflops: f64,
    pub(crate) source: Value,
}

impl Ceilings {
    /// The `ceilings` of a `peer_bench.py` report (or a file holding just that object).
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let value: Value = serde_json::from_slice(&bytes)
            .with_context(|| format!("parsing {}", path.display()))?;
        let c = value.get("ceilings").unwrap_or(&value);
        let get = |k: &str| {
            c.get(k)
                .and_then(Value::as_f64)
                .filter(|v| *v > 0.0)
                .with_context(|| format!("{}: no positive ceilings.{k}", path.display()))
        };
        Ok(Self {
            copy_gbps: get("copy_GBps_read_plus_write")?,
            gemm_tflops: get("gemm_bf16_TFLOPs")?,
            source: json!({"file": path, "device": value.get("device"), "measured": c}),
        })
    }

    /// The bounds of a row doing `flops` and reading `bytes`, against its measured median.
    pub(crate) fn bound(&self, flops: f64, bytes: u64, median_ms: f64) -> Value {
        let bandwidth_ms = bytes as f64 / (self.copy_gbps * 1e9) * 1e3;
        let flops_ms = flops / (self.gemm_tflops * 1e12) * 1e3;
        let bound_ms = bandwidth_ms.max(flops_ms);
        json!({
            "bandwidth_ms": bandwidth_ms,
            "flops_ms": flops_ms,
            "bound_ms": bound_ms,
            "bound_by": if bandwidth_ms >= flops_ms { "bandwidth" } else { "flops" },
            "fraction_of_ceiling": bound_ms / median_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Qwen3.5-4B's text config (`tools/reference/real_common.py`).
    fn real_text_config() -> TextConfig {
        let mut layer_types = Vec::new();
        for _ in 0..8 {
            layer_types.extend(["linear_attention"; 3]);
            layer_types.push("full_attention");
        }
        serde_json::from_value(json!({
            "vocab_size": 248_320, "hidden_size": 2560, "intermediate_size": 9216,
            "num_hidden_layers": 32, "layer_types": layer_types,
            "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
            "linear_num_key_heads": 16, "linear_num_value_heads": 32,
            "linear_key_head_dim": 128, "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 0.25},
        }))
        .unwrap()
    }

    #[test]
    fn real_shape_costs() {
        let cost = ModelCost::new(&real_text_config());
        // The real-shape checkpoint's 4,539,265,536 parameters, less the vision tower
        // (333,514,240) and the embedding (248,320 x 2,560).
        assert_eq!(cost.non_embedding_params, 3_570_052_096);
        // Projections: 24 x 42,106,880 (DeltaNet) + 8 x 36,700,160 (attention) + 32 x 70,778,880.
        assert_eq!(cost.dense_macs_per_token, 3_569_090_560);
        let f = cost.flops(&[139], LETTERS);
        assert_eq!(f.dense, 2.0 * 3_569_090_560.0 * 139.0);
        assert_eq!(f.readout, 2.0 * 2560.0 * 26.0);
        assert_eq!(f.attention, 2.0 * 8.0 * 16.0 * 256.0 * 139.0 * 140.0);
        assert_eq!(f.delta_rule, 7.0 * 24.0 * 32.0 * 128.0 * 128.0 * 139.0);
        // Two sequences of 100 attend less than one of 200.
        assert!(cost.flops(&[100, 100], 26).attention < cost.flops(&[200], 26).attention);
        assert_eq!(
            cost.weight_bytes(100),
            2 * (3_570_052_096 + 2560 * (100 + 26))
        );
    }
}
