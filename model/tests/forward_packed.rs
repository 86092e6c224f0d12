//! The text forward pass on a tiny random model with the real layer pattern: packing, finiteness,
//! input checks, and the letter readout on top.

use instinct_kernels::{Backend, CpuBackend};
use instinct_model::config::{LayerKind, TextConfig};
use instinct_model::forward::{BatchLimits, SequenceInput, TextModel};
use instinct_model::readout::{LetterReadout, QWEN_LETTER_TOKEN_IDS};
use instinct_model::weights::{
    AttentionWeights, DeltaNetWeights, HostTensor, LayerWeights, MixerWeights, MlpWeights,
    TextWeights,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Tiny dims with the real structure: 8 layers `[lin, lin, lin, full] × 2`, partial rotary 0.25,
/// GQA 2:1, DeltaNet value heads = 2 × key heads, conv kernel 4.
fn tiny_config() -> TextConfig {
    let layer_types: Vec<&str> = (0..8)
        .map(|i| {
            if (i + 1) % 4 == 0 {
                "full_attention"
            } else {
                "linear_attention"
            }
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "vocab_size": 96,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 8,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 12,
        "linear_conv_kernel_dim": 4,
        "rms_norm_eps": 1e-6,
        "layer_types": layer_types,
        "tie_word_embeddings": true,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000.0,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": true
        }
    }))
    .unwrap()
}

fn tensor(rng: &mut StdRng, shape: &[usize], lo: f32, hi: f32) -> HostTensor {
    let n = shape.iter().product();
    HostTensor::new(
        shape.to_vec(),
        (0..n).map(|_| rng.gen_range(lo..hi)).collect(),
    )
}

/// A linear weight `[out, in]` scaled so activations stay O(1).
fn linear(rng: &mut StdRng, out: usize, inp: usize) -> HostTensor {
    let s = (3.0 / inp as f32).sqrt();
    tensor(rng, &[out, inp], -s, s)
}

fn random_weights(cfg: &TextConfig, seed: u64) -> TextWeights {
    let mut rng = StdRng::seed_from_u64(seed);
    let h = cfg.hidden_size;
    let layers = cfg
        .layer_types
        .iter()
        .map(|kind| {
            let mixer = match kind {
                LayerKind::LinearAttention => {
                    let qkv = cfg.linear_qkv_dim();
                    let vw = cfg.linear_num_value_heads * cfg.linear_value_head_dim;
                    let hv = cfg.linear_num_value_heads;
                    let a_log: Vec<f32> =
                        (0..hv).map(|_| rng.gen_range(1.0f32..16.0).ln()).collect();
                    MixerWeights::Linear(DeltaNetWeights {
                        in_proj_qkv: linear(&mut rng, qkv, h),
                        in_proj_z: linear(&mut rng, vw, h),
                        in_proj_b: linear(&mut rng, hv, h),
                        in_proj_a: linear(&mut rng, hv, h),
                        conv1d: tensor(&mut rng, &[qkv, cfg.linear_conv_kernel_dim], -0.5, 0.5),
                        dt_bias: tensor(&mut rng, &[hv], 0.0, 1.0),
                        a_log: HostTensor::new(vec![hv], a_log),
                        norm: tensor(&mut rng, &[cfg.linear_value_head_dim], 0.5, 1.5),
                        out_proj: linear(&mut rng, h, vw),
                    })
                }
                LayerKind::FullAttention => {
                    let (hq, hk, d) = (
                        cfg.num_attention_heads,
                        cfg.num_key_value_heads,
                        cfg.head_dim,
                    );
                    MixerWeights::Full(AttentionWeights {
                        q_proj: linear(&mut rng, 2 * hq * d, h),
                        k_proj: linear(&mut rng, hk * d, h),
                        v_proj: linear(&mut rng, hk * d, h),
                        o_proj: linear(&mut rng, h, hq * d),
                        q_norm: tensor(&mut rng, &[d], -0.2, 0.2),
                        k_norm: tensor(&mut rng, &[d], -0.2, 0.2),
                    })
                }
            };
            LayerWeights {
                input_layernorm: tensor(&mut rng, &[h], -0.2, 0.2),
                post_attention_layernorm: tensor(&mut rng, &[h], -0.2, 0.2),
                mixer,
                mlp: MlpWeights {
                    gate_proj: linear(&mut rng, cfg.intermediate_size, h),
                    up_proj: linear(&mut rng, cfg.intermediate_size, h),
                    down_proj: linear(&mut rng, h, cfg.intermediate_size),
                },
            }
        })
        .collect();
    TextWeights {
        embed_tokens: tensor(&mut rng, &[cfg.vocab_size, h], -1.0, 1.0),
        norm: tensor(&mut rng, &[h], -0.2, 0.2),
        layers,
    }
}

fn random_ids(rng: &mut StdRng, len: usize, vocab: usize) -> Vec<u32> {
    (0..len).map(|_| rng.gen_range(0..vocab as u32)).collect()
}

const LIMITS: BatchLimits = BatchLimits {
    max_tokens: 300,
    max_seqs: 6,
};

fn model(seed: u64) -> (TextConfig, TextWeights, TextModel<CpuBackend>) {
    let cfg = tiny_config();
    let w = random_weights(&cfg, seed);
    let m = TextModel::new(CpuBackend::new(), &cfg, &w, LIMITS).unwrap();
    (cfg, w, m)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn packed_batch_equals_each_sequence_alone_and_is_finite() {
    let (cfg, _, mut m) = model(1);
    let mut rng = StdRng::seed_from_u64(2);
    // Lengths around the 64-token chunk edge, a single token, and more than two chunks.
    let seqs: Vec<Vec<u32>> = [5usize, 65, 1, 130, 64]
        .iter()
        .map(|&l| random_ids(&mut rng, l, cfg.vocab_size))
        .collect();
    let inputs: Vec<SequenceInput> = seqs.iter().map(|s| SequenceInput::text(s)).collect();
    let packed = m.forward_last(&inputs).unwrap();
    assert_eq!(packed.len(), seqs.len());
    for (i, s) in seqs.iter().enumerate() {
        assert_eq!(packed[i].len(), cfg.hidden_size);
        assert!(
            packed[i].iter().all(|v| v.is_finite()),
            "sequence {i} not finite"
        );
        let alone = m.forward_last(&[SequenceInput::text(s)]).unwrap();
        let err = max_diff(&alone[0], &packed[i]);
        assert!(
            err < 1e-5,
            "sequence {i} (len {}): packed vs alone differ by {err:e}",
            s.len()
        );
    }
    // Distinct prompts give distinct states (the model is not degenerate).
    assert!(max_diff(&packed[0], &packed[1]) > 1e-2);
    // Order inside the batch does not matter either.
    let reversed: Vec<SequenceInput> = inputs.iter().rev().copied().collect();
    let out_rev = m.forward_last(&reversed).unwrap();
    for i in 0..seqs.len() {
        assert!(max_diff(&out_rev[seqs.len() - 1 - i], &packed[i]) < 1e-5);
    }
}

/// `cfg` and `w` with one more layer of `kind` whose output projections (mixer out_proj / o_proj
/// and MLP down) are zero: it adds nothing to the residual stream.
fn with_inert_layer(
    cfg: &TextConfig,
    w: &TextWeights,
    kind: LayerKind,
) -> (TextConfig, TextWeights) {
    let mut cfg = cfg.clone();
    cfg.num_hidden_layers += 1;
    cfg.layer_types.push(kind);
    let mut extra = random_weights(&cfg, 99).layers.pop().unwrap();
    let out = match &mut extra.mixer {
        MixerWeights::Linear(d) => &mut d.out_proj,
        MixerWeights::Full(a) => &mut a.o_proj,
    };
    out.data.iter_mut().for_each(|x| *x = 0.0);
    extra.mlp.down_proj.data.iter_mut().for_each(|x| *x = 0.0);
    let mut w = w.clone();
    w.layers.push(extra);
    (cfg, w)
}

/// Past its mixer the last layer runs on one row per sequence: an attention mixer computes only
/// those rows, a DeltaNet mixer's rows are gathered. Appending an inert layer moves the last real
/// layer onto the every-row path without changing what the model computes, so a model must answer
/// exactly as it does with an inert layer after it: for a model ending in attention (its last-row
/// path against the full one) and for one ending in a DeltaNet layer (its gather against the full
/// path).
#[test]
fn the_last_layer_on_last_rows_answers_as_on_every_row() {
    let cfg = tiny_config();
    assert!(matches!(
        cfg.layer_types.last(),
        Some(LayerKind::FullAttention)
    ));
    let w = random_weights(&cfg, 11);
    // The same layers plus a (live) DeltaNet layer at the end.
    let mut cfg_delta = cfg.clone();
    cfg_delta.num_hidden_layers += 1;
    cfg_delta.layer_types.push(LayerKind::LinearAttention);
    let mut w_delta = w.clone();
    w_delta
        .layers
        .push(random_weights(&cfg_delta, 12).layers.pop().unwrap());
    let mut rng = StdRng::seed_from_u64(13);
    let seqs: Vec<Vec<u32>> = [1usize, 65, 7]
        .iter()
        .map(|&l| random_ids(&mut rng, l, cfg.vocab_size))
        .collect();
    let inputs: Vec<SequenceInput> = seqs.iter().map(|s| SequenceInput::text(s)).collect();
    for (name, cfg, w, inert) in [
        ("ending in attention", &cfg, &w, LayerKind::LinearAttention),
        (
            "ending in DeltaNet",
            &cfg_delta,
            &w_delta,
            LayerKind::FullAttention,
        ),
    ] {
        let (cfg_more, w_more) = with_inert_layer(cfg, w, inert);
        let mut last_rows = TextModel::new(CpuBackend::new(), cfg, w, LIMITS).unwrap();
        let mut every_row = TextModel::new(CpuBackend::new(), &cfg_more, &w_more, LIMITS).unwrap();
        let a = last_rows.forward_last(&inputs).unwrap();
        let b = every_row.forward_last(&inputs).unwrap();
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            let err = max_diff(x, y);
            assert!(err < 1e-6, "{name}, sequence {i}: differs by {err:e}");
            assert!(
                x.iter().any(|v| v.abs() > 1e-3),
                "{name}, sequence {i}: degenerate"
            );
        }
    }
    // The DeltaNet layer is live: the two models' answers differ.
    let mut m = TextModel::new(CpuBackend::new(), &cfg, &w, LIMITS).unwrap();
    let mut m_delta = TextModel::new(CpuBackend::new(), &cfg_delta, &w_delta, LIMITS).unwrap();
    let (a, b) = (
        m.forward_last(&inputs).unwrap(),
        m_delta.forward_last(&inputs).unwrap(),
    );
    assert!(max_diff(&a[1], &b[1]) > 1e-2);
}

#[test]
fn every_token_and_both_mixers_reach_the_last_position() {
    let (cfg, _, mut m) = model(3);
    let mut rng = StdRng::seed_from_u64(4);
    let base = random_ids(&mut rng, 90, cfg.vocab_size);
    let reference = m.forward_last(&[SequenceInput::text(&base)]).unwrap();
    for pos in [0usize, 40, 89] {
        let mut changed = base.clone();
        changed[pos] = (changed[pos] + 1) % cfg.vocab_size as u32;
        let out = m.forward_last(&[SequenceInput::text(&changed)]).unwrap();
        assert!(
            max_diff(&out[0], &reference[0]) > 1e-6,
            "token {pos} has no effect"
        );
    }
    // Explicit text positions (p, p, p) are the default.
    let positions: Vec<[u32; 3]> = (0..90).map(|p| [p, p, p]).collect();
    let explicit = m
        .forward_last(&[SequenceInput {
            token_ids: &base,
            positions: Some(&positions),
        }])
        .unwrap();
    assert_eq!(explicit, reference);
    // Positions drive the attention layers: shifting them changes the result.
    let shifted: Vec<[u32; 3]> = (0..90).map(|p| [p * 5, p * 5, p * 5]).collect();
    let moved = m
        .forward_last(&[SequenceInput {
            token_ids: &base,
            positions: Some(&shifted),
        }])
        .unwrap();
    assert!(max_diff(&moved[0], &reference[0]) > 1e-6);
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let (cfg, w, mut m) = model(5);
    let ok = [1u32, 2, 3];
    assert!(m.forward_last(&[]).is_err());
    assert!(m.forward_last(&[SequenceInput::text(&[])]).is_err());
    assert!(m
        .forward_last(&[SequenceInput::text(&[cfg.vocab_size as u32])])
        .is_err());
    let long = vec![1u32; LIMITS.max_tokens + 1];
    assert!(m.forward_last(&[SequenceInput::text(&long)]).is_err());
    let many = vec![SequenceInput::text(&ok); LIMITS.max_seqs + 1];
    assert!(m.forward_last(&many).is_err());
    let short_pos = [[0u32; 3]; 2];
    assert!(m
        .forward_last(&[SequenceInput {
            token_ids: &ok,
            positions: Some(&short_pos)
        }])
        .is_err());
    // The model still works after rejected batches.
    assert!(m.forward_last(&[SequenceInput::text(&ok)]).is_ok());

    let mut bad = w.clone();
    bad.layers[3].mlp.up_proj = HostTensor::new(vec![1, 1], vec![0.0]);
    assert!(TextModel::new(CpuBackend::new(), &cfg, &bad, LIMITS).is_err());
    let mut swapped = w.clone();
    swapped.layers.swap(2, 3);
    assert!(TextModel::new(CpuBackend::new(), &cfg, &swapped, LIMITS).is_err());
}

#[test]
fn readout_gives_probabilities_over_offered_letters() {
    let (cfg, w, mut m) = model(7);
    let mut rng = StdRng::seed_from_u64(8);
    let readout = LetterReadout::from_embedding(&w.embed_tokens, &QWEN_LETTER_TOKEN_IDS).unwrap();
    let seqs: Vec<Vec<u32>> = (0..3)
        .map(|i| random_ids(&mut rng, 20 + 7 * i, cfg.vocab_size))
        .collect();
    let inputs: Vec<SequenceInput> = seqs.iter().map(|s| SequenceInput::text(s)).collect();
    let hidden = m.forward_last(&inputs).unwrap();
    for h in &hidden {
        for n in [1usize, 2, 5, 26] {
            let d = readout.decide(h, n).unwrap();
            assert_eq!(d.probabilities.len(), n);
            let sum: f64 = d.probabilities.iter().map(|&p| p as f64).sum();
            assert!((sum - 1.0).abs() < 1e-6, "n {n}: sum {sum}");
            assert!(d.probabilities.iter().all(|&p| (0.0..=1.0).contains(&p)));
            let max = d.probabilities.iter().cloned().fold(0.0f32, f32::max);
            assert_eq!(d.probabilities[d.choice], max);
            assert!((0.0..=1.0).contains(&d.confidence));
            // Probabilities follow the dot products with the letter rows.
            let logits = readout.logits(h, n).unwrap();
            for (i, logit) in logits.iter().enumerate() {
                let row = &w.embed_tokens.data[(32 + i) * cfg.hidden_size..][..cfg.hidden_size];
                let direct: f64 = row.iter().zip(h).map(|(&a, &b)| a as f64 * b as f64).sum();
                assert!((logit - direct).abs() < 1e-9);
            }
        }
        assert_eq!(readout.decide(h, 1).unwrap().probabilities, vec![1.0]);
    }
    assert!(readout.decide(&hidden[0], 27).is_err());
}

#[test]
fn warm_shapes_runs_the_limit_then_every_power_of_two_bucket_and_changes_no_answer() {
    let (cfg, _, mut m) = model(5);
    let mut rng = StdRng::seed_from_u64(6);
    let ids = random_ids(&mut rng, 70, cfg.vocab_size);
    let before = m.forward_last(&[SequenceInput::text(&ids)]).unwrap();
    let rows = m.warm_shapes().unwrap();
    // The limit first (it sizes every buffer); the CPU warms every bucket.
    assert_eq!(rows, [LIMITS.max_tokens, 1, 2, 4, 8, 16, 32, 64, 128, 256]);
    let after = m.forward_last(&[SequenceInput::text(&ids)]).unwrap();
    assert_eq!(before, after, "warming left state behind");
}

/// A plain pass padded to the shape a CUDA graph is captured at (more rows, in no sequence, and
/// empty sequences after the real ones) answers exactly as the pass at its own shape, whatever
/// the padding rows hold from earlier batches.
#[test]
fn a_pass_padded_to_a_captured_shape_answers_as_unpadded() {
    let cfg = tiny_config();
    let w = random_weights(&cfg, 5);
    let limits = BatchLimits::new(512, 8);
    let mut own = TextModel::new(CpuBackend::new(), &cfg, &w, limits).unwrap();
    let mut padded = TextModel::new(CpuBackend::padding_passes(), &cfg, &w, limits).unwrap();
    let mut rng = StdRng::seed_from_u64(6);
    // A long batch first leaves its rows in the buffers the padded passes then run over.
    let batches: [&[usize]; 6] = [
        &[200, 190],
        &[1],
        &[5, 65, 1],
        &[130, 64, 7, 9, 2],
        &[139],
        &[17],
    ];
    for lens in batches {
        let seqs: Vec<Vec<u32>> = lens
            .iter()
            .map(|&l| random_ids(&mut rng, l, cfg.vocab_size))
            .collect();
        let inputs: Vec<SequenceInput> = seqs.iter().map(|s| SequenceInput::text(s)).collect();
        let rows: usize = lens.iter().sum();
        let shape = padded.backend().pass_shape(rows, lens.len()).unwrap();
        assert!(shape.rows > rows, "{lens:?} pads its rows ({shape:?})");
        let want = own.forward_last(&inputs).unwrap();
        let got = padded.forward_last(&inputs).unwrap();
        assert_eq!(got.len(), lens.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "batch {lens:?}, sequence {i}: padded to {shape:?}");
        }
    }
}
