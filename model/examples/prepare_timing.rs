//! Times request preparation per question, single-threaded: the chat template render and the
//! tokenization of each of the 60 real fixture questions (their user messages, cut out of the
//! fixtures' `chat`), with the built-in rendering and with a Jinja template (the one the
//! real-shape and tiny checkpoints ship, `model/assets/tiny/chat_template.jinja`).
//!
//! `cargo run -p instinct-model --release --example prepare_timing [-- ROUNDS]`
//! (vocabulary from `tools/fetch-qwen-vocab.sh`, fixtures from `../shared/fixtures`;
//! `tools/reference/prepare_bench.sh` runs it with the host and revision).
//!
//! Per question, the fastest of `ROUNDS` rounds (on a shared machine, the least disturbed) of
//! render, tokenize and their sum; then the median and p90 over the 60 questions, of the time per
//! question and of the time per 1,000 ids. "warm" reuses one tokenizer (its piece cache filled by
//! an untimed first pass); "cold" is a fresh tokenizer's first pass over the 60 questions, the
//! fastest of up to 7 fresh tokenizers. Tokenizing is timed two ways: "whole" (`Tokenizer::encode`
//! of the chat) and "prefix" (`encode_with_prefix`, the system turn's ids cached, as the server's
//! `Preparer` does).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{anyhow, ensure, Context, Result};
use instinct_model::chat::ChatTemplate;
use instinct_model::prompt::SYSTEM_PROMPT;
use instinct_model::tokenizer::{build_qwen35_tokenizer, EncodedPrefix, Tokenizer};

struct Question {
    user: String,
    ids: Vec<u32>,
}

/// Per question, in µs: render, tokenize.
type Times = Vec<(f64, f64)>;

fn main() -> Result<()> {
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|r| r.parse())
        .transpose()?
        .unwrap_or(41)
        .max(1);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let vocab = instinct_model::checkout::qwen_vocab(&root)?;
    let fixtures = instinct_model::checkout::text_fixtures(&root);
    let tokenizer = Tokenizer::new(build_qwen35_tokenizer(&vocab)?)?;
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&fixtures).with_context(|| fixtures.display().to_string())?,
    )?;
    let head = format!("<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n");
    let tail = "<|im_end|>\n<|im_start|>assistant\n<think>\n";
    let questions: Vec<Question> = json["fixtures"]
        .as_array()
        .ok_or_else(|| anyhow!("no fixtures"))?
        .iter()
        .map(|f| {
            let chat = f["chat"].as_str().unwrap_or_default();
            let user = chat
                .strip_prefix(&head)
                .and_then(|c| c.strip_suffix(tail))
                .ok_or_else(|| anyhow!("fixture {} is not a Cua-S1 chat", f["id"]))?;
            let ids = serde_json::from_value(f["input_ids"].clone())?;
            Ok(Question {
                user: user.to_string(),
                ids,
            })
        })
        .collect::<Result<_>>()?;
    let jinja = ChatTemplate::from_jinja(include_str!("../assets/tiny/chat_template.jinja"))?;
    let builtin = ChatTemplate::builtin();
    for (name, chat) in [("builtin", &builtin), ("jinja", &jinja)] {
        let prefix = tokenizer.encode_prefix(&chat.fixed_prefix(SYSTEM_PROMPT)?)?;
        ensure!(!prefix.ids().is_empty(), "{name}: no prefix to cache");
        for q in &questions {
            let rendered = chat.render(SYSTEM_PROMPT, &q.user)?;
            ensure!(
                tokenizer.encode(&rendered)? == q.ids
                    && tokenizer.encode_with_prefix(&prefix, &rendered)? == q.ids,
                "{name}: the ids differ from the fixture's"
            );
        }
    }

    println!(
        "{} questions, {} ids, {rounds} rounds",
        questions.len(),
        questions.iter().map(|q| q.ids.len()).sum::<usize>()
    );
    println!(
        "template\tcache\tpath\trender_us\ttokenize_us\tquestion_us p50\tp90\tper_1k_ids_us p50\tp90"
    );
    for (name, chat) in [("builtin", &builtin), ("jinja", &jinja)] {
        let prefix = tokenizer.encode_prefix(&chat.fixed_prefix(SYSTEM_PROMPT)?)?;
        for (path, prefix) in [("whole", None), ("prefix", Some(&prefix))] {
            time_all(chat, &tokenizer, prefix, &questions)?;
            let warm: Vec<Times> = (0..rounds)
                .map(|_| time_all(chat, &tokenizer, prefix, &questions))
                .collect::<Result<_>>()?;
            report(&format!("{name}\twarm\t{path}"), &questions, &warm);
            let cold: Vec<Times> = (0..rounds.min(7))
                .map(|_| {
                    let fresh = Tokenizer::new(tokenizer.inner().clone())?;
                    time_all(chat, &fresh, prefix, &questions)
                })
                .collect::<Result<_>>()?;
            report(&format!("{name}\tcold\t{path}"), &questions, &cold);
        }
    }
    Ok(())
}

fn time_all(
    chat: &ChatTemplate,
    tokenizer: &Tokenizer,
    prefix: Option<&EncodedPrefix>,
    questions: &[Question],
) -> Result<Times> {
    questions
        .iter()
        .map(|q| {
            let t0 = Instant::now();
            let rendered = chat.render(SYSTEM_PROMPT, &q.user)?;
            let t1 = Instant::now();
            let ids = match prefix {
                Some(prefix) => tokenizer.encode_with_prefix(prefix, &rendered)?,
                None => tokenizer.encode(&rendered)?,
            };
            let t2 = Instant::now();
            std::hint::black_box(ids);
            Ok(((t1 - t0).as_secs_f64() * 1e6, (t2 - t1).as_secs_f64() * 1e6))
        })
        .collect()
}

fn min(v: Vec<f64>) -> f64 {
    v.into_iter().fold(f64::INFINITY, f64::min)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The value below which 90% of `v` lie (nearest rank).
fn p90(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() * 9).div_ceil(10) - 1]
}

fn report(label: &str, questions: &[Question], rounds: &[Times]) {
    // Per question, the fastest round of each stage.
    let per_question: Vec<(f64, f64, f64)> = (0..questions.len())
        .map(|i| {
            let render = min(rounds.iter().map(|r| r[i].0).collect());
            let tokenize = min(rounds.iter().map(|r| r[i].1).collect());
            let total = min(rounds.iter().map(|r| r[i].0 + r[i].1).collect());
            (render, tokenize, total)
        })
        .collect();
    let totals: Vec<f64> = per_question.iter().map(|t| t.2).collect();
    let per_1k: Vec<f64> = per_question
        .iter()
        .zip(questions)
        .map(|(t, q)| t.2 * 1000.0 / q.ids.len() as f64)
        .collect();
    println!(
        "{label}\t{:.1}\t{:.1}\t{:.1}\t{:.1}\t{:.1}\t{:.1}",
        median(per_question.iter().map(|t| t.0).collect()),
        median(per_question.iter().map(|t| t.1).collect()),
        median(totals.clone()),
        p90(totals),
        median(per_1k.clone()),
        p90(per_1k),
    );
}
