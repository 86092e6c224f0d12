//! Tiny Qwen3.5 snapshots and PEFT adapters written from the tests themselves, with the real
//! layer pattern (three Gated DeltaNet layers, then one full-attention layer, twice) and
//! deliberately unequal dimensions so a transposed or swapped tensor cannot pass.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

pub const VOCAB: usize = 16;
pub const HIDDEN: usize = 8;
pub const INTER: usize = 12;
pub const LAYERS: usize = 8;
pub const HEADS: usize = 2;
pub const KV_HEADS: usize = 1;
pub const HEAD_DIM: usize = 4;
pub const LIN_K_HEADS: usize = 2;
pub const LIN_V_HEADS: usize = 4;
pub const LIN_K_DIM: usize = 2;
pub const LIN_V_DIM: usize = 3;
pub const CONV_K: usize = 4;
/// 2·Hk·Dk + Hv·Dv
pub const LIN_QKV: usize = 2 * LIN_K_HEADS * LIN_K_DIM + LIN_V_HEADS * LIN_V_DIM;
pub const LIN_V: usize = LIN_V_HEADS * LIN_V_DIM;

pub const CG_PREFIX: &str = "model.language_model.";
pub const CAUSAL_PREFIX: &str = "model.";

pub fn is_full_attention(layer: usize) -> bool {
    (layer + 1).is_multiple_of(4)
}

fn text_config_value(tie: bool) -> serde_json::Value {
    let layer_types: Vec<&str> = (0..LAYERS)
        .map(|i| {
            if is_full_attention(i) {
                "full_attention"
            } else {
                "linear_attention"
            }
        })
        .collect();
    serde_json::json!({
        "model_type": "qwen3_5_text",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTER,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "linear_num_key_heads": LIN_K_HEADS,
        "linear_num_value_heads": LIN_V_HEADS,
        "linear_key_head_dim": LIN_K_DIM,
        "linear_value_head_dim": LIN_V_DIM,
        "linear_conv_kernel_dim": CONV_K,
        "rms_norm_eps": 1e-6,
        "layer_types": layer_types,
        "tie_word_embeddings": tie,
        "rope_parameters": {
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [1, 1, 0],
            "mrope_interleaved": true,
            "rope_type": "default"
        }
    })
}

/// `config.json` as `Qwen3_5ForConditionalGeneration` saves it (text + vision config).
pub fn multimodal_config_json(tie: bool) -> String {
    serde_json::json!({
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": text_config_value(tie),
        "vision_config": {"depth": 2, "hidden_size": 4, "out_hidden_size": HIDDEN},
        "image_token_id": 12,
        "tie_word_embeddings": tie
    })
    .to_string()
}

/// `config.json` as `Qwen3_5ForCausalLM` saves it (a bare text config).
pub fn text_only_config_json(tie: bool) -> String {
    let mut v = text_config_value(tie);
    v["architectures"] = serde_json::json!(["Qwen3_5ForCausalLM"]);
    v.to_string()
}

/// A tensor to write: its values are given in f32 and stored as `dtype`.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

impl Tensor {
    pub fn random(rng: &mut StdRng, dtype: Dtype, shape: &[usize]) -> Self {
        let n = shape.iter().product();
        let values = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
        Self {
            dtype,
            shape: shape.to_vec(),
            values,
        }
    }

    /// The values as a reader sees them after the round trip through `dtype`.
    pub fn stored_values(&self) -> Vec<f32> {
        match self.dtype {
            Dtype::BF16 => self
                .values
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_f32())
                .collect(),
            Dtype::F16 => self
                .values
                .iter()
                .map(|&v| half::f16::from_f32(v).to_f32())
                .collect(),
            _ => self.values.clone(),
        }
    }

    fn bytes(&self) -> Vec<u8> {
        match self.dtype {
            Dtype::F32 => self.values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            Dtype::BF16 => self
                .values
                .iter()
                .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
                .collect(),
            Dtype::F16 => self
                .values
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
            Dtype::I32 => self
                .values
                .iter()
                .flat_map(|&v| (v as i32).to_le_bytes())
                .collect(),
            other => panic!("fixture cannot write {other:?}"),
        }
    }
}

pub type Tensors = BTreeMap<String, Tensor>;

/// Every text tensor of the tiny model under `prefix`, bf16 except `A_log` and the gated-norm
/// weight, which are f32 as in the real checkpoints.
pub fn text_tensors(prefix: &str, seed: u64) -> Tensors {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = Tensors::new();
    let mut add = |name: String, dtype: Dtype, shape: &[usize]| {
        t.insert(name, Tensor::random(&mut rng, dtype, shape));
    };
    let bf = Dtype::BF16;
    add(format!("{prefix}embed_tokens.weight"), bf, &[VOCAB, HIDDEN]);
    add(format!("{prefix}norm.weight"), bf, &[HIDDEN]);
    for i in 0..LAYERS {
        let l = format!("{prefix}layers.{i}.");
        add(format!("{l}input_layernorm.weight"), bf, &[HIDDEN]);
        add(format!("{l}post_attention_layernorm.weight"), bf, &[HIDDEN]);
        add(format!("{l}mlp.gate_proj.weight"), bf, &[INTER, HIDDEN]);
        add(format!("{l}mlp.up_proj.weight"), bf, &[INTER, HIDDEN]);
        add(format!("{l}mlp.down_proj.weight"), bf, &[HIDDEN, INTER]);
        if is_full_attention(i) {
            let a = format!("{l}self_attn.");
            add(
                format!("{a}q_proj.weight"),
                bf,
                &[2 * HEADS * HEAD_DIM, HIDDEN],
            );
            add(
                format!("{a}k_proj.weight"),
                bf,
                &[KV_HEADS * HEAD_DIM, HIDDEN],
            );
            add(
                format!("{a}v_proj.weight"),
                bf,
                &[KV_HEADS * HEAD_DIM, HIDDEN],
            );
            add(format!("{a}o_proj.weight"), bf, &[HIDDEN, HEADS * HEAD_DIM]);
            add(format!("{a}q_norm.weight"), bf, &[HEAD_DIM]);
            add(format!("{a}k_norm.weight"), bf, &[HEAD_DIM]);
        } else {
            let d = format!("{l}linear_attn.");
            add(format!("{d}in_proj_qkv.weight"), bf, &[LIN_QKV, HIDDEN]);
            add(format!("{d}in_proj_z.weight"), bf, &[LIN_V, HIDDEN]);
            add(format!("{d}in_proj_b.weight"), bf, &[LIN_V_HEADS, HIDDEN]);
            add(format!("{d}in_proj_a.weight"), bf, &[LIN_V_HEADS, HIDDEN]);
            add(format!("{d}conv1d.weight"), bf, &[LIN_QKV, 1, CONV_K]);
            add(format!("{d}dt_bias"), bf, &[LIN_V_HEADS]);
            add(format!("{d}A_log"), Dtype::F32, &[LIN_V_HEADS]);
            add(format!("{d}norm.weight"), Dtype::F32, &[LIN_V_DIM]);
            add(format!("{d}out_proj.weight"), bf, &[HIDDEN, LIN_V]);
        }
    }
    t
}

/// A few vision-tower and MTP tensors, as the real snapshot has beside the text model.
pub fn vision_and_mtp_tensors(seed: u64) -> Tensors {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = Tensors::new();
    for (name, shape) in [
        ("model.visual.blocks.0.mlp.linear_fc1.weight", vec![6, 4]),
        ("model.visual.blocks.0.mlp.linear_fc1.bias", vec![6]),
        ("model.visual.merger.linear_fc2.weight", vec![HIDDEN, 6]),
        ("mtp.fc.weight", vec![HIDDEN, 2 * HIDDEN]),
        (
            "mtp.layers.0.self_attn.q_proj.weight",
            vec![2 * HEADS * HEAD_DIM, HIDDEN],
        ),
        ("mtp.norm.weight", vec![HIDDEN]),
    ] {
        t.insert(
            name.to_string(),
            Tensor::random(&mut rng, Dtype::BF16, &shape),
        );
    }
    t
}

/// Writes one safetensors file.
pub fn write_safetensors(path: &Path, tensors: &Tensors) {
    let bytes: Vec<(String, Vec<u8>)> = tensors
        .iter()
        .map(|(name, t)| (name.clone(), t.bytes()))
        .collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, t), (_, b))| {
            let view = TensorView::new(t.dtype, t.shape.clone(), b).expect("valid view");
            (name.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).expect("write safetensors");
}

/// Writes `config.json` and `model.safetensors`.
pub fn write_single_file_snapshot(dir: &Path, config_json: &str, tensors: &Tensors) {
    std::fs::write(dir.join("config.json"), config_json).unwrap();
    write_safetensors(&dir.join("model.safetensors"), tensors);
}

/// Writes `config.json`, `shards` shard files (tensors dealt round-robin) and the index.
pub fn write_sharded_snapshot(dir: &Path, config_json: &str, tensors: &Tensors, shards: usize) {
    std::fs::write(dir.join("config.json"), config_json).unwrap();
    let mut parts = vec![Tensors::new(); shards];
    let mut weight_map = serde_json::Map::new();
    for (i, (name, t)) in tensors.iter().enumerate() {
        let shard = i % shards;
        let file = format!("model-{:05}-of-{:05}.safetensors", shard + 1, shards);
        parts[shard].insert(name.clone(), t.clone());
        weight_map.insert(name.clone(), file.into());
    }
    for (shard, part) in parts.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", shard + 1, shards);
        write_safetensors(&dir.join(file), part);
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

/// `adapter_config.json` as PEFT 0.21 writes it (every field present), with overrides.
pub fn adapter_config_json(
    r: usize,
    alpha: f64,
    targets: &[&str],
    overrides: serde_json::Value,
) -> String {
    let mut v = serde_json::json!({
        "alora_invocation_tokens": null, "alpha_pattern": {}, "arrow_config": null,
        "auto_mapping": null, "base_model_name_or_path": "Qwen/Qwen3.5-4B", "bias": "none",
        "corda_config": null, "ensure_weight_tying": false, "eva_config": null,
        "exclude_modules": null, "fan_in_fan_out": false, "inference_mode": true,
        "init_lora_weights": true, "kasa_config": null, "layer_replication": null,
        "layers_pattern": null, "layers_to_transform": null, "loftq_config": {},
        "lora_alpha": alpha, "lora_bias": false, "lora_dropout": 0.05, "lora_ga_config": null,
        "megatron_config": null, "megatron_core": "megatron.core", "modules_to_save": null,
        "monteclora_config": null, "peft_type": "LORA", "peft_version": "0.21.0",
        "qalora_group_size": 16, "r": r, "rank_pattern": {}, "revision": null,
        "target_modules": targets, "target_parameters": null, "task_type": "CAUSAL_LM",
        "trainable_token_indices": null, "use_bdlora": null, "use_dora": false,
        "use_qalora": false, "use_rslora": false, "velora_config": null
    });
    for (k, val) in overrides.as_object().expect("overrides object") {
        v[k] = val.clone();
    }
    v.to_string()
}

pub const TEXT_TARGETS: &[&str] = &[
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
];

/// `(module path inside a layer, out, in)` of the Linears the Cua-S1 text adapter adapts in
/// layer `i`: the MLP everywhere, q/k/v/o on full-attention layers only.
pub fn cua_text_modules(i: usize) -> Vec<(&'static str, usize, usize)> {
    let mut m = vec![
        ("mlp.gate_proj", INTER, HIDDEN),
        ("mlp.up_proj", INTER, HIDDEN),
        ("mlp.down_proj", HIDDEN, INTER),
    ];
    if is_full_attention(i) {
        m.extend([
            ("self_attn.q_proj", 2 * HEADS * HEAD_DIM, HIDDEN),
            ("self_attn.k_proj", KV_HEADS * HEAD_DIM, HIDDEN),
            ("self_attn.v_proj", KV_HEADS * HEAD_DIM, HIDDEN),
            ("self_attn.o_proj", HIDDEN, HEADS * HEAD_DIM),
        ]);
    }
    m
}

/// Adds an f32 A `[r, in]` / B `[out, r]` pair for `module` (a full PEFT module key).
pub fn add_lora_pair(
    t: &mut Tensors,
    rng: &mut StdRng,
    module: &str,
    r: usize,
    out: usize,
    inputs: usize,
) {
    t.insert(
        format!("{module}.lora_A.weight"),
        Tensor::random(rng, Dtype::F32, &[r, inputs]),
    );
    t.insert(
        format!("{module}.lora_B.weight"),
        Tensor::random(rng, Dtype::F32, &[out, r]),
    );
}

/// The Cua-S1-shaped text adapter tensors with keys under `layers_prefix` (e.g.
/// `base_model.model.model.layers.`).
pub fn cua_text_adapter(layers_prefix: &str, r: usize, seed: u64) -> Tensors {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut t = Tensors::new();
    for i in 0..LAYERS {
        for (path, out, inputs) in cua_text_modules(i) {
            add_lora_pair(
                &mut t,
                &mut rng,
                &format!("{layers_prefix}{i}.{path}"),
                r,
                out,
                inputs,
            );
        }
    }
    t
}

/// Writes an adapter directory.
pub fn write_adapter(dir: &Path, config_json: &str, tensors: &Tensors) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("adapter_config.json"), config_json).unwrap();
    write_safetensors(&dir.join("adapter_model.safetensors"), tensors);
}

/// Renders an error with its whole context chain.
pub fn message(err: anyhow::Error) -> String {
    format!("{err:#}")
}
