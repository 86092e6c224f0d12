//! Shared by the HTTP tests: a demo-model server on a loopback port and a hand-parsed HTTP/1.1
//! client, so tests see exactly what goes over the wire.
#![allow(dead_code)]

use std::sync::Arc;

use instinct::engine::{self, LoadOptions};
use instinct::prefix_reuse::PrefixReuse;
use instinct::server::{self, AppState, Ready, Settings};
use instinct_model::source::{Device, ModelSource};
use instinct_scheduler::{Config, Scheduler};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const SERVED: &str = "cua-s1-4b-0.2";

/// One of the model crate's test images.
pub fn image_file(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/data/images")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A screenshot request: `bytes` as a `mime` data URL in `state`, `questions` as given (JSON).
pub fn screenshot_request(mime: &str, bytes: &[u8], questions: &str) -> String {
    use base64::Engine as _;
    let data = base64::engine::general_purpose::STANDARD.encode(bytes);
    format!(
        r#"{{"model":"cua-s1-4b-0.2","state":{{"image":"data:{mime};base64,{data}"}},"questions":{questions}}}"#
    )
}
pub const MODEL_ID: &str = "instinct/demo-tiny-qwen3.5:text";

pub fn demo_ready() -> Ready {
    demo_ready_with(Config {
        max_batch_seqs: 16,
        ..Config::default()
    })
}

/// The demo model behind a scheduler configured as given.
pub fn demo_ready_with(config: Config) -> Ready {
    let source = ModelSource::resolve(None, None, None).unwrap();
    let limits = engine::batch_limits(config.batch_capacity().unwrap());
    let options = LoadOptions {
        image_cache_bytes: 64 << 20,
        prefix_cache_bytes: Some(0),
        max_chunk_tokens: config.max_chunk_tokens,
        ..LoadOptions::default()
    };
    let loaded = engine::load(Device::Cpu, &source, limits, options).unwrap();
    Ready {
        preparer: loaded.preparer,
        scheduler: Scheduler::start(config, loaded.engines).unwrap(),
    }
}

/// The demo model on `engines` CPU engines with a prefix cache of `prefix_cache_bytes` (0: no
/// reuse), and the engines' prefix reuse, to read its counters.
pub fn demo_ready_with_prefix(
    config: Config,
    engines: usize,
    prefix_cache_bytes: usize,
) -> (Ready, Arc<PrefixReuse>) {
    let source = ModelSource::resolve(None, None, None).unwrap();
    let limits = engine::batch_limits(config.batch_capacity().unwrap());
    let options = LoadOptions {
        cpu_engines: engines,
        image_cache_bytes: 64 << 20,
        prefix_cache_bytes: Some(prefix_cache_bytes),
        max_chunk_tokens: config.max_chunk_tokens,
        ..LoadOptions::default()
    };
    let mut loaded = engine::load(Device::Cpu, &source, limits, options).unwrap();
    let reuse = loaded.prefix_reuse.pop().expect("one device");
    let ready = Ready {
        preparer: loaded.preparer,
        scheduler: Scheduler::start(config, loaded.engines).unwrap(),
    };
    (ready, reuse)
}

/// Starts a server; `ready` decides whether the model is installed (ready) or not (loading).
pub async fn start(ready: bool) -> std::net::SocketAddr {
    let state = Arc::new(AppState::new(Settings::new(SERVED, MODEL_ID)));
    if ready {
        state.set_ready(demo_ready());
    }
    serve_state(state).await
}

/// Serves `state` on a fresh loopback port.
pub async fn serve_state(state: Arc<AppState>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(server::serve(listener, state));
    addr
}

/// A child process (a server the test started) killed when the test ends, pass or fail.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port free at the time of asking (for a child process to bind).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
}

/// One HTTP/1.1 exchange on a fresh connection (`Connection: close`), parsed by hand so the test
/// sees exactly what went over the wire.
pub async fn exchange(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> Reply {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request_head = format!(
        "{head}\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(request_head.as_bytes()).await.unwrap();
    // The server may answer (413) and close before reading a body it refused: a failed write of
    // the body is expected then, and the answer is still there to read.
    let _ = stream.write_all(body).await;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("header end");
    Reply {
        body: raw[split + 4..].to_vec(),
        ..parse_head(&raw[..split])
    }
}

/// A response head (status line and header lines, without the empty line), with no body.
pub fn parse_head(head: &[u8]) -> Reply {
    let head = String::from_utf8(head.to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_string(), v.trim().to_string())
        })
        .collect();
    Reply {
        status,
        headers,
        body: Vec::new(),
    }
}

pub async fn post(addr: std::net::SocketAddr, body: &str) -> Reply {
    exchange(
        addr,
        "POST /v1/systemone HTTP/1.1\r\nContent-Type: application/json",
        body.as_bytes(),
    )
    .await
}

/// Fails unless `reply` is a 200, showing its body.
#[track_caller]
pub fn assert_ok(reply: &Reply) {
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
}

/// A 200 reply's probabilities per question key, and its prompt tokens (`usage.input_tokens`).
pub fn answers(reply: &Reply) -> (std::collections::BTreeMap<String, Vec<f64>>, u64) {
    assert_ok(reply);
    let body = reply.json();
    let per_question = body["answers"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, a)| {
            let p = a["probabilities"].as_object().unwrap();
            (k.clone(), p.values().map(|v| v.as_f64().unwrap()).collect())
        })
        .collect();
    (
        per_question,
        body["usage"]["input_tokens"].as_u64().unwrap(),
    )
}
