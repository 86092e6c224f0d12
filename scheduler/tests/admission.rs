//! Admission: bounded queue, backpressure, cancellation, requests that can never run.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use instinct_scheduler::{Config, Question, RejectReason, Ticket};

#[test]
fn burst_over_capacity_rejects_some_and_answers_every_accepted_request_once() {
    let config = Config {
        max_queue_requests: 16,
        max_queue_tokens: 3_000,
        max_batch_tokens: 1_024,
        max_batch_seqs: 8,
        max_wait: Duration::from_millis(1),
        ..Config::default()
    };
    let h = Arc::new(Harness::new(config, 1, Duration::from_millis(1)));
    let submitters: Vec<_> = (0..4u32)
        .map(|t| {
            let h = Arc::clone(&h);
            std::thread::spawn(move || {
                let mut rng = Lcg(u64::from(t) + 7);
                let mut accepted: Vec<(Vec<Question>, Ticket)> = Vec::new();
                let mut rejected = Vec::new();
                for r in 0..150u32 {
                    let n = 1 + rng.below(3) as u32;
                    let questions: Vec<Question> = (0..n)
                        .map(|q| {
                            let tag = t * 100_000 + r * 10 + q;
                            question(tag, 10 + rng.below(290) as usize, 2 + rng.below(5) as usize)
                        })
                        .collect();
                    match h.scheduler.submit(questions.clone(), None) {
                        Ok(ticket) => accepted.push((questions, ticket)),
                        Err(rejection) => rejected.push((questions, rejection)),
                    }
                    // Bursts of 10 (4 threads x 10 x ~300 tokens overflow the 3,000-token
                    // queue each time), with pauses in which the engine drains some.
                    if r % 10 == 9 {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                (accepted, rejected)
            })
        })
        .collect();

    let mut offered = 0;
    let mut accepted_requests = 0;
    let mut rejected_requests = 0;
    let mut answered = 0;
    let mut accepted_tags = Vec::new();
    let mut rejected_tags = Vec::new();
    for s in submitters {
        let (accepted, rejected) = s.join().unwrap();
        offered += accepted.len() + rejected.len();
        accepted_requests += accepted.len();
        rejected_requests += rejected.len();
        for (questions, rejection) in rejected {
            assert!(
                matches!(
                    rejection.reason,
                    RejectReason::QueueFullRequests | RejectReason::QueueFullTokens
                ),
                "{rejection:?}"
            );
            let retry = rejection
                .retry_after
                .expect("queue-full rejections say when to retry");
            assert!(retry >= Duration::from_secs(1) && retry <= Duration::from_secs(60));
            rejected_tags.extend(questions.iter().map(|q| q.ids[0]));
        }
        for (questions, ticket) in accepted {
            let answer = wait(ticket, LONG).expect("accepted request answered");
            assert_eq!(answer, expected_answer(&questions), "answer mixed up");
            accepted_tags.extend(questions.iter().map(|q| q.ids[0]));
            answered += 1;
        }
    }
    assert_eq!(offered, 600);
    assert!(
        !rejected_tags.is_empty(),
        "the burst must overflow the queue"
    );
    assert!(
        answered > 16,
        "more than one queue's worth must be served: {answered}"
    );
    assert_eq!(offered, accepted_requests + rejected_requests);
    assert_eq!(answered, accepted_requests, "an accepted request was lost");

    // Every accepted question computed exactly once, no rejected one computed at all.
    let mut computed: HashMap<u32, usize> = HashMap::new();
    for record in h.log.lock().iter() {
        for tag in record.tags() {
            *computed.entry(tag).or_default() += 1;
        }
    }
    for tag in &accepted_tags {
        assert_eq!(
            computed.get(tag),
            Some(&1),
            "question {tag} computed != once"
        );
    }
    for tag in &rejected_tags {
        assert!(
            !computed.contains_key(tag),
            "rejected question {tag} was computed"
        );
    }
    assert_eq!(computed.len(), accepted_tags.len());
    let stats = h.scheduler.stats();
    assert_eq!(
        (
            stats.queued_requests,
            stats.queued_tokens,
            stats.in_flight_requests
        ),
        (0, 0, 0)
    );
}

#[test]
fn dropped_tickets_free_their_capacity_and_are_never_computed() {
    let config = Config {
        max_queue_requests: 4,
        ..Config::default()
    };
    let h = Harness::new(config, 1, Duration::ZERO);
    let blocker = h.block_engine();
    let requests: Vec<Vec<Question>> = (1..=4)
        .map(|t| vec![question(t, 50, 3), question(t + 100, 20, 2)])
        .collect();
    let mut tickets: Vec<Option<Ticket>> = requests
        .iter()
        .map(|q| Some(h.scheduler.submit(q.clone(), None).expect("room for 4")))
        .collect();
    let full = h
        .scheduler
        .submit(vec![question(9, 10, 2)], None)
        .unwrap_err();
    assert_eq!(full.reason, RejectReason::QueueFullRequests);
    assert_eq!(h.scheduler.stats().queued_tokens, 4 * 70);

    // The clients of requests 2 and 3 hang up.
    tickets[1] = None;
    tickets[2] = None;
    let stats = h.scheduler.stats();
    assert_eq!((stats.queued_requests, stats.queued_tokens), (2, 2 * 70));
    assert_eq!(stats.queued_sequences, 4);

    let late: Vec<Vec<Question>> = (5..=6).map(|t| vec![question(t, 30, 2)]).collect();
    let late_tickets: Vec<Ticket> = late
        .iter()
        .map(|q| {
            h.scheduler
                .submit(q.clone(), None)
                .expect("capacity was freed")
        })
        .collect();

    h.gate.open();
    wait(blocker, LONG).unwrap();
    for i in [0, 3] {
        let answer = wait(tickets[i].take().unwrap(), LONG).unwrap();
        assert_eq!(answer, expected_answer(&requests[i]));
    }
    for (q, t) in late.iter().zip(late_tickets) {
        assert_eq!(wait(t, LONG).unwrap(), expected_answer(q));
    }
    for tag in [2, 102, 3, 103] {
        assert_eq!(
            h.times_computed(tag),
            0,
            "cancelled question {tag} computed"
        );
    }
    for tag in [1, 101, 4, 104, 5, 6] {
        assert_eq!(h.times_computed(tag), 1);
    }
    assert_eq!(h.scheduler.stats().in_flight_requests, 0);
}

#[test]
fn requests_that_can_never_run_or_are_malformed_are_refused_without_retry() {
    let config = Config {
        max_queue_tokens: 1_000,
        max_batch_tokens: 512,
        max_batch_seqs: 4,
        ..Config::default()
    };
    let h = Harness::new(config, 1, Duration::ZERO);
    let cases: Vec<(Vec<Question>, RejectReason)> = vec![
        (vec![question(1, 513, 2)], RejectReason::TooLarge),
        (
            (2..5).map(|t| question(t, 400, 2)).collect(),
            RejectReason::TooLarge,
        ),
        (vec![], RejectReason::Invalid),
        (vec![Question::text(vec![], 2)], RejectReason::Invalid),
        (vec![question(5, 10, 0)], RejectReason::Invalid),
    ];
    for (questions, reason) in cases {
        let rejection = h.scheduler.submit(questions, None).unwrap_err();
        assert_eq!(rejection.reason, reason);
        assert_eq!(rejection.retry_after, None);
    }
    // The largest question that fits one batch is served.
    let edge = vec![question(6, 512, 2)];
    let ticket = h.scheduler.submit(edge.clone(), None).unwrap();
    assert_eq!(wait(ticket, LONG).unwrap(), expected_answer(&edge));
    assert_eq!(
        h.times_computed(1) + h.times_computed(2) + h.times_computed(5),
        0
    );
}

#[test]
fn retry_after_follows_the_measured_drain_rate() {
    // ~100 tokens per 20 ms batch = ~5,000 tokens/s; a 50,000-token backlog is ~10 s.
    let config = Config {
        max_queue_requests: 10_000,
        max_queue_tokens: 50_000,
        max_batch_tokens: 100,
        max_batch_seqs: 1,
        max_wait: Duration::ZERO,
        ..Config::default()
    };
    let h = Harness::new(config, 1, Duration::from_millis(20));
    let mut tickets = Vec::new();
    for t in 0..500 {
        tickets.push(h.scheduler.submit(vec![question(t, 100, 2)], None).unwrap());
    }
    // Let a few batches complete so the rate is measured.
    std::thread::sleep(Duration::from_millis(150));
    let mut t = 1_000;
    let rejection = loop {
        match h.scheduler.submit(vec![question(t, 100, 2)], None) {
            Ok(ticket) => tickets.push(ticket),
            Err(r) => break r,
        }
        t += 1;
    };
    assert_eq!(rejection.reason, RejectReason::QueueFullTokens);
    let retry = rejection.retry_after.unwrap().as_secs_f64();
    assert!((4.0..=40.0).contains(&retry), "retry_after {retry} s");
    drop(tickets);
}
