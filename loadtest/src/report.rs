//! The report: per-level counts, throughput, goodput, latency percentiles, server-side phases.
//! Serialized as JSON (`--json`) and printed as a short table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::client::OutcomeKind;
use crate::prometheus::PhaseDelta;
use crate::runner::{LevelRun, LoadMode};
use crate::schedule::Arrival;
use crate::stats::{LatencyHistogram, Percentiles};

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub tool: &'static str,
    pub version: &'static str,
    pub target: String,
    /// "open" or "closed".
    pub mode: &'static str,
    pub workload: WorkloadInfo,
    pub slo_ms: Option<f64>,
    pub max_requests: u64,
    pub duration_limit_s: f64,
    pub timeout_ms: f64,
    pub warmup_requests: u64,
    pub seed: u64,
    pub levels: Vec<LevelReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkloadInfo {
    pub description: String,
    pub distinct_requests: usize,
    pub mean_questions_per_request: f64,
    pub prompt_tokens_per_question_min: usize,
    pub prompt_tokens_per_question_max: usize,
}

/// The offered load of one level.
#[derive(Debug, Clone, Serialize)]
pub struct LoadPoint {
    pub mode: &'static str,
    /// Open loop: the arrival process.
    pub arrival: Option<Arrival>,
    /// Open loop: the target request rate (requests/s).
    pub rate_rps: Option<f64>,
    /// Closed loop: the number of clients.
    pub concurrency: Option<usize>,
}

impl LoadPoint {
    /// The number plotted on the x axis of the sweep chart.
    pub fn x(&self) -> f64 {
        self.rate_rps
            .or(self.concurrency.map(|c| c as f64))
            .unwrap_or(0.0)
    }
}

/// Retry-After values seen on 503s.
#[derive(Debug, Clone, Serialize)]
pub struct RetryAfter {
    /// 503s that carried a numeric Retry-After.
    pub with_header: u64,
    pub mean_s: Option<f64>,
    pub max_s: Option<f64>,
}

/// The `/metrics` delta of one level.
#[derive(Debug, Clone, Serialize, Default)]
pub struct ServerMetrics {
    pub available: bool,
    pub error: Option<String>,
    pub phases: BTreeMap<String, PhaseDelta>,
}

/// One level of the run (one rate or one concurrency).
#[derive(Debug, Clone, Serialize)]
pub struct LevelReport {
    pub load: LoadPoint,
    /// From the first scheduled send to the last answer.
    pub duration_s: f64,
    /// Measured requests sent (= completed + rejected_503 + errors).
    pub sent: u64,
    /// 200 with one answer per question.
    pub completed: u64,
    /// 503 answers (load shed); never in the latency percentiles.
    pub rejected_503: u64,
    /// Every other failure: HTTP statuses, timeouts, connection failures, malformed answers,
    /// requests still unfinished at the hard deadline.
    pub errors: u64,
    /// `errors` by key: a status code ("422") or "timeout", "connection", "transport",
    /// "invalid_response", "unfinished".
    pub errors_by_status: BTreeMap<String, u64>,
    pub retry_after: RetryAfter,
    pub warmup_sent: u64,
    pub warmup_ok: u64,
    /// Measured requests sent per second.
    pub send_rate_rps: f64,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Questions answered per second.
    pub decision_throughput: f64,
    /// `usage.input_tokens` of completed requests per second.
    pub prompt_token_throughput: f64,
    /// Completed requests within the SLO per second (with `--slo-ms`).
    pub request_goodput: Option<f64>,
    /// Completed within the SLO / sent (with `--slo-ms`).
    pub goodput_fraction: Option<f64>,
    /// Latency of completed requests (open loop: from the scheduled send time).
    pub latency_ms: Option<Percentiles>,
    /// Open loop: how late requests left compared with their schedule.
    pub send_lag_ms: Option<Percentiles>,
    /// `[latency ms, fraction ≤]` points of the latency distribution.
    pub latency_cdf_ms: Vec<[f64; 2]>,
    /// `Server-Timing` phases of completed requests.
    pub server_timing_ms: BTreeMap<String, Percentiles>,
    pub server_metrics: ServerMetrics,
}

impl LevelReport {
    /// Aggregates the records of one level.
    pub fn from_run(run: &LevelRun, slo: Option<Duration>, server_metrics: ServerMetrics) -> Self {
        let mut latency = LatencyHistogram::new();
        let mut lag = LatencyHistogram::new();
        let mut phases: BTreeMap<String, LatencyHistogram> = BTreeMap::new();
        let mut errors_by_status: BTreeMap<String, u64> = BTreeMap::new();
        let (mut completed, mut rejected, mut within_slo) = (0u64, 0u64, 0u64);
        let (mut decisions, mut tokens) = (0u64, 0u64);
        let mut retry_values = Vec::new();
        for record in &run.records {
            let outcome = &record.outcome;
            match &outcome.kind {
                OutcomeKind::Ok => {
                    completed += 1;
                    decisions += outcome.decisions;
                    tokens += outcome.input_tokens;
                    let l = record.latency();
                    latency.record(l);
                    if slo.is_some_and(|slo| l <= slo) {
                        within_slo += 1;
                    }
                    for (name, ms) in &outcome.server_timing {
                        phases.entry(name.clone()).or_default().record_ms(*ms);
                    }
                }
                OutcomeKind::Overloaded { retry_after_s } => {
                    rejected += 1;
                    retry_values.extend(*retry_after_s);
                }
                OutcomeKind::Error { key } => {
                    *errors_by_status.entry(key.clone()).or_default() += 1
                }
            }
            if matches!(run.mode, LoadMode::Open { .. }) {
                lag.record(record.send_lag());
            }
        }
        if run.unfinished > 0 {
            errors_by_status.insert("unfinished".into(), run.unfinished);
        }
        let errors = errors_by_status.values().sum();
        let sent = run.sent();
        let seconds = run
            .finished
            .saturating_duration_since(run.started)
            .as_secs_f64()
            .max(1e-9);
        let load = match run.mode {
            LoadMode::Open { arrival, rate } => LoadPoint {
                mode: "open",
                arrival: Some(arrival),
                rate_rps: Some(rate),
                concurrency: None,
            },
            LoadMode::Closed { concurrency } => LoadPoint {
                mode: "closed",
                arrival: None,
                rate_rps: None,
                concurrency: Some(concurrency),
            },
        };
        Self {
            load,
            duration_s: seconds,
            sent,
            completed,
            rejected_503: rejected,
            errors,
            errors_by_status,
            retry_after: RetryAfter {
                with_header: retry_values.len() as u64,
                mean_s: (!retry_values.is_empty())
                    .then(|| retry_values.iter().sum::<f64>() / retry_values.len() as f64),
                max_s: retry_values.iter().copied().reduce(f64::max),
            },
            warmup_sent: run.warmup_sent,
            warmup_ok: run.warmup_ok,
            send_rate_rps: sent as f64 / seconds,
            request_throughput: completed as f64 / seconds,
            decision_throughput: decisions as f64 / seconds,
            prompt_token_throughput: tokens as f64 / seconds,
            request_goodput: slo.map(|_| within_slo as f64 / seconds),
            goodput_fraction: slo.map(|_| within_slo as f64 / sent.max(1) as f64),
            latency_ms: latency.summary(),
            send_lag_ms: lag.summary(),
            latency_cdf_ms: latency.cdf(),
            server_timing_ms: phases
                .into_iter()
                .filter_map(|(name, h)| h.summary().map(|p| (name, p)))
                .collect(),
            server_metrics,
        }
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.2}"))
}

/// A human-readable summary of the report.
pub fn render_text(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "instinct-loadtest {} → {} ({} loop)\nworkload: {}",
        report.version, report.target, report.mode, report.workload.description
    );
    for level in &report.levels {
        let load = match (
            &level.load.rate_rps,
            &level.load.arrival,
            &level.load.concurrency,
        ) {
            (Some(rate), Some(arrival), _) => format!("rate {rate} req/s ({arrival:?})"),
            (_, _, Some(c)) => format!("concurrency {c}"),
            _ => String::new(),
        };
        let _ = writeln!(out, "\n== {load}, {:.2} s", level.duration_s);
        let _ = writeln!(
            out,
            "sent {}  ok {}  503 {}  errors {} {:?}",
            level.sent, level.completed, level.rejected_503, level.errors, level.errors_by_status
        );
        let _ = writeln!(
            out,
            "throughput {:.2} req/s  {:.2} decisions/s  {:.0} prompt tokens/s  (sent {:.2} req/s)",
            level.request_throughput,
            level.decision_throughput,
            level.prompt_token_throughput,
            level.send_rate_rps
        );
        if let (Some(goodput), Some(fraction), Some(slo)) =
            (level.request_goodput, level.goodput_fraction, report.slo_ms)
        {
            let _ = writeln!(
                out,
                "goodput {goodput:.2} req/s within {slo} ms ({:.1} % of sent)",
                fraction * 100.0
            );
        }
        let _ = writeln!(
            out,
            "{:<18} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "latency (ms)", "mean", "p50", "p90", "p95", "p99", "p99.9", "max"
        );
        let mut row = |name: &str, p: &Percentiles| {
            let _ = writeln!(
                out,
                "{:<18} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
                name, p.mean, p.p50, p.p90, p.p95, p.p99, p.p99_9, p.max
            );
        };
        if let Some(p) = &level.latency_ms {
            row("end to end", p);
        }
        for (name, p) in &level.server_timing_ms {
            row(&format!("server {name}"), p);
        }
        if let Some(p) = &level.send_lag_ms {
            row("send lag", p);
        }
        if level.server_metrics.available {
            for (phase, d) in &level.server_metrics.phases {
                let _ = writeln!(
                    out,
                    "/metrics {phase:<12} n {:>8.0}  mean {} ms  p50≈{} ms  p99≈{} ms",
                    d.count,
                    opt(d.mean_ms),
                    opt(d.p50_ms),
                    opt(d.p99_ms)
                );
            }
        } else if let Some(e) = &level.server_metrics.error {
            let _ = writeln!(out, "/metrics unavailable: {e}");
        }
        if level.rejected_503 > 0 {
            let _ = writeln!(
                out,
                "503 Retry-After: {} with header, mean {} s, max {} s",
                level.retry_after.with_header,
                opt(level.retry_after.mean_s),
                opt(level.retry_after.max_s)
            );
        }
    }
    out
}
