//! One invocation: validate the flags, build the workload, run every level, write the reports.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

use crate::cli::{Args, ArrivalKind};
use crate::client::Client;
use crate::prometheus::{self, HistogramSnapshot};
use crate::report::{render_text, LevelReport, Report, ServerMetrics, WorkloadInfo};
use crate::runner::{run_measured, warm_up, LoadMode, RunLimits};
use crate::samples::SampleWriter;
use crate::schedule::Arrival;
use crate::target::Target;
use crate::workload::synthetic::{self, ScreenshotMix, SyntheticConfig};
use crate::workload::{fixtures, Workload};

/// Runs the load test described by `args`, writes `--json`, `--samples` and `--svg-dir` outputs, and returns
/// the report (the binary prints its text form).
pub async fn run(args: &Args) -> Result<Report> {
    let target = Target::parse(&args.target).await?;
    let modes = load_modes(args)?;
    if args.requests == 0 {
        bail!("--requests must be at least 1");
    }
    if !(args.duration.is_finite() && args.duration > 0.0) {
        bail!("--duration must be a positive number of seconds");
    }
    if args.timeout_ms == 0 {
        bail!("--timeout-ms must be at least 1");
    }
    if args.slo_ms.is_some_and(|s| !(s.is_finite() && s > 0.0)) {
        bail!("--slo-ms must be a positive number");
    }
    let workload = Arc::new(build_workload(args)?);
    let limits = RunLimits {
        max_requests: args.requests,
        duration: Duration::from_secs_f64(args.duration),
        timeout: Duration::from_millis(args.timeout_ms),
        max_in_flight: args.max_in_flight,
        warmup: args.warmup,
        seed: args.seed,
    };
    let client = Client::new(target.clone(), limits.timeout);
    let mut samples = args
        .samples
        .as_deref()
        .map(SampleWriter::create)
        .transpose()?;
    let slo = args.slo_ms.map(|ms| Duration::from_secs_f64(ms / 1000.0));

    let mut levels = Vec::with_capacity(modes.len());
    // The run goes through the bodies in order, warm-ups and levels alike, so no body is sent
    // twice before all were sent once (screenshots stay new to the server's image cache).
    let mut next_body = 0u64;
    for (i, mode) in modes.iter().enumerate() {
        let progress = progress_bar(args.quiet, i, modes.len(), mode);
        // Warm-ups go before the first scrape, so they are in neither side of the report.
        let (warmup_sent, warmup_ok) =
            warm_up(&client, &workload, next_body, limits.warmup).await?;
        next_body += warmup_sent;
        let before = scrape(&client, args.no_metrics).await;
        let mut run =
            run_measured(&client, &workload, next_body, *mode, &limits, &progress).await?;
        next_body += run.sent();
        run.warmup_sent = warmup_sent;
        run.warmup_ok = warmup_ok;
        progress.finish_and_clear();
        let after = scrape(&client, args.no_metrics).await;
        let server_metrics = match (before, after) {
            (Ok(b), Ok(a)) => ServerMetrics {
                available: true,
                error: None,
                phases: prometheus::phase_deltas(&b, &a),
            },
            (Err(e), _) | (_, Err(e)) => ServerMetrics {
                available: false,
                error: Some(format!("{e:#}")),
                phases: Default::default(),
            },
        };
        if let Some(samples) = &mut samples {
            samples.write_level(i, &run.records)?;
        }
        levels.push(LevelReport::from_run(&run, slo, server_metrics));
    }

    let report = Report {
        tool: "instinct-loadtest",
        version: env!("CARGO_PKG_VERSION"),
        target: target.base_url(),
        mode: if args.rate.is_empty() {
            "closed"
        } else {
            "open"
        },
        workload: WorkloadInfo::new(&workload),
        slo_ms: args.slo_ms,
        max_requests: args.requests,
        duration_limit_s: args.duration,
        timeout_ms: args.timeout_ms as f64,
        warmup_requests: args.warmup,
        seed: args.seed,
        levels,
    };
    if let Some(path) = &args.json {
        let file = std::fs::File::create(path)
            .with_context(|| format!("creating the JSON report {}", path.display()))?;
        serde_json::to_writer_pretty(std::io::BufWriter::new(file), &report)
            .with_context(|| format!("writing the JSON report {}", path.display()))?;
    }
    if let Some(dir) = &args.svg_dir {
        crate::svg::write_charts(&report, dir)?;
    }
    Ok(report)
}

/// Runs and returns the text summary (what the binary prints); with `--dump-workload`, writes
/// the bodies instead and sends nothing.
pub async fn run_and_render(args: &Args) -> Result<String> {
    if let Some(path) = &args.dump_workload {
        let workload = build_workload(args)?;
        dump_workload(&workload, path)?;
        return Ok(format!(
            "wrote {} request bodies ({}) to {}\n",
            workload.requests.len(),
            workload.description,
            path.display()
        ));
    }
    Ok(render_text(&run(args).await?))
}

/// Writes one JSON line per distinct body: `{label, kind, questions, approx_prompt_tokens, body}`.
pub fn dump_workload(workload: &Workload, path: &std::path::Path) -> Result<()> {
    use std::io::Write;
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for r in &workload.requests {
        let body: serde_json::Value = serde_json::from_slice(&r.body)?;
        let line = serde_json::json!({
            "label": r.label,
            "kind": r.kind,
            "questions": r.questions,
            "approx_prompt_tokens": r.approx_prompt_tokens,
            "body": body,
        });
        writeln!(out, "{line}")?;
    }
    out.flush()
        .with_context(|| format!("writing {}", path.display()))
}

fn load_modes(args: &Args) -> Result<Vec<LoadMode>> {
    match (args.rate.is_empty(), args.concurrency.is_empty()) {
        (false, true) => {
            let arrival = match args.arrival {
                ArrivalKind::Constant => Arrival::Constant,
                ArrivalKind::Poisson => Arrival::Poisson,
                ArrivalKind::Gamma => Arrival::Gamma {
                    burstiness: args.burstiness,
                },
            };
            for &rate in &args.rate {
                if !(rate.is_finite() && rate > 0.0) {
                    bail!("--rate values must be positive numbers, got {rate}");
                }
            }
            Ok(args
                .rate
                .iter()
                .map(|&rate| LoadMode::Open { arrival, rate })
                .collect())
        }
        (true, false) => {
            if args.concurrency.contains(&0) {
                bail!("--concurrency values must be at least 1");
            }
            Ok(args
                .concurrency
                .iter()
                .map(|&concurrency| LoadMode::Closed { concurrency })
                .collect())
        }
        _ => bail!("give exactly one of --rate (open loop) or --concurrency (closed loop)"),
    }
}

fn build_workload(args: &Args) -> Result<Workload> {
    if !(0.0..=1.0).contains(&args.screenshot_fraction) {
        bail!(
            "--screenshot-fraction must be 0 to 1, got {}",
            args.screenshot_fraction
        );
    }
    match &args.fixtures {
        Some(path) => {
            if args.options.is_some() || args.prompt_tokens.is_some() {
                bail!("--options and --prompt-tokens apply to the synthetic workload only");
            }
            if args.screenshot_fraction != 0.0 {
                bail!("--screenshot-fraction applies to the synthetic workload only");
            }
            fixtures::load(
                path,
                args.fixture_format,
                args.questions.unwrap_or(1),
                &args.model,
            )
        }
        None => synthetic::generate(&SyntheticConfig {
            seed: args.seed,
            count: args.synthetic_count,
            prompt_tokens: args.prompt_tokens,
            options: args.options,
            questions: args.questions,
            goal_less: args.goal_less,
            model: args.model.clone(),
            screenshots: ScreenshotMix {
                fraction: args.screenshot_fraction,
                size: args.screenshot_size,
                questions: args.screenshot_questions,
            },
        }),
    }
}

async fn scrape(client: &Client, disabled: bool) -> Result<HashMap<String, HistogramSnapshot>> {
    if disabled {
        bail!("disabled by --no-metrics");
    }
    Ok(prometheus::parse(&client.scrape_metrics().await?))
}

fn progress_bar(quiet: bool, index: usize, levels: usize, mode: &LoadMode) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(0);
    let style = ProgressStyle::with_template(
        "{msg} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec})",
    )
    .expect("the template is valid");
    bar.set_style(style);
    let load = match mode {
        LoadMode::Open { rate, .. } => format!("{rate} req/s"),
        LoadMode::Closed { concurrency } => format!("c={concurrency}"),
    };
    bar.set_message(format!("level {}/{levels} {load}", index + 1));
    bar
}
