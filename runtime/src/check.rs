//! `instinct check`: runs a fixed corpus of questions through the model on a chosen device and
//! compares the answers with transformers' fp32 and bf16 references (`tools/reference/
//! real_goldens.py`), under the DESIGN.md rule: max |p − p_fp32| ≤ 2 × max |p_bf16 − p_fp32| +
//! 0.01, and the fp32 choice kept wherever its top-two margin is ≥ 0.05.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use instinct_kernels::{Backend, CpuBackend};
use instinct_model::decider::{load_text, Prompt};
use instinct_model::forward::BatchLimits;
use instinct_model::readout::first_argmax;
use instinct_model::source::Device;
use serde::Deserialize;
use serde_json::json;

use instinct_kernels::cuda::{CudaBackend, CudaOptions};

/// Options of `instinct check`.
#[derive(Args, Debug)]
pub struct CheckArgs {
    /// Snapshot directory.
    #[arg(long)]
    pub model: PathBuf,
    /// Text adapter merged at load.
    #[arg(long)]
    pub text_adapter: Option<PathBuf>,
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// Prompts as token ids: `{"prompts": {name: [ids]}, ...}`.
    #[arg(long)]
    pub corpus: PathBuf,
    /// The references: `{"questions": [{prompt, n_options, p_fp32, p_bf16, margin_fp32}]}`.
    #[arg(long)]
    pub goldens: PathBuf,
    /// Where to write the report (JSON).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Token budget of one forward pass (the longest prompt must fit).
    #[arg(long, default_value_t = 16_384)]
    pub max_tokens: usize,
    /// Skip questions whose prompt is longer than this many tokens (e.g. for a quick run).
    #[arg(long)]
    pub max_ids: Option<usize>,
    /// Captured passes on a GPU (`on` or `off`), as `instinct serve --cuda-graphs`: compare the
    /// two reports' probabilities to see that replayed passes answer as launched.
    #[arg(long, default_value = "on", value_parser = instinct_bench::parse_on_off,
          action = clap::ArgAction::Set)]
    pub cuda_graphs: bool,
}

#[derive(Deserialize)]
struct Corpus {
    prompts: HashMap<String, Vec<u32>>,
}

#[derive(Deserialize)]
struct Goldens {
    questions: Vec<GoldenQuestion>,
}

#[derive(Deserialize)]
struct GoldenQuestion {
    prompt: String,
    n_options: usize,
    p_fp32: Vec<f64>,
    p_bf16: Vec<f64>,
    margin_fp32: f64,
}

/// Runs the check and prints its summary; fails if the rule is not met.
pub fn run(args: &CheckArgs) -> anyhow::Result<()> {
    let ordinal = match args.device {
        Device::Cpu => return check_on(CpuBackend::new(), args),
        Device::Cuda(ordinal) => ordinal,
    };
    let t0 = Instant::now();
    let backend = CudaBackend::new(CudaOptions {
        ordinal,
        cuda_graphs: args.cuda_graphs,
        ..CudaOptions::default()
    })?;
    eprintln!(
        "cuda backend started (kernels compiled or loaded) in {:.2?}",
        t0.elapsed()
    );
    let graphs = backend.graph_probe();
    check_on(backend, args)?;
    if let Some(graphs) = graphs {
        let s = graphs.stats();
        let replays: u64 = s.replays.iter().map(|r| r.1).sum();
        eprintln!(
            "captured passes: {} shapes captured, {replays} replays, {} passes as launched, {} \
             failed{}",
            s.captures,
            s.misses,
            s.failed,
            s.last_failure
                .map(|w| format!(" (last: {w})"))
                .unwrap_or_default()
        );
    }
    Ok(())
}

fn check_on<B: Backend>(backend: B, args: &CheckArgs) -> anyhow::Result<()> {
    let corpus: Corpus = serde_json::from_slice(&std::fs::read(&args.corpus)?)
        .with_context(|| format!("reading {}", args.corpus.display()))?;
    let goldens: Goldens = serde_json::from_slice(&std::fs::read(&args.goldens)?)
        .with_context(|| format!("reading {}", args.goldens.display()))?;
    let limits = BatchLimits {
        max_tokens: args.max_tokens,
        max_seqs: 1,
    };
    let t0 = Instant::now();
    let mut loaded = load_text(backend, &args.model, args.text_adapter.as_deref(), limits)?;
    let load_s = t0.elapsed().as_secs_f64();
    eprintln!("loaded in {load_s:.1} s");

    let mut rows = Vec::new();
    let (mut worst, mut worst_bf16) = (0f64, 0f64);
    let mut choice_checked = 0;
    let mut choice_kept = 0;
    let mut latency_ms: HashMap<usize, Vec<f64>> = HashMap::new();
    for q in &goldens.questions {
        let ids = corpus
            .prompts
            .get(&q.prompt)
            .with_context(|| format!("prompt {} is not in the corpus", q.prompt))?;
        if args.max_ids.is_some_and(|max| ids.len() > max) {
            continue;
        }
        let t = Instant::now();
        let p = loaded
            .decider
            .decide(&[Prompt::text(ids, q.n_options)])?
            .pop()
            .context("no answer")?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        eprintln!(
            "{} ({} ids, {} options): {ms:.1} ms",
            q.prompt,
            ids.len(),
            q.n_options
        );
        latency_ms.entry(ids.len()).or_default().push(ms);
        let err = p
            .iter()
            .zip(&q.p_fp32)
            .map(|(&a, &b)| (f64::from(a) - b).abs())
            .fold(0.0, f64::max);
        let err_bf16 = q
            .p_bf16
            .iter()
            .zip(&q.p_fp32)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        worst = worst.max(err);
        worst_bf16 = worst_bf16.max(err_bf16);
        let ours = first_argmax(&p);
        let reference = q
            .p_fp32
            .iter()
            .enumerate()
            .fold(0, |b, (i, &x)| if x > q.p_fp32[b] { i } else { b });
        if q.margin_fp32 >= 0.05 {
            choice_checked += 1;
            choice_kept += usize::from(ours == reference);
        }
        rows.push(json!({
            "prompt": q.prompt, "ids": ids.len(), "n_options": q.n_options,
            "max_abs_diff": err, "bf16_max_abs_diff": err_bf16,
            "choice": ours, "choice_fp32": reference, "margin_fp32": q.margin_fp32,
            "ms": ms, "p": p,
        }));
    }
    let allowance = 2.0 * worst_bf16 + 0.01;
    let passed = worst <= allowance && choice_kept == choice_checked;
    let mut by_length: Vec<_> = latency_ms.into_iter().collect();
    by_length.sort_by_key(|(len, _)| *len);
    let latency: Vec<_> = by_length
        .iter()
        .map(|(len, v)| {
            let mut v = v.clone();
            v.sort_by(f64::total_cmp);
            json!({"ids": len, "runs": v.len(), "min_ms": v[0], "median_ms": v[v.len() / 2]})
        })
        .collect();
    let report = json!({
        "device": args.device.to_string(),
        "cuda_graphs": args.cuda_graphs,
        "model": args.model,
        "load_seconds": load_s,
        "questions": rows.len(),
        "max_abs_diff": worst,
        "bf16_reference_max_abs_diff": worst_bf16,
        "allowance": allowance,
        "choices_checked_margin_ge_0.05": choice_checked,
        "choices_kept": choice_kept,
        "passed": passed,
        "latency_by_length": latency,
        "rows": rows,
    });
    println!(
        "{} questions on {}: max |p - p_fp32| = {worst:.5} (allowance {allowance:.5} = 2 x {worst_bf16:.5} + 0.01); \
         choice kept on {choice_kept}/{choice_checked} questions with margin >= 0.05: {}",
        rows.len(),
        args.device,
        if passed { "PASS" } else { "FAIL" }
    );
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_vec_pretty(&report)?)?;
    }
    if !passed {
        bail!("the agreement rule is not met");
    }
    Ok(())
}
