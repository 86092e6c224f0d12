//! The tiny Qwen3.5 checkpoint of `model/assets/tiny` run through our loader, adapter merge, CPU
//! forward pass and readout, against transformers' fp32 goldens (`tools/reference/goldens.py`):
//! final hidden states within 1e-4 relative, letter probabilities within 1e-5.

use std::path::PathBuf;

use instinct_kernels::CpuBackend;
use instinct_model::checkpoint::Snapshot;
use instinct_model::forward::{BatchLimits, SequenceInput, TextModel};
use instinct_model::lora::LoraAdapter;
use instinct_model::readout::LetterReadout;
use serde_json::Value;

fn tiny_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/tiny")
}

fn goldens() -> Value {
    let text = std::fs::read_to_string(tiny_dir().join("goldens.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

struct Loaded {
    model: TextModel<CpuBackend>,
    readout: LetterReadout,
}

fn load(with_adapter: bool, letter_ids: &[u32]) -> Loaded {
    let snap = Snapshot::open(tiny_dir()).unwrap();
    let mut weights = snap.load_text_weights().unwrap();
    if with_adapter {
        let adapter = LoraAdapter::open(tiny_dir().join("adapter-text")).unwrap();
        let report = adapter.merge_into_text_only(&mut weights).unwrap();
        assert_eq!(
            report.merged.len(),
            32,
            "the text adapter targets 32 modules"
        );
    }
    let readout = LetterReadout::from_embedding(&weights.embed_tokens, letter_ids).unwrap();
    let limits = BatchLimits {
        max_tokens: 1024,
        max_seqs: 8,
    };
    let model = TextModel::new(CpuBackend::new(), &snap.config().text, &weights, limits).unwrap();
    Loaded { model, readout }
}

/// Checks every golden case, each run alone and all of them packed in one batch.
fn check(variant: &str, with_adapter: bool) {
    let g = goldens();
    let letter_ids: Vec<u32> = floats(&g["letter_ids"]).iter().map(|&x| x as u32).collect();
    let mut loaded = load(with_adapter, &letter_ids);
    let cases = g["cases"].as_array().unwrap();
    let ids: Vec<Vec<u32>> = cases
        .iter()
        .map(|c| floats(&c["input_ids"]).iter().map(|&x| x as u32).collect())
        .collect();
    let packed_inputs: Vec<SequenceInput> = ids.iter().map(|i| SequenceInput::text(i)).collect();
    let packed = loaded.model.forward_last(&packed_inputs).unwrap();

    let mut worst_hidden = 0f64;
    let mut worst_prob = 0f64;
    for (i, case) in cases.iter().enumerate() {
        let name = case["name"].as_str().unwrap();
        let want = &case[variant];
        let alone = loaded
            .model
            .forward_last(&[SequenceInput::text(&ids[i])])
            .unwrap();
        for (label, h) in [("alone", &alone[0]), ("packed", &packed[i])] {
            let want_h = floats(&want["final_hidden"]);
            assert_eq!(h.len(), want_h.len());
            let scale = want_h.iter().map(|x| x.abs()).fold(0.0, f64::max);
            let err = h
                .iter()
                .zip(&want_h)
                .map(|(&a, &b)| (f64::from(a) - b).abs())
                .fold(0.0, f64::max);
            worst_hidden = worst_hidden.max(err / scale);
            assert!(
                err <= 1e-4 * scale,
                "{variant}/{name} ({label}): hidden max error {err:e} over scale {scale}"
            );
            for n in [26usize, 3] {
                let p = loaded.readout.probabilities(h, n).unwrap();
                let want_p = floats(&want[format!("probs_{n}").as_str()]);
                let perr = p
                    .iter()
                    .zip(&want_p)
                    .map(|(&a, &b)| (f64::from(a) - b).abs())
                    .fold(0.0, f64::max);
                worst_prob = worst_prob.max(perr);
                assert!(
                    perr <= 1e-5,
                    "{variant}/{name} ({label}): probs_{n} max error {perr:e}"
                );
            }
        }
    }
    eprintln!(
        "{variant}: {} cases, worst hidden error {worst_hidden:e} (relative to max |h|), worst probability error {worst_prob:e}",
        cases.len()
    );
}

#[test]
fn base_model_matches_transformers_fp32() {
    check("base", false);
}

#[test]
fn text_adapter_merged_matches_peft_fp32() {
    check("text_adapter", true);
}
