//! The harness against an in-process mock server: counts, 503 accounting, coordinated
//! omission, bounds, reports and charts.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use indicatif::ProgressBar;
use instinct_loadtest::app;
use instinct_loadtest::cli::Args;
use instinct_loadtest::client::Client;
use instinct_loadtest::runner::{run_level, LoadMode, RunLimits};
use instinct_loadtest::schedule::Arrival;
use instinct_loadtest::target::Target;
use instinct_loadtest::workload::synthetic::{generate, SyntheticConfig};
use serde_json::Value;

use common::{start, MockConfig};

fn args(url: &str, extra: &[&str]) -> Args {
    let mut argv = vec!["instinct-loadtest", "--target", url, "--quiet"];
    argv.extend_from_slice(extra);
    Args::try_parse_from(argv).unwrap()
}

fn small_workload() -> Arc<instinct_loadtest::workload::Workload> {
    Arc::new(
        generate(&SyntheticConfig {
            seed: 1,
            count: 8,
            ..SyntheticConfig::default()
        })
        .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_add_up_and_503s_are_counted_apart() {
    let server = start(MockConfig {
        delay: Duration::from_millis(2),
        reject_one_in: 5,
        error_one_in: 7,
        ..Default::default()
    })
    .await;
    let a = args(
        &server.url,
        &[
            "--rate",
            "400",
            "--arrival",
            "constant",
            "--requests",
            "140",
            "--warmup",
            "0",
            "--questions",
            "2",
            "--slo-ms",
            "1000",
        ],
    );
    let report = app::run(&a).await.unwrap();
    let level = &report.levels[0];
    assert_eq!(level.sent, 140);
    assert_eq!(
        level.completed + level.rejected_503 + level.errors,
        level.sent
    );
    // Request n is a 503 when n % 5 == 0 (28 of 140), else a 500 when n % 7 == 0 (20 − 4 = 16).
    assert_eq!(level.rejected_503, 28);
    assert_eq!(level.errors, 16);
    assert_eq!(level.errors_by_status.get("500"), Some(&16));
    assert_eq!(level.errors_by_status.len(), 1);
    assert_eq!(level.completed, 96);
    // 503s are never latency samples.
    assert_eq!(level.latency_ms.unwrap().count, level.completed);
    assert_eq!(level.retry_after.with_header, 28);
    assert_eq!(level.retry_after.mean_s, Some(2.0));
    // Two questions per request, 100 input tokens per question (the mock's usage).
    let decisions = level.decision_throughput * level.duration_s;
    assert!((decisions - 192.0).abs() < 1e-6, "{decisions}");
    let tokens = level.prompt_token_throughput * level.duration_s;
    assert!((tokens - 19_200.0).abs() < 1e-3, "{tokens}");
    // Goodput counts completed requests only: at most completed/sent of the traffic.
    let fraction = level.goodput_fraction.unwrap();
    assert!(
        fraction <= 96.0 / 140.0 + 1e-9 && fraction > 0.5,
        "{fraction}"
    );
    // Server-side breakdown: Server-Timing percentiles and the /metrics delta.
    let infer = &level.server_timing_ms["infer"];
    assert_eq!(infer.count, 96);
    assert!((infer.p50 - 2.0).abs() < 0.01, "{infer:?}");
    assert!((level.server_timing_ms["prepare"].p99 - 0.5).abs() < 0.01);
    assert!(level.server_metrics.available);
    let phases = &level.server_metrics.phases;
    assert_eq!(phases["infer"].count, 96.0);
    assert!((phases["infer"].mean_ms.unwrap() - 2.0).abs() < 1e-6);
    assert!((phases["prepare"].mean_ms.unwrap() - 0.5).abs() < 1e-6);
    assert!(!phases.contains_key("queue_wait"));
}

/// Coordinated omission: a server that stalls 300 ms once. Closed loop (one client) sees one
/// slow request; open loop with the same one connection slot must charge the stall to every
/// request scheduled during it, because latency counts from the intended send time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_latency_includes_the_scheduled_start_delay() {
    let stall = MockConfig {
        delay: Duration::from_millis(1),
        stall: Some((20, Duration::from_millis(300))),
        ..Default::default()
    };
    let workload = small_workload();
    let limits = RunLimits {
        max_requests: 100,
        duration: Duration::from_secs(10),
        timeout: Duration::from_secs(5),
        max_in_flight: 1,
        warmup: 0,
        seed: 3,
    };
    let slow = |records: &[instinct_loadtest::runner::Record]| {
        records
            .iter()
            .filter(|r| r.latency() > Duration::from_millis(100))
            .count()
    };

    let server = start(stall.clone()).await;
    let client = Client::new(Target::parse(&server.url).await.unwrap(), limits.timeout);
    let closed = run_level(
        &client,
        &workload,
        LoadMode::Closed { concurrency: 1 },
        &limits,
        &ProgressBar::hidden(),
    )
    .await
    .unwrap();
    assert_eq!(closed.records.len(), 100);
    assert_eq!(slow(&closed.records), 1, "closed loop hides the backlog");

    let server = start(stall).await;
    let client = Client::new(Target::parse(&server.url).await.unwrap(), limits.timeout);
    let open = run_level(
        &client,
        &workload,
        LoadMode::Open {
            arrival: Arrival::Constant,
            rate: 100.0,
        },
        &limits,
        &ProgressBar::hidden(),
    )
    .await
    .unwrap();
    assert_eq!(open.records.len(), 100);
    // 300 ms at 10 ms spacing: about 20 requests are scheduled more than 100 ms before they
    // can be answered.
    let n = slow(&open.records);
    assert!(n >= 15, "open loop charged the stall to only {n} requests");
    let report = instinct_loadtest::report::LevelReport::from_run(&open, None, Default::default());
    assert!(report.latency_ms.unwrap().p90 > 100.0);
    assert!(report.send_lag_ms.unwrap().max > 100.0);
}

/// With free connection slots the open loop keeps sending on schedule while the server stalls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_does_not_wait_for_answers() {
    let server = start(MockConfig {
        delay: Duration::from_millis(1),
        stall: Some((10, Duration::from_millis(300))),
        ..Default::default()
    })
    .await;
    let a = args(
        &server.url,
        &[
            "--rate",
            "100",
            "--arrival",
            "constant",
            "--requests",
            "60",
            "--warmup",
            "0",
        ],
    );
    let report = app::run(&a).await.unwrap();
    let level = &report.levels[0];
    assert_eq!(level.completed, 60);
    // Requests left on time (small lag) although ~30 of them sat behind the stall.
    let lag = level.send_lag_ms.unwrap();
    assert!(lag.p90 < 50.0, "{lag:?}");
    // …and their latency, from the intended send time, shows it: ~20 of 60 waited > 100 ms.
    let latency = level.latency_ms.unwrap();
    assert!(latency.p90 > 100.0, "{latency:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_sweep_is_bounded_in_time() {
    let server = start(MockConfig {
        delay: Duration::from_millis(5),
        ..Default::default()
    })
    .await;
    let a = args(
        &server.url,
        &[
            "--concurrency",
            "1,4",
            "--requests",
            "1000000",
            "--duration",
            "0.3",
            "--warmup",
            "2",
        ],
    );
    let t0 = Instant::now();
    let report = app::run(&a).await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(report.mode, "closed");
    assert_eq!(report.levels.len(), 2);
    for level in &report.levels {
        assert!(level.sent > 5 && level.sent < 1000, "{}", level.sent);
        assert_eq!(level.completed, level.sent);
        assert_eq!(level.warmup_sent, 2);
        assert_eq!(level.warmup_ok, 2);
        let p = level.latency_ms.unwrap();
        assert!(p.p50 >= 5.0 && p.p50 < 100.0, "{p:?}");
    }
    // Four clients against a server that overlaps requests: more throughput than one.
    assert!(report.levels[1].request_throughput > report.levels[0].request_throughput * 1.5);
    // Warm-ups are not in the server's /metrics delta either.
    let answered: f64 = report
        .levels
        .iter()
        .map(|l| l.server_metrics.phases["infer"].count)
        .sum();
    assert_eq!(
        answered as u64,
        report.levels.iter().map(|l| l.completed).sum::<u64>()
    );
}

#[tokio::test]
async fn non_loopback_targets_are_refused_before_sending() {
    for target in [
        "http://10.0.0.7:8000",
        "http://192.168.0.1",
        "http://example.com:80",
    ] {
        let a = args(target, &["--rate", "10", "--requests", "1"]);
        let err = app::run(&a).await.unwrap_err();
        assert!(format!("{err:#}").contains("not a loopback"), "{err:#}");
    }
}

#[test]
fn the_binary_refuses_a_non_loopback_target() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_instinct-loadtest"))
        .args([
            "--target",
            "http://10.1.2.3:8000",
            "--rate",
            "1",
            "--requests",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not a loopback"), "{stderr}");
}

#[tokio::test]
async fn an_unreachable_server_is_a_clear_error() {
    // Bind then drop, so the port is (almost certainly) closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let a = args(
        &format!("http://127.0.0.1:{port}"),
        &["--rate", "10", "--requests", "3"],
    );
    let err = app::run(&a).await.unwrap_err();
    assert!(format!("{err:#}").contains("cannot connect"), "{err:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn samples_hold_every_measured_request_on_the_wall_clock() {
    let server = start(MockConfig {
        delay: Duration::from_millis(2),
        reject_one_in: 5,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("samples.jsonl");
    let a = args(
        &server.url,
        &[
            "--rate",
            "200,400",
            "--requests",
            "20",
            "--warmup",
            "2",
            "--samples",
            path.to_str().unwrap(),
        ],
    );
    let unix_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
            * 1e3
    };
    let before = unix_ms();
    let report = app::run(&a).await.unwrap();
    let after = unix_ms();
    let lines: Vec<Value> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // Every measured request of both levels, none of the warm-ups.
    assert_eq!(lines.len(), 40);
    for (level, report_level) in report.levels.iter().enumerate() {
        let of_level: Vec<&Value> = lines.iter().filter(|l| l["level"] == level).collect();
        assert_eq!(of_level.len() as u64, report_level.sent);
        let rejected = of_level.iter().filter(|l| l["outcome"] == "503").count();
        assert_eq!(rejected as u64, report_level.rejected_503);
        let ok = of_level.iter().filter(|l| l["outcome"] == "ok").count();
        assert_eq!(ok as u64, report_level.completed);
    }
    for l in &lines {
        let at = l["at_unix_ms"].as_f64().unwrap();
        assert!(before <= at && at <= after, "{at} not in {before}..{after}");
        assert!(l["latency_ms"].as_f64().unwrap() > 0.0);
        assert!(l["send_lag_ms"].as_f64().unwrap() >= 0.0);
        assert_eq!(l["kind"], "text");
        if l["outcome"] == "ok" {
            assert!(l["decisions"].as_u64().unwrap() > 0);
            assert!(l["server_ms"].as_object().is_some_and(|m| !m.is_empty()));
        }
    }
}

#[tokio::test]
async fn a_samples_file_that_cannot_be_written_fails_before_anything_is_sent() {
    let server = start(MockConfig::default()).await;
    let a = args(
        &server.url,
        &[
            "--rate",
            "10",
            "--requests",
            "3",
            "--samples",
            "/nonexistent/dir/s.jsonl",
        ],
    );
    let err = app::run(&a).await.unwrap_err();
    assert!(format!("{err:#}").contains("samples file"), "{err:#}");
    assert_eq!(
        server
            .counters
            .received
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_report_has_the_documented_fields() {
    let server = start(MockConfig {
        delay: Duration::from_millis(1),
        reject_one_in: 10,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let a = args(
        &server.url,
        &[
            "--rate",
            "200",
            "--arrival",
            "gamma",
            "--burstiness",
            "0.5",
            "--requests",
            "50",
            "--slo-ms",
            "50",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    app::run(&a).await.unwrap();
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for key in [
        "tool",
        "version",
        "target",
        "mode",
        "workload",
        "slo_ms",
        "max_requests",
        "duration_limit_s",
        "timeout_ms",
        "warmup_requests",
        "seed",
        "levels",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert_eq!(v["mode"], "open");
    assert_eq!(v["slo_ms"], 50.0);
    let level = &v["levels"][0];
    for key in [
        "load",
        "duration_s",
        "sent",
        "completed",
        "rejected_503",
        "errors",
        "errors_by_status",
        "retry_after",
        "warmup_sent",
        "warmup_ok",
        "send_rate_rps",
        "request_throughput",
        "decision_throughput",
        "prompt_token_throughput",
        "request_goodput",
        "goodput_fraction",
        "latency_ms",
        "send_lag_ms",
        "latency_cdf_ms",
        "server_timing_ms",
        "server_metrics",
    ] {
        assert!(level.get(key).is_some(), "missing levels[0].{key}");
    }
    assert_eq!(level["load"]["arrival"]["process"], "gamma");
    assert_eq!(level["load"]["arrival"]["burstiness"], 0.5);
    assert_eq!(level["load"]["rate_rps"], 200.0);
    for key in [
        "count", "mean", "min", "p50", "p90", "p95", "p99", "p99_9", "max",
    ] {
        assert!(level["latency_ms"][key].is_number(), "latency_ms.{key}");
    }
    assert_eq!(level["sent"], 50);
    // 3 warm-ups took request numbers 1–3, so the measured 50 are numbers 4–53: 5 are 503s.
    assert_eq!(level["rejected_503"], 5);
    assert_eq!(level["completed"], 45);
    assert!(level["server_metrics"]["phases"]["infer"]["mean_ms"].is_number());
    assert!(level["latency_cdf_ms"].as_array().unwrap().len() > 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn svg_charts_are_written_and_well_formed() {
    let server = start(MockConfig {
        delay: Duration::from_millis(1),
        no_metrics: true,
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("charts");
    let a = args(
        &server.url,
        &[
            "--rate",
            "50,150",
            "--requests",
            "30",
            "--warmup",
            "0",
            "--svg-dir",
            svg.to_str().unwrap(),
        ],
    );
    let report = app::run(&a).await.unwrap();
    assert_eq!(report.levels.len(), 2);
    assert!(!report.levels[0].server_metrics.available);
    assert!(report.levels[0]
        .server_metrics
        .error
        .as_deref()
        .unwrap()
        .contains("404"));
    for name in ["latency_vs_load.svg", "latency_cdf.svg"] {
        let text = std::fs::read_to_string(svg.join(name)).unwrap();
        let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        let lines = doc
            .descendants()
            .filter(|n| n.tag_name().name() == "polyline" || n.tag_name().name() == "path")
            .count();
        assert!(lines >= 2, "{name}: {lines} lines");
        assert!(text.contains("latency (ms)"), "{name} has no axis label");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixture_requests_are_accepted_in_both_formats() {
    let fixture = r#"{"fixtures": [{"id": "f1", "family": "login_auth", "app": "web",
        "goal": "Sign in", "ax_tree": "- Button \"OK\" @ [0, 0, 1, 1]",
        "options": [
          {"element_id": "el_0", "role": "Button", "label": "OK", "action": "click", "entity_id": null},
          {"element_id": "el_1", "role": "TextBox", "label": "User", "action": "fill", "entity_id": "ent_0"}],
        "input_ids": [1, 2, 3]}]}"#;
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), fixture).unwrap();
    let server = start(MockConfig::default()).await;
    for format in ["native", "plain"] {
        let a = args(
            &server.url,
            &[
                "--fixtures",
                file.path().to_str().unwrap(),
                "--fixture-format",
                format,
                "--questions",
                "3",
                "--concurrency",
                "2",
                "--requests",
                "10",
                "--warmup",
                "0",
            ],
        );
        let report = app::run(&a).await.unwrap();
        let level = &report.levels[0];
        assert_eq!(
            level.completed, 10,
            "{format}: {:?}",
            level.errors_by_status
        );
        assert!((level.decision_throughput * level.duration_s - 30.0).abs() < 1e-6);
    }
}

#[tokio::test]
async fn dump_workload_writes_the_bodies_and_sends_nothing() {
    let server = start(MockConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bodies.jsonl");
    let a = args(
        &server.url,
        &[
            "--dump-workload",
            path.to_str().unwrap(),
            "--synthetic-count",
            "12",
        ],
    );
    let text = app::run_and_render(&a).await.unwrap();
    assert!(text.contains("wrote 12 request bodies"), "{text}");
    let lines: Vec<Value> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 12);
    for line in &lines {
        let questions = line["body"]["questions"].as_object().unwrap().len();
        assert_eq!(line["questions"], questions);
        assert!(line["approx_prompt_tokens"].as_u64().unwrap() >= 140 * questions as u64);
    }
    assert_eq!(
        server
            .counters
            .received
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}

/// Half text, half screenshots against the mock: every level is split by kind, the kinds add up
/// to the totals, the slower screenshots show in their own percentiles, and no image is sent
/// twice over the warm-ups and both levels (the bodies outnumber the sends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_load_is_reported_by_kind_and_never_repeats_a_screenshot() {
    let server = start(MockConfig {
        delay: Duration::from_millis(2),
        screenshot_delay: Duration::from_millis(40),
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let a = args(
        &server.url,
        &[
            "--concurrency",
            "2,4",
            "--requests",
            "24",
            "--warmup",
            "2",
            "--synthetic-count",
            "64",
            "--screenshot-fraction",
            "0.5",
            "--screenshot-size",
            "160x120",
            "--screenshot-questions",
            "1-3",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    let text = app::run_and_render(&a).await.unwrap();
    use std::sync::atomic::Ordering::SeqCst;
    assert!(server.counters.screenshots.load(SeqCst) >= 10);
    assert_eq!(server.counters.repeated_images.load(SeqCst), 0);
    assert_eq!(server.counters.received.load(SeqCst), 2 * (2 + 24));

    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let kinds = &v["workload"]["by_kind"];
    assert_eq!(kinds["text"]["distinct_requests"], 32);
    assert_eq!(kinds["screenshot"]["distinct_requests"], 32);
    // 160×120 resizes to 288×224 (scaled up to 65,536 px): 63 image tokens per question.
    assert!(
        kinds["screenshot"]["prompt_tokens_per_question_min"]
            .as_u64()
            .unwrap()
            > 63 + 118
    );
    for level in v["levels"].as_array().unwrap() {
        assert_eq!(level["completed"], 24, "{level}");
        let text = &level["by_kind"]["text"];
        let shot = &level["by_kind"]["screenshot"];
        let sum = |key: &str| text[key].as_f64().unwrap() + shot[key].as_f64().unwrap();
        assert_eq!(sum("sent"), 24.0);
        assert_eq!(sum("completed"), 24.0);
        assert!(
            (sum("decision_throughput") - level["decision_throughput"].as_f64().unwrap()).abs()
                < 1e-9
        );
        for kind in [text, shot] {
            assert!(kind["completed"].as_u64().unwrap() > 0, "{level}");
            for key in ["mean", "p50", "p99"] {
                assert!(kind["latency_ms"][key].is_number(), "{kind}");
            }
        }
        assert!(shot["latency_ms"]["p50"].as_f64().unwrap() > 40.0);
        assert!(text["latency_ms"]["p50"].as_f64().unwrap() < 40.0);
        assert!(shot["server_timing_ms"]["infer"]["mean"].is_number());
    }
    assert!(text.contains("by kind"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("screenshot")), "{text}");
    assert!(
        text.contains("32 screenshot requests (160x120, 1-3 questions/request)"),
        "{text}"
    );
}

#[tokio::test]
async fn screenshot_flags_are_checked() {
    let url = "http://127.0.0.1:9";
    for (flag, value, message) in [
        ("--screenshot-size", "2048x1024", "1048576"),
        ("--screenshot-size", "3000x100", "2048 px per side"),
        ("--screenshot-size", "1000x4", "200:1"),
        ("--screenshot-size", "1024", "WIDTHxHEIGHT"),
        ("--screenshot-questions", "9", "1 to 8"),
        ("--screenshot-questions", "3-1", "1 to 8"),
    ] {
        let err = Args::try_parse_from([
            "instinct-loadtest",
            "--target",
            url,
            "--concurrency",
            "1",
            flag,
            value,
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains(message), "{flag} {value}: {err}");
    }
    for fraction in ["-0.5", "1.01", "NaN"] {
        let a = args(
            url,
            &["--concurrency", "1", "--screenshot-fraction", fraction],
        );
        let err = app::run(&a).await.unwrap_err().to_string();
        assert!(
            err.contains("--screenshot-fraction must be 0 to 1"),
            "{err}"
        );
    }
    let fixtures = args(
        url,
        &[
            "--dump-workload",
            "/dev/null",
            "--fixtures",
            "x.json",
            "--screenshot-fraction",
            "0.5",
        ],
    );
    let err = app::run_and_render(&fixtures)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("synthetic workload only"), "{err}");
}
