//! Serving under load on the demo model over real HTTP: overload answers 503 with Retry-After and
//! loses nothing, a client that hangs up frees its place, batched answers equal serial ones, a
//! drain finishes what was accepted, and the load-test harness runs against the server.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use instinct::server::{AppState, Settings};
use instinct_scheduler::Config;
use serde_json::Value;
use tokio::io::AsyncWriteExt;

/// A request whose one question has a prompt of about `words` tokens, with `tag` making it
/// distinct.
fn request(tag: usize, words: usize) -> String {
    let tree: String = (0..words)
        .map(|i| format!("w{} ", (i + tag) % 97))
        .collect();
    format!(
        r#"{{"state":"{tree}","questions":{{"q{tag}":{{"type":"choice","instructions":"Pick {tag}","criteria":{{"a":"Alpha","b":"Beta","c":"Gamma"}}}}}}}}"#
    )
}

fn probabilities(answer: &Value) -> Vec<f64> {
    let answers = answer["answers"].as_object().unwrap();
    let (_, a) = answers.iter().next().unwrap();
    a["probabilities"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

async fn server_with(config: Config) -> (Arc<AppState>, std::net::SocketAddr) {
    let state = Arc::new(AppState::new(Settings::new(SERVED, MODEL_ID)));
    state.set_ready(demo_ready_with(config));
    let addr = serve_state(state.clone()).await;
    (state, addr)
}

fn assert_close(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() < 1e-5, "{what}: {a:?} vs {b:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_over_capacity_gets_fast_503s_and_every_accepted_request_its_answer() {
    let (_state, addr) = server_with(Config {
        max_queue_requests: 4,
        max_batch_seqs: 4,
        ..Config::default()
    })
    .await;
    // The answers each request must get, computed one at a time first.
    let offered = 32;
    let mut serial = Vec::new();
    for i in 0..offered {
        let r = post(addr, &request(i, 120)).await;
        assert_eq!(r.status, 200);
        serial.push(probabilities(&r.json()));
    }
    let burst: Vec<_> = (0..offered)
        .map(|i| tokio::spawn(async move { (i, post(addr, &request(i, 120)).await) }))
        .collect();
    let (mut accepted, mut rejected) = (0, 0);
    for h in burst {
        let (i, r) = h.await.unwrap();
        match r.status {
            200 => {
                accepted += 1;
                assert_close(&probabilities(&r.json()), &serial[i], "batched vs serial");
            }
            503 => {
                rejected += 1;
                let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
                assert!((1..=60).contains(&retry));
                assert_eq!(r.json()["code"], "overloaded");
            }
            s => panic!(
                "request {i}: status {s}: {}",
                String::from_utf8_lossy(&r.body)
            ),
        }
    }
    eprintln!("burst: offered {offered}, accepted {accepted}, rejected {rejected}, lost 0");
    assert_eq!(accepted + rejected, offered, "nothing lost");
    assert!(
        rejected > 0,
        "a burst of {offered} over a queue of 4 must be refused in part"
    );
    assert!(accepted >= 4, "the queue's worth is served");
    // The server is healthy afterwards.
    assert_eq!(post(addr, &request(0, 120)).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_hangs_up_frees_its_place_in_the_queue() {
    let (state, addr) = server_with(Config {
        max_queue_requests: 1,
        max_batch_seqs: 1,
        max_batch_tokens: 16_384,
        ..Config::default()
    })
    .await;
    // A long request occupies the engine, a second one the only queue place; its client then
    // hangs up.
    let long = tokio::spawn(async move { post(addr, &request(1, 1_000)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let body = request(2, 100);
    let mut quitter = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/systemone HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    quitter.write_all(head.as_bytes()).await.unwrap();
    quitter.write_all(body.as_bytes()).await.unwrap();
    let ready = state.ready().unwrap();
    for _ in 0..100 {
        if ready.scheduler.stats().queued_requests == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        ready.scheduler.stats().queued_requests,
        1,
        "the second request is queued"
    );
    drop(quitter);
    for _ in 0..200 {
        if ready.scheduler.stats().queued_requests == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        ready.scheduler.stats().queued_requests,
        0,
        "the hung-up request left the queue while the long one still runs"
    );
    // Its place is free: a new request is admitted (not 503) and answered.
    let third = post(addr, &request(3, 100)).await;
    assert_eq!(
        third.status,
        200,
        "{}",
        String::from_utf8_lossy(&third.body)
    );
    assert_eq!(long.await.unwrap().status, 200);
    let metrics = exchange(addr, "GET /metrics HTTP/1.1", b"").await;
    let text = String::from_utf8(metrics.body).unwrap();
    assert!(
        text.lines()
            .any(|l| l.starts_with("instinct_cancelled_total") && !l.ends_with(" 0")),
        "cancellations are counted:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_finishes_accepted_requests_and_refuses_new_ones() {
    let (state, addr) = server_with(Config {
        max_batch_seqs: 2,
        ..Config::default()
    })
    .await;
    let inflight: Vec<_> = (0..6)
        .map(|i| tokio::spawn(async move { post(addr, &request(i, 400)).await }))
        .collect();
    tokio::time::sleep(Duration::from_millis(30)).await;
    let drainer = {
        let state = state.clone();
        tokio::spawn(async move { instinct::serve::drain(&state, Duration::from_secs(60)).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let refused = post(addr, &request(99, 50)).await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.json()["code"], "draining");
    assert!(refused.header("retry-after").is_some());
    assert_eq!(
        exchange(addr, "GET /readyz HTTP/1.1", b"").await.status,
        503
    );
    let mut ok = 0;
    for h in inflight {
        let r = h.await.unwrap();
        // Requests that reached admission before the drain are answered; any that arrived after
        // it are refused as draining, never dropped.
        match r.status {
            200 => ok += 1,
            503 => assert_eq!(r.json()["code"], "draining"),
            s => panic!("status {s}"),
        }
    }
    assert!(ok >= 1, "accepted requests finish during the drain");
    drainer.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_load_test_harness_runs_against_the_demo_server() {
    use clap::Parser;
    let (_state, addr) = server_with(Config::default()).await;
    let dir = std::env::temp_dir().join(format!("instinct-loadtest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("report.json");
    let args = instinct_loadtest::cli::Args::try_parse_from([
        "instinct-loadtest",
        "--target",
        &format!("http://{addr}"),
        "--concurrency",
        "1,4",
        "--requests",
        "12",
        "--synthetic-count",
        "12",
        "--prompt-tokens",
        "300",
        "--warmup",
        "1",
        "--duration",
        "60",
        "--slo-ms",
        "2000",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
        "--svg-dir",
        dir.to_str().unwrap(),
    ])
    .unwrap();
    instinct_loadtest::app::run(&args).await.unwrap();
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let levels = report["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 2);
    for level in levels {
        assert_eq!(level["sent"], 12, "{level}");
        assert_eq!(level["completed"], 12, "{level}");
        assert!(level["decision_throughput"].as_f64().unwrap() > 0.0);
        assert!(level["latency_ms"]["p99"].as_f64().unwrap() > 0.0);
        assert_eq!(level["server_metrics"]["available"], true, "{level}");
    }
    assert!(dir.join("latency_cdf.svg").is_file());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `body` padded with trailing spaces (still one JSON value) to exactly `len` bytes.
fn padded(body: &str, len: usize) -> String {
    assert!(body.len() <= len);
    format!("{body}{}", " ".repeat(len - body.len()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_in_flight_never_hold_more_bytes_than_the_budget() {
    const BUDGET: usize = 64 * 1024;
    let settings = Settings {
        max_inflight_bytes: BUDGET,
        max_body_bytes: 48 * 1024,
        max_screenshot_body_bytes: 48 * 1024,
        ..Settings::new(SERVED, MODEL_ID)
    };
    let state = Arc::new(AppState::new(settings));
    state.set_ready(demo_ready());
    let addr = serve_state(state.clone()).await;

    // A body that drips in holds the bytes it declared from its head on.
    let slow_body = padded(&request(1, 40), 40_000);
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/systemone HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n",
        slow_body.len()
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    slow.write_all(&slow_body.as_bytes()[..100]).await.unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while state.inflight.used() < 40_000 {
        assert!(
            std::time::Instant::now() < until,
            "the slow body was never reserved"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // One that does not fit beside it is refused at once, before its body is read...
    let t0 = std::time::Instant::now();
    let big = post(addr, &padded(&request(2, 40), 30_000)).await;
    assert_eq!(big.status, 503);
    assert_eq!(big.json()["code"], "overloaded");
    assert!(big.header("retry-after").is_some());
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    // ...and one that fits is served.
    assert_eq!(post(addr, &request(3, 40)).await.status, 200);

    // The slow body arrives; its request is answered and its bytes given back.
    slow.write_all(&slow_body.as_bytes()[100..]).await.unwrap();
    let mut raw = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut slow, &mut raw)
        .await
        .unwrap();
    assert!(
        raw.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&raw[..40])
    );
    assert_eq!(
        post(addr, &padded(&request(2, 40), 30_000)).await.status,
        200
    );

    // A burst of bodies worth several budgets: each answer is 200 or a fast 503, the budget's
    // peak stays within it, and everything is given back.
    let burst: Vec<_> = (0..24)
        .map(|i| {
            let body = padded(&request(10 + i, 40), 20_000);
            tokio::spawn(async move { post(addr, &body).await.status })
        })
        .collect();
    let mut statuses = Vec::new();
    for h in burst {
        statuses.push(h.await.unwrap());
    }
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 503),
        "{statuses:?}"
    );
    assert!(statuses.contains(&200), "{statuses:?}");
    assert!(
        state.inflight.peak() <= BUDGET,
        "peak {}",
        state.inflight.peak()
    );
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while state.inflight.used() != 0 {
        assert!(
            std::time::Instant::now() < until,
            "{} bytes never given back",
            state.inflight.used()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
