//! The report: per-level counts, throughput, goodput, latency percentiles, server-side phases.
//! Serialized as JSON (`--json`) and printed as a short table.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::client::OutcomeKind;
use crate::prometheus::PhaseDelta;
use crate::runner::{LevelRun, LoadMode, Record};
use crate::schedule::Arrival;
use crate::stats::{LatencyHistogram, Percentiles};
use crate::workload::{token_range, RequestKind, Workload};

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
    /// The same, per kind of request (`text`, `screenshot`).
    pub by_kind: BTreeMap<String, KindWorkload>,
}

impl WorkloadInfo {
    pub fn new(workload: &Workload) -> Self {
        let (min, max) = workload.prompt_token_range();
        let by_kind = workload
            .kinds()
            .into_iter()
            .map(|kind| {
                let specs = workload.of_kind(kind);
                let n = specs.clone().count();
                let questions: usize = specs.clone().map(|r| r.questions).sum();
                let (min, max) = token_range(specs);
                let info = KindWorkload {
                    distinct_requests: n,
                    mean_questions_per_request: questions as f64 / n.max(1) as f64,
                    prompt_tokens_per_question_min: min,
                    prompt_tokens_per_question_max: max,
                };
                (kind.name().to_string(), info)
            })
            .collect();
        Self {
            description: workload.description.clone(),
            distinct_requests: workload.requests.len(),
            mean_questions_per_request: workload.mean_questions(),
            prompt_tokens_per_question_min: min,
            prompt_tokens_per_question_max: max,
            by_kind,
        }
    }
}

/// The distinct bodies of one kind.
#[derive(Debug, Clone, Serialize)]
pub struct KindWorkload {
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
    /// The level's requests split by kind (`text`, `screenshot`); rates divide by the level's
    /// `duration_s`, so they add up to the totals.
    pub by_kind: BTreeMap<String, KindReport>,
}

/// One kind of request within a level: the level's counts, rates and latencies over its
/// requests alone.
#[derive(Debug, Clone, Serialize)]
pub struct KindReport {
    pub sent: u64,
    pub completed: u64,
    pub rejected_503: u64,
    pub errors: u64,
    pub errors_by_status: BTreeMap<String, u64>,
    pub request_throughput: f64,
    pub decision_throughput: f64,
    pub prompt_token_throughput: f64,
    pub request_goodput: Option<f64>,
    pub goodput_fraction: Option<f64>,
    pub latency_ms: Option<Percentiles>,
    pub server_timing_ms: BTreeMap<String, Percentiles>,
}

/// Counts and distributions over a set of records (a level, or one kind within it).
#[derive(Debug, Default)]
struct Tally {
    latency: LatencyHistogram,
    phases: BTreeMap<String, LatencyHistogram>,
    errors_by_status: BTreeMap<String, u64>,
    records: u64,
    completed: u64,
    rejected: u64,
    within_slo: u64,
    decisions: u64,
    tokens: u64,
    retry_values: Vec<f64>,
}

impl Tally {
    fn add(&mut self, record: &Record, slo: Option<Duration>) {
        self.records += 1;
        let outcome = &record.outcome;
        match &outcome.kind {
            OutcomeKind::Ok => {
                self.completed += 1;
                self.decisions += outcome.decisions;
                self.tokens += outcome.input_tokens;
                let l = record.latency();
                self.latency.record(l);
                if slo.is_some_and(|slo| l <= slo) {
                    self.within_slo += 1;
                }
                for (name, ms) in &outcome.server_timing {
                    self.phases.entry(name.clone()).or_default().record_ms(*ms);
                }
            }
            OutcomeKind::Overloaded { retry_after_s } => {
                self.rejected += 1;
                self.retry_values.extend(*retry_after_s);
            }
            OutcomeKind::Error { key } => {
                *self.errors_by_status.entry(key.clone()).or_default() += 1
            }
        }
    }

    /// Counts requests that never finished.
    fn add_unfinished(&mut self, n: u64) {
        if n > 0 {
            self.errors_by_status.insert("unfinished".into(), n);
        }
    }

    fn sent(&self) -> u64 {
        self.records
            + self
                .errors_by_status
                .get("unfinished")
                .copied()
                .unwrap_or(0)
    }

    fn errors(&self) -> u64 {
        self.errors_by_status.values().sum()
    }

    fn server_timing(&self) -> BTreeMap<String, Percentiles> {
        self.phases
            .iter()
            .filter_map(|(name, h)| h.summary().map(|p| (name.clone(), p)))
            .collect()
    }

    fn kind_report(&self, seconds: f64, slo: Option<Duration>) -> KindReport {
        let sent = self.sent();
        KindReport {
            sent,
            completed: self.completed,
            rejected_503: self.rejected,
            errors: self.errors(),
            errors_by_status: self.errors_by_status.clone(),
            request_throughput: self.completed as f64 / seconds,
            decision_throughput: self.decisions as f64 / seconds,
            prompt_token_throughput: self.tokens as f64 / seconds,
            request_goodput: slo.map(|_| self.within_slo as f64 / seconds),
            goodput_fraction: slo.map(|_| self.within_slo as f64 / sent.max(1) as f64),
            latency_ms: self.latency.summary(),
            server_timing_ms: self.server_timing(),
        }
    }
}

impl LevelReport {
    /// Aggregates the records of one level.
    pub fn from_run(run: &LevelRun, slo: Option<Duration>, server_metrics: ServerMetrics) -> Self {
        let mut all = Tally::default();
        let mut by_kind: BTreeMap<RequestKind, Tally> = BTreeMap::new();
        let mut lag = LatencyHistogram::new();
        for record in &run.records {
            all.add(record, slo);
            by_kind.entry(record.kind).or_default().add(record, slo);
            if matches!(run.mode, LoadMode::Open { .. }) {
                lag.record(record.send_lag());
            }
        }
        all.add_unfinished(run.unfinished);
        for (kind, n) in &run.unfinished_by_kind {
            by_kind.entry(*kind).or_default().add_unfinished(*n);
        }
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
        let totals = all.kind_report(seconds, slo);
        let retry_values = &all.retry_values;
        Self {
            load,
            duration_s: seconds,
            sent,
            completed: totals.completed,
            rejected_503: totals.rejected_503,
            errors: totals.errors,
            errors_by_status: totals.errors_by_status,
            retry_after: RetryAfter {
                with_header: retry_values.len() as u64,
                mean_s: (!retry_values.is_empty())
                    .then(|| retry_values.iter().sum::<f64>() / retry_values.len() as f64),
                max_s: retry_values.iter().copied().reduce(f64::max),
            },
            warmup_sent: run.warmup_sent,
            warmup_ok: run.warmup_ok,
            send_rate_rps: sent as f64 / seconds,
            request_throughput: totals.request_throughput,
            decision_throughput: totals.decision_throughput,
            prompt_token_throughput: totals.prompt_token_throughput,
            request_goodput: totals.request_goodput,
            goodput_fraction: totals.goodput_fraction,
            latency_ms: totals.latency_ms,
            send_lag_ms: lag.summary(),
            latency_cdf_ms: all.latency.cdf(),
            server_timing_ms: totals.server_timing_ms,
            server_metrics,
            by_kind: by_kind
                .iter()
                .map(|(kind, t)| (kind.name().to_string(), t.kind_report(seconds, slo)))
                .collect(),
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
        if level.by_kind.keys().any(|k| k != "text") {
            let _ = writeln!(
                out,
                "{:<18} {:>6} {:>6} {:>6} {:>6} {:>9} {:>11} {:>9} {:>9} {:>9}",
                "by kind",
                "sent",
                "ok",
                "503",
                "errors",
                "req/s",
                "decisions/s",
                "mean ms",
                "p50 ms",
                "p99 ms"
            );
            for (kind, k) in &level.by_kind {
                let (mean, p50, p99) = k.latency_ms.map_or((None, None, None), |p| {
                    (Some(p.mean), Some(p.p50), Some(p.p99))
                });
                let _ = writeln!(
                    out,
                    "{:<18} {:>6} {:>6} {:>6} {:>6} {:>9.2} {:>11.2} {:>9} {:>9} {:>9}",
                    kind,
                    k.sent,
                    k.completed,
                    k.rejected_503,
                    k.errors,
                    k.request_throughput,
                    k.decision_throughput,
                    opt(mean),
                    opt(p50),
                    opt(p99)
                );
            }
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

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::client::Outcome;
    use crate::runner::Record;

    fn record(
        start: Instant,
        kind: RequestKind,
        ms: u64,
        outcome: OutcomeKind,
        decisions: u64,
    ) -> Record {
        Record {
            outcome: Outcome {
                kind: outcome,
                sent_at: start,
                done_at: start + Duration::from_millis(ms),
                server_timing: vec![("infer".into(), ms as f64 / 2.0)],
                request_id: None,
                decisions,
                input_tokens: 100 * decisions,
            },
            kind,
            latency_origin: start,
        }
    }

    #[test]
    fn levels_are_split_by_kind() {
        use RequestKind::{Screenshot, Text};
        let start = Instant::now();
        let ok = || OutcomeKind::Ok;
        let mut records = vec![
            record(start, Text, 10, ok(), 2),
            record(start, Text, 20, ok(), 2),
            record(start, Text, 30, ok(), 2),
            record(start, Text, 40, ok(), 2),
            record(start, Screenshot, 100, ok(), 1),
            record(start, Screenshot, 300, ok(), 3),
            record(
                start,
                Screenshot,
                5,
                OutcomeKind::Overloaded {
                    retry_after_s: Some(2.0),
                },
                0,
            ),
        ];
        records.push(record(
            start,
            Text,
            5,
            OutcomeKind::Error { key: "500".into() },
            0,
        ));
        let run = LevelRun {
            mode: LoadMode::Closed { concurrency: 2 },
            records,
            unfinished: 1,
            unfinished_by_kind: [(Screenshot, 1)].into(),
            warmup_sent: 0,
            warmup_ok: 0,
            started: start,
            finished: start + Duration::from_secs(2),
        };
        let level =
            LevelReport::from_run(&run, Some(Duration::from_millis(150)), Default::default());
        // The totals, as before.
        assert_eq!(
            (
                level.sent,
                level.completed,
                level.rejected_503,
                level.errors
            ),
            (9, 6, 1, 2)
        );
        assert_eq!(level.decision_throughput, 6.0);
        assert_eq!(level.latency_ms.unwrap().count, 6);

        let text = &level.by_kind["text"];
        assert_eq!(
            (text.sent, text.completed, text.rejected_503, text.errors),
            (5, 4, 0, 1)
        );
        assert_eq!(text.errors_by_status, [("500".to_string(), 1)].into());
        assert_eq!(text.request_throughput, 2.0);
        assert_eq!(text.decision_throughput, 4.0);
        assert_eq!(text.prompt_token_throughput, 400.0);
        assert_eq!(text.request_goodput, Some(2.0));
        assert_eq!(text.goodput_fraction, Some(0.8));
        let p = text.latency_ms.unwrap();
        assert_eq!(p.count, 4);
        assert!((p.mean - 25.0).abs() < 0.05, "{p:?}");
        assert!(
            (p.p50 - 20.0).abs() < 0.05 && (p.p99 - 40.0).abs() < 0.05,
            "{p:?}"
        );
        assert!((text.server_timing_ms["infer"].max - 20.0).abs() < 0.05);

        let shot = &level.by_kind["screenshot"];
        assert_eq!(
            (shot.sent, shot.completed, shot.rejected_503, shot.errors),
            (4, 2, 1, 1)
        );
        assert_eq!(
            shot.errors_by_status,
            [("unfinished".to_string(), 1)].into()
        );
        assert_eq!(shot.decision_throughput, 2.0);
        assert_eq!(shot.request_goodput, Some(0.5));
        let p = shot.latency_ms.unwrap();
        assert!((p.mean - 200.0).abs() < 0.2, "{p:?}");
        assert!(
            (p.p50 - 100.0).abs() < 0.1 && (p.p99 - 300.0).abs() < 0.3,
            "{p:?}"
        );

        // The kinds add up to the totals.
        let kinds = level.by_kind.values();
        assert_eq!(kinds.clone().map(|k| k.sent).sum::<u64>(), level.sent);
        assert_eq!(kinds.clone().map(|k| k.errors).sum::<u64>(), level.errors);
        let decisions: f64 = kinds.map(|k| k.decision_throughput).sum();
        assert_eq!(decisions, level.decision_throughput);

        let report = Report {
            tool: "instinct-loadtest",
            version: "0",
            target: "http://127.0.0.1:1".into(),
            mode: "closed",
            workload: WorkloadInfo::new(&Workload {
                description: "test".into(),
                requests: Vec::new(),
            }),
            slo_ms: Some(150.0),
            max_requests: 9,
            duration_limit_s: 1.0,
            timeout_ms: 1.0,
            warmup_requests: 0,
            seed: 0,
            levels: vec![level],
        };
        let text = render_text(&report);
        let shot_row = text
            .lines()
            .find(|l| l.starts_with("screenshot"))
            .unwrap_or_else(|| panic!("{text}"));
        let cells: Vec<&str> = shot_row.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "screenshot",
                "4",
                "2",
                "1",
                "1",
                "1.00",
                "2.00",
                "199.95",
                "100.03",
                "300.03"
            ]
        );
    }
}
