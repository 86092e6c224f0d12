//! The scheduler's metrics, read back through a debugging recorder. One test: the recorder is
//! global to this test binary.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use instinct_scheduler::{telemetry as names, Config, Failure, RejectReason};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;

#[test]
fn scheduler_metrics_are_recorded_under_their_names() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("first recorder of this binary");
    names::describe();

    let config = Config {
        max_queue_requests: 3,
        max_batch_tokens: 200,
        max_batch_seqs: 8,
        ..Config::default()
    };
    let h = Harness::new(config, 1, Duration::ZERO);
    let blocker = h.block_engine();
    let kept: Vec<_> = (0..2)
        .map(|t| vec![question(t, 60, 2), question(t + 10, 60, 2)])
        .collect();
    let kept_tickets: Vec<_> = h.submit_all(&kept);
    let cancelled = h.scheduler.submit(vec![question(20, 10, 2)], None).unwrap();
    let full = h
        .scheduler
        .submit(vec![question(21, 10, 2)], None)
        .unwrap_err();
    assert_eq!(full.reason, RejectReason::QueueFullRequests);
    drop(cancelled);
    let late = h
        .scheduler
        .submit(
            vec![question(22, 10, 2)],
            Some(Instant::now() + Duration::from_millis(5)),
        )
        .unwrap();
    assert_eq!(wait(late, LONG), Err(Failure::DeadlineExceeded));
    h.gate.open();
    wait(blocker, LONG).unwrap();
    for t in kept_tickets {
        wait(t, LONG).unwrap();
    }

    let mut counters = HashMap::new();
    let mut gauges = HashMap::new();
    let mut histograms: HashMap<String, Vec<f64>> = HashMap::new();
    for (key, _unit, _description, value) in snapshotter.snapshot().into_vec() {
        let (kind, key) = key.into_parts();
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = if labels.is_empty() {
            key.name().to_string()
        } else {
            format!("{}{{{}}}", key.name(), labels.join(","))
        };
        match (kind, value) {
            (MetricKind::Counter, DebugValue::Counter(v)) => {
                counters.insert(name, v);
            }
            (MetricKind::Gauge, DebugValue::Gauge(v)) => {
                gauges.insert(name, v.into_inner());
            }
            (MetricKind::Histogram, DebugValue::Histogram(v)) => {
                histograms.insert(name, v.into_iter().map(|x| x.into_inner()).collect());
            }
            other => panic!("unexpected metric {other:?}"),
        }
    }

    assert_eq!(
        counters["instinct_rejections_total{reason=queue_full_requests}"],
        1
    );
    assert_eq!(counters[names::CANCELLED_TOTAL], 1);
    assert_eq!(counters[names::DEADLINE_EXCEEDED_TOTAL], 1);
    for gauge in [
        names::QUEUE_REQUESTS,
        names::QUEUE_TOKENS,
        names::INFLIGHT_REQUESTS,
    ] {
        assert_eq!(gauges[gauge], 0.0, "{gauge}");
    }
    // 1 blocker + 4 kept questions computed; the cancelled and expired ones never started.
    let batches = h.log.lock().len();
    assert_eq!(histograms[names::QUEUE_WAIT_SECONDS].len(), 5);
    assert!(histograms[names::QUEUE_WAIT_SECONDS]
        .iter()
        .all(|&s| s >= 0.0));
    // Per engine: the mock engines say no device, so the default label stands.
    let infer = format!("{}{{engine=0,device=unnamed}}", names::INFER_SECONDS);
    assert_eq!(histograms[&infer].len(), batches);
    assert_eq!(
        counters[&format!("{}{{engine=0,device=unnamed}}", names::ENGINE_BATCHES_TOTAL)],
        batches as u64
    );
    // Every failure series exists from the start, at zero here.
    for kind in names::FAILURE_KINDS {
        let series = format!(
            "{}{{kind={kind},engine=0,device=unnamed}}",
            names::ENGINE_FAILURES_TOTAL
        );
        assert_eq!(counters[&series], 0, "{series}");
    }
    assert_eq!(gauges[names::ENGINES], 1.0);
    assert_eq!(gauges[names::ENGINES_LOST], 0.0);
    assert_eq!(histograms[names::BATCH_SEQUENCES].iter().sum::<f64>(), 5.0);
    assert_eq!(
        histograms[names::BATCH_TOKENS].iter().sum::<f64>(),
        4.0 + 4.0 * 60.0
    );
    let fill = &histograms[names::BATCH_FILL_RATIO];
    assert_eq!(fill.len(), batches);
    assert!(fill.iter().all(|&f| f > 0.0 && f <= 1.0), "{fill:?}");
    // Blocker 4/200; then 3 x 60 questions (a fourth does not fit 200); then the last one.
    let mut sorted = fill.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(sorted, vec![4.0 / 200.0, 60.0 / 200.0, 180.0 / 200.0]);
}
