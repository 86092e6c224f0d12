//! Chunked prefill over real HTTP on the demo model: questions longer than `max_chunk_tokens` run
//! as consecutive chunks carrying their prefix state, and answer as they do whole (within 1e-5
//! per probability), with prefix reuse off and on; the chunks are counted in /metrics.

mod common;

use std::sync::Arc;

use common::*;
use instinct::server::{AppState, Settings};
use instinct_scheduler::Config;

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

/// A demo server whose scheduler chunks questions longer than `chunk` tokens (`None`: whole),
/// with a prefix cache of `budget` bytes (0: no reuse).
async fn server(chunk: Option<usize>, budget: usize) -> std::net::SocketAddr {
    let config = Config {
        max_batch_seqs: 16,
        max_chunk_tokens: chunk,
        ..Config::default()
    };
    let (ready, _) = demo_ready_with_prefix(config, 1, budget);
    let state = Arc::new(AppState::new(Settings::new(SERVED, MODEL_ID)));
    state.set_ready(ready);
    serve_state(state).await
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
            assert_eq!(got.len(), want.len());
            for ((k, p), (_, q)) in got.iter().zip(&want) {
                for (x, y) in p.iter().zip(q) {
                    assert!(
                        (x - y).abs() <= 1e-5,
                        "server {s}, tree {words} words, {k}: {p:?} vs whole {q:?}"
                    );
                }
            }
        }
    }
    let metrics = exchange(chunked[0], "GET /metrics HTTP/1.1", b"").await;
    let text = String::from_utf8(metrics.body).unwrap();
    let chunks: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("instinct_prefill_chunks_total "))
        .expect("the chunk counter is exported")
        .parse()
        .unwrap();
    assert!(chunks >= 3.0 * 5.0, "{chunks} chunks counted");
}
