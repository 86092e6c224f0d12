//! Batch formation: packing under the bucket shapes, reassembly, ageing.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use instinct_scheduler::{Bucket, Config, Question, Ticket};

fn bucketed_config() -> Config {
    Config {
        max_batch_tokens: 1_024,
        max_batch_seqs: 8,
        buckets: vec![
            Bucket::new(256, 2),
            Bucket::new(512, 4),
            Bucket::new(1_024, 8),
        ],
        max_wait: Duration::from_millis(1),
        ..Config::default()
    }
}

/// 20 requests of 1-4 questions (20-300 tokens), plus one of 4 x 300 tokens that cannot fit one
/// batch.
fn workload() -> Vec<Vec<Question>> {
    let mut rng = Lcg(42);
    let mut requests: Vec<Vec<Question>> = (0..20u32)
        .map(|r| {
            (0..1 + rng.below(4) as u32)
                .map(|q| {
                    question(
                        r * 10 + q,
                        20 + rng.below(281) as usize,
                        2 + rng.below(5) as usize,
                    )
                })
                .collect()
        })
        .collect();
    requests.insert(7, (0..4).map(|q| question(900 + q, 300, 4)).collect());
    requests
}

#[test]
fn batches_under_load_fit_the_buckets_and_requests_are_reassembled_in_order() {
    let config = bucketed_config();
    let buckets = config.buckets.clone();
    let h = Harness::new(config, 1, Duration::ZERO);
    let requests = workload();
    let answers = h.run_queued(&requests);
    for (q, a) in requests.iter().zip(&answers) {
        assert_eq!(a, &expected_answer(q));
    }

    let batches = h.batches();
    assert!(
        batches.iter().any(|b| b.seqs.len() > 1),
        "no batching under load"
    );
    for b in &batches {
        let tokens: usize = b.seqs.iter().map(Vec::len).sum();
        assert_eq!(tokens, b.tokens);
        assert!(
            tokens <= 1_024 && b.seqs.len() <= 8,
            "{tokens} tokens, {} seqs",
            b.seqs.len()
        );
        assert!(buckets.contains(&b.bucket));
        assert!(
            b.bucket.holds(tokens, b.seqs.len()),
            "{:?} does not hold the batch",
            b.bucket
        );
        let smallest = buckets
            .iter()
            .filter(|c| c.holds(tokens, b.seqs.len()))
            .min()
            .unwrap();
        assert_eq!(&b.bucket, smallest, "not the smallest bucket");
    }
    // The 4 x 300-token request spans batches.
    let spans: HashSet<usize> = (900..904).map(|t| h.batch_of(t).unwrap()).collect();
    assert!(
        spans.len() >= 2,
        "1,200 tokens cannot be one batch of <= 1,024"
    );
    // Nothing was computed twice.
    let total: usize = batches.iter().map(|b| b.seqs.len()).sum();
    assert_eq!(total, requests.iter().map(Vec::len).sum::<usize>());
}

#[test]
fn answers_do_not_depend_on_batch_composition() {
    let requests = workload();
    let one_by_one = Harness::new(
        Config {
            max_batch_tokens: 1_024,
            max_batch_seqs: 1,
            ..Config::default()
        },
        1,
        Duration::ZERO,
    );
    let batched = Harness::new(bucketed_config(), 1, Duration::ZERO);
    let alone = one_by_one.run_queued(&requests);
    let together = batched.run_queued(&requests);
    assert!(one_by_one.batches().iter().all(|b| b.seqs.len() == 1));
    assert!(batched.batches().iter().any(|b| b.seqs.len() > 2));
    assert_eq!(alone, together);
    for (q, a) in requests.iter().zip(&alone) {
        assert_eq!(a, &expected_answer(q));
    }
}

/// Submits `make(i)` requests from a thread until `stop` is set; returns their tickets.
fn feeder(
    h: &Arc<Harness>,
    stop: &Arc<AtomicBool>,
    make: fn(u32) -> Question,
) -> std::thread::JoinHandle<Vec<Ticket>> {
    let h = Arc::clone(h);
    let stop = Arc::clone(stop);
    std::thread::spawn(move || {
        let mut tickets = Vec::new();
        let mut i = 0;
        while !stop.load(Ordering::Relaxed) && i < 5_000 {
            if let Ok(t) = h.scheduler.submit(vec![make(i)], None) {
                tickets.push(t);
            }
            i += 1;
            std::thread::sleep(Duration::from_micros(200));
        }
        tickets
    })
}

/// One slow engine (2 ms a batch) behind a queue a stream of requests never fills.
fn streaming_harness() -> Arc<Harness> {
    let config = Config {
        max_queue_requests: 100_000,
        max_queue_tokens: 1_000_000,
        max_batch_tokens: 1_000,
        max_batch_seqs: 64,
        max_wait: Duration::from_millis(1),
        ..Config::default()
    };
    Arc::new(Harness::new(config, 1, Duration::from_millis(2)))
}

#[test]
fn a_long_question_is_not_starved_by_a_stream_of_short_ones() {
    let h = streaming_harness();
    let blocker = h.block_engine();
    // 2,000 tokens of short questions ahead of the long one: two full batches.
    let ahead: Vec<Ticket> = (0..40)
        .map(|t| h.scheduler.submit(vec![question(t, 50, 2)], None).unwrap())
        .collect();
    let long = vec![question(500, 900, 3)];
    let long_ticket = h.scheduler.submit(long.clone(), None).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stream = feeder(&h, &stop, |i| question(10_000 + i, 50, 2));
    std::thread::sleep(Duration::from_millis(5));
    h.gate.open();
    wait(blocker, LONG).unwrap();
    assert_eq!(wait(long_ticket, LONG).unwrap(), expected_answer(&long));
    // Keep the stream going a little longer so it demonstrably outlives the long question.
    std::thread::sleep(Duration::from_millis(30));
    stop.store(true, Ordering::Relaxed);
    for t in ahead.into_iter().chain(stream.join().unwrap()) {
        wait(t, LONG).unwrap();
    }
    let long_batch = h.batch_of(500).unwrap();
    assert!(
        long_batch <= 2,
        "long question ran in batch {long_batch}, expected by batch 2"
    );
    let last_ahead = (0..40).map(|t| h.batch_of(t).unwrap()).max().unwrap();
    assert!(
        last_ahead <= long_batch,
        "a question queued earlier ran later"
    );
    let stream_after = h
        .batches()
        .iter()
        .skip(long_batch + 1)
        .filter(|b| b.tags().iter().any(|&t| t >= 10_000))
        .count();
    assert!(
        stream_after > 0,
        "the short stream must continue after the long question"
    );
}

#[test]
fn a_short_question_does_not_wait_behind_long_ones() {
    let h = streaming_harness();
    let blocker = h.block_engine();
    // Ten long questions (one per batch) queued before the short one, and more keep coming.
    let ahead: Vec<Ticket> = (0..10)
        .map(|t| h.scheduler.submit(vec![question(t, 600, 2)], None).unwrap())
        .collect();
    let short = vec![question(500, 50, 3)];
    let short_ticket = h.scheduler.submit(short.clone(), None).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stream = feeder(&h, &stop, |i| question(10_000 + i, 600, 2));
    h.gate.open();
    wait(blocker, LONG).unwrap();
    assert_eq!(wait(short_ticket, LONG).unwrap(), expected_answer(&short));
    stop.store(true, Ordering::Relaxed);
    drop(stream.join().unwrap()); // cancel the rest of the stream
    for t in ahead {
        wait(t, LONG).unwrap();
    }
    assert_eq!(
        h.batch_of(500),
        Some(0),
        "the short question backfills the first batch"
    );
    assert_eq!(
        h.batch_of(9),
        Some(9),
        "the long ones keep their FIFO order"
    );
}

#[test]
fn an_idle_engine_starts_at_once_however_long_the_fill_wait() {
    // Nothing runs anywhere: the engine must not hold a lone question for the 30 s fill wait.
    let config = Config {
        max_wait: Duration::from_secs(30),
        ..bucketed_config()
    };
    let h = Harness::new(config, 1, Duration::ZERO);
    for round in 0..3u32 {
        let started = std::time::Instant::now();
        let ticket = h
            .scheduler
            .submit(vec![question(round, 16, 2)], None)
            .expect("admitted");
        let answer = wait(ticket, Duration::from_secs(5)).expect("answered without the fill wait");
        assert_eq!(answer, expected_answer(&[question(round, 16, 2)]));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "round {round}: waited {:?}",
            started.elapsed()
        );
    }
    assert!(h.batches().iter().all(|b| b.seqs.len() == 1));
}

#[test]
fn while_a_batch_runs_an_idle_engine_waits_for_its_batch_to_fill() {
    // Engine A runs a gated batch; engine B, idle, gets two questions 20 ms apart. With a 400 ms
    // fill wait while a batch runs, B takes both in one batch.
    let config = Config {
        max_wait: Duration::from_millis(400),
        ..bucketed_config()
    };
    let h = Harness::new(config, 2, Duration::ZERO);
    let blocker = h
        .scheduler
        .submit(vec![question(GATE_MARK, 4, 2)], None)
        .expect("blocker admitted");
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while h
        .scheduler
        .stats()
        .engines
        .iter()
        .all(|e| e.busy_since.is_none())
    {
        assert!(
            std::time::Instant::now() < until,
            "no engine started the blocker"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let first = h.scheduler.submit(vec![question(1, 16, 2)], None).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let second = h.scheduler.submit(vec![question(2, 16, 2)], None).unwrap();
    wait(first, LONG).unwrap();
    wait(second, LONG).unwrap();
    h.gate.open();
    wait(blocker, LONG).unwrap();
    let batches = h.batches();
    assert!(
        batches.iter().any(|b| b.tags() == vec![1, 2]),
        "the two questions ran apart: {:?}",
        batches.iter().map(Record::tags).collect::<Vec<_>>()
    );
}
