//! Faults injected into the demo engine, seen over real HTTP: a failed or panicking batch answers
//! its requests with a 500 problem carrying the request id and the next batches are served; a
//! hung batch makes `/livez` fail until it returns; a lost device answers what it can, turns
//! `/livez` and `/readyz` to 503 and makes the server loop return an error (the process exits
//! non-zero); with two engines, one lost device leaves the other serving.

mod common;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use instinct::engine::{self, LoadOptions};
use instinct::server::{AppState, Ready, Settings};
use instinct_model::source::{Device, ModelSource};
use instinct_scheduler::{Batch, Config, Engine, FatalEngineError, Scheduler};
use parking_lot::{Condvar, Mutex};
use serde_json::Value;

#[derive(Clone, Copy, Debug)]
enum Fault {
    Error,
    Panic,
    /// Blocks until the gate opens, then answers.
    Hang,
    /// What a sticky CUDA error becomes.
    DeviceLost,
}

/// The faults the next batches meet, in order (any engine), and the gate hung batches wait on.
#[derive(Default)]
struct Plan {
    faults: Mutex<VecDeque<Fault>>,
    open: Mutex<bool>,
    opened: Condvar,
}

impl Plan {
    fn inject(&self, fault: Fault) {
        self.faults.lock().push_back(fault);
    }
    fn open_gate(&self) {
        *self.open.lock() = true;
        self.opened.notify_all();
    }
}

/// The demo engine behind a wrapper that fails the way the plan says.
struct Faulty {
    inner: Box<dyn Engine>,
    plan: Arc<Plan>,
}

impl Engine for Faulty {
    fn run_batch(&mut self, batch: &Batch<'_>) -> anyhow::Result<Vec<Vec<f32>>> {
        let fault = self.plan.faults.lock().pop_front();
        match fault {
            None => {}
            Some(Fault::Error) => anyhow::bail!("injected failure"),
            Some(Fault::Panic) => panic!("injected panic"),
            Some(Fault::Hang) => {
                let mut open = self.plan.open.lock();
                while !*open {
                    self.plan.opened.wait(&mut open);
                }
            }
            Some(Fault::DeviceLost) => {
                return Err(anyhow::Error::new(FatalEngineError(
                    "injected: CUDA_ERROR_ILLEGAL_ADDRESS".into(),
                )))
            }
        }
        self.inner.run_batch(batch)
    }
}

struct Server {
    state: Arc<AppState>,
    addr: std::net::SocketAddr,
    plan: Arc<Plan>,
}

/// A demo server with `engines` faulty engines and a 300 ms stall limit.
async fn server(engines: usize) -> Server {
    let config = Config {
        heartbeat_interval: Duration::from_millis(10),
        max_batch_seqs: 4,
        ..Config::default()
    };
    let source = ModelSource::resolve(None, None, None).unwrap();
    let limits = engine::batch_limits(config.batch_capacity().unwrap());
    let options = LoadOptions {
        cpu_engines: engines,
        image_cache_bytes: 1 << 20,
        prefix_cache_bytes: Some(0),
        ..LoadOptions::default()
    };
    let loaded = engine::load(Device::Cpu, &source, limits, options).unwrap();
    let plan = Arc::new(Plan::default());
    let faulty: Vec<Box<dyn Engine>> = loaded
        .engines
        .into_iter()
        .map(|inner| {
            Box::new(Faulty {
                inner,
                plan: plan.clone(),
            }) as Box<dyn Engine>
        })
        .collect();
    let settings = Settings {
        engine_stall: Duration::from_millis(300),
        ..Settings::new(SERVED, MODEL_ID)
    };
    let state = Arc::new(AppState::new(settings));
    state.set_ready(Ready {
        preparer: loaded.preparer,
        scheduler: Scheduler::start(config, faulty).unwrap(),
    });
    let addr = serve_state(state.clone()).await;
    Server { state, addr, plan }
}

const BODY: &str = r#"{"state":"- Button \"OK\"\n- Button \"Cancel\"","questions":{"q":{"type":"choice","instructions":"Confirm","criteria":{"ok":"OK","cancel":"Cancel"}}}}"#;

async fn post_as(addr: std::net::SocketAddr, request_id: &str) -> Reply {
    exchange(
        addr,
        &format!(
            "POST /v1/systemone HTTP/1.1\r\nContent-Type: application/json\r\nX-Request-Id: {request_id}"
        ),
        BODY.as_bytes(),
    )
    .await
}

async fn get(addr: std::net::SocketAddr, path: &str) -> Reply {
    exchange(addr, &format!("GET {path} HTTP/1.1"), b"").await
}

/// `instinct_engine_failures_total` of `kind`, summed over engines, on `/metrics`.
async fn failures_of(addr: std::net::SocketAddr, kind: &str) -> f64 {
    let text = String::from_utf8(get(addr, "/metrics").await.body).unwrap();
    let label = format!("kind=\"{kind}\"");
    text.lines()
        .filter(|l| l.starts_with("instinct_engine_failures_total{") && l.contains(&label))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// Polls `path` until it answers `status`, or fails the test after `within`.
async fn until_status(
    addr: std::net::SocketAddr,
    path: &str,
    status: u16,
    within: Duration,
) -> Value {
    let until = Instant::now() + within;
    loop {
        let r = get(addr, path).await;
        if r.status == status {
            return r.json();
        }
        assert!(Instant::now() < until, "{path} never answered {status}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn assert_inference_failed(r: &Reply, request_id: &str) {
    assert_eq!(r.status, 500);
    let body = r.json();
    assert_eq!(body["code"], "inference_failed", "{body}");
    assert_eq!(body["request_id"], request_id, "{body}");
    assert_eq!(r.header("x-request-id"), Some(request_id));
    assert_eq!(
        body["detail"], "inference failed",
        "no internal detail leaks: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_or_panicking_batch_answers_500_with_the_request_id_and_serving_goes_on() {
    let s = server(1).await;
    assert_eq!(post_as(s.addr, "warm").await.status, 200);
    let (errors, panics) = (
        failures_of(s.addr, "error").await,
        failures_of(s.addr, "panic").await,
    );

    s.plan.inject(Fault::Error);
    assert_inference_failed(&post_as(s.addr, "fails-1").await, "fails-1");
    assert_eq!(post_as(s.addr, "after-error").await.status, 200);

    s.plan.inject(Fault::Panic);
    assert_inference_failed(&post_as(s.addr, "panics-1").await, "panics-1");
    assert_eq!(post_as(s.addr, "after-panic").await.status, 200);

    assert!(failures_of(s.addr, "error").await >= errors + 1.0);
    assert!(failures_of(s.addr, "panic").await >= panics + 1.0);
    assert_eq!(get(s.addr, "/livez").await.status, 200);
    assert_eq!(get(s.addr, "/readyz").await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hung_batch_fails_livez_until_it_returns() {
    let s = server(1).await;
    assert_eq!(get(s.addr, "/livez").await.status, 200);
    s.plan.inject(Fault::Hang);
    let addr = s.addr;
    let hung = tokio::spawn(async move { post_as(addr, "hung").await });
    let wedged = until_status(s.addr, "/livez", 503, Duration::from_secs(5)).await;
    assert_eq!(wedged["status"], "wedged");
    assert_eq!(wedged["engines"], serde_json::json!([0]));
    s.plan.open_gate();
    assert_eq!(
        hung.await.unwrap().status,
        200,
        "the hung request is answered once it returns"
    );
    until_status(s.addr, "/livez", 200, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_device_answers_what_it_can_then_the_server_stops_with_an_error() {
    let s = server(1).await;
    let fatal_before = failures_of(s.addr, "fatal").await;
    let state = s.state.clone();
    let stopped = tokio::spawn(async move {
        instinct::serve::until_stopped(&state, std::future::pending(), Duration::from_secs(1)).await
    });
    s.plan.inject(Fault::DeviceLost);
    let started = Instant::now();
    assert_inference_failed(&post_as(s.addr, "lost-1").await, "lost-1");
    let livez = until_status(s.addr, "/livez", 503, Duration::from_secs(2)).await;
    assert_eq!(livez["status"], "engines_lost");
    let readyz = get(s.addr, "/readyz").await;
    assert_eq!(readyz.status, 503);
    assert_eq!(readyz.json()["status"], "engines_lost");
    let refused = post_as(s.addr, "after-loss").await;
    assert_eq!(refused.status, 503);
    assert!(refused.header("retry-after").is_some());
    assert_eq!(refused.json()["request_id"], "after-loss");
    let result = tokio::time::timeout(Duration::from_secs(5), stopped)
        .await
        .expect("the server loop returns instead of hanging")
        .unwrap();
    let error = result.expect_err("a lost device makes the server loop fail");
    assert!(
        error.to_string().contains("every engine is lost"),
        "{error:#}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(failures_of(s.addr, "fatal").await >= fatal_before + 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_lost_device_of_two_leaves_the_server_ready_on_the_other() {
    let s = server(2).await;
    s.plan.inject(Fault::DeviceLost);
    assert_inference_failed(&post_as(s.addr, "lost-one").await, "lost-one");
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        let ready = get(s.addr, "/readyz").await;
        assert_eq!(ready.status, 200, "ready while one engine serves");
        if ready.json()["engines"] == serde_json::json!({"serving": 1, "lost": 1}) {
            break;
        }
        assert!(
            Instant::now() < until,
            "readyz never reported the lost engine"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for i in 0..6 {
        assert_eq!(post_as(s.addr, &format!("after-{i}")).await.status, 200);
    }
    assert_eq!(get(s.addr, "/livez").await.status, 200);
}

/// `instinct_engine_batches_total` per engine label, from `/metrics`.
async fn batches_per_engine(addr: std::net::SocketAddr) -> Vec<(String, f64)> {
    let text = String::from_utf8(get(addr, "/metrics").await.body).unwrap();
    let mut out: Vec<(String, f64)> = text
        .lines()
        .filter(|l| l.starts_with("instinct_engine_batches_total{"))
        .map(|l| {
            let engine = l
                .split("engine=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            (
                engine.to_string(),
                l.rsplit(' ').next().unwrap().parse().unwrap(),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_engines_answer_a_burst_as_one_does_and_each_takes_batches() {
    let one = server(1).await;
    let three = server(3).await;
    let body = |i: usize| BODY.replace("Confirm", &format!("Confirm {i}"));
    let mut serial = Vec::new();
    for i in 0..24 {
        let r = exchange(
            one.addr,
            "POST /v1/systemone HTTP/1.1\r\nContent-Type: application/json",
            body(i).as_bytes(),
        )
        .await;
        assert_eq!(r.status, 200);
        serial.push(r.json()["answers"]["q"]["probabilities"].clone());
    }
    let addr = three.addr;
    let burst: Vec<_> = (0..24)
        .map(|i| {
            let b = body(i);
            tokio::spawn(async move {
                exchange(
                    addr,
                    "POST /v1/systemone HTTP/1.1\r\nContent-Type: application/json",
                    b.as_bytes(),
                )
                .await
            })
        })
        .collect();
    for (i, h) in burst.into_iter().enumerate() {
        let r = h.await.unwrap();
        assert_eq!(r.status, 200, "nothing is lost or refused");
        let got = &r.json()["answers"]["q"]["probabilities"];
        for (k, v) in serial[i].as_object().unwrap() {
            let (a, b) = (v.as_f64().unwrap(), got[k].as_f64().unwrap());
            assert!((a - b).abs() < 1e-5, "question {i} option {k}: {a} vs {b}");
        }
    }
    // Per scheduler (the metrics of this test binary are shared by every server in it).
    let stats = three.state.ready().unwrap().scheduler.stats();
    let batches: Vec<u64> = stats.engines.iter().map(|e| e.batches).collect();
    assert!(
        batches.iter().all(|&n| n > 0),
        "every engine ran batches: {batches:?}"
    );
    let series = batches_per_engine(three.addr).await;
    let engines: Vec<&str> = series.iter().map(|(e, _)| e.as_str()).collect();
    assert!(
        ["0", "1", "2"].iter().all(|e| engines.contains(e)),
        "one batches series per engine: {series:?}"
    );
}
