//! Chunked prefill: a resumable question longer than `max_chunk_tokens` runs as consecutive
//! chunks, one per batch, each after the previous one completed, with the engine's state carried
//! between them; whole questions go first and chunks take the room they leave (cut to it) in a
//! batch of at most one chunk's worth; nothing is lost or left counted when a chunked request is
//! cancelled, expires or fails. The mock engine resumes its hash of the ids
//! from the carry, so a chunked answer equals the whole question's only if every chunk ran once,
//! in order.

mod common;

use std::time::{Duration, Instant};

use common::*;
use instinct_scheduler::{Config, Failure, Question, RejectReason, StartError, Ticket};

fn config(max_batch_tokens: usize, max_chunk_tokens: Option<usize>) -> Config {
    Config {
        max_batch_tokens,
        max_batch_seqs: 4,
        max_chunk_tokens,
        ..Config::default()
    }
}

/// The batches that ran chunks of the question tagged `tag` (its first chunk starts with the
/// tag; later ones are found by their ids): (batch index, chunk start, chunk ids).
fn chunks_of(h: &Harness, q: &Question) -> Vec<(usize, usize, Vec<u32>)> {
    let mut found = Vec::new();
    for (b, record) in h.batches().iter().enumerate() {
        for (ids, start) in record.seqs.iter().zip(&record.chunk_starts) {
            if let Some(start) = *start {
                if q.ids[start..].starts_with(ids) {
                    found.push((b, start, ids.clone()));
                }
            }
        }
    }
    found
}

/// Every carry the engine left was dropped, each on an engine thread: a carry may hold device
/// memory, whose free from the thread that cancelled could land inside a graph capture.
fn assert_carries_dropped_on_engine_threads(h: &Harness) {
    let threads = h.carries_dropped(LONG);
    assert!(!threads.is_empty(), "some chunk left a carry");
    for t in &threads {
        assert!(t.starts_with("instinct-engine-"), "a carry dropped on {t}");
    }
}

fn assert_settled(h: &Harness) {
    let stats = h.scheduler.stats();
    assert_eq!(stats.in_flight_requests, 0);
    assert_eq!(stats.queued_requests, 0);
    assert_eq!(
        stats.queued_tokens, 0,
        "every chunk's tokens left the queue"
    );
    assert_eq!(stats.queued_sequences, 0);
}

#[test]
fn a_long_question_runs_in_chunks_one_per_batch_and_answers_as_whole() {
    let h = Harness::new(config(64, Some(16)), 1, Duration::ZERO);
    // 50 tokens: chunks of 16, 16, 16 and 2; a question of exactly 16 runs whole.
    let long = question(1, 50, 3);
    let exact = question(2, 16, 2);
    let t = h.submit_all(&[vec![long.clone()], vec![exact.clone()]]);
    let mut t = t.into_iter();
    assert_eq!(
        wait(t.next().unwrap(), LONG).unwrap(),
        expected_answer(std::slice::from_ref(&long))
    );
    assert_eq!(
        wait(t.next().unwrap(), LONG).unwrap(),
        expected_answer(&[exact])
    );
    let chunks = chunks_of(&h, &long);
    let starts: Vec<usize> = chunks.iter().map(|c| c.1).collect();
    assert_eq!(starts, vec![0, 16, 32, 48]);
    let batches: Vec<usize> = chunks.iter().map(|c| c.0).collect();
    assert!(
        batches.windows(2).all(|w| w[0] < w[1]),
        "one chunk per batch, in order: {batches:?}"
    );
    let joined: Vec<u32> = chunks.iter().flat_map(|c| c.2.clone()).collect();
    assert_eq!(joined, long.ids, "the chunks are the question, once");
    assert_eq!(h.times_computed(2), 1);
    assert_settled(&h);
}

/// Runs `requests` all queued before the first batch forms ([`Harness::run_queued`]); every
/// answer is the expected one.
fn run_queued_together(h: &Harness, requests: &[Vec<Question>]) {
    for (q, answer) in requests.iter().zip(h.run_queued(requests)) {
        assert_eq!(answer, expected_answer(q), "nothing is lost");
    }
}

#[test]
fn short_questions_go_before_a_long_questions_chunks() {
    let h = Harness::new(config(32, Some(24)), 1, Duration::ZERO);
    // A long question (chunks of at most 24), then short ones.
    let long = question(1, 64, 2);
    let shorts: Vec<Question> = (10..16).map(|t| question(t, 8, 2)).collect();
    let mut requests = vec![vec![long.clone()]];
    requests.extend(shorts.iter().map(|q| vec![q.clone()]));
    run_queued_together(&h, &requests);
    // Whole questions go first (four fill the first batch, two the second); the long question's
    // first chunk is never cut (it would shorten the cached prefix it may resume from), so it
    // waits for a batch with room for all 24 of its tokens; then one chunk per batch.
    let short_batches: Vec<usize> = shorts
        .iter()
        .map(|q| h.batch_of(q.ids[0]).unwrap())
        .collect();
    assert_eq!(short_batches, vec![0, 0, 0, 0, 1, 1]);
    let chunks = chunks_of(&h, &long);
    let at: Vec<(usize, usize)> = chunks.iter().map(|c| (c.0, c.1)).collect();
    assert_eq!(at, vec![(2, 0), (3, 24), (4, 48)]);
    assert_settled(&h);
}

#[test]
fn a_later_chunk_is_cut_to_the_room_short_questions_leave() {
    let h = Harness::new(config(32, Some(24)), 1, Duration::ZERO);
    // A long question whose first chunk holds the engine (it starts with the gate's mark) while
    // two short ones queue.
    let long = question(GATE_MARK, 64, 2);
    let long_ticket = h.hold_engine_with(long.clone());
    let shorts: Vec<Vec<Question>> = (10..12).map(|t| vec![question(t, 8, 2)]).collect();
    let tickets = h.submit_all(&shorts);
    h.gate.open();
    assert_eq!(
        wait(long_ticket, LONG).unwrap(),
        expected_answer(std::slice::from_ref(&long)),
        "the cut chunks still compute the whole question"
    );
    for (q, t) in shorts.iter().zip(tickets) {
        assert_eq!(wait(t, LONG).unwrap(), expected_answer(q));
    }
    // The second chunk runs beside the short ones, cut to the 8 tokens of 24 they leave; the
    // rest follows in chunks of 24 from there.
    let log = h.log.lock().clone();
    let shapes: Vec<(Vec<Option<usize>>, usize)> = log
        .iter()
        .map(|r| (r.chunk_starts.clone(), r.tokens))
        .collect();
    assert_eq!(
        shapes,
        vec![
            (vec![Some(0)], 24),
            (vec![Some(24), None, None], 24),
            (vec![Some(32)], 24),
            (vec![Some(56)], 8),
        ]
    );
    assert_settled(&h);
}

#[test]
fn a_batch_with_chunks_holds_one_chunks_worth_however_many_long_questions_wait() {
    // Three long questions (chunks of at most 16): a batch never holds more than 16 tokens; all
    // three still finish; the one with the least left runs first, and none is passed over more
    // than OVERDUE_AFTER (8) batches in a row.
    let h = Harness::new(config(64, Some(16)), 1, Duration::ZERO);
    let longs: Vec<Question> = [(1, 48), (2, 40), (3, 48)]
        .iter()
        .map(|&(t, n)| question(t, n, 2))
        .collect();
    let requests: Vec<Vec<Question>> = longs.iter().map(|q| vec![q.clone()]).collect();
    run_queued_together(&h, &requests);
    for record in h.batches() {
        let tokens: usize = record.seqs.iter().map(Vec::len).sum();
        assert!(tokens <= 16, "{tokens} tokens in one batch");
    }
    let batches_of = |q: &Question| chunks_of(&h, q).iter().map(|c| c.0).collect::<Vec<_>>();
    // The 40-token question has the least left from the start: its 3 chunks run first.
    assert_eq!(batches_of(&longs[1]), vec![0, 1, 2]);
    for q in &longs {
        let batches = batches_of(q);
        for w in batches.windows(2) {
            assert!(w[1] - w[0] <= 9, "passed over too long: {batches:?}");
        }
    }
    assert_settled(&h);
}

#[test]
fn with_a_threshold_only_questions_over_it_run_in_chunks() {
    let cfg = Config {
        chunk_over_tokens: Some(40),
        ..config(64, Some(16))
    };
    let h = Harness::new(cfg, 1, Duration::ZERO);
    // 40 tokens: whole, in one batch, though over the chunk size; 41: chunks of 16, 16 and 9.
    let moderate = question(1, 40, 2);
    let long = question(2, 41, 2);
    let requests = [vec![moderate.clone()], vec![long.clone()]];
    for (q, t) in requests.iter().zip(h.submit_all(&requests)) {
        assert_eq!(wait(t, LONG).unwrap(), expected_answer(q));
    }
    assert!(chunks_of(&h, &moderate).is_empty(), "ran whole");
    assert_eq!(h.times_computed(1), 1);
    let starts: Vec<usize> = chunks_of(&h, &long).iter().map(|c| c.1).collect();
    assert_eq!(starts, vec![0, 16, 32]);
    assert_settled(&h);
}

#[test]
fn a_question_longer_than_every_bucket_is_admitted_only_when_it_can_be_chunked() {
    let whole = Harness::new(config(32, None), 1, Duration::ZERO);
    let refused = whole
        .scheduler
        .submit(vec![question(1, 100, 2)], None)
        .unwrap_err();
    assert_eq!(refused.reason, RejectReason::TooLarge);

    let chunked = Harness::new(config(32, Some(32)), 1, Duration::ZERO);
    let long = question(1, 100, 2);
    let t = chunked.scheduler.submit(vec![long.clone()], None).unwrap();
    assert_eq!(
        wait(t, LONG).unwrap(),
        expected_answer(std::slice::from_ref(&long))
    );
    assert_eq!(chunks_of(&chunked, &long).len(), 4);
    // A question the engine cannot resume is never chunked.
    let fixed = Question {
        resumable: false,
        ..question(2, 100, 2)
    };
    let refused = chunked.scheduler.submit(vec![fixed], None).unwrap_err();
    assert_eq!(refused.reason, RejectReason::TooLarge);
    assert_settled(&chunked);
}

#[test]
fn a_chunk_size_that_fits_no_bucket_is_refused_at_start() {
    for chunk in [0, 33] {
        let bad = config(32, Some(chunk));
        assert!(
            matches!(bad.batch_capacity(), Err(StartError::Config(_))),
            "max_chunk_tokens {chunk}"
        );
    }
    assert!(config(32, Some(32)).batch_capacity().is_ok());
}

#[test]
fn a_cancelled_chunked_question_runs_no_more_chunks() {
    let h = Harness::new(config(32, Some(8)), 1, Duration::from_millis(50));
    let long = question(1, 80, 2);
    let ticket = h.scheduler.submit(vec![long.clone()], None).unwrap();
    let until = Instant::now() + LONG;
    while chunks_of(&h, &long).is_empty() {
        assert!(Instant::now() < until, "the first chunk never ran");
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(ticket);
    // The chunk running when it was cancelled may finish; none after it starts.
    std::thread::sleep(Duration::from_millis(100));
    let ran = chunks_of(&h, &long).len();
    assert!(ran <= 2, "{ran} chunks ran");
    h.scheduler.drain();
    assert!(h.scheduler.wait_drained(LONG), "no batch left running");
    assert_eq!(chunks_of(&h, &long).len(), ran);
    assert_settled(&h);
    assert_carries_dropped_on_engine_threads(&h);
}

#[test]
fn a_deadline_passing_after_every_question_started_lets_the_chunks_run_on() {
    let h = Harness::new(config(32, Some(8)), 1, Duration::from_millis(30));
    // 10 chunks of 30 ms; the deadline passes during the third.
    let long = question(1, 80, 2);
    let deadline = Instant::now() + Duration::from_millis(80);
    let ticket = h
        .scheduler
        .submit(vec![long.clone()], Some(deadline))
        .unwrap();
    assert_eq!(
        wait(ticket, LONG).unwrap(),
        expected_answer(std::slice::from_ref(&long)),
        "it reached the model with its first chunk"
    );
    assert_eq!(chunks_of(&h, &long).len(), 10);
    assert_settled(&h);
}

#[test]
fn a_deadline_passing_before_a_question_started_fails_the_request_and_stops_its_chunks() {
    // A batch carrying chunks holds 8 tokens: one chunk a batch. The request's second question
    // waits (the first has less left once started, and its first chunk is not overdue before 8
    // batches of 20 ms), so the deadline finds it not started.
    let h = Harness::new(config(32, Some(8)), 1, Duration::from_millis(20));
    let (first, second) = (question(1, 80, 2), question(2, 80, 2));
    let deadline = Instant::now() + Duration::from_millis(50);
    let ticket = h
        .scheduler
        .submit(vec![first.clone(), second.clone()], Some(deadline))
        .unwrap();
    assert_eq!(wait(ticket, LONG), Err(Failure::DeadlineExceeded));
    h.scheduler.drain();
    assert!(h.scheduler.wait_drained(LONG), "no batch left running");
    let ran = chunks_of(&h, &first).len();
    assert!(ran < 10, "all {ran} chunks ran");
    assert!(chunks_of(&h, &second).is_empty());
    assert_settled(&h);
    assert_carries_dropped_on_engine_threads(&h);
}

#[test]
fn a_failed_chunk_fails_its_request_and_the_rest_never_runs() {
    // One sequence per batch: the failure is the doomed question's alone.
    let one_per_batch = Config {
        max_batch_seqs: 1,
        ..config(32, Some(8))
    };
    let h = Harness::new(one_per_batch, 1, Duration::ZERO);
    // The mock fails a batch whose sequence starts with FAIL_MARK: the first chunk.
    let doomed = question(FAIL_MARK, 40, 2);
    let ok = question(3, 40, 2);
    let tickets = h.submit_all(&[vec![doomed.clone()], vec![ok.clone()]]);
    let mut tickets = tickets.into_iter();
    assert!(matches!(
        wait(tickets.next().unwrap(), LONG),
        Err(Failure::Internal(_))
    ));
    assert_eq!(
        wait(tickets.next().unwrap(), LONG).unwrap(),
        expected_answer(&[ok])
    );
    assert_eq!(chunks_of(&h, &doomed).len(), 1, "only the failed chunk ran");
    assert_settled(&h);
}

/// A long question's second chunk waits in the queue, with the first chunk's carry, while the
/// engine is held: batches hold one sequence and take 50 ms, and a gated question queued while the
/// first chunk runs goes next (whole questions go before chunks). The request's second question
/// has not started (so a deadline still applies). Returns once the gated question runs, with the
/// long question's ticket and the gated one's.
fn hold_a_chunk_in_the_queue(deadline: Option<Instant>) -> (Harness, Question, Ticket, Ticket) {
    let one_per_batch = Config {
        max_batch_seqs: 1,
        ..config(32, Some(8))
    };
    let h = Harness::new(one_per_batch, 1, Duration::from_millis(50));
    let long = question(1, 40, 2);
    let unstarted = question(2, 40, 2);
    let ticket = h
        .scheduler
        .submit(vec![long.clone(), unstarted], deadline)
        .unwrap();
    let until = Instant::now() + LONG;
    while h.scheduler.stats().queued_tokens != 72 {
        assert!(Instant::now() < until, "the first chunk never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    let gated = h.block_engine();
    while h.times_computed(GATE_MARK) == 0 {
        assert!(Instant::now() < until, "the gated question never ran");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        chunks_of(&h, &long).len(),
        1,
        "the first chunk ran, the second waits"
    );
    assert_eq!(h.carries.lock().put, 1);
    (h, long, ticket, gated)
}

/// After the request of [`hold_a_chunk_in_the_queue`] went (by `why`): its carry was not dropped
/// by the thread that ended it, but by the engine once released, and no chunk ran after.
fn release_the_held_chunk(h: &Harness, long: &Question, why: &str) {
    assert!(
        h.carries.lock().dropped_on.is_empty(),
        "not dropped by the thread of the {why}"
    );
    h.gate.open();
    assert_carries_dropped_on_engine_threads(h);
    h.scheduler.drain();
    assert!(h.scheduler.wait_drained(LONG));
    assert_eq!(chunks_of(h, long).len(), 1, "no chunk ran after the {why}");
    assert_settled(h);
}

#[test]
fn a_queued_chunks_carry_is_dropped_by_the_engine_when_its_request_is_cancelled() {
    let (h, long, ticket, _gated) = hold_a_chunk_in_the_queue(None);
    drop(ticket);
    release_the_held_chunk(&h, &long, "cancel");
}

#[test]
fn a_queued_chunks_carry_is_dropped_by_the_engine_when_its_deadline_passes() {
    let deadline = Instant::now() + Duration::from_millis(100);
    let (h, long, ticket, _gated) = hold_a_chunk_in_the_queue(Some(deadline));
    // The engine is still held: the deadline thread fails the request.
    assert_eq!(wait(ticket, LONG), Err(Failure::DeadlineExceeded));
    release_the_held_chunk(&h, &long, "deadline");
}
