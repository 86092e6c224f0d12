//! Fatal engine errors: an engine whose device is lost takes no more batches; the others keep
//! serving; once every engine is lost, what is left fails, new requests are refused and
//! `all_engines_lost` resolves.

mod common;

use std::time::{Duration, Instant};

use common::*;
use instinct_scheduler::{Config, Failure, RejectReason};

/// Waits (polling) until `done` holds, or fails the test.
fn eventually(what: &str, done: impl Fn() -> bool) {
    let until = Instant::now() + LONG;
    while !done() {
        assert!(Instant::now() < until, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The failure of a request whose batch met the lost device, or that was left when it was lost.
fn assert_device_lost(result: Result<Vec<Vec<f32>>, Failure>) {
    match result {
        Err(Failure::Internal(m)) => assert!(m.contains("device is lost"), "{m}"),
        other => panic!("expected an internal failure, got {other:?}"),
    }
}

fn lost_resolves(h: &Harness, within: Duration) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async { tokio::time::timeout(within, h.scheduler.all_engines_lost()).await })
        .is_ok()
}

#[test]
fn the_last_engine_lost_fails_what_is_left_and_refuses_new_work() {
    let h = Harness::new(Config::default(), 1, Duration::ZERO);
    let blocker = h.block_engine();
    // Queued behind the blocker: the fatal batch first, then work that can never run.
    let fatal = h
        .scheduler
        .submit(vec![question(FATAL_MARK, 8, 2)], None)
        .unwrap();
    assert!(!lost_resolves(&h, Duration::from_millis(20)));
    h.gate.open();
    wait(blocker, LONG).unwrap();
    assert_device_lost(wait(fatal, LONG));
    assert!(lost_resolves(&h, LONG), "all_engines_lost resolves");
    // `lost` is set before waiters are told; the thread ends just after, so `exited` may lag.
    assert!(h.scheduler.stats().engines[0].lost);
    eventually("the lost engine's thread exits", || {
        h.scheduler.stats().engines[0].exited
    });
    let stats = h.scheduler.stats();
    assert_eq!(stats.serving_engines(), 0);
    assert!(
        !stats.engines[0].is_wedged(Instant::now(), Duration::ZERO),
        "a lost engine is not a wedged one"
    );
    assert_eq!(stats.in_flight_requests, 0);
    let refused = h
        .scheduler
        .submit(vec![question(5, 8, 2)], None)
        .unwrap_err();
    assert_eq!(refused.reason, RejectReason::NoEngine);
    assert!(refused.retry_after.is_some());
}

#[test]
fn requests_queued_when_the_last_engine_is_lost_fail_at_once() {
    let h = Harness::new(Config::default(), 1, Duration::ZERO);
    let blocker = h.block_engine();
    // The fatal question and the next one are planned as separate batches: the second one waits
    // in the queue when the engine dies.
    let fatal = h
        .scheduler
        .submit(vec![question(FATAL_MARK, 8, 2)], None)
        .unwrap();
    let stranded: Vec<_> = (0..3)
        .map(|t| {
            h.scheduler
                .submit(vec![question(10 + t, 8, 2)], None)
                .unwrap()
        })
        .collect();
    h.gate.open();
    wait(blocker, LONG).unwrap();
    assert!(matches!(wait(fatal, LONG), Err(Failure::Internal(_))));
    for t in stranded {
        // Either they shared the fatal batch or they were stranded: both fail, none hangs.
        assert_device_lost(wait(t, LONG));
    }
    assert!(lost_resolves(&h, LONG));
    assert_eq!(h.scheduler.stats().in_flight_requests, 0);
}

#[test]
fn one_engine_lost_of_two_leaves_the_other_serving_everything() {
    let config = Config {
        max_batch_seqs: 2,
        ..Config::default()
    };
    let h = Harness::new(config, 2, Duration::from_millis(2));
    let fatal = h
        .scheduler
        .submit(vec![question(FATAL_MARK, 8, 2)], None)
        .unwrap();
    assert!(matches!(wait(fatal, LONG), Err(Failure::Internal(_))));
    eventually("one engine lost", || {
        h.scheduler
            .stats()
            .engines
            .iter()
            .filter(|e| e.lost)
            .count()
            == 1
    });
    let lost_engine = h
        .scheduler
        .stats()
        .engines
        .iter()
        .position(|e| e.lost)
        .unwrap();
    let batches_before = h.log.lock().len();
    let requests: Vec<_> = (0..20)
        .map(|t| vec![question(t, 12, 2), question(t + 100, 12, 3)])
        .collect();
    let tickets = h.submit_all(&requests);
    for (q, t) in requests.iter().zip(tickets) {
        assert_eq!(
            wait(t, LONG).unwrap(),
            expected_answer(q),
            "nothing is lost"
        );
    }
    let after: Vec<usize> = h.log.lock()[batches_before..]
        .iter()
        .map(|r| r.engine)
        .collect();
    assert!(!after.is_empty());
    assert!(
        after.iter().all(|&e| e != lost_engine),
        "the lost engine ran no batch after its fatal error: {after:?}"
    );
    assert_eq!(h.scheduler.stats().serving_engines(), 1);
    assert!(!lost_resolves(&h, Duration::from_millis(20)));
}

#[test]
fn a_slow_engine_and_a_fast_one_share_the_queue_by_speed_and_lose_nothing() {
    use instinct_scheduler::{Engine, Scheduler};
    use std::sync::Arc;

    let log = Log::default();
    let gate = Arc::new(Gate::default());
    gate.open();
    let engines: Vec<Box<dyn Engine>> = [Duration::from_millis(30), Duration::from_millis(3)]
        .into_iter()
        .enumerate()
        .map(|(id, delay)| {
            Box::new(MockEngine {
                id,
                delay,
                log: log.clone(),
                gate: gate.clone(),
                carries: Default::default(),
            }) as Box<dyn Engine>
        })
        .collect();
    let config = Config {
        max_batch_seqs: 2,
        ..Config::default()
    };
    let scheduler = Scheduler::start(config, engines).unwrap();
    let requests: Vec<_> = (0..60).map(|t| vec![question(t, 10, 2)]).collect();
    let tickets: Vec<_> = requests
        .iter()
        .map(|q| scheduler.submit(q.clone(), None).unwrap())
        .collect();
    for (q, t) in requests.iter().zip(tickets) {
        assert_eq!(wait(t, LONG).unwrap(), expected_answer(q));
    }
    let per_engine: Vec<usize> = (0..2)
        .map(|e| log.lock().iter().filter(|r| r.engine == e).count())
        .collect();
    // Whichever engine is free takes the next batch: the fast one runs several times as many
    // (10x faster; 3x leaves room for a loaded machine), the slow one still runs some.
    assert!(per_engine[0] >= 1, "{per_engine:?}");
    assert!(per_engine[1] >= 3 * per_engine[0], "{per_engine:?}");
    let computed: usize = log.lock().iter().map(|r| r.seqs.len()).sum();
    assert_eq!(computed, 60, "every question ran exactly once");
}
