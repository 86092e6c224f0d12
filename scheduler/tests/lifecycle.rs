//! Deadlines, drain and shutdown, engine failures, several engines, liveness.

mod common;

use std::time::{Duration, Instant};

use common::*;
use instinct_scheduler::{Config, Failure, RejectReason, Ticket};

#[test]
fn a_request_past_its_deadline_fails_before_reaching_the_model() {
    let h = Harness::new(Config::default(), 1, Duration::ZERO);
    let blocker = h.block_engine();
    let submitted = Instant::now();
    let late = h
        .scheduler
        .submit(
            vec![question(1, 30, 2), question(2, 30, 2)],
            Some(submitted + Duration::from_millis(30)),
        )
        .unwrap();
    let patient_q = vec![question(3, 30, 2)];
    let patient = h.scheduler.submit(patient_q.clone(), None).unwrap();
    // The engine is still blocked: the deadline thread fails the request on time.
    assert_eq!(wait(late, LONG), Err(Failure::DeadlineExceeded));
    let waited = submitted.elapsed();
    assert!(
        waited >= Duration::from_millis(30) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    let stats = h.scheduler.stats();
    assert_eq!((stats.queued_requests, stats.queued_sequences), (1, 1));

    h.gate.open();
    wait(blocker, LONG).unwrap();
    assert_eq!(wait(patient, LONG).unwrap(), expected_answer(&patient_q));
    assert_eq!(h.times_computed(1) + h.times_computed(2), 0);
}

#[test]
fn the_default_deadline_applies_to_requests_without_one() {
    let config = Config {
        default_deadline: Some(Duration::from_millis(20)),
        ..Config::default()
    };
    let h = Harness::new(config, 1, Duration::ZERO);
    let blocker = h.block_engine();
    let ticket = h.scheduler.submit(vec![question(1, 10, 2)], None).unwrap();
    assert_eq!(wait(ticket, LONG), Err(Failure::DeadlineExceeded));
    h.gate.open();
    // The blocker was admitted before and was already running: it completes.
    wait(blocker, LONG).unwrap();
    assert_eq!(h.times_computed(1), 0);
}

#[test]
fn drain_refuses_new_work_and_finishes_what_was_accepted() {
    let h = Harness::new(Config::default(), 1, Duration::ZERO);
    let blocker = h.block_engine();
    let requests: Vec<_> = (0..5)
        .map(|t| vec![question(t, 40, 3), question(t + 50, 20, 2)])
        .collect();
    let tickets: Vec<Ticket> = h.submit_all(&requests);
    h.scheduler.drain();
    assert!(h.scheduler.is_draining());
    let refused = h
        .scheduler
        .submit(vec![question(99, 10, 2)], None)
        .unwrap_err();
    assert_eq!(refused.reason, RejectReason::Draining);
    assert!(refused.retry_after.is_some());
    assert!(
        !h.scheduler.wait_drained(Duration::from_millis(20)),
        "work is still blocked"
    );

    h.gate.open();
    assert!(h.scheduler.wait_drained(LONG));
    wait(blocker, LONG).unwrap();
    for (q, t) in requests.iter().zip(tickets) {
        assert_eq!(wait(t, LONG).unwrap(), expected_answer(q));
    }
    assert_eq!(h.times_computed(99), 0);
    assert!(h.scheduler.shutdown(LONG));
    let stats = h.scheduler.stats();
    assert!(stats.engines.iter().all(|e| e.exited));
    assert_eq!(
        h.scheduler
            .submit(vec![question(98, 10, 2)], None)
            .unwrap_err()
            .reason,
        RejectReason::Draining
    );
}

#[tokio::test]
async fn async_tickets_and_drained_future() {
    let h = Harness::new(Config::default(), 1, Duration::from_millis(1));
    let requests: Vec<_> = (0..8).map(|t| vec![question(t, 25, 4)]).collect();
    let tickets: Vec<Ticket> = h.submit_all(&requests);
    h.scheduler.drain();
    let drained = h.scheduler.drained();
    for (q, t) in requests.iter().zip(tickets) {
        assert_eq!(t.await.unwrap().probabilities, expected_answer(q));
    }
    tokio::time::timeout(LONG, drained)
        .await
        .expect("drained resolves");
    assert_eq!(h.scheduler.stats().in_flight_requests, 0);
}

#[test]
fn shutdown_without_drain_time_fails_what_is_left_once() {
    let h = Harness::new(Config::default(), 1, Duration::ZERO);
    let blocker = h.block_engine();
    let queued = h.scheduler.submit(vec![question(1, 10, 2)], None).unwrap();
    let opener = {
        let gate = std::sync::Arc::clone(&h.gate);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            gate.open();
        })
    };
    // Grace too short for the blocked engine: everything unanswered fails with ShuttingDown, the
    // join waits for the running batch.
    assert!(!h.scheduler.shutdown(Duration::from_millis(10)));
    opener.join().unwrap();
    assert_eq!(wait(queued, LONG), Err(Failure::ShuttingDown));
    assert_eq!(wait(blocker, LONG), Err(Failure::ShuttingDown));
    assert_eq!(h.times_computed(1), 0);
}

#[test]
fn an_engine_error_or_panic_fails_only_that_batch_and_the_thread_keeps_serving() {
    let config = Config {
        max_batch_seqs: 1,
        ..Config::default()
    };
    let h = Harness::new(config, 1, Duration::ZERO);
    let good1 = vec![question(1, 10, 2)];
    let t_good1 = h.scheduler.submit(good1.clone(), None).unwrap();
    let t_fail = h
        .scheduler
        .submit(vec![question(FAIL_MARK, 10, 2)], None)
        .unwrap();
    let t_panic = h
        .scheduler
        .submit(vec![question(PANIC_MARK, 10, 2)], None)
        .unwrap();
    let t_short = h
        .scheduler
        .submit(vec![question(SHORT_MARK, 10, 2)], None)
        .unwrap();
    // A request with a good question and a failing one fails as a whole.
    let t_mixed = h
        .scheduler
        .submit(vec![question(2, 10, 2), question(FAIL_MARK, 10, 2)], None)
        .unwrap();
    let good2 = vec![question(3, 10, 2)];
    let t_good2 = h.scheduler.submit(good2.clone(), None).unwrap();

    assert_eq!(wait(t_good1, LONG).unwrap(), expected_answer(&good1));
    for (ticket, needle) in [
        (t_fail, "mock failure"),
        (t_panic, "panicked: mock panic"),
        (t_short, "0 results for 1 sequences"),
        (t_mixed, "mock failure"),
    ] {
        match wait(ticket, LONG) {
            Err(Failure::Internal(message)) => assert!(message.contains(needle), "{message}"),
            other => panic!("expected an internal failure, got {other:?}"),
        }
    }
    assert_eq!(wait(t_good2, LONG).unwrap(), expected_answer(&good2));
    let after = vec![question(4, 10, 2)];
    let t_after = h.scheduler.submit(after.clone(), None).unwrap();
    assert_eq!(wait(t_after, LONG).unwrap(), expected_answer(&after));
    let engine = h.scheduler.stats().engines[0];
    assert_eq!(engine.failed_batches, 4);
    assert!(!engine.exited);
}

#[test]
fn a_failing_batch_fails_exactly_its_own_requests() {
    let h = Harness::new(Config::default(), 1, Duration::ZERO);
    let blocker = h.block_engine();
    // These three are queued together and form one batch.
    let together: Vec<Ticket> = [
        question(1, 10, 2),
        question(FAIL_MARK, 10, 2),
        question(2, 10, 2),
    ]
    .into_iter()
    .map(|q| h.scheduler.submit(vec![q], None).unwrap())
    .collect();
    h.gate.open();
    wait(blocker, LONG).unwrap();
    for t in together {
        assert!(matches!(wait(t, LONG), Err(Failure::Internal(_))));
    }
    assert_eq!(h.batch_of(1), h.batch_of(FAIL_MARK));
    let later = vec![question(3, 10, 2)];
    let t = h.scheduler.submit(later.clone(), None).unwrap();
    assert_eq!(wait(t, LONG).unwrap(), expected_answer(&later));
}

#[test]
fn two_engines_pull_from_one_queue() {
    let config = Config {
        max_batch_seqs: 2,
        ..Config::default()
    };
    let h = Harness::new(config, 2, Duration::from_millis(5));
    let requests: Vec<_> = (0..30)
        .map(|t| vec![question(t, 20, 2), question(t + 100, 20, 3)])
        .collect();
    let tickets: Vec<Ticket> = h.submit_all(&requests);
    for (q, t) in requests.iter().zip(tickets) {
        assert_eq!(wait(t, LONG).unwrap(), expected_answer(q));
    }
    let per_engine: Vec<usize> = (0..2)
        .map(|e| h.log.lock().iter().filter(|r| r.engine == e).count())
        .collect();
    assert!(
        per_engine.iter().all(|&n| n > 0),
        "both engines work: {per_engine:?}"
    );
    let stats = h.scheduler.stats();
    assert_eq!(stats.engines.len(), 2);
    assert_eq!(
        stats
            .engines
            .iter()
            .map(|e| e.batches as usize)
            .sum::<usize>(),
        per_engine.iter().sum()
    );
}

#[test]
fn heartbeats_tell_an_idle_engine_from_a_wedged_one() {
    let config = Config {
        heartbeat_interval: Duration::from_millis(5),
        ..Config::default()
    };
    let h = Harness::new(config, 1, Duration::ZERO);
    let first = h.scheduler.stats().engines[0].last_heartbeat;
    std::thread::sleep(Duration::from_millis(40));
    let idle = h.scheduler.stats().engines[0];
    assert!(idle.last_heartbeat > first, "an idle engine keeps beating");
    assert!(!idle.is_wedged(Instant::now(), Duration::from_millis(100)));
    assert!(idle.busy_since.is_none());

    let blocker = h.block_engine();
    std::thread::sleep(Duration::from_millis(150));
    let stuck = h.scheduler.stats().engines[0];
    assert!(stuck.busy_since.is_some());
    assert!(stuck.is_wedged(Instant::now(), Duration::from_millis(100)));
    h.gate.open();
    wait(blocker, LONG).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let back = h.scheduler.stats().engines[0];
    assert!(!back.is_wedged(Instant::now(), Duration::from_millis(100)));
}

#[test]
fn answers_report_queue_and_infer_time() {
    let h = Harness::new(Config::default(), 1, Duration::from_millis(20));
    let blocker = h.block_engine();
    let submitted = Instant::now();
    let questions = vec![question(1, 10, 2)];
    let ticket = h.scheduler.submit(questions.clone(), None).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    h.gate.open();
    wait(blocker, LONG).unwrap();
    let answer = wait_answer(ticket, LONG).unwrap();
    let total = submitted.elapsed();
    assert_eq!(answer.probabilities, expected_answer(&questions));
    // Queued behind the blocked batch (>= 30 ms + its 20 ms run), then one 20 ms batch.
    assert!(
        answer.queued >= Duration::from_millis(45),
        "{:?}",
        answer.queued
    );
    assert!(
        answer.infer >= Duration::from_millis(20),
        "{:?}",
        answer.infer
    );
    assert!(answer.queued + answer.infer <= total);
}
