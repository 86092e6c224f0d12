//! Hostile and odd HTTP clients, over raw TCP so that malformed bytes reach the server as sent:
//! slow heads and bodies are cut by timeouts, oversized heads get 431, connections beyond
//! `--max-connections` are refused at once, smuggling shapes get 400 and the connection closed,
//! pipelined and HTTP/1.0 requests work, a client that stops reading is dropped without holding
//! an engine, and under a flood of ten times the capacity the probes stay fast and every request
//! gets 200 or 503.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use instinct::server::{AppState, Settings};
use instinct_scheduler::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The flood test runs alone (write), the others beside each other (read): its probe latencies
/// then measure the server under the flood, not the model loads of neighbouring tests.
static ALONE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A server with `settings` changed by `tweak`; the demo model is loaded only when `ready`.
async fn server(
    ready: Option<Config>,
    tweak: impl FnOnce(&mut Settings),
) -> (Arc<AppState>, SocketAddr) {
    let mut settings = Settings::new(SERVED, MODEL_ID);
    tweak(&mut settings);
    let state = Arc::new(AppState::new(settings));
    if let Some(config) = ready {
        state.set_ready(demo_ready_with(config));
    }
    let addr = serve_state(state.clone()).await;
    (state, addr)
}

fn small_engine() -> Config {
    Config {
        max_batch_seqs: 4,
        ..Config::default()
    }
}

/// A request with one question named `q{tag}`, whose prompt has about `words` words.
fn question(tag: usize, words: usize) -> String {
    let tree: String = (0..words)
        .map(|i| format!("w{} ", (i + tag) % 97))
        .collect();
    format!(
        r#"{{"state":"{tree}","questions":{{"q{tag}":{{"type":"choice","instructions":"Pick","criteria":{{"a":"Alpha","b":"Beta"}}}}}}}}"#
    )
}

fn post_bytes(body: &str, extra: &str) -> Vec<u8> {
    format!(
        "POST /v1/systemone HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n{extra}\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A raw client connection that reads answers one at a time.
struct Raw {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    async fn connect(addr: SocketAddr) -> Raw {
        Raw {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// More bytes from the server; 0 when the connection ended (closed or reset).
    async fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).await.unwrap_or(0);
        self.buf.extend_from_slice(&chunk[..n]);
        n
    }

    /// The next answer, or `None` when the connection ends before one starts; fails after 10 s
    /// rather than hang.
    async fn answer(&mut self) -> Option<Reply> {
        tokio::time::timeout(Duration::from_secs(10), self.next_answer())
            .await
            .expect("an answer or the end of the connection within 10 s")
    }

    async fn next_answer(&mut self) -> Option<Reply> {
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let reply = parse_head(&self.buf[..end]);
                let len: usize = reply
                    .header("content-length")
                    .map_or(0, |v| v.parse().unwrap());
                while self.buf.len() < end + 4 + len {
                    assert!(self.fill().await > 0, "connection ended mid-answer");
                }
                let body = self.buf[end + 4..end + 4 + len].to_vec();
                self.buf.drain(..end + 4 + len);
                return Some(Reply { body, ..reply });
            }
            if self.fill().await == 0 {
                assert!(
                    self.buf.is_empty(),
                    "connection ended mid-head: {:?}",
                    String::from_utf8_lossy(&self.buf)
                );
                return None;
            }
        }
    }

    /// Waits until the server ends the connection, at most `limit`; returns the wait and
    /// asserts that no further answer came.
    async fn ends_within(&mut self, limit: Duration) -> Duration {
        let t0 = Instant::now();
        let ended = tokio::time::timeout(limit, async { while self.fill().await > 0 {} }).await;
        assert!(
            ended.is_ok(),
            "the connection was still open after {limit:?}"
        );
        assert!(
            self.buf.is_empty(),
            "unexpected bytes: {:?}",
            String::from_utf8_lossy(&self.buf)
        );
        t0.elapsed()
    }
}

/// The value of one series in the `/metrics` text, 0 when absent.
async fn metric(addr: SocketAddr, series: &str) -> f64 {
    let reply = exchange(addr, "GET /metrics HTTP/1.1", b"").await;
    let text = String::from_utf8(reply.body).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Every answer of the server that ends a connection says so.
fn assert_closing(reply: &Reply) {
    assert_eq!(
        reply.header("connection"),
        Some("close"),
        "{:?}",
        reply.headers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_heads_and_idle_connections_are_cut_at_the_header_timeout() {
    let _beside = ALONE.read().await;
    let timeout = Duration::from_millis(500);
    let (_, addr) = server(None, |s| s.header_timeout = timeout).await;

    // Silent after connecting.
    let mut silent = Raw::connect(addr).await;
    let waited = silent.ends_within(Duration::from_secs(3)).await;
    assert!(waited >= timeout - Duration::from_millis(50), "{waited:?}");

    // Slowloris: a header line every 100 ms keeps bytes coming, but the head never ends.
    let mut drip = Raw::connect(addr).await;
    drip.send(b"GET /livez HTTP/1.1\r\nHost: t\r\n").await;
    let t0 = Instant::now();
    let dripping = async {
        for i in 0.. {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if drip
                .stream
                .write_all(format!("X-{i}: v\r\n").as_bytes())
                .await
                .is_err()
            {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(3), dripping).await;
    let cut = t0.elapsed();
    assert!(
        cut < Duration::from_secs(2),
        "a dripped head held the connection for {cut:?}"
    );
    assert!(
        drip.answer().await.is_none(),
        "no answer to an unfinished head"
    );

    // Idle after an answer on a keep-alive connection.
    let mut idle = Raw::connect(addr).await;
    idle.send(b"GET /livez HTTP/1.1\r\nHost: t\r\n\r\n").await;
    assert_eq!(idle.answer().await.unwrap().status, 200);
    let waited = idle.ends_within(Duration::from_secs(3)).await;
    assert!(waited >= timeout - Duration::from_millis(50), "{waited:?}");

    let series = "instinct_connection_timeouts_total{phase=";
    assert!(metric(addr, &format!("{series}\"head\"}}")).await >= 1.0);
    assert!(metric(addr, &format!("{series}\"idle\"}}")).await >= 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_gets_408_and_the_connection_closes() {
    let _beside = ALONE.read().await;
    let timeout = Duration::from_millis(500);
    let (_, addr) = server(None, |s| s.body_timeout = timeout).await;

    // One byte every 50 ms: always progressing, never finishing in time.
    let mut slow = Raw::connect(addr).await;
    slow.send(
        b"POST /v1/systemone HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{",
    )
    .await;
    let t0 = Instant::now();
    for _ in 0..60 {
        let answered = tokio::time::timeout(Duration::from_millis(50), slow.stream.readable());
        if answered.await.is_ok() || slow.stream.write_all(b" ").await.is_err() {
            break;
        }
    }
    let reply = slow.answer().await;
    let took = t0.elapsed();
    let reply = reply.expect("an answer");
    assert_eq!(reply.status, 408);
    assert_eq!(reply.json()["code"], "body_timeout");
    assert_closing(&reply);
    assert!(
        took >= timeout - Duration::from_millis(50) && took < Duration::from_secs(2),
        "{took:?}"
    );
    slow.ends_within(Duration::from_secs(2)).await;

    // A body that arrives in time is read (this server has no model: 503 not_ready).
    let reply = post(addr, &question(0, 5)).await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.json()["code"], "not_ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_over_the_limits_get_431() {
    let _beside = ALONE.read().await;
    let (_, addr) = server(None, |s| {
        s.max_header_bytes = 2048;
        s.max_headers = 16;
    })
    .await;
    let head = |lines: usize, value: usize| {
        let mut h = String::from("GET /livez HTTP/1.1\r\nHost: t\r\n");
        for i in 1..lines {
            h.push_str(&format!("X-{i:02}: {}\r\n", "v".repeat(value)));
        }
        h + "\r\n"
    };
    let ask = |bytes: String| async move {
        let mut c = Raw::connect(addr).await;
        // The server may answer and close before it has read everything.
        let _ = c.stream.write_all(bytes.as_bytes()).await;
        let reply = c.answer().await.expect("an answer");
        (reply, c)
    };

    // At the limits: served.
    let at = head(16, 100);
    assert!(at.len() <= 2048);
    let (reply, _) = ask(at).await;
    assert_eq!(reply.status, 200);

    // Over a limit, under twice it: a 431 problem, and the connection closes.
    for (over, what) in [(head(2, 2500), "bytes"), (head(17, 10), "header lines")] {
        let (reply, mut c) = ask(over).await;
        assert_eq!(reply.status, 431, "{what}");
        assert_eq!(reply.json()["code"], "headers_too_large", "{what}");
        assert!(reply.json()["detail"]
            .as_str()
            .unwrap()
            .contains("2048 bytes and 16 header"));
        assert_closing(&reply);
        c.ends_within(Duration::from_secs(2)).await;
    }

    // Over twice a limit: hyper's own 431, without a body; an unfinished head too.
    for (over, what) in [
        (head(2, 5000), "bytes"),
        (head(40, 10), "header lines"),
        (
            format!("GET /livez HTTP/1.1\r\nX: {}", "v".repeat(5000)),
            "unfinished",
        ),
    ] {
        let (reply, mut c) = ask(over).await;
        assert_eq!(reply.status, 431, "{what}");
        assert!(reply.body.is_empty(), "{what}");
        c.ends_within(Duration::from_secs(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smuggling_shapes_get_400_and_no_second_request_is_read() {
    let _beside = ALONE.read().await;
    let (_, addr) = server(None, |_| {}).await;
    let smuggled = "GET /health HTTP/1.1\r\nHost: t\r\n\r\n";
    let post = |headers: &str, body: &str| {
        format!("POST /v1/systemone HTTP/1.1\r\nHost: t\r\n{headers}\r\n{body}{smuggled}")
    };
    // (request, whether the answer is ours with a problem body, or hyper's bare one)
    let cases = [
        // CL.TE and TE.CL, in both header orders.
        (
            post(
                "Content-Length: 6\r\nTransfer-Encoding: chunked\r\n",
                "0\r\n\r\n",
            ),
            true,
        ),
        (
            post(
                "Transfer-Encoding: chunked\r\nContent-Length: 40\r\n",
                "0\r\n\r\n",
            ),
            true,
        ),
        // Codings hyper reads as chunked.
        (
            post("Transfer-Encoding: gzip, chunked\r\n", "0\r\n\r\n"),
            true,
        ),
        (
            post(
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                "0\r\n\r\n",
            ),
            true,
        ),
        (
            post(
                "Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n",
                "0\r\n\r\n",
            ),
            true,
        ),
        // A broken chunk size.
        (
            post("Transfer-Encoding: chunked\r\n", "zz\r\n{}\r\n0\r\n\r\n"),
            true,
        ),
        (
            post("Transfer-Encoding: chunked\r\n", "-1\r\n{}\r\n0\r\n\r\n"),
            true,
        ),
        (
            post("Transfer-Encoding: chunked\r\n", "fffffffffffffffff\r\n"),
            true,
        ),
        (
            post("Transfer-Encoding: chunked\r\n", "2\r\n{}XX0\r\n\r\n"),
            true,
        ),
        // Shapes hyper refuses itself.
        (
            post("Content-Length: 2\r\nContent-Length: 3\r\n", "{}"),
            false,
        ),
        (post("Content-Length: +2\r\n", "{}"), false),
        (post("Content-Length: 2, 2\r\n", "{}"), false),
        (
            post("Transfer-Encoding: chunked, identity\r\n", "0\r\n\r\n"),
            false,
        ),
        (post("Transfer-Encoding: xchunked\r\n", "0\r\n\r\n"), false),
        (post("Transfer-Encoding : chunked\r\n", "0\r\n\r\n"), false),
        (
            post("Transfer-Encoding:\r\n chunked\r\n", "0\r\n\r\n"),
            false,
        ),
        (
            format!(
                "POST /v1/systemone HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n\
                 {smuggled}"
            ),
            false,
        ),
    ];
    for (request, ours) in cases {
        let mut c = Raw::connect(addr).await;
        let _ = c.stream.write_all(request.as_bytes()).await;
        let reply = c.answer().await.expect("an answer");
        assert_eq!(reply.status, 400, "{request:?}");
        if ours {
            assert_eq!(reply.json()["code"], "invalid_framing", "{request:?}");
            assert_closing(&reply);
        } else {
            assert!(reply.body.is_empty(), "{request:?}");
        }
        // Nothing else: the smuggled request is never answered.
        c.ends_within(Duration::from_secs(2)).await;
    }

    // A plain chunked body is fine, and the request after it is served on the same connection.
    let body = question(0, 3);
    let chunked = format!(
        "POST /v1/systemone HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n\
         {:x}\r\n{body}\r\n0\r\n\r\n{smuggled}",
        body.len()
    );
    let mut c = Raw::connect(addr).await;
    c.send(chunked.as_bytes()).await;
    let first = c.answer().await.unwrap();
    assert_eq!(
        (first.status, first.json()["code"].clone()),
        (503, "not_ready".into())
    );
    let second = c.answer().await.unwrap();
    assert_eq!(second.json()["status"], "loading", "GET /health answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_get_their_answers_in_order() {
    let _beside = ALONE.read().await;
    let (_, addr) = server(Some(small_engine()), |_| {}).await;
    let mut bytes = Vec::new();
    for tag in [1, 2] {
        bytes.extend(post_bytes(
            &question(tag, 20),
            &format!("X-Request-Id: r{tag}\r\n"),
        ));
    }
    bytes.extend(b"GET /livez HTTP/1.1\r\nHost: t\r\nX-Request-Id: r3\r\n\r\n");
    let body = question(4, 20);
    bytes.extend(
        format!(
            "POST /v1/systemone HTTP/1.1\r\nHost: t\r\nX-Request-Id: r4\r\n\
             Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    let mut c = Raw::connect(addr).await;
    // All four requests in one write.
    c.send(&bytes).await;
    for tag in 1..=4 {
        let reply = c.answer().await.expect("an answer");
        assert_ok(&reply);
        assert_eq!(
            reply.header("x-request-id"),
            Some(format!("r{tag}").as_str())
        );
        if tag != 3 {
            let name = format!("q{tag}");
            assert!(
                reply.json()["answers"].get(&name).is_some(),
                "answer to {name}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_1_0_requests_work_with_and_without_keep_alive() {
    let _beside = ALONE.read().await;
    let (_, addr) = server(Some(small_engine()), |_| {}).await;

    // Without keep-alive: one answer, then the server closes.
    let mut c = Raw::connect(addr).await;
    let body = question(1, 10);
    c.send(
        format!(
            "POST /v1/systemone HTTP/1.0\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await;
    let reply = c.answer().await.unwrap();
    assert_eq!(reply.status, 200);
    assert!(reply.json()["answers"]["q1"].is_object());
    c.ends_within(Duration::from_secs(2)).await;

    // With keep-alive: the connection stays for a second request.
    let mut c = Raw::connect(addr).await;
    for _ in 0..2 {
        c.send(b"GET /livez HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .await;
        let reply = c.answer().await.expect("an answer on the kept connection");
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("connection"), Some("keep-alive"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_dropped_and_holds_no_engine() {
    let _beside = ALONE.read().await;
    // 3 s: the three requests below take under 1 s even beside the flood test on two cores.
    let write_timeout = Duration::from_secs(3);
    let (state, addr) = server(
        Some(Config {
            max_queue_requests: 1,
            max_batch_seqs: 1,
            ..Config::default()
        }),
        |s| s.write_timeout = write_timeout,
    )
    .await;
    // A reader that never reads, with a small receive buffer: one question, then 300 requests
    // for the ~40 KB OpenAPI document (12 MB, more than the socket buffers on both sides hold).
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stuck = socket.connect(addr).await.unwrap();
    let mut bytes = post_bytes(&question(0, 20), "");
    for _ in 0..300 {
        bytes.extend(b"GET /openapi.json HTTP/1.1\r\nHost: t\r\n\r\n");
    }
    stuck.write_all(&bytes).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Meanwhile the one engine and the one queue place serve others.
    let t0 = Instant::now();
    for tag in 1..=3 {
        let reply = post(addr, &question(tag, 20)).await;
        assert_ok(&reply);
    }
    assert!(
        state.open_connections() >= 1,
        "the stuck client is still connected while the others are served"
    );
    eprintln!("3 requests beside a stuck reader: {:?}", t0.elapsed());

    // The stuck connection is dropped after the write timeout.
    let deadline = Instant::now() + write_timeout * 3;
    while state.open_connections() > 0 {
        assert!(
            Instant::now() < deadline,
            "the stuck connection was not dropped"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // What it can still read ends early: far fewer than 300 documents.
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stuck.read_to_end(&mut got)).await;
    let document = instinct::openapi::DOCUMENT.len();
    assert!(got.len() < 100 * document, "read {} bytes", got.len());
    assert!(metric(addr, "instinct_connection_timeouts_total{phase=\"write\"}").await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_are_refused_at_once() {
    let _beside = ALONE.read().await;
    let (state, addr) = server(None, |s| s.max_connections = 4).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(Raw::connect(addr).await);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while state.open_connections() < 4 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    for send_first in [true, false] {
        let t0 = Instant::now();
        let mut extra = Raw::connect(addr).await;
        if send_first {
            extra
                .send(b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n")
                .await;
        }
        let reply = extra.answer().await.expect("an answer");
        let took = t0.elapsed();
        assert_eq!(reply.status, 503);
        assert_eq!(reply.json()["code"], "too_many_connections");
        assert_eq!(reply.header("retry-after"), Some("1"));
        assert_closing(&reply);
        assert!(took < Duration::from_millis(500), "refused in {took:?}");
        extra.ends_within(Duration::from_secs(2)).await;
    }
    assert_eq!(state.open_connections(), 4, "refused ones are not counted");

    // An orchestrator's probes are still answered, one request per connection: a replica whose
    // connections are full is busy, not dead. (No model is loaded here: /readyz and /health say
    // "loading", as they would below the limit.)
    for (path, status) in [("/livez", 200), ("/readyz", 503), ("/health", 503)] {
        let t0 = Instant::now();
        let mut probe = Raw::connect(addr).await;
        probe
            .send(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
            .await;
        let reply = probe.answer().await.expect("an answer");
        assert_eq!(reply.status, status, "{path}");
        assert_ne!(
            reply.json()["status"],
            serde_json::Value::Null,
            "{path}: the probe's own answer"
        );
        assert!(
            t0.elapsed() < Duration::from_millis(500),
            "{path} took {:?}",
            t0.elapsed()
        );
        assert_closing(&reply);
        probe.ends_within(Duration::from_secs(2)).await;
    }
    // A probe's connection serves nothing else: the request after it is not read.
    let mut sneaky = Raw::connect(addr).await;
    sneaky
        .send(b"GET /livez HTTP/1.1\r\nHost: t\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n")
        .await;
    assert_eq!(sneaky.answer().await.expect("an answer").status, 200);
    sneaky.ends_within(Duration::from_secs(2)).await;
    assert_eq!(state.open_connections(), 4);

    // A place freed is a place taken.
    held.pop();
    let deadline = Instant::now() + Duration::from_secs(2);
    while state.open_connections() > 3 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(metric(addr, "instinct_connections_refused_total").await >= 2.0);
    let reply = exchange(addr, "GET /livez HTTP/1.1", b"").await;
    assert_eq!(reply.status, 200);
}

/// Probes as a kubelet sends them: a fresh connection each, on its own thread, so the flood's
/// tasks cannot delay the client side.
fn probe(addr: SocketAddr, path: &str) -> (u16, Duration) {
    let t0 = Instant::now();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let status = std::str::from_utf8(&raw[9..12]).unwrap().parse().unwrap();
    (status, t0.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_flood_of_ten_times_capacity_probes_stay_fast_and_every_request_gets_200_or_503() {
    let _alone = ALONE.write().await;
    // Capacity: 4 queued requests and a batch of 4 running. The flood: 80 clients, each sending
    // its next request as soon as the last is answered, for 3 s.
    let (_, addr) = server(
        Some(Config {
            max_queue_requests: 4,
            max_batch_seqs: 4,
            ..Config::default()
        }),
        |s| s.request_timeout = Some(Duration::from_secs(2)),
    )
    .await;
    let clients = 80;
    let flood_for = Duration::from_secs(3);
    let stop = Instant::now() + flood_for;
    let flood: Vec<_> = (0..clients)
        .map(|i| {
            tokio::spawn(async move {
                let mut c = Raw::connect(addr).await;
                let mut seen = Vec::new();
                while Instant::now() < stop {
                    c.send(&post_bytes(&question(i, 40), "")).await;
                    // None hangs: every answer within 10 s.
                    let reply = c.answer().await.expect("an answer");
                    let code = if reply.status == 200 {
                        "ok".to_string()
                    } else {
                        reply.json()["code"].as_str().unwrap_or("?").to_string()
                    };
                    seen.push((reply.status, code));
                }
                seen
            })
        })
        .collect();

    let prober = std::thread::spawn(move || {
        let mut probes = Vec::new();
        while Instant::now() < stop {
            for path in ["/livez", "/readyz"] {
                probes.push((path, probe(addr, path)));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        probes
    });

    let mut answers = Vec::new();
    for h in flood {
        answers.extend(h.await.unwrap());
    }
    let probes = tokio::task::spawn_blocking(move || prober.join().unwrap())
        .await
        .unwrap();

    let ok = answers.iter().filter(|(s, _)| *s == 200).count();
    let refused = answers.iter().filter(|(s, _)| *s == 503).count();
    let slowest = probes.iter().map(|(_, (_, d))| *d).max().unwrap();
    eprintln!(
        "flood: {} answers ({ok} 200, {refused} 503); {} probes, slowest {slowest:?}",
        answers.len(),
        probes.len()
    );
    for (status, code) in &answers {
        assert!(
            *status == 200
                || (*status == 503 && ["overloaded", "deadline_exceeded"].contains(&code.as_str())),
            "{status} {code}"
        );
    }
    assert!(
        ok > 0 && refused > 0,
        "the flood was over capacity and some got through"
    );
    assert!(probes.len() >= 20, "{} probes", probes.len());
    for (path, (status, took)) in &probes {
        assert_eq!(*status, 200, "{path}");
        assert!(*took < Duration::from_millis(100), "{path} took {took:?}");
    }
}
