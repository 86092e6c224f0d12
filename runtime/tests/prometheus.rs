//! A real Prometheus server (Debian's `prometheus`, installed by `tools/install-test-deps.sh`)
//! scrapes a running instinct under load; the p99 latency and the rejection count are read back
//! through PromQL.

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use instinct::server::{AppState, Settings};
use instinct_scheduler::Config;
use serde_json::Value;

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Runs an instant PromQL query; `None` until Prometheus has data for it.
async fn query(prom: std::net::SocketAddr, promql: &str) -> Option<f64> {
    let head = format!(
        "GET /api/v1/query?query={} HTTP/1.1",
        percent_encode(promql)
    );
    let reply = exchange(prom, &head, b"").await;
    if reply.status != 200 {
        return None;
    }
    let body: Value = serde_json::from_slice(&reply.body).ok()?;
    let value = body["data"]["result"].get(0)?["value"][1].as_str()?;
    value.parse().ok().filter(|v: &f64| v.is_finite())
}

fn request(tag: usize) -> String {
    format!(
        r#"{{"state":"- Button \"Save {tag}\"\n- Button \"Cancel\"","questions":{{"q":{{"type":"choice","instructions":"Save?","criteria":{{"save":"Save","cancel":"Cancel"}}}}}}}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prometheus_reads_p99_and_rejections_through_promql() {
    let binary = std::env::var("INSTINCT_PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
    let state = Arc::new(AppState::new(Settings::new(SERVED, MODEL_ID)));
    state.set_ready(demo_ready_with(Config {
        max_queue_requests: 2,
        max_batch_seqs: 2,
        ..Config::default()
    }));
    let addr = serve_state(state).await;

    let dir = std::env::temp_dir().join(format!("instinct-prom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: instinct\n    static_configs:\n      - targets: ['{addr}']\n"
        ),
    )
    .unwrap();
    let prom_port = free_port();
    let child = Command::new(&binary)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start `{binary}` ({e}): install Debian's `prometheus` package (tools/install-test-deps.sh does)")
        });
    let _prom = KillOnDrop(child);
    let prom: std::net::SocketAddr = format!("127.0.0.1:{prom_port}").parse().unwrap();

    // Load: steady requests, then bursts over the queue so some are rejected.
    let mut ok = 0u64;
    let mut rejected = 0u64;
    for round in 0..4 {
        for i in 0..5 {
            let r = post(addr, &request(round * 100 + i)).await;
            assert_eq!(r.status, 200);
            ok += 1;
        }
        let burst: Vec<_> = (0..16)
            .map(|i| tokio::spawn(async move { post(addr, &request(round * 100 + 50 + i)).await }))
            .collect();
        for h in burst {
            match h.await.unwrap().status {
                200 => ok += 1,
                503 => rejected += 1,
                s => panic!("status {s}"),
            }
        }
    }
    assert!(rejected > 0, "the bursts must overflow a queue of 2");

    // Wait until a scrape after the load is in Prometheus.
    let deadline = Instant::now() + Duration::from_secs(60);
    let total_query = r#"sum(instinct_requests_total{code="ok"})"#;
    loop {
        if query(prom, total_query).await == Some(ok as f64) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never saw {ok} answered requests (last: {:?})",
            query(prom, total_query).await
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let rejections = query(prom, "sum(instinct_rejections_total)").await.unwrap();
    assert_eq!(rejections, rejected as f64, "rejections seen by clients");
    let overloaded = query(
        prom,
        r#"sum(instinct_requests_total{status="503",code="overloaded"})"#,
    )
    .await
    .unwrap();
    assert_eq!(overloaded, rejected as f64);
    let p99 = query(
        prom,
        "histogram_quantile(0.99, sum by (le) (instinct_request_duration_seconds_bucket))",
    )
    .await
    .expect("a p99 over the request-duration histogram");
    let p50 = query(
        prom,
        "histogram_quantile(0.50, sum by (le) (instinct_request_duration_seconds_bucket))",
    )
    .await
    .unwrap();
    eprintln!("PromQL: p50 {p50:.4} s, p99 {p99:.4} s, rejections {rejections}, answered {ok}");
    assert!(p99 > 0.0 && p99 < 30.0, "p99 {p99}");
    assert!(p50 <= p99);
    let _ = std::fs::remove_dir_all(&dir);
}
