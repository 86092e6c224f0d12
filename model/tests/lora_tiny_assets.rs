//! The committed tiny checkpoint (`model/assets/tiny`, saved by transformers' `save_pretrained`
//! as `Qwen3_5ForConditionalGeneration`, sharded) and its two PEFT adapters load with every
//! tensor and every adapter key accounted for.

use std::path::PathBuf;

use instinct_model::checkpoint::{Snapshot, SnapshotLayout, VISION_PREFIX};
use instinct_model::lora::{AdapterKeyLayout, LoraAdapter, LoraTarget, TextLinear};
use instinct_model::tensor_store::TensorStore;
use instinct_model::weights::MixerWeights;

fn tiny_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/tiny")
}

/// Number of tensors stored in an adapter file.
fn stored_keys(adapter_dir: &str) -> usize {
    TensorStore::open_file(
        tiny_dir()
            .join(adapter_dir)
            .join("adapter_model.safetensors"),
    )
    .unwrap()
    .len()
}

#[test]
fn tiny_snapshot_loads_every_text_tensor() {
    let snapshot = Snapshot::open(tiny_dir()).unwrap();
    assert_eq!(snapshot.layout(), SnapshotLayout::ConditionalGeneration);
    let text = &snapshot.config().text;
    let weights = snapshot.load_text_weights().unwrap();
    assert_eq!(weights.layers.len(), text.num_hidden_layers);

    // Text tensors loaded + vision tensors left = every stored tensor.
    let full = text
        .layer_types
        .iter()
        .filter(|k| **k == instinct_model::config::LayerKind::FullAttention)
        .count();
    let linear = text.num_hidden_layers - full;
    let text_tensors = 2 + 5 * text.num_hidden_layers + 6 * full + 9 * linear;
    let vision_tensors = snapshot
        .tensors()
        .names()
        .filter(|n| n.starts_with(VISION_PREFIX))
        .count();
    assert!(
        vision_tensors > 0,
        "the ConditionalGeneration snapshot carries the vision tower"
    );
    assert_eq!(snapshot.tensors().len(), text_tensors + vision_tensors);

    // The f32-on-disk DeltaNet parameters (as in the real checkpoints) came through.
    let a_log = "model.language_model.layers.0.linear_attn.A_log";
    let MixerWeights::Linear(dn) = &weights.layers[0].mixer else {
        panic!("layer 0 is a DeltaNet layer")
    };
    assert_eq!(dn.a_log, snapshot.read_tensor_f32(a_log).unwrap());
    assert_eq!(
        dn.conv1d.shape,
        vec![text.linear_qkv_dim(), text.linear_conv_kernel_dim]
    );
}

#[test]
fn tiny_text_adapter_merges_with_every_key_used() {
    let snapshot = Snapshot::open(tiny_dir()).unwrap();
    let base = snapshot.load_text_weights().unwrap();
    let adapter = LoraAdapter::open(tiny_dir().join("adapter-text")).unwrap();
    assert_eq!(adapter.key_layout(), Some(AdapterKeyLayout::CausalLm));
    assert_eq!((adapter.config().r, adapter.config().scale()), (16, 2.0));
    assert_eq!(adapter.modules().len() * 2, stored_keys("adapter-text"));

    let mut merged = base.clone();
    let report = adapter.merge_into_text_only(&mut merged).unwrap();
    assert_eq!(report.merged.len(), adapter.modules().len());
    assert!(report.vision.is_empty());
    // The Cua-S1 pattern: MLPs of every layer, q/k/v/o of the full-attention layers only.
    let text = &snapshot.config().text;
    let full = text
        .layer_types
        .iter()
        .filter(|k| **k == instinct_model::config::LayerKind::FullAttention)
        .count();
    assert_eq!(report.merged.len(), 3 * text.num_hidden_layers + 4 * full);

    // One module checked against W + 2·B·A computed here.
    let module = adapter
        .modules()
        .iter()
        .find(|m| {
            m.target
                == LoraTarget::Text {
                    layer: 3,
                    linear: TextLinear::QProj,
                }
        })
        .expect("q_proj of layer 3 is adapted");
    let (MixerWeights::Full(before), MixerWeights::Full(after)) =
        (&base.layers[3].mixer, &merged.layers[3].mixer)
    else {
        panic!("layer 3 is full attention")
    };
    let (out, inputs, r) = (
        before.q_proj.shape[0],
        before.q_proj.shape[1],
        module.a.shape[0],
    );
    let mut max_change = 0f64;
    for o in 0..out {
        for i in 0..inputs {
            let dot: f64 = (0..r)
                .map(|k| module.b.data[o * r + k] as f64 * module.a.data[k * inputs + i] as f64)
                .sum();
            let expected = before.q_proj.data[o * inputs + i] as f64 + 2.0 * dot;
            let got = after.q_proj.data[o * inputs + i] as f64;
            assert!(
                (got - expected).abs() <= 1e-5 * (1.0 + expected.abs()),
                "[{o}, {i}] {got} vs {expected}"
            );
            max_change = max_change.max((got - before.q_proj.data[o * inputs + i] as f64).abs());
        }
    }
    assert!(max_change > 1e-3, "the random adapter must move the weight");
}

#[test]
fn tiny_multimodal_adapter_vision_keys_land_on_vision_weights() {
    let snapshot = Snapshot::open(tiny_dir()).unwrap();
    let adapter = LoraAdapter::open(tiny_dir().join("adapter-multimodal")).unwrap();
    assert_eq!(
        adapter.key_layout(),
        Some(AdapterKeyLayout::ConditionalGeneration)
    );
    assert_eq!(
        adapter.modules().len() * 2,
        stored_keys("adapter-multimodal")
    );

    let mut weights = snapshot.load_text_weights().unwrap();
    let err = format!(
        "{:#}",
        adapter.merge_into_text_only(&mut weights).unwrap_err()
    );
    assert!(
        err.contains("screenshot serving is not supported yet"),
        "{err}"
    );

    let report = adapter.merge_into_text(&mut weights).unwrap();
    assert!(!report.vision.is_empty());
    assert_eq!(
        report.merged.len() + report.vision.len(),
        adapter.modules().len()
    );
    for module in &report.vision {
        let LoraTarget::Vision(linear) = module.target else {
            panic!("text module in the vision list")
        };
        let name = format!("{VISION_PREFIX}{}", linear.weight_name());
        let mut weight = snapshot.read_tensor_f32(&name).unwrap();
        module.merge_into(&mut weight).unwrap();
    }
}
