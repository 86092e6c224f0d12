//! The text forward pass on a tiny random model with the real layer pattern: packing, finiteness,
//! input checks, and the letter readout on top.

use instinct_kernels::CpuBackend;
use instinct_model::config::TextConfig;
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
                instinct_model::config::LayerKind::LinearAttention => {
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
                instinct_model::config::LayerKind::FullAttention => {
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
fn warm_shapes_runs_every_power_of_two_bucket_then_the_limit_and_changes_no_answer() {
    let (cfg, _, mut m) = model(5);
    let mut rng = StdRng::seed_from_u64(6);
    let ids = random_ids(&mut rng, 70, cfg.vocab_size);
    let before = m.forward_last(&[SequenceInput::text(&ids)]).unwrap();
    let rows = m.warm_shapes().unwrap();
    assert_eq!(rows, [1, 2, 4, 8, 16, 32, 64, 128, 256, LIMITS.max_tokens]);
    let after = m.forward_last(&[SequenceInput::text(&ids)]).unwrap();
    assert_eq!(before, after, "warming left state behind");
}
