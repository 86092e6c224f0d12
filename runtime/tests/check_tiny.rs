//! `instinct check` on the CPU with the tiny checkpoint's transformers goldens: the same command
//! that checks the CUDA backend on the real shapes.

use instinct::check::{run, CheckArgs};
use serde_json::{json, Value};

#[test]
fn check_passes_on_the_tiny_goldens_and_writes_its_report() {
    let assets = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/assets/tiny");
    let goldens: Value =
        serde_json::from_slice(&std::fs::read(assets.join("goldens.json")).unwrap()).unwrap();
    let mut prompts = serde_json::Map::new();
    let mut questions = Vec::new();
    for case in goldens["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        prompts.insert(name.into(), case["input_ids"].clone());
        let adapter = &case["text_adapter"];
        for n in [26, 3] {
            let p = adapter[format!("probs_{n}").as_str()].clone();
            questions.push(json!({
                "prompt": name, "n_options": n, "p_fp32": p, "p_bf16": p,
                "margin_fp32": adapter[format!("margin_{n}").as_str()],
            }));
        }
    }
    let dir = std::env::temp_dir().join(format!("instinct-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let corpus = dir.join("corpus.json");
    let golden = dir.join("goldens.json");
    let out = dir.join("report.json");
    std::fs::write(&corpus, json!({ "prompts": prompts }).to_string()).unwrap();
    std::fs::write(&golden, json!({ "questions": questions }).to_string()).unwrap();
    let args = CheckArgs {
        model: assets.clone(),
        text_adapter: Some(assets.join("adapter-text")),
        device: instinct_model::source::Device::Cpu,
        corpus,
        goldens: golden.clone(),
        out: Some(out.clone()),
        max_tokens: 1024,
        max_ids: None,
        cuda_graphs: false,
    };
    run(&args).unwrap();
    let report: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert_eq!(report["passed"], true);
    assert_eq!(report["questions"], 14);
    assert!(report["max_abs_diff"].as_f64().unwrap() < 1e-5);

    // A wrong reference fails the rule.
    questions[0]["p_fp32"][0] = json!(0.9);
    questions[0]["p_bf16"][0] = json!(0.9);
    std::fs::write(&golden, json!({ "questions": questions }).to_string()).unwrap();
    assert!(run(&args).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}
