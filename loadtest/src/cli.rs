//! Command-line flags (every flag can also be set by an `INSTINCT_LOADTEST_*` variable).

use std::path::PathBuf;

use clap::{ArgGroup, Parser, ValueEnum};

use crate::workload::fixtures::FixtureFormat;
use crate::workload::screenshot::{QuestionRange, ScreenshotSize};
use crate::workload::DEFAULT_MODEL;

/// Load generator for the instinct server: open- or closed-loop load on `POST /v1/systemone`,
/// latency percentiles, throughput, goodput, server phase breakdown, JSON and SVG reports.
#[derive(Debug, Clone, Parser)]
#[command(name = "instinct-loadtest", version)]
#[command(group(
    ArgGroup::new("load")
        .required(true)
        .args(["rate", "concurrency", "dump_workload"])
))]
pub struct Args {
    /// Base URL of the server. Only loopback targets are accepted (127.0.0.0/8, ::1, localhost).
    #[arg(
        long,
        env = "INSTINCT_LOADTEST_TARGET",
        default_value = "http://127.0.0.1:8000"
    )]
    pub target: String,

    // ---- workload ----
    /// Use the real Cua-S1 fixtures from this file (cua-s1-4b-0.2-text.json) instead of the
    /// synthetic generator.
    #[arg(long, env = "INSTINCT_LOADTEST_FIXTURES")]
    pub fixtures: Option<PathBuf>,

    /// Wire format of fixture requests.
    #[arg(long, env = "INSTINCT_LOADTEST_FIXTURE_FORMAT", value_enum, default_value_t = FixtureFormat::Native)]
    pub fixture_format: FixtureFormat,

    /// Questions per request (fixtures: copies of the fixture's question; synthetic: fixed
    /// count instead of the mix's 1 to 5).
    #[arg(long, env = "INSTINCT_LOADTEST_QUESTIONS")]
    pub questions: Option<usize>,

    /// Synthetic: fixed number of options per question (1 to 26).
    #[arg(long, env = "INSTINCT_LOADTEST_OPTIONS")]
    pub options: Option<usize>,

    /// Synthetic: fixed prompt length per question, in approximate tokens.
    #[arg(long, env = "INSTINCT_LOADTEST_PROMPT_TOKENS")]
    pub prompt_tokens: Option<usize>,

    /// Synthetic: no question has instructions (the goal line is left out of every prompt), so
    /// a request's questions share their prompt up to the options, as prefix reuse expects.
    #[arg(long, env = "INSTINCT_LOADTEST_GOAL_LESS")]
    pub goal_less: bool,

    /// Synthetic: number of distinct request bodies (cycled).
    #[arg(long, env = "INSTINCT_LOADTEST_SYNTHETIC_COUNT", default_value_t = 64)]
    pub synthetic_count: usize,

    /// Synthetic: the share (0 to 1) of the distinct bodies that are screenshot requests, each
    /// with its own seeded PNG; the rest are the text mix.
    #[arg(
        long,
        env = "INSTINCT_LOADTEST_SCREENSHOT_FRACTION",
        default_value_t = 0.0,
        allow_negative_numbers = true
    )]
    pub screenshot_fraction: f64,

    /// Synthetic: size of the screenshots, WIDTHxHEIGHT (the server takes at most 2048 per side,
    /// 1,048,576 px, 200:1).
    #[arg(
        long,
        env = "INSTINCT_LOADTEST_SCREENSHOT_SIZE",
        default_value = "1024x1024",
        value_name = "WxH",
        value_parser = parse_screenshot_size
    )]
    pub screenshot_size: ScreenshotSize,

    /// Synthetic: questions per screenshot request, N or MIN-MAX (drawn uniformly), 1 to 8.
    #[arg(
        long,
        env = "INSTINCT_LOADTEST_SCREENSHOT_QUESTIONS",
        default_value = "1",
        value_name = "N|MIN-MAX",
        value_parser = parse_question_range
    )]
    pub screenshot_questions: QuestionRange,

    /// Seed of the synthetic generator and of the arrival schedule.
    #[arg(long, env = "INSTINCT_LOADTEST_SEED", default_value_t = 78)]
    pub seed: u64,

    /// The `model` field of every request.
    #[arg(long, env = "INSTINCT_LOADTEST_MODEL", default_value = DEFAULT_MODEL)]
    pub model: String,

    // ---- load ----
    /// Open loop: request rate(s) in requests/s; several values (comma-separated) sweep.
    #[arg(long, env = "INSTINCT_LOADTEST_RATE", value_delimiter = ',')]
    pub rate: Vec<f64>,

    /// Open loop: arrival process.
    #[arg(long, env = "INSTINCT_LOADTEST_ARRIVAL", value_enum, default_value_t = ArrivalKind::Poisson)]
    pub arrival: ArrivalKind,

    /// Open loop, gamma arrivals: shape factor (1 = Poisson, < 1 burstier, > 1 smoother).
    #[arg(long, env = "INSTINCT_LOADTEST_BURSTINESS", default_value_t = 1.0)]
    pub burstiness: f64,

    /// Open loop: most requests in flight at once; later ones wait, and the wait counts in
    /// their latency.
    #[arg(long, env = "INSTINCT_LOADTEST_MAX_IN_FLIGHT", default_value_t = 1024)]
    pub max_in_flight: usize,

    /// Closed loop: number(s) of concurrent clients; several values (comma-separated) sweep.
    #[arg(long, env = "INSTINCT_LOADTEST_CONCURRENCY", value_delimiter = ',')]
    pub concurrency: Vec<usize>,

    /// Most measured requests per level.
    #[arg(long, env = "INSTINCT_LOADTEST_REQUESTS", default_value_t = 1000)]
    pub requests: u64,

    /// Longest send phase per level, in seconds (open loop: last scheduled send; closed loop:
    /// last request started).
    #[arg(long, env = "INSTINCT_LOADTEST_DURATION", default_value_t = 60.0)]
    pub duration: f64,

    /// Per-request timeout in milliseconds.
    #[arg(long, env = "INSTINCT_LOADTEST_TIMEOUT_MS", default_value_t = 30_000)]
    pub timeout_ms: u64,

    /// Warm-up requests sent one by one before each level, excluded from the results.
    #[arg(long, env = "INSTINCT_LOADTEST_WARMUP", default_value_t = 3)]
    pub warmup: u64,

    // ---- report ----
    /// Latency objective for goodput, in milliseconds.
    #[arg(long, env = "INSTINCT_LOADTEST_SLO_MS")]
    pub slo_ms: Option<f64>,

    /// Write the JSON report to this file.
    #[arg(long, env = "INSTINCT_LOADTEST_JSON")]
    pub json: Option<PathBuf>,

    /// Write every measured request to this file, one JSON line each: level, at_unix_ms (the
    /// scheduled send in open loop), latency_ms, send_lag_ms, outcome, kind, decisions,
    /// input_tokens, server_ms (Server-Timing phases), request_id.
    #[arg(long, env = "INSTINCT_LOADTEST_SAMPLES")]
    pub samples: Option<PathBuf>,

    /// Write SVG charts (latency_vs_load.svg, latency_cdf.svg) into this directory.
    #[arg(long, env = "INSTINCT_LOADTEST_SVG_DIR")]
    pub svg_dir: Option<PathBuf>,

    /// Write the workload's distinct request bodies to this file (JSON lines: label, questions,
    /// approx_prompt_tokens, body) and exit without sending anything.
    #[arg(long, env = "INSTINCT_LOADTEST_DUMP_WORKLOAD")]
    pub dump_workload: Option<PathBuf>,

    /// Do not scrape `/metrics` before and after each level.
    #[arg(long, env = "INSTINCT_LOADTEST_NO_METRICS")]
    pub no_metrics: bool,

    /// No progress bar (it is also off when stderr is not a terminal).
    #[arg(long, short, env = "INSTINCT_LOADTEST_QUIET")]
    pub quiet: bool,
}

fn parse_screenshot_size(s: &str) -> Result<ScreenshotSize, String> {
    s.parse().map_err(|e: anyhow::Error| e.to_string())
}

fn parse_question_range(s: &str) -> Result<QuestionRange, String> {
    s.parse().map_err(|e: anyhow::Error| e.to_string())
}

/// `--arrival` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ArrivalKind {
    Constant,
    Poisson,
    Gamma,
}
