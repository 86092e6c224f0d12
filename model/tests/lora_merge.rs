//! PEFT LoRA adapters merged into tiny snapshots written by the test itself: the merged weight
//! is checked against `W + scale·B·A` computed independently (f64, naive loops), and every way
//! an adapter can fail to land on the model is an error naming the key.

mod checkpoint_fixture;

use checkpoint_fixture::*;
use instinct_model::checkpoint::Snapshot;
use instinct_model::lora::{AdapterKeyLayout, LoraAdapter, LoraTarget, TextLinear, VisionLinear};
use instinct_model::weights::{HostTensor, MixerWeights, TextWeights};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tempfile::TempDir;

const CAUSAL_KEYS: &str = "base_model.model.model.layers.";
const CG_KEYS: &str = "base_model.model.model.language_model.layers.";

fn base_weights(seed: u64) -> TextWeights {
    base_snapshot(seed).1.load_text_weights().unwrap()
}

/// `W + scale · B · A` in f64, the textbook way.
fn reference_merge(w: &HostTensor, a: &HostTensor, b: &HostTensor, scale: f64) -> Vec<f64> {
    let (out, inputs, r) = (w.shape[0], w.shape[1], a.shape[0]);
    let mut merged = vec![0f64; out * inputs];
    for o in 0..out {
        for i in 0..inputs {
            let mut dot = 0f64;
            for k in 0..r {
                dot += b.data[o * r + k] as f64 * a.data[k * inputs + i] as f64;
            }
            merged[o * inputs + i] = w.data[o * inputs + i] as f64 + scale * dot;
        }
    }
    merged
}

fn weight<'a>(weights: &'a TextWeights, layer: usize, path: &str) -> &'a HostTensor {
    let l = &weights.layers[layer];
    match (path, &l.mixer) {
        ("mlp.gate_proj", _) => &l.mlp.gate_proj,
        ("mlp.up_proj", _) => &l.mlp.up_proj,
        ("mlp.down_proj", _) => &l.mlp.down_proj,
        ("self_attn.q_proj", MixerWeights::Full(a)) => &a.q_proj,
        ("self_attn.k_proj", MixerWeights::Full(a)) => &a.k_proj,
        ("self_attn.v_proj", MixerWeights::Full(a)) => &a.v_proj,
        ("self_attn.o_proj", MixerWeights::Full(a)) => &a.o_proj,
        ("linear_attn.in_proj_qkv", MixerWeights::Linear(d)) => &d.in_proj_qkv,
        ("linear_attn.out_proj", MixerWeights::Linear(d)) => &d.out_proj,
        _ => panic!("no {path} in layer {layer}"),
    }
}

fn lora_tensor(tensors: &Tensors, key: &str) -> HostTensor {
    let t = &tensors[key];
    HostTensor::new(t.shape.clone(), t.values.clone())
}

/// Checks every adapted Linear against the reference merge and every other weight unchanged.
fn assert_merged(
    before: &TextWeights,
    after: &TextWeights,
    adapter: &Tensors,
    keys: &str,
    scale: f64,
) {
    let mut checked = 0;
    for i in 0..LAYERS {
        for (path, _, _) in cua_text_modules(i) {
            let a = lora_tensor(adapter, &format!("{keys}{i}.{path}.lora_A.weight"));
            let b = lora_tensor(adapter, &format!("{keys}{i}.{path}.lora_B.weight"));
            let w0 = weight(before, i, path);
            let expected = reference_merge(w0, &a, &b, scale);
            let got = &weight(after, i, path).data;
            let mut changed = false;
            for (j, (&g, &e)) in got.iter().zip(&expected).enumerate() {
                assert!(
                    (g as f64 - e).abs() <= 1e-5 * (1.0 + e.abs()),
                    "layer {i} {path} [{j}]: {g} vs {e}"
                );
                changed |= g != w0.data[j];
            }
            assert!(changed, "layer {i} {path} was not modified");
            checked += 1;
        }
        // Untargeted weights stay bit-identical.
        let (lb, la) = (&before.layers[i], &after.layers[i]);
        assert_eq!(lb.input_layernorm, la.input_layernorm);
        match (&lb.mixer, &la.mixer) {
            (MixerWeights::Linear(x), MixerWeights::Linear(y)) => {
                assert_eq!(x.in_proj_qkv, y.in_proj_qkv);
                assert_eq!(x.in_proj_z, y.in_proj_z);
                assert_eq!(x.out_proj, y.out_proj);
                assert_eq!(x.conv1d, y.conv1d);
            }
            (MixerWeights::Full(x), MixerWeights::Full(y)) => {
                assert_eq!(x.q_norm, y.q_norm);
                assert_eq!(x.k_norm, y.k_norm);
            }
            _ => panic!("mixer kind changed"),
        }
    }
    assert_eq!(checked, 6 * 3 + 2 * 7);
    assert_eq!(before.embed_tokens, after.embed_tokens);
    assert_eq!(before.norm, after.norm);
}

fn assert_unchanged(before: &TextWeights, after: &TextWeights) {
    for (x, y) in before.layers.iter().zip(&after.layers) {
        assert_eq!(x.mlp.gate_proj, y.mlp.gate_proj);
        assert_eq!(x.mlp.down_proj, y.mlp.down_proj);
        if let (MixerWeights::Full(p), MixerWeights::Full(q)) = (&x.mixer, &y.mixer) {
            assert_eq!(p.q_proj, q.q_proj);
        }
    }
}

fn open_adapter(config_json: &str, tensors: &Tensors) -> (TempDir, anyhow::Result<LoraAdapter>) {
    let dir = TempDir::new().unwrap();
    write_adapter(dir.path(), config_json, tensors);
    let adapter = LoraAdapter::open(dir.path());
    (dir, adapter)
}

fn plain_config(r: usize, alpha: f64) -> String {
    adapter_config_json(r, alpha, TEXT_TARGETS, serde_json::json!({}))
}

#[test]
fn text_adapter_merge_equals_w_plus_scaled_ba() {
    let before = base_weights(1);
    let adapter_tensors = cua_text_adapter(CAUSAL_KEYS, 4, 2);
    let (_dir, adapter) = open_adapter(&plain_config(4, 8.0), &adapter_tensors);
    let adapter = adapter.unwrap();
    assert_eq!(adapter.key_layout(), Some(AdapterKeyLayout::CausalLm));
    assert_eq!(adapter.config().scale(), 2.0);
    assert!(!adapter.targets_vision());

    let mut after = before.clone();
    let report = adapter.merge_into_text_only(&mut after).unwrap();
    assert_eq!(report.merged.len(), adapter.modules().len());
    assert_eq!(report.merged.len(), 32);
    assert!(report.vision.is_empty());
    assert!(report.merged.contains(&LoraTarget::Text {
        layer: 7,
        linear: TextLinear::QProj
    }));
    assert_merged(&before, &after, &adapter_tensors, CAUSAL_KEYS, 2.0);
}

#[test]
fn rslora_scales_by_alpha_over_sqrt_r() {
    let before = base_weights(3);
    let adapter_tensors = cua_text_adapter(CAUSAL_KEYS, 4, 4);
    let config = adapter_config_json(
        4,
        6.0,
        TEXT_TARGETS,
        serde_json::json!({"use_rslora": true}),
    );
    let (_dir, adapter) = open_adapter(&config, &adapter_tensors);
    let adapter = adapter.unwrap();
    assert_eq!(adapter.config().scale(), 3.0);
    let mut after = before.clone();
    adapter.merge_into_text(&mut after).unwrap();
    assert_merged(&before, &after, &adapter_tensors, CAUSAL_KEYS, 3.0);
}

/// The `multimodal/` layout: text keys under `language_model`, plus vision block and merger MLPs.
fn multimodal_adapter(seed: u64) -> Tensors {
    let mut t = cua_text_adapter(CG_KEYS, 4, seed);
    let mut rng = StdRng::seed_from_u64(seed + 100);
    for j in 0..2 {
        add_lora_pair(
            &mut t,
            &mut rng,
            &format!("base_model.model.model.visual.blocks.{j}.mlp.linear_fc1"),
            4,
            6,
            4,
        );
        add_lora_pair(
            &mut t,
            &mut rng,
            &format!("base_model.model.model.visual.blocks.{j}.mlp.linear_fc2"),
            4,
            4,
            6,
        );
    }
    add_lora_pair(
        &mut t,
        &mut rng,
        "base_model.model.model.visual.merger.linear_fc1",
        4,
        16,
        16,
    );
    add_lora_pair(
        &mut t,
        &mut rng,
        "base_model.model.model.visual.merger.linear_fc2",
        4,
        HIDDEN,
        16,
    );
    t
}

fn multimodal_config() -> String {
    let mut targets = TEXT_TARGETS.to_vec();
    targets.extend(["linear_fc1", "linear_fc2"]);
    adapter_config_json(4, 8.0, &targets, serde_json::json!({}))
}

#[test]
fn multimodal_adapter_merges_text_and_hands_back_vision_modules() {
    let before = base_weights(5);
    let adapter_tensors = multimodal_adapter(6);
    let (_dir, adapter) = open_adapter(&multimodal_config(), &adapter_tensors);
    let adapter = adapter.unwrap();
    assert_eq!(
        adapter.key_layout(),
        Some(AdapterKeyLayout::ConditionalGeneration)
    );
    assert!(adapter.targets_vision());

    let mut after = before.clone();
    let report = adapter.merge_into_text(&mut after).unwrap();
    assert_eq!(report.merged.len(), 32);
    assert_merged(&before, &after, &adapter_tensors, CG_KEYS, 2.0);

    let mut vision: Vec<LoraTarget> = report.vision.iter().map(|m| m.target).collect();
    vision.sort();
    let mut want = vec![
        LoraTarget::Vision(VisionLinear::BlockFc1 { block: 0 }),
        LoraTarget::Vision(VisionLinear::BlockFc2 { block: 0 }),
        LoraTarget::Vision(VisionLinear::BlockFc1 { block: 1 }),
        LoraTarget::Vision(VisionLinear::BlockFc2 { block: 1 }),
        LoraTarget::Vision(VisionLinear::MergerFc1),
        LoraTarget::Vision(VisionLinear::MergerFc2),
    ];
    want.sort();
    assert_eq!(vision, want);
    assert_eq!(
        report.merged.len() + report.vision.len(),
        adapter.modules().len()
    );

    // The caller can merge a vision module into its own weight.
    let module = report
        .vision
        .iter()
        .find(|m| m.target == LoraTarget::Vision(VisionLinear::MergerFc2))
        .unwrap();
    assert_eq!(module.weight_shape(), [HIDDEN, 16]);
    let w0 = HostTensor::new(
        vec![HIDDEN, 16],
        (0..HIDDEN * 16).map(|x| x as f32 * 0.01).collect(),
    );
    let mut w = w0.clone();
    module.merge_into(&mut w).unwrap();
    let expected = reference_merge(&w0, &module.a, &module.b, 2.0);
    for (g, e) in w.data.iter().zip(&expected) {
        assert!((*g as f64 - e).abs() < 1e-5 * (1.0 + e.abs()));
    }
    let err = message(
        module
            .merge_into(&mut HostTensor::new(
                vec![16, HIDDEN],
                vec![0.0; 16 * HIDDEN],
            ))
            .unwrap_err(),
    );
    assert!(
        err.contains("merger.linear_fc2") && err.contains("[16, 8]"),
        "{err}"
    );
}

#[test]
fn text_only_merge_refuses_vision_adapter_before_touching_weights() {
    let before = base_weights(7);
    let (_dir, adapter) = open_adapter(&multimodal_config(), &multimodal_adapter(8));
    let mut after = before.clone();
    let err = message(
        adapter
            .unwrap()
            .merge_into_text_only(&mut after)
            .unwrap_err(),
    );
    assert!(err.contains("targets the vision tower"), "{err}");
    assert!(
        err.contains("screenshot serving is not supported yet"),
        "{err}"
    );
    assert_unchanged(&before, &after);
}

#[test]
fn attention_key_on_deltanet_layer_is_an_error_and_nothing_merges() {
    let before = base_weights(9);
    let mut tensors = cua_text_adapter(CAUSAL_KEYS, 4, 10);
    let mut rng = StdRng::seed_from_u64(11);
    let key = format!("{CAUSAL_KEYS}0.self_attn.q_proj");
    add_lora_pair(
        &mut tensors,
        &mut rng,
        &key,
        4,
        2 * HEADS * HEAD_DIM,
        HIDDEN,
    );
    let (_dir, adapter) = open_adapter(&plain_config(4, 8.0), &tensors);
    let mut after = before.clone();
    let err = message(adapter.unwrap().merge_into_text(&mut after).unwrap_err());
    assert!(err.contains(&key), "{err}");
    assert!(err.contains("linear_attention (Gated DeltaNet)"), "{err}");
    assert_unchanged(&before, &after);
}

#[test]
fn layer_beyond_the_model_is_an_error() {
    let mut tensors = cua_text_adapter(CAUSAL_KEYS, 4, 12);
    let mut rng = StdRng::seed_from_u64(13);
    let key = format!("{CAUSAL_KEYS}{LAYERS}.mlp.up_proj");
    add_lora_pair(&mut tensors, &mut rng, &key, 4, INTER, HIDDEN);
    let (_dir, adapter) = open_adapter(&plain_config(4, 8.0), &tensors);
    let err = message(
        adapter
            .unwrap()
            .merge_into_text(&mut base_weights(14))
            .unwrap_err(),
    );
    assert!(
        err.contains(&key) && err.contains("does not exist"),
        "{err}"
    );
}

#[test]
fn unknown_module_is_an_error_naming_the_key() {
    for module in [
        "base_model.model.model.layers.1.mlp.fancy_proj",
        "base_model.model.model.embed_tokens",
        "base_model.model.lm_head",
        "base_model.model.model.visual.patch_embed.proj",
        "model.layers.1.mlp.up_proj",
    ] {
        let mut tensors = cua_text_adapter(CAUSAL_KEYS, 4, 15);
        let mut rng = StdRng::seed_from_u64(16);
        add_lora_pair(&mut tensors, &mut rng, module, 4, INTER, HIDDEN);
        let (_dir, adapter) = open_adapter(&plain_config(4, 8.0), &tensors);
        let err = message(adapter.unwrap_err());
        assert!(
            err.contains(&format!("{module}.lora_A.weight")),
            "{module}: {err}"
        );
    }
}

#[test]
fn key_without_partner_is_an_error_naming_it() {
    for (remove, keep) in [("lora_B", "lora_A"), ("lora_A", "lora_B")] {
        let mut tensors = cua_text_adapter(CAUSAL_KEYS, 4, 17);
        let module = format!("{CAUSAL_KEYS}3.self_attn.v_proj");
        tensors
            .remove(&format!("{module}.{remove}.weight"))
            .unwrap();
        let (_dir, adapter) = open_adapter(&plain_config(4, 8.0), &tensors);
        let err = message(adapter.unwrap_err());
        assert!(err.contains(&format!("{module}.{keep}.weight")), "{err}");
        assert!(
            err.contains(&format!("{module}.{remove}.weight")),
            "partner named: {err}"
        );
    }
}

#[test]
fn non_lora_key_is_an_error() {
    let mut tensors = cua_text_adapter(CAUSAL_KEYS, 4, 18);
    let mut rng = StdRng::seed_from_u64(19);
    let key = format!("{CAUSAL_KEYS}3.self_attn.v_proj.lora_magnitude_vector");
    tensors.insert(
        key.clone(),
        Tensor::random(&mut rng, safetensors::Dtype::F32, &[4]),
    );
    let (_dir, adapter) = open_adapter(&plain_config(4, 8.0), &tensors);
    let err = message(adapter.unwrap_err());
    assert!(err.contains(&key), "{err}");
}

#[test]
fn shape_mismatch_is_an_error_naming_module_and_shapes() {
    let before = base_weights(20);
    let mut tensors = cua_text_adapter(CAUSAL_KEYS, 4, 21);
    let module = format!("{CAUSAL_KEYS}5.mlp.down_proj");
    let mut rng = StdRng::seed_from_u64(22);
    // A with `in` = hidden instead of intermediate.
    tensors.insert(
        format!("{module}.lora_A.weight"),
        Tensor::random(&mut rng, safetensors::Dtype::F32, &[4, HIDDEN]),
    );
    let (_dir, adapter) = open_adapter(&plain_config(4, 8.0), &tensors);
    let mut after = before.clone();
    let err = message(adapter.unwrap().merge_into_text(&mut after).unwrap_err());
    assert!(err.contains(&module), "{err}");
    assert!(
        err.contains(&format!("{:?}", [HIDDEN, INTER])),
        "base shape: {err}"
    );
    assert!(
        err.contains(&format!("{:?}", [HIDDEN, HIDDEN])),
        "needed shape: {err}"
    );
    assert_unchanged(&before, &after);
}

#[test]
fn rank_other_than_config_r_is_an_error() {
    let tensors = cua_text_adapter(CAUSAL_KEYS, 4, 23);
    let (_dir, adapter) = open_adapter(&plain_config(8, 16.0), &tensors);
    let err = message(adapter.unwrap_err());
    assert!(
        err.contains("r = 8") && err.contains("lora_A has shape [4,"),
        "{err}"
    );
}

#[test]
fn mixed_key_layouts_are_an_error() {
    let mut tensors = cua_text_adapter(CAUSAL_KEYS, 4, 24);
    let mut rng = StdRng::seed_from_u64(25);
    add_lora_pair(
        &mut tensors,
        &mut rng,
        &format!("{CG_KEYS}0.mlp.up_proj"),
        4,
        INTER,
        HIDDEN,
    );
    let (_dir, adapter) = open_adapter(&plain_config(4, 8.0), &tensors);
    let err = message(adapter.unwrap_err());
    assert!(err.contains("layout"), "{err}");
}

#[test]
fn module_not_in_target_modules_is_an_error() {
    let tensors = cua_text_adapter(CAUSAL_KEYS, 4, 26);
    let config = adapter_config_json(
        4,
        8.0,
        &["gate_proj", "up_proj", "down_proj"],
        serde_json::json!({}),
    );
    let (_dir, adapter) = open_adapter(&config, &tensors);
    let err = message(adapter.unwrap_err());
    assert!(
        err.contains("self_attn") && err.contains("target_modules"),
        "{err}"
    );

    let config = adapter_config_json(
        4,
        8.0,
        TEXT_TARGETS,
        serde_json::json!({"layers_to_transform": [3, 7]}),
    );
    let (_dir, adapter) = open_adapter(&config, &tensors);
    let err = message(adapter.unwrap_err());
    assert!(err.contains("layers_to_transform"), "{err}");
}

#[test]
fn unmergeable_configs_are_refused_by_name() {
    let tensors = cua_text_adapter(CAUSAL_KEYS, 4, 27);
    for (overrides, needle) in [
        (serde_json::json!({"use_dora": true}), "use_dora"),
        (serde_json::json!({"bias": "all"}), "bias"),
        (serde_json::json!({"bias": "lora_only"}), "bias"),
        (
            serde_json::json!({"modules_to_save": ["lm_head"]}),
            "modules_to_save",
        ),
        (
            serde_json::json!({"rank_pattern": {"q_proj": 8}}),
            "rank_pattern",
        ),
        (
            serde_json::json!({"alpha_pattern": {"q_proj": 8}}),
            "alpha_pattern",
        ),
        (serde_json::json!({"lora_bias": true}), "lora_bias"),
        (
            serde_json::json!({"init_lora_weights": "pissa"}),
            "init_lora_weights",
        ),
        (
            serde_json::json!({"alora_invocation_tokens": [1, 2]}),
            "alora_invocation_tokens",
        ),
        (serde_json::json!({"peft_type": "LOHA"}), "peft_type"),
        (serde_json::json!({"r": 0}), "`r`"),
    ] {
        let config = adapter_config_json(4, 8.0, TEXT_TARGETS, overrides.clone());
        let (_dir, adapter) = open_adapter(&config, &tensors);
        let err = message(adapter.unwrap_err());
        assert!(err.contains(needle), "{overrides}: {err}");
    }
}

#[test]
fn pickled_adapter_is_refused() {
    let dir = TempDir::new().unwrap();
    std::fs::write(dir.path().join("adapter_config.json"), plain_config(4, 8.0)).unwrap();
    std::fs::write(dir.path().join("adapter_model.bin"), b"not safetensors").unwrap();
    let err = message(LoraAdapter::open(dir.path()).unwrap_err());
    assert!(err.contains("adapter_model.bin"), "{err}");
}

/// A snapshot written for the test (kept while the returned directory lives).
fn base_snapshot(seed: u64) -> (TempDir, Snapshot) {
    let dir = TempDir::new().unwrap();
    write_single_file_snapshot(
        dir.path(),
        &multimodal_config_json(true),
        &text_tensors(CG_PREFIX, seed),
    );
    let snapshot = Snapshot::open(dir.path()).unwrap();
    (dir, snapshot)
}

fn same_bits(a: &TextWeights, b: &TextWeights) -> bool {
    format!("{a:?}") == format!("{b:?}")
}

/// Merging each Linear as it is decoded gives the weights and the report of reading, then
/// merging, bit for bit: for the text adapter (text only) and the multimodal one (its vision
/// modules handed back).
#[test]
fn merging_while_reading_equals_reading_then_merging() {
    let (_snap_dir, snapshot) = base_snapshot(21);
    for (config, tensors, text_only) in [
        (
            plain_config(4, 8.0),
            cua_text_adapter(CAUSAL_KEYS, 4, 22),
            true,
        ),
        (multimodal_config(), multimodal_adapter(23), false),
    ] {
        let (_dir, adapter) = open_adapter(&config, &tensors);
        let adapter = adapter.unwrap();
        let mut then = snapshot.load_text_weights().unwrap();
        let report = if text_only {
            adapter.merge_into_text_only(&mut then).unwrap()
        } else {
            adapter.merge_into_text(&mut then).unwrap()
        };
        let (fused, fused_report) = adapter.read_merged_into_text(&snapshot, text_only).unwrap();
        assert!(same_bits(&fused, &then), "text_only {text_only}");
        assert!(!same_bits(&fused, &snapshot.load_text_weights().unwrap()));
        assert_eq!(fused_report.merged, report.merged);
        let targets = |r: &instinct_model::lora::MergeReport| -> Vec<LoraTarget> {
            r.vision.iter().map(|m| m.target).collect()
        };
        assert_eq!(targets(&fused_report), targets(&report));
    }
}

/// The errors of merging while reading are those of the separate merge.
#[test]
fn merging_while_reading_refuses_what_the_separate_merge_refuses() {
    let (_snap_dir, snapshot) = base_snapshot(24);
    let mut rng = StdRng::seed_from_u64(25);
    // An attention key on a DeltaNet layer, a layer beyond the model, a wrong shape.
    let on_deltanet = format!("{CAUSAL_KEYS}0.self_attn.q_proj");
    let beyond = format!("{CAUSAL_KEYS}{LAYERS}.mlp.up_proj");
    let wrong_shape = format!("{CAUSAL_KEYS}1.mlp.down_proj");
    let cases: [(&str, usize, usize, &str); 3] = [
        (
            &on_deltanet,
            2 * HEADS * HEAD_DIM,
            HIDDEN,
            "linear_attention (Gated DeltaNet)",
        ),
        (&beyond, INTER, HIDDEN, "does not exist"),
        (&wrong_shape, INTER, HIDDEN, "needs a base weight of shape"),
    ];
    for (key, out, inputs, why) in cases {
        let mut tensors = cua_text_adapter(CAUSAL_KEYS, 4, 26);
        tensors.retain(|name, _| !name.starts_with(&format!("{key}.")));
        add_lora_pair(&mut tensors, &mut rng, key, 4, out, inputs);
        let (_dir, adapter) = open_adapter(&plain_config(4, 8.0), &tensors);
        let adapter = adapter.unwrap();
        let separate = message(
            adapter
                .merge_into_text(&mut snapshot.load_text_weights().unwrap())
                .unwrap_err(),
        );
        let fused = message(adapter.read_merged_into_text(&snapshot, true).unwrap_err());
        for err in [&separate, &fused] {
            assert!(err.contains(key) && err.contains(why), "{err}");
        }
    }
    let (_dir, vision) = open_adapter(&multimodal_config(), &multimodal_adapter(27));
    let err = message(
        vision
            .unwrap()
            .read_merged_into_text(&snapshot, true)
            .unwrap_err(),
    );
    assert!(err.contains("targets the vision tower"), "{err}");
}

/// A weight merged in runs of rows (as the decoder hands them over) equals one merged whole, bit
/// for bit, wherever the runs start.
#[test]
fn merging_in_runs_of_rows_equals_merging_whole() {
    use instinct_model::lora::LoraModule;
    let (out, inputs, r) = (37, 23, 5);
    let values = |n: usize, seed: f32| -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + seed) * 0.731).sin()).collect()
    };
    let module = LoraModule {
        key: "test".into(),
        target: LoraTarget::Text {
            layer: 0,
            linear: TextLinear::DownProj,
        },
        a: HostTensor::new(vec![r, inputs], values(r * inputs, 1.0)),
        b: HostTensor::new(vec![out, r], values(out * r, 2.0)),
        scale: 1.75,
    };
    let w0 = HostTensor::new(vec![out, inputs], values(out * inputs, 3.0));
    let mut whole = w0.clone();
    module.merge_into(&mut whole).unwrap();
    for cuts in [vec![0, out], vec![0, 1, out], vec![0, 10, 11, 30, out]] {
        let mut parts = w0.clone();
        for run in cuts.windows(2) {
            let rows = &mut parts.data[run[0] * inputs..run[1] * inputs];
            module.merge_into_rows(run[0], rows);
        }
        let bits = |t: &HostTensor| t.data.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&parts), bits(&whole), "runs {cuts:?}");
    }
}
