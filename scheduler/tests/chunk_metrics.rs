//! Chunked prefill's metrics, read back through a debugging recorder (its own test binary: the
//! recorder is global): every chunk is counted, and a chunked question waits once, until its
//! first chunk starts.

mod common;

use std::time::Duration;

use common::*;
use instinct_scheduler::{telemetry as names, Config};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

#[test]
fn chunks_are_counted_and_a_chunked_question_waits_once() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("first recorder of this binary");
    let config = Config {
        max_batch_tokens: 32,
        max_chunk_tokens: Some(16),
        ..Config::default()
    };
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
}
