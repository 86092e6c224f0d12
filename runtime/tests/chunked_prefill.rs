//! Chunked prefill over real HTTP on the demo model: questions longer than `max_chunk_tokens` run
//! as consecutive chunks carrying their prefix state, and answer as they do whole (within 1e-5
//! per probability), with prefix reuse off and on; the chunks are counted in /metrics; their
//! states are reserved in the in-flight byte budget, and a request whose states do not fit runs
//! whole instead; with reuse on, a question's first chunk resumes from the cached system turn, and
//! goal-less questions over one state run whole so that they share it.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use instinct::server::{AppState, Settings};
use instinct_scheduler::{Bucket, Config};

/// A request of `n` goal-less questions over one accessibility tree of `words` words.
fn request(tag: usize, words: usize, n: usize) -> String {
    let tree: String = (0..words)
        .map(|i| format!("- Button w{} ", (i * 7 + tag) % 101))
        .collect();
    let questions: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#""q{i}":{{"type":"choice","instructions":"pick {i}","criteria":{{"a":"Open {i}","b":"Close","c":"Wait"}}}}"#
            )
        })
        .collect();
    format!(
        r#"{{"state":"{tree}","questions":{{{}}}}}"#,
        questions.join(",")
    )
}

/// A request of `n` goal-less questions (no `instructions`: the state is most of each prompt)
/// over one accessibility tree of `words` words.
fn goal_less(tag: usize, words: usize, n: usize) -> String {
    let tree: String = (0..words)
        .map(|i| format!("- Button w{} ", (i * 7 + tag) % 101))
        .collect();
    let questions: Vec<String> = (0..n)
        .map(|i| format!(r#""q{i}":{{"type":"choice","instructions":null,"criteria":{{"a":"Open {i}","b":"Close"}}}}"#))
        .collect();
    format!(
        r#"{{"state":"{tree}","questions":{{{}}}}}"#,
        questions.join(",")
    )
}

/// A demo server whose scheduler chunks questions longer than `chunk` tokens (`None`: whole),
/// with a prefix cache of `budget` bytes (0: no reuse).
async fn server(chunk: Option<usize>, budget: usize) -> std::net::SocketAddr {
    server_with(
        chunk,
        budget,
        Settings::new(SERVED, MODEL_ID).max_inflight_bytes,
    )
    .await
    .0
}

/// The scheduler of these servers: batches of up to 16 questions, chunks of `chunk` tokens.
fn chunking(chunk: Option<usize>) -> Config {
    Config {
        max_batch_seqs: 16,
        max_chunk_tokens: chunk,
        ..Config::default()
    }
}

/// [`server`] with an in-flight byte budget of `inflight` bytes, and its state.
async fn server_with(
    chunk: Option<usize>,
    budget: usize,
    inflight: usize,
) -> (std::net::SocketAddr, Arc<AppState>) {
    let (ready, _) = demo_ready_with_prefix(chunking(chunk), 1, budget);
    let settings = Settings {
        max_inflight_bytes: inflight,
        ..Settings::new(SERVED, MODEL_ID)
    };
    let state = Arc::new(AppState::new(settings));
    state.set_ready(ready);
    (serve_state(state.clone()).await, state)
}

/// `instinct_prefill_chunks_total` as `addr` exports it.
async fn chunks_counted(addr: std::net::SocketAddr) -> f64 {
    counted(addr, "instinct_prefill_chunks_total").await
}

/// Counter `name` as `addr` exports it (0 before the process first counts it: a counter never
/// incremented has no line). The counters are the process's: tests running beside add to them.
async fn counted(addr: std::net::SocketAddr, name: &str) -> f64 {
    let metrics = exchange(addr, "GET /metrics HTTP/1.1", b"").await;
    let text = String::from_utf8(metrics.body).unwrap();
    let prefix = format!("{name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0.0, |v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_chunk_resumes_from_the_cached_system_turn() {
    let whole = server(None, 0).await;
    let (ready, reuse) = demo_ready_with_prefix(chunking(Some(320)), 1, 256 << 20);
    let state = Arc::new(AppState::new(Settings::new(SERVED, MODEL_ID)));
    state.set_ready(ready);
    let chunked = serve_state(state).await;
    let system = reuse.system_ids().len();
    // A short request runs whole, through reuse: the system turn is snapshotted on the way.
    let short = request(3, 1, 1);
    let (want, short_tokens) = answers(&post(whole, &short).await);
    assert!(short_tokens < 320, "{short_tokens} tokens: not chunked");
    assert_close(&answers(&post(chunked, &short).await).0, &want, "short");
    assert_eq!(reuse.entries(), 1, "the system turn");
    // Three long questions, chunked: each first chunk resumes after the system turn.
    let passes = "instinct_forward_passes_total";
    let before = (
        reuse.stats(),
        chunks_counted(chunked).await,
        counted(chunked, passes).await,
    );
    let long = request(1, 60, 3);
    let (want, tokens) = answers(&post(whole, &long).await);
    assert_close(
        &answers(&post(chunked, &long).await).0,
        &want,
        "long, chunked",
    );
    let after = reuse.stats();
    assert!(
        chunks_counted(chunked).await >= before.1 + 3.0 * 2.0,
        "it ran in chunks"
    );
    assert!(after.passes > before.0.passes);
    assert!(
        counted(chunked, passes).await - before.2 >= (after.passes - before.0.passes) as f64,
        "{passes} counts every pass"
    );
    assert_eq!(after.hits - before.0.hits, 3);
    assert_eq!(after.hit_tokens - before.0.hit_tokens, 3 * system as u64);
    assert_eq!(
        after.computed_tokens - before.0.computed_tokens,
        tokens - 3 * system as u64
    );
}

#[track_caller]
fn assert_close(got: &BTreeMap<String, Vec<f64>>, want: &BTreeMap<String, Vec<f64>>, what: &str) {
    assert_eq!(got.len(), want.len());
    for ((k, p), (_, q)) in got.iter().zip(want) {
        for (x, y) in p.iter().zip(q) {
            assert!((x - y).abs() <= 1e-5, "{what}, {k}: {p:?} vs whole {q:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_questions_answer_as_whole_ones() {
    let whole = server(None, 0).await;
    // 64 is one delta-rule chunk; 100 cuts off its grid.
    let chunked = [
        server(Some(64), 0).await,
        server(Some(100), 0).await,
        server(Some(64), 256 << 20).await,
    ];
    for (tag, words) in [(1, 60), (2, 5)] {
        let body = request(tag, words, 3);
        let (want, tokens) = answers(&post(whole, &body).await);
        if words == 60 {
            assert!(
                tokens > 3 * 300,
                "long enough to be chunked: {tokens} tokens"
            );
        }
        for (s, &addr) in chunked.iter().enumerate() {
            let (got, got_tokens) = answers(&post(addr, &body).await);
            assert_eq!(got_tokens, tokens);
            assert_close(&got, &want, &format!("server {s}, tree of {words} words"));
        }
    }
    let chunks = chunks_counted(chunked[0]).await;
    assert!(chunks >= 3.0 * 5.0, "{chunks} chunks counted");

    // The states are reserved while the request runs: on the demo model a snapshot is 114 KiB
    // plus 2 KiB per token, so three questions of ~350 tokens in chunks of 64 hold megabytes.
    let body = request(1, 60, 3);
    let (want, _) = answers(&post(whole, &body).await);
    let (roomy, roomy_state) = server_with(Some(64), 0, 64 << 20).await;
    let before = chunks_counted(roomy).await;
    assert_close(&answers(&post(roomy, &body).await).0, &want, "roomy budget");
    assert!(chunks_counted(roomy).await > before, "it ran in chunks");
    let peak = roomy_state.inflight.peak();
    assert!(
        peak > 2 << 20,
        "the chunk states were reserved: peak {peak} bytes"
    );
    // A budget that holds the request but not its states: it runs whole, exactly as before.
    let (tight, tight_state) = server_with(Some(64), 0, 512 << 10).await;
    let before = chunks_counted(tight).await;
    let (got, _) = answers(&post(tight, &body).await);
    assert_close(&got, &want, "tight budget");
    assert_eq!(chunks_counted(tight).await, before, "it ran whole");
    assert!(tight_state.inflight.peak() <= 512 << 10);
    assert_eq!(tight_state.inflight.used(), 0, "everything was given back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goal_less_questions_over_one_state_run_whole_and_compute_it_once() {
    let whole = server(None, 0).await;
    let body = goal_less(4, 60, 3);
    let (want, tokens) = answers(&post(whole, &body).await);
    for (budget, shared) in [(256 << 20, true), (0, false)] {
        let (ready, reuse) = demo_ready_with_prefix(chunking(Some(64)), 1, budget);
        let state = Arc::new(AppState::new(Settings::new(SERVED, MODEL_ID)));
        state.set_ready(ready);
        let chunked = serve_state(state.clone()).await;
        let before = reuse.stats();
        let (got, got_tokens) = answers(&post(chunked, &body).await);
        assert_eq!(got_tokens, tokens);
        assert_close(&got, &want, "goal-less");
        if shared {
            // Whole, in one batch: the tree ran once, then each question's options.
            let computed = reuse.stats().computed_tokens - before.computed_tokens;
            assert!(
                2 * computed < tokens,
                "{computed} of {tokens} tokens computed: the state was not shared"
            );
        } else {
            // Without reuse nothing is shared: they run in chunks (their states were reserved).
            assert!(state.inflight.peak() > 1 << 20, "{}", state.inflight.peak());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goal_less_questions_longer_than_every_bucket_still_run_in_chunks() {
    let whole = server(None, 0).await;
    let body = goal_less(5, 60, 2);
    let (want, tokens) = answers(&post(whole, &body).await);
    // Batches of at most 256 tokens: these questions (over 256 each) can only run in chunks.
    let small = Config {
        max_batch_tokens: 256,
        buckets: vec![Bucket::new(256, 16)],
        ..chunking(Some(64))
    };
    let (ready, _reuse) = demo_ready_with_prefix(small, 1, 256 << 20);
    let state = Arc::new(AppState::new(Settings::new(SERVED, MODEL_ID)));
    state.set_ready(ready);
    let chunked = serve_state(state).await;
    let (got, got_tokens) = answers(&post(chunked, &body).await);
    assert!(
        got_tokens / 2 > 256,
        "{got_tokens} tokens: not over the bucket"
    );
    assert_eq!(got_tokens, tokens);
    assert_close(&got, &want, "over every bucket");
}
