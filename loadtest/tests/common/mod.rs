//! A tiny in-process imitation of the instinct server for the harness tests: it answers
//! `POST /v1/systemone` like the real one (answers, usage, `Server-Timing`, `X-Request-Id`),
//! with a configurable delay, a deterministic 503 / 500 rate and an optional one-time stall,
//! and serves `/metrics` histograms for the phases it pretends to run.

#![allow(dead_code)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Map, Value};
use tokio::net::TcpListener;
use tokio::sync::Mutex;

#[derive(Debug, Clone, Default)]
pub struct MockConfig {
    /// Time every answered request takes.
    pub delay: Duration,
    /// Request number n (1-based, in arrival order) gets a 503 when n % reject_one_in == 0.
    pub reject_one_in: u64,
    /// … and a 500 when n % error_one_in == 0 (503 wins when both match).
    pub error_one_in: u64,
    /// Request number `.0` holds the whole server for `.1` (every other request waits).
    pub stall: Option<(u64, Duration)>,
    /// Answer `/metrics` with 404 instead of histograms.
    pub no_metrics: bool,
    /// Extra time a screenshot request takes.
    pub screenshot_delay: Duration,
}

/// What the mock saw.
#[derive(Debug, Default)]
pub struct MockCounters {
    pub received: AtomicU64,
    pub answered: AtomicU64,
    pub infer_micros: AtomicU64,
    pub fast_infers: AtomicU64,
    /// Screenshot requests received, and how many carried an image already seen.
    pub screenshots: AtomicU64,
    pub repeated_images: AtomicU64,
}

pub struct MockServer {
    pub url: String,
    pub counters: Arc<MockCounters>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct State {
    config: MockConfig,
    counters: Arc<MockCounters>,
    gate: Mutex<()>,
    images: std::sync::Mutex<std::collections::HashSet<String>>,
}

pub async fn start(config: MockConfig) -> MockServer {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let counters = Arc::new(MockCounters::default());
    let state = Arc::new(State {
        config,
        counters: counters.clone(),
        gate: Mutex::new(()),
        images: Default::default(),
    });
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let state = state.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| handle(state.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    MockServer {
        url,
        counters,
        task,
    }
}

fn response(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r
}

async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    match (req.method().as_str(), req.uri().path()) {
        ("GET", "/metrics") if !state.config.no_metrics => Ok(metrics(&state.counters)),
        ("POST", "/v1/systemone") => Ok(decide(state, req).await),
        _ => Ok(response(
            StatusCode::NOT_FOUND,
            "{\"detail\":\"not found\"}".into(),
        )),
    }
}

async fn decide(state: Arc<State>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let n = state.counters.received.fetch_add(1, Ordering::SeqCst) + 1;
    let body = req.into_body().collect().await.unwrap().to_bytes();
    {
        // Every request passes the gate; the stalling one holds it.
        let _held = state.gate.lock().await;
        if let Some((at, stall)) = state.config.stall {
            if n == at {
                tokio::time::sleep(stall).await;
            }
        }
    }
    let c = &state.config;
    if c.reject_one_in > 0 && n.is_multiple_of(c.reject_one_in) {
        let mut r = response(
            StatusCode::SERVICE_UNAVAILABLE,
            "{\"detail\":\"queue full\"}".into(),
        );
        r.headers_mut().insert("retry-after", "2".parse().unwrap());
        return r;
    }
    if c.error_one_in > 0 && n.is_multiple_of(c.error_one_in) {
        return response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "{\"detail\":\"inference failed\"}".into(),
        );
    }
    let answers = match answers_for(&body) {
        Ok((a, image)) => {
            if let Some(image) = image {
                state.counters.screenshots.fetch_add(1, Ordering::SeqCst);
                if !state.images.lock().unwrap().insert(image) {
                    state
                        .counters
                        .repeated_images
                        .fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(c.screenshot_delay).await;
            }
            a
        }
        Err(detail) => {
            return response(
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({ "detail": detail }).to_string(),
            )
        }
    };
    tokio::time::sleep(c.delay).await;
    let questions = answers.len() as u64;
    let infer_ms = c.delay.as_secs_f64() * 1000.0;
    state
        .counters
        .infer_micros
        .fetch_add(c.delay.as_micros() as u64, Ordering::SeqCst);
    if c.delay < Duration::from_millis(10) {
        state.counters.fast_infers.fetch_add(1, Ordering::SeqCst);
    }
    state.counters.answered.fetch_add(1, Ordering::SeqCst);
    let out = json!({
        "model": "cua-ai/cua-s1-4b-0.2@mock:text",
        "answers": answers,
        "usage": {"input_tokens": 100 * questions, "output_tokens": 0},
    });
    let mut r = response(StatusCode::OK, out.to_string());
    let h = r.headers_mut();
    h.insert(
        "server-timing",
        format!("prepare;dur=0.5, infer;dur={infer_ms:.3}")
            .parse()
            .unwrap(),
    );
    h.insert("x-request-id", format!("mock-{n}").parse().unwrap());
    h.insert("content-type", "application/json".parse().unwrap());
    r
}

/// Validates the request like the real contract (model, questions, 1–26 criteria; for a
/// screenshot request its own rules) and makes one answer per question: the first option,
/// uniform probabilities. Also returns the data URL of a screenshot request.
fn answers_for(body: &[u8]) -> Result<(Map<String, Value>, Option<String>), String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    if v["model"] != "cua-s1-4b-0.2" {
        return Err("'model' must be 'cua-s1-4b-0.2'".into());
    }
    let image = match v["state"].as_object() {
        Some(state) if state.len() == 1 && state.contains_key("image") => {
            let url = state["image"].as_str().unwrap_or_default();
            if !url.starts_with("data:image/png;base64,") {
                return Err("'state.image' must be a data URL".into());
            }
            let top: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
            if top != ["model", "state", "questions"] {
                return Err(format!("screenshot request with fields {top:?}"));
            }
            let questions = v["questions"].as_object().ok_or("no questions")?;
            if !(1..=8).contains(&questions.len()) {
                return Err("1 to 8 screenshot questions".into());
            }
            for q in questions.values() {
                let fields = q.as_object().ok_or("question not an object")?;
                if fields
                    .keys()
                    .any(|k| !["type", "instructions", "criteria"].contains(&k.as_str()))
                {
                    return Err("unknown field in a screenshot question".into());
                }
            }
            Some(url.to_string())
        }
        _ => None,
    };
    let state_ok = match &v["state"] {
        Value::String(s) => !s.is_empty(),
        Value::Object(o) => !o.is_empty(),
        _ => false,
    };
    if !state_ok {
        return Err("'state' must not be empty".into());
    }
    if let Some(format) = v.get("prompt_format") {
        let s = &v["state"];
        if format != "cua-s1-native"
            || !(s["app"].is_string()
                && s["task_family"].is_string()
                && s["accessibility_tree"].is_string())
        {
            return Err("bad native request".into());
        }
    }
    let questions = v["questions"].as_object().ok_or("no questions")?;
    if questions.is_empty() || questions.len() > 64 {
        return Err("1 to 64 questions".into());
    }
    // Like the server: answers keyed by question name, in request order.
    let mut answers = Map::new();
    for (name, q) in questions {
        let criteria = q["criteria"]
            .as_object()
            .filter(|c| (1..=26).contains(&c.len()))
            .ok_or(format!("question {name:?}: bad criteria"))?;
        let p = 1.0 / criteria.len() as f64;
        let probabilities: Map<String, Value> =
            criteria.keys().map(|k| (k.clone(), json!(p))).collect();
        answers.insert(
            name.clone(),
            json!({
                "type": "choice",
                "choice": criteria.keys().next().unwrap(),
                "probabilities": probabilities,
                "confidence": 0.0,
            }),
        );
    }
    Ok((answers, image))
}

fn metrics(c: &MockCounters) -> Response<Full<Bytes>> {
    let answered = c.answered.load(Ordering::SeqCst);
    let infer_s = c.infer_micros.load(Ordering::SeqCst) as f64 / 1e6;
    let fast = c.fast_infers.load(Ordering::SeqCst);
    let text = format!(
        "# TYPE instinct_infer_seconds histogram\n\
         instinct_infer_seconds_bucket{{le=\"0.01\"}} {fast}\n\
         instinct_infer_seconds_bucket{{le=\"1\"}} {answered}\n\
         instinct_infer_seconds_bucket{{le=\"+Inf\"}} {answered}\n\
         instinct_infer_seconds_sum {infer_s}\n\
         instinct_infer_seconds_count {answered}\n\
         # TYPE instinct_prepare_seconds histogram\n\
         instinct_prepare_seconds_sum {}\n\
         instinct_prepare_seconds_count {answered}\n",
        answered as f64 * 0.0005
    );
    response(StatusCode::OK, text)
}
