//! `config.json` of a Qwen3.5 snapshot (`Qwen3_5Config` with `text_config` and `vision_config`), or
//! a bare text config (`Qwen3_5TextConfig`, as `Qwen3_5ForCausalLM` saves it).

use serde::Deserialize;

/// Which mixer a decoder layer uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// Gated DeltaNet (linear attention with a recurrent state).
    LinearAttention,
    /// Gated full attention (GQA, partial M-RoPE, sigmoid output gate).
    FullAttention,
}

/// The text model's hyper-parameters. Field names are those of `config.json`.
#[derive(Clone, Debug, Deserialize)]
pub struct TextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel_dim: usize,
    pub rms_norm_eps: f64,
    pub layer_types: Vec<LayerKind>,
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    /// RoPE settings; transformers 5 writes them as `rope_parameters`.
    #[serde(alias = "rope_scaling")]
    pub rope_parameters: RopeParameters,
}

/// Rotary embedding settings of the full-attention layers.
#[derive(Clone, Debug, Deserialize)]
pub struct RopeParameters {
    pub rope_theta: f64,
    #[serde(default = "default_partial_rotary")]
    pub partial_rotary_factor: f64,
    #[serde(default)]
    pub mrope_section: Vec<usize>,
    #[serde(default)]
    pub mrope_interleaved: bool,
    #[serde(default)]
    pub rope_type: Option<String>,
}

fn default_partial_rotary() -> f64 {
    1.0
}

impl TextConfig {
    /// Number of rotary dimensions per head (the rest of the head is left unrotated).
    pub fn rotary_dim(&self) -> usize {
        (self.head_dim as f64 * self.rope_parameters.partial_rotary_factor) as usize
    }

    /// Width of the packed q|k|v projection of a DeltaNet layer.
    pub fn linear_qkv_dim(&self) -> usize {
        2 * self.linear_num_key_heads * self.linear_key_head_dim
            + self.linear_num_value_heads * self.linear_value_head_dim
    }
}

/// Top-level `config.json`: either the multimodal wrapper or a bare text config.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub text: TextConfig,
    /// `vision_config` as written, kept raw until the vision tower is built.
    pub vision: Option<serde_json::Value>,
    pub image_token_id: Option<u32>,
    pub video_token_id: Option<u32>,
    pub vision_start_token_id: Option<u32>,
    pub vision_end_token_id: Option<u32>,
    /// Whether the LM head is the embedding (no `lm_head.weight` in the checkpoint).
    pub tie_word_embeddings: bool,
}

impl ModelConfig {
    /// Parses `config.json` text. Accepts the `Qwen3_5Config` wrapper (with `text_config`) or a
    /// bare `Qwen3_5TextConfig`.
    pub fn from_json(text: &str) -> anyhow::Result<Self> {
        let root: serde_json::Value = serde_json::from_str(text)?;
        let text_value = root
            .get("text_config")
            .cloned()
            .unwrap_or_else(|| root.clone());
        let text: TextConfig = serde_json::from_value(text_value)
            .map_err(|e| anyhow::anyhow!("config.json: text config: {e}"))?;
        anyhow::ensure!(
            text.layer_types.len() == text.num_hidden_layers,
            "config.json: layer_types has {} entries, num_hidden_layers is {}",
            text.layer_types.len(),
            text.num_hidden_layers
        );
        let id = |k: &str| root.get(k).and_then(|v| v.as_u64()).map(|v| v as u32);
        let tie = root
            .get("tie_word_embeddings")
            .and_then(|v| v.as_bool())
            .or(text.tie_word_embeddings)
            .unwrap_or(false);
        Ok(Self {
            vision: root.get("vision_config").cloned(),
            image_token_id: id("image_token_id"),
            video_token_id: id("video_token_id"),
            vision_start_token_id: id("vision_start_token_id"),
            vision_end_token_id: id("vision_end_token_id"),
            tie_word_embeddings: tie,
            text,
        })
    }
}
