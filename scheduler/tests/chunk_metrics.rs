//! Chunked prefill's metrics, read back through a debugging recorder (its own test binary: the
//! recorder is global): every chunk is counted, and a chunked question waits once, until its
//! first chunk starts; cut and overdue chunks are counted apart.

mod common;

use std::time::Duration;

use common::*;
use instinct_scheduler::{telemetry as names, Config};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// The chunk counters since the last snapshot (the debugging recorder hands counters over and
/// starts them again): (chunks, cut, overdue).
fn chunk_counts(snapshotter: &Snapshotter) -> (u64, u64, u64) {
    let mut counts = (0, 0, 0);
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let DebugValue::Counter(n) = value else {
            continue;
        };
        match key.key().name() {
            names::PREFILL_CHUNKS_TOTAL => counts.0 = n,
            names::PREFILL_CHUNKS_CUT_TOTAL => counts.1 = n,
            names::PREFILL_CHUNKS_OVERDUE_TOTAL => counts.2 = n,
            _ => {}
        }
    }
    counts
}

/// Chunks of at most 16 tokens, batches of at most 32.
fn chunking() -> Config {
    Config {
        max_batch_tokens: 32,
        max_chunk_tokens: Some(16),
        ..Config::default()
    }
}

#[test]
fn chunks_are_counted_cut_and_overdue_apart_and_a_chunked_question_waits_once() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("first recorder of this binary");
    let config = chunking();
    // 100 ms a batch: a wait measured at a later chunk would include the earlier chunks' runs.
    let h = Harness::new(config, 1, Duration::from_millis(100));
    // 40 tokens: chunks of 16, 16 and 8, the first after the whole question of 10 (it leaves 6
    // of the 16 tokens a batch with a chunk holds, and a first chunk is not cut).
    let requests = vec![vec![question(1, 40, 2)], vec![question(2, 10, 2)]];
    for (q, t) in requests.iter().zip(h.submit_all(&requests)) {
        assert_eq!(wait(t, LONG).unwrap(), expected_answer(q));
    }
    let (mut chunks, mut waits) = (None, None);
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        match (key.key().name(), value) {
            (names::PREFILL_CHUNKS_TOTAL, DebugValue::Counter(n)) => chunks = Some(n),
            (names::QUEUE_WAIT_SECONDS, DebugValue::Histogram(v)) => {
                waits = Some(v.into_iter().map(|w| w.into_inner()).collect::<Vec<f64>>())
            }
            (names::PREFILL_CHUNKS_CUT_TOTAL | names::PREFILL_CHUNKS_OVERDUE_TOTAL, v) => {
                assert_eq!(v, DebugValue::Counter(0), "no chunk was cut or overdue");
            }
            _ => {}
        }
    }
    assert_eq!(chunks, Some(3));
    let waits = waits.expect("waits recorded");
    assert_eq!(
        waits.len(),
        2,
        "one wait per question, not per chunk: {waits:?}"
    );
    // The whole question started in the first batch, the chunked one in the second (its wait
    // ends at its first chunk's start, not at a later chunk's, 200 ms on).
    assert!(waits.iter().all(|&w| w < 0.18), "{waits:?}");

    // A long question's first chunk holds the engine (it starts with the gate's mark) while a
    // short question queues: the second chunk is cut to the 6 tokens it leaves of 16.
    let h = Harness::new(chunking(), 1, Duration::ZERO);
    let long = question(GATE_MARK, 40, 2);
    let held = h.hold_engine_with(long.clone());
    let short = vec![question(3, 10, 2)];
    let beside = h.submit_all(std::slice::from_ref(&short)).remove(0);
    h.gate.open();
    assert_eq!(wait(held, LONG).unwrap(), expected_answer(&[long]));
    assert_eq!(wait(beside, LONG).unwrap(), expected_answer(&short));
    // Chunks 0..16, 16..22 (cut), 22..38, 38..40.
    assert_eq!(chunk_counts(&snapshotter), (4, 1, 0));

    // A first chunk behind 20 whole questions of 16 tokens (two fill a batch, none leaves it
    // room): left out of 8 batches, it goes first in the ninth.
    let h = Harness::new(chunking(), 1, Duration::ZERO);
    let mut requests = vec![vec![question(4, 40, 2)]];
    requests.extend((10..30).map(|t| vec![question(t, 16, 2)]));
    for (q, answer) in requests.iter().zip(h.run_queued(&requests)) {
        assert_eq!(answer, expected_answer(q));
    }
    let first_chunk = h.batches().iter().position(|r| r.tags().contains(&4));
    assert_eq!(first_chunk, Some(8));
    assert_eq!(chunk_counts(&snapshotter), (3, 0, 1));
}
