//! Loading tiny Qwen3.5 snapshots written by the test itself: both name layouts, single and
//! sharded files, dtype mix, ignored tensors, and the errors for bad checkpoints.

mod checkpoint_fixture;

use checkpoint_fixture::*;
use instinct_model::checkpoint::{Snapshot, SnapshotLayout};
use instinct_model::weights::{HostTensor, MixerWeights, TextWeights};
use safetensors::Dtype;
use tempfile::TempDir;

fn expected(tensors: &Tensors, name: &str) -> HostTensor {
    let t = &tensors[name];
    HostTensor::new(t.shape.clone(), t.stored_values())
}

/// Every loaded tensor equals the written one (after the dtype round trip).
fn assert_matches(weights: &TextWeights, tensors: &Tensors, prefix: &str) {
    let e = |suffix: &str| expected(tensors, &format!("{prefix}{suffix}"));
    assert_eq!(weights.embed_tokens, e("embed_tokens.weight"));
    assert_eq!(weights.norm, e("norm.weight"));
    assert_eq!(weights.layers.len(), LAYERS);
    for (i, layer) in weights.layers.iter().enumerate() {
        let e = |suffix: &str| expected(tensors, &format!("{prefix}layers.{i}.{suffix}"));
        assert_eq!(layer.input_layernorm, e("input_layernorm.weight"));
        assert_eq!(
            layer.post_attention_layernorm,
            e("post_attention_layernorm.weight")
        );
        assert_eq!(layer.mlp.gate_proj, e("mlp.gate_proj.weight"));
        assert_eq!(layer.mlp.up_proj, e("mlp.up_proj.weight"));
        assert_eq!(layer.mlp.down_proj, e("mlp.down_proj.weight"));
        match (&layer.mixer, is_full_attention(i)) {
            (MixerWeights::Full(a), true) => {
                assert_eq!(a.q_proj, e("self_attn.q_proj.weight"));
                assert_eq!(a.k_proj, e("self_attn.k_proj.weight"));
                assert_eq!(a.v_proj, e("self_attn.v_proj.weight"));
                assert_eq!(a.o_proj, e("self_attn.o_proj.weight"));
                assert_eq!(a.q_norm, e("self_attn.q_norm.weight"));
                assert_eq!(a.k_norm, e("self_attn.k_norm.weight"));
            }
            (MixerWeights::Linear(d), false) => {
                assert_eq!(d.in_proj_qkv, e("linear_attn.in_proj_qkv.weight"));
                assert_eq!(d.in_proj_z, e("linear_attn.in_proj_z.weight"));
                assert_eq!(d.in_proj_b, e("linear_attn.in_proj_b.weight"));
                assert_eq!(d.in_proj_a, e("linear_attn.in_proj_a.weight"));
                let conv = e("linear_attn.conv1d.weight");
                assert_eq!(d.conv1d.shape, vec![LIN_QKV, CONV_K], "conv1d squeezed");
                assert_eq!(d.conv1d.data, conv.data);
                assert_eq!(d.dt_bias, e("linear_attn.dt_bias"));
                assert_eq!(d.a_log, e("linear_attn.A_log"));
                assert_eq!(d.norm, e("linear_attn.norm.weight"));
                assert_eq!(d.out_proj, e("linear_attn.out_proj.weight"));
            }
            (_, full) => panic!("layer {i}: wrong mixer kind (full attention expected: {full})"),
        }
    }
}

#[test]
fn conditional_generation_layout_single_file_loads_exactly() {
    let dir = TempDir::new().unwrap();
    let mut tensors = text_tensors(CG_PREFIX, 1);
    tensors.extend(vision_and_mtp_tensors(2));
    write_single_file_snapshot(dir.path(), &multimodal_config_json(true), &tensors);

    let snapshot = Snapshot::open(dir.path()).unwrap();
    assert_eq!(snapshot.layout(), SnapshotLayout::ConditionalGeneration);
    assert!(snapshot.config().vision.is_some());
    // f32 and bf16 really are mixed in the file.
    let a_log = format!("{CG_PREFIX}layers.0.linear_attn.A_log");
    assert_eq!(snapshot.tensors().dtype(&a_log), Some(Dtype::F32));
    assert_eq!(
        snapshot
            .tensors()
            .dtype(&format!("{CG_PREFIX}embed_tokens.weight")),
        Some(Dtype::BF16)
    );
    let weights = snapshot.load_text_weights().unwrap();
    assert_matches(&weights, &tensors, CG_PREFIX);
    // A_log keeps its full f32 precision (no bf16 rounding on the way).
    let raw = &tensors[&a_log].values;
    assert!(raw.iter().any(|v| half::bf16::from_f32(*v).to_f32() != *v));
    let MixerWeights::Linear(dn) = &weights.layers[0].mixer else {
        panic!("layer 0 is DeltaNet")
    };
    assert_eq!(&dn.a_log.data, raw);
}

#[test]
fn vision_tensors_are_readable_by_name() {
    let dir = TempDir::new().unwrap();
    let mut tensors = text_tensors(CG_PREFIX, 1);
    tensors.extend(vision_and_mtp_tensors(2));
    write_single_file_snapshot(dir.path(), &multimodal_config_json(true), &tensors);
    let snapshot = Snapshot::open(dir.path()).unwrap();
    let name = "model.visual.merger.linear_fc2.weight";
    assert_eq!(
        snapshot.read_tensor_f32(name).unwrap(),
        expected(&tensors, name)
    );
    let err = message(
        snapshot
            .read_tensor_f32("model.visual.nope.weight")
            .unwrap_err(),
    );
    assert!(err.contains("model.visual.nope.weight"), "{err}");
}

#[test]
fn causal_lm_layout_with_bare_text_config_loads_exactly() {
    let dir = TempDir::new().unwrap();
    let mut tensors = text_tensors(CAUSAL_PREFIX, 3);
    // transformers' CausalLM drops model.visual.* and mtp.* on load; they may still be there.
    tensors.extend(vision_and_mtp_tensors(4));
    write_single_file_snapshot(dir.path(), &text_only_config_json(true), &tensors);
    let snapshot = Snapshot::open(dir.path()).unwrap();
    assert_eq!(snapshot.layout(), SnapshotLayout::CausalLm);
    assert!(snapshot.config().vision.is_none());
    assert_matches(
        &snapshot.load_text_weights().unwrap(),
        &tensors,
        CAUSAL_PREFIX,
    );
}

#[test]
fn sharded_snapshot_with_index_loads_exactly() {
    let dir = TempDir::new().unwrap();
    let mut tensors = text_tensors(CG_PREFIX, 5);
    tensors.extend(vision_and_mtp_tensors(6));
    write_sharded_snapshot(dir.path(), &multimodal_config_json(true), &tensors, 3);
    assert!(!dir.path().join("model.safetensors").exists());
    let snapshot = Snapshot::open(dir.path()).unwrap();
    let files: std::collections::BTreeSet<_> = snapshot
        .tensors()
        .names()
        .map(|n| snapshot.tensors().file_of(n).unwrap().to_path_buf())
        .collect();
    assert_eq!(files.len(), 3);
    assert_matches(&snapshot.load_text_weights().unwrap(), &tensors, CG_PREFIX);
}

#[test]
fn f16_and_f32_tensors_are_converted() {
    let dir = TempDir::new().unwrap();
    let mut tensors = text_tensors(CG_PREFIX, 7);
    for (name, t) in tensors.iter_mut() {
        if name.contains("mlp.") {
            t.dtype = Dtype::F16;
        } else if name.contains("self_attn.") {
            t.dtype = Dtype::F32;
        }
    }
    write_single_file_snapshot(dir.path(), &multimodal_config_json(true), &tensors);
    let weights = Snapshot::open(dir.path())
        .unwrap()
        .load_text_weights()
        .unwrap();
    assert_matches(&weights, &tensors, CG_PREFIX);
}

fn load_error(config_json: &str, tensors: &Tensors) -> String {
    let dir = TempDir::new().unwrap();
    write_single_file_snapshot(dir.path(), config_json, tensors);
    match Snapshot::open(dir.path()).and_then(|s| s.load_text_weights()) {
        Ok(_) => panic!("loading should fail"),
        Err(e) => message(e),
    }
}

#[test]
fn missing_tensor_is_named_with_its_expected_shape() {
    let mut tensors = text_tensors(CG_PREFIX, 8);
    let name = format!("{CG_PREFIX}layers.7.self_attn.k_proj.weight");
    tensors.remove(&name).unwrap();
    let err = load_error(&multimodal_config_json(true), &tensors);
    assert!(err.contains(&name), "{err}");
    assert!(err.contains("missing"), "{err}");
    assert!(
        err.contains(&format!("{:?}", [KV_HEADS * HEAD_DIM, HIDDEN])),
        "{err}"
    );
}

#[test]
fn misshapen_tensor_is_named_with_both_shapes() {
    let mut tensors = text_tensors(CG_PREFIX, 9);
    let name = format!("{CG_PREFIX}layers.2.linear_attn.out_proj.weight");
    // Transposed: same element count, wrong layout.
    tensors.get_mut(&name).unwrap().shape = vec![LIN_V, HIDDEN];
    let err = load_error(&multimodal_config_json(true), &tensors);
    assert!(err.contains(&name), "{err}");
    assert!(
        err.contains(&format!("{:?}", [LIN_V, HIDDEN])),
        "found shape: {err}"
    );
    assert!(
        err.contains(&format!("{:?}", [HIDDEN, LIN_V])),
        "expected shape: {err}"
    );
}

#[test]
fn unsqueezed_conv1d_is_a_shape_error() {
    let mut tensors = text_tensors(CG_PREFIX, 10);
    let name = format!("{CG_PREFIX}layers.1.linear_attn.conv1d.weight");
    tensors.get_mut(&name).unwrap().shape = vec![LIN_QKV, CONV_K];
    let err = load_error(&multimodal_config_json(true), &tensors);
    assert!(
        err.contains(&name) && err.contains(&format!("{:?}", [LIN_QKV, 1, CONV_K])),
        "{err}"
    );
}

#[test]
fn unexpected_text_tensor_is_refused() {
    let mut tensors = text_tensors(CG_PREFIX, 11);
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0);
    let name = format!("{CG_PREFIX}layers.3.self_attn.q_proj.bias");
    tensors.insert(
        name.clone(),
        Tensor::random(&mut rng, Dtype::BF16, &[2 * HEADS * HEAD_DIM]),
    );
    let err = load_error(&multimodal_config_json(true), &tensors);
    assert!(err.contains(&name), "{err}");
}

#[test]
fn tensor_outside_known_prefixes_is_refused() {
    let mut tensors = text_tensors(CG_PREFIX, 12);
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0);
    tensors.insert(
        "transformer.wte.weight".into(),
        Tensor::random(&mut rng, Dtype::BF16, &[2]),
    );
    let err = load_error(&multimodal_config_json(true), &tensors);
    assert!(err.contains("transformer.wte.weight"), "{err}");
}

#[test]
fn untied_head_is_refused() {
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0);
    let mut tensors = text_tensors(CG_PREFIX, 13);
    let err = load_error(&multimodal_config_json(false), &tensors);
    assert!(err.contains("tie_word_embeddings is false"), "{err}");

    tensors.insert(
        "lm_head.weight".into(),
        Tensor::random(&mut rng, Dtype::BF16, &[VOCAB, HIDDEN]),
    );
    let err = load_error(&multimodal_config_json(false), &tensors);
    assert!(
        err.contains("tie_word_embeddings is false") && err.contains("lm_head.weight"),
        "{err}"
    );

    // Tied: transformers ignores a stored head, and so do we.
    let dir = TempDir::new().unwrap();
    write_single_file_snapshot(dir.path(), &multimodal_config_json(true), &tensors);
    let weights = Snapshot::open(dir.path())
        .unwrap()
        .load_text_weights()
        .unwrap();
    assert_matches(&weights, &tensors, CG_PREFIX);
}

#[test]
fn unsupported_dtype_is_named() {
    let mut tensors = text_tensors(CG_PREFIX, 14);
    let name = format!("{CG_PREFIX}norm.weight");
    tensors.get_mut(&name).unwrap().dtype = Dtype::I32;
    let err = load_error(&multimodal_config_json(true), &tensors);
    assert!(err.contains(&name) && err.contains("I32"), "{err}");
}

#[test]
fn missing_embedding_is_named() {
    let mut tensors = text_tensors(CG_PREFIX, 15);
    tensors.remove(&format!("{CG_PREFIX}embed_tokens.weight"));
    let err = load_error(&multimodal_config_json(true), &tensors);
    assert!(
        err.contains("model.language_model.embed_tokens.weight"),
        "{err}"
    );
}

#[test]
fn inconsistent_shard_index_is_refused() {
    let tensors = text_tensors(CG_PREFIX, 16);
    let index_path = |d: &TempDir| d.path().join("model.safetensors.index.json");
    let edit_index =
        |d: &TempDir, edit: &dyn Fn(&mut serde_json::Map<String, serde_json::Value>)| {
            let text = std::fs::read_to_string(index_path(d)).unwrap();
            let mut index: serde_json::Value = serde_json::from_str(&text).unwrap();
            edit(index["weight_map"].as_object_mut().unwrap());
            std::fs::write(index_path(d), index.to_string()).unwrap();
        };
    let norm = format!("{CG_PREFIX}norm.weight");

    // The index names a tensor its shard does not hold.
    let dir = TempDir::new().unwrap();
    write_sharded_snapshot(dir.path(), &multimodal_config_json(true), &tensors, 2);
    edit_index(&dir, &|map| {
        map.insert(
            "model.language_model.ghost.weight".into(),
            "model-00001-of-00002.safetensors".into(),
        );
    });
    let err = message(Snapshot::open(dir.path()).err().expect("must fail"));
    assert!(err.contains("model.language_model.ghost.weight"), "{err}");

    // A shard holds a tensor the index does not list.
    let dir = TempDir::new().unwrap();
    write_sharded_snapshot(dir.path(), &multimodal_config_json(true), &tensors, 2);
    edit_index(&dir, &|map| {
        map.remove(&norm);
    });
    let err = message(Snapshot::open(dir.path()).err().expect("must fail"));
    assert!(err.contains(&norm) && err.contains("not listed"), "{err}");

    // A shard name escaping the directory.
    let dir = TempDir::new().unwrap();
    write_sharded_snapshot(dir.path(), &multimodal_config_json(true), &tensors, 2);
    edit_index(&dir, &|map| {
        map.insert(norm.clone(), "../elsewhere.safetensors".into());
    });
    let err = message(Snapshot::open(dir.path()).err().expect("must fail"));
    assert!(err.contains("../elsewhere.safetensors"), "{err}");
}

#[test]
fn directory_without_weights_is_refused() {
    let dir = TempDir::new().unwrap();
    std::fs::write(dir.path().join("config.json"), multimodal_config_json(true)).unwrap();
    let err = message(Snapshot::open(dir.path()).err().expect("must fail"));
    assert!(err.contains("model.safetensors"), "{err}");
}

#[test]
fn truncated_safetensors_file_is_refused() {
    let dir = TempDir::new().unwrap();
    let tensors = text_tensors(CG_PREFIX, 17);
    write_single_file_snapshot(dir.path(), &multimodal_config_json(true), &tensors);
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    let err = message(Snapshot::open(dir.path()).err().expect("must fail"));
    assert!(err.contains("invalid safetensors"), "{err}");
}
