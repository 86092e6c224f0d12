//! `/metrics`: the Prometheus text exposition of everything recorded through the `metrics`
//! facade (the scheduler's queue and batch metrics, and the HTTP-level ones named here).
//! Histograms use explicit buckets, so they aggregate across replicas with
//! `histogram_quantile(0.99, sum by (le) (rate(..._bucket[1m])))`.

use std::sync::{Mutex, OnceLock};

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, Unit};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use instinct_scheduler::telemetry;

use crate::engine::DeviceMemory;
use crate::prefix_reuse;
use instinct_kernels::cuda::GraphStats;

/// Histogram, per request: from the first byte of the body to the answer.
pub const REQUEST_DURATION_SECONDS: &str = "instinct_request_duration_seconds";
/// Histogram, per request: validation, prompt rendering and tokenization.
pub const PREPARE_SECONDS: &str = "instinct_prepare_seconds";
/// Histogram: per screenshot not in the image cache, decoding and preprocessing its bytes.
pub const IMAGE_PREPROCESS_SECONDS: &str = "instinct_image_preprocess_seconds";
/// Histogram: per screenshot not in the image cache, the vision tower's encoding (with the wait
/// for a pass while the tower runs other requests' images).
pub const IMAGE_ENCODE_SECONDS: &str = "instinct_image_encode_seconds";
/// Histogram, per request: from admission to the last answer of its questions (queue + infer).
pub const SCHEDULER_SECONDS: &str = "instinct_request_scheduler_seconds";
/// Counter, label `status` (HTTP status code) and `code` (problem code, `ok` for 200).
pub const REQUESTS_TOTAL: &str = "instinct_requests_total";
/// Counter: questions answered.
pub const DECISIONS_TOTAL: &str = "instinct_decisions_total";
/// Counter: prompt tokens of answered requests.
pub const PROMPT_TOKENS_TOTAL: &str = "instinct_prompt_tokens_total";
/// Histogram, per request: prompt tokens.
pub const REQUEST_PROMPT_TOKENS: &str = "instinct_request_prompt_tokens";
/// Gauge: resident memory of the process.
pub const PROCESS_RESIDENT_BYTES: &str = "instinct_process_resident_memory_bytes";
/// Gauge: bytes of model weights held by the engine (host memory on the CPU backend).
pub const WEIGHTS_BYTES: &str = "instinct_model_weights_bytes";
/// Gauge: 1 once the model is loaded and warmed up, 0 before and while draining.
pub const READY: &str = "instinct_ready";
/// Gauge, per GPU (`device`) and `kind`: `weights`, `activations` (buffers, workspace and scratch
/// allocated once at load), `free` and `total` (read from the driver at scrape time).
pub const DEVICE_MEMORY_BYTES: &str = "instinct_device_memory_bytes";

/// Counter, per GPU (`device`) and `bucket` (`ROWSxSEQUENCES`): passes replayed from a captured
/// graph (`--cuda-graphs on`).
pub const GRAPH_REPLAYS_TOTAL: &str = "instinct_graph_replays_total";
/// Counter, per GPU: passes of a capturable size that ran as launched (a shape's first batch, a
/// shape whose capture failed, a graph made stale by larger scratch).
pub const GRAPH_MISSES_TOTAL: &str = "instinct_graph_misses_total";
/// Counter, per GPU: captures made.
pub const GRAPH_CAPTURES_TOTAL: &str = "instinct_graph_captures_total";
/// Gauge, per GPU: seconds spent capturing since start (a gauge: counters hold integers).
pub const GRAPH_CAPTURE_SECONDS: &str = "instinct_graph_capture_seconds";
/// Gauge, per GPU: shapes whose capture failed (they run as launched; the log says why).
pub const GRAPH_FAILED_SHAPES: &str = "instinct_graph_failed_shapes";
/// Counter, per GPU: graphs dropped, least recently used first, to keep at most 512 per language copy.
pub const GRAPH_EVICTIONS_TOTAL: &str = "instinct_graph_evictions_total";

/// Gauge: bytes held for requests in flight (bodies, parsed requests, token ids, screenshot
/// features), against `--max-inflight-mib`.
pub const INFLIGHT_BYTES: &str = "instinct_inflight_bytes";
/// Gauge: the limit of [`INFLIGHT_BYTES`].
pub const INFLIGHT_BYTES_LIMIT: &str = "instinct_inflight_bytes_limit";
/// Gauge: device memory reserved for the prefix states of questions running in chunks (GPUs).
pub const CHUNK_STATE_BYTES: &str = "instinct_chunk_state_bytes";
/// Gauge: the limit of [`CHUNK_STATE_BYTES`].
pub const CHUNK_STATE_BYTES_LIMIT: &str = "instinct_chunk_state_bytes_limit";

/// Gauge: client connections being served (refused ones not counted).
pub const CONNECTIONS_OPEN: &str = "instinct_connections_open";
/// Counter: connections refused because `--max-connections` were open.
pub const CONNECTIONS_REFUSED_TOTAL: &str = "instinct_connections_refused_total";
/// Counter, label `phase`: connections cut by a timeout: `head` (the request head did not arrive
/// in time), `idle` (no next request on a keep-alive connection), `body` (408) and `write` (the
/// client stopped reading its response).
pub const CONNECTION_TIMEOUTS_TOTAL: &str = "instinct_connection_timeouts_total";
/// Every `phase` of [`CONNECTION_TIMEOUTS_TOTAL`].
pub const TIMEOUT_PHASES: &[&str] = &["head", "idle", "body", "write"];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// How often histogram samples are drained without a scrape.
const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Installs the Prometheus recorder (once per process) and returns its handle.
pub fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let latency = [
            REQUEST_DURATION_SECONDS,
            PREPARE_SECONDS,
            IMAGE_PREPROCESS_SECONDS,
            IMAGE_ENCODE_SECONDS,
            SCHEDULER_SECONDS,
            telemetry::QUEUE_WAIT_SECONDS,
            telemetry::INFER_SECONDS,
        ];
        let mut builder = PrometheusBuilder::new();
        for name in latency {
            builder = builder
                .set_buckets_for_metric(
                    Matcher::Full(name.into()),
                    telemetry::LATENCY_BUCKETS_SECONDS,
                )
                .expect("non-empty buckets");
        }
        for name in [
            telemetry::BATCH_SEQUENCES,
            telemetry::BATCH_TOKENS,
            REQUEST_PROMPT_TOKENS,
        ] {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(name.into()), telemetry::SIZE_BUCKETS)
                .expect("non-empty buckets");
        }
        builder = builder
            .set_buckets_for_metric(
                Matcher::Full(telemetry::BATCH_FILL_RATIO.into()),
                telemetry::RATIO_BUCKETS,
            )
            .expect("non-empty buckets");
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        // Another recorder may already be installed (e.g. by a test harness); then ours still
        // renders, just without the facade's global events.
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("a metrics recorder was already installed; /metrics may be incomplete");
        }
        telemetry::describe();
        describe();
        // Exported from the start, so alerts on them see 0 rather than no series.
        gauge!(CONNECTIONS_OPEN).set(0.0);
        counter!(CONNECTIONS_REFUSED_TOTAL).absolute(0);
        for phase in TIMEOUT_PHASES {
            counter!(CONNECTION_TIMEOUTS_TOTAL, "phase" => *phase).absolute(0);
        }
        for name in prefix_reuse::COUNTERS {
            counter!(*name).absolute(0);
        }
        gauge!(prefix_reuse::BYTES).set(0.0);
        gauge!(prefix_reuse::BUDGET_BYTES).set(0.0);
        // The recorder keeps every histogram sample until they are drained into the histograms,
        // which a scrape does; a server nobody scrapes would grow without bound. Drain them
        // every few seconds regardless.
        let upkeep = handle.clone();
        let spawned = std::thread::Builder::new()
            .name("instinct-metrics-upkeep".into())
            .spawn(move || loop {
                std::thread::sleep(UPKEEP_INTERVAL);
                upkeep.run_upkeep();
            });
        if let Err(e) = spawned {
            tracing::warn!(
                "no metrics upkeep thread ({e}); histogram samples drain on scrapes only"
            );
        }
        handle.clone()
    })
}

fn describe() {
    describe_histogram!(
        REQUEST_DURATION_SECONDS,
        Unit::Seconds,
        "Per request: body received to answer sent"
    );
    describe_histogram!(
        PREPARE_SECONDS,
        Unit::Seconds,
        "Per request: validation, prompt rendering and tokenization"
    );
    describe_histogram!(
        IMAGE_PREPROCESS_SECONDS,
        Unit::Seconds,
        "Per screenshot not in the image cache: decoding and preprocessing"
    );
    describe_histogram!(
        IMAGE_ENCODE_SECONDS,
        Unit::Seconds,
        "Per screenshot not in the image cache: the vision tower, its wait for a pass included"
    );
    describe_histogram!(
        SCHEDULER_SECONDS,
        Unit::Seconds,
        "Per request: admission to its last answer (queue + infer)"
    );
    describe_counter!(
        REQUESTS_TOTAL,
        "Requests to /v1/systemone by status and code"
    );
    describe_counter!(DECISIONS_TOTAL, "Questions answered");
    describe_counter!(PROMPT_TOKENS_TOTAL, "Prompt tokens of answered requests");
    describe_histogram!(
        REQUEST_PROMPT_TOKENS,
        Unit::Count,
        "Prompt tokens per request"
    );
    describe_gauge!(
        PROCESS_RESIDENT_BYTES,
        Unit::Bytes,
        "Resident memory of the process"
    );
    describe_gauge!(
        WEIGHTS_BYTES,
        Unit::Bytes,
        "Model weights held by the engine"
    );
    describe_gauge!(READY, "1 when ready to serve, 0 while loading or draining");
    describe_gauge!(CONNECTIONS_OPEN, "Client connections being served");
    describe_gauge!(
        INFLIGHT_BYTES,
        Unit::Bytes,
        "Bytes held for requests in flight: bodies, parsed requests, token ids, screenshot features"
    );
    describe_gauge!(
        INFLIGHT_BYTES_LIMIT,
        Unit::Bytes,
        "Limit of instinct_inflight_bytes (--max-inflight-mib)"
    );
    describe_gauge!(
        CHUNK_STATE_BYTES,
        Unit::Bytes,
        "Device memory reserved for the prefix states of questions running in chunks (GPUs)"
    );
    describe_gauge!(
        CHUNK_STATE_BYTES_LIMIT,
        Unit::Bytes,
        "Limit of instinct_chunk_state_bytes (--max-chunk-state-mib)"
    );
    describe_counter!(
        CONNECTIONS_REFUSED_TOTAL,
        "Connections refused at --max-connections"
    );
    describe_counter!(
        CONNECTION_TIMEOUTS_TOTAL,
        "Connections cut by a timeout, by phase: head, idle, body, write"
    );
    describe_counter!(
        prefix_reuse::HITS_TOTAL,
        "Text questions that resumed from a cached prefix snapshot"
    );
    describe_counter!(
        prefix_reuse::MISSES_TOTAL,
        "Text questions that found no cached prefix snapshot (prefix reuse on)"
    );
    describe_counter!(
        prefix_reuse::HIT_TOKENS_TOTAL,
        "Prompt tokens taken from cached prefix snapshots instead of computed"
    );
    describe_counter!(
        prefix_reuse::EVICTIONS_TOTAL,
        "Prefix snapshots evicted to stay within --prefix-cache-mib"
    );
    describe_counter!(
        prefix_reuse::PROMPT_TOKENS_COMPUTED_TOTAL,
        "Prompt tokens run through the model (beside instinct_prompt_tokens_total)"
    );
    describe_counter!(
        prefix_reuse::FORWARD_PASSES_TOTAL,
        "Forward passes run: one a batch, two where a shared prefix runs first"
    );
    describe_gauge!(
        prefix_reuse::BYTES,
        Unit::Bytes,
        "Bytes of prefix snapshots cached"
    );
    describe_gauge!(
        prefix_reuse::BUDGET_BYTES,
        Unit::Bytes,
        "Budget of the prefix cache (--prefix-cache-mib; 0 where prefix reuse is off)"
    );
    describe_gauge!(
        DEVICE_MEMORY_BYTES,
        Unit::Bytes,
        "GPU memory by kind: weights, activations, graphs (captured passes), free, total"
    );
    describe_counter!(
        GRAPH_REPLAYS_TOTAL,
        "Passes replayed from a captured CUDA graph, by bucket (rows x sequences)"
    );
    describe_counter!(
        GRAPH_MISSES_TOTAL,
        "Passes of a capturable size run as launched (first of their shape, failed or stale capture)"
    );
    describe_counter!(GRAPH_CAPTURES_TOTAL, "CUDA graphs captured");
    describe_gauge!(
        GRAPH_CAPTURE_SECONDS,
        Unit::Seconds,
        "Time spent capturing CUDA graphs since start"
    );
    describe_gauge!(
        GRAPH_FAILED_SHAPES,
        "Pass shapes whose capture failed and that run as launched"
    );
    describe_counter!(
        GRAPH_EVICTIONS_TOTAL,
        "CUDA graphs dropped (least recently used) to keep at most 512 per language copy"
    );
}

/// GPUs whose free memory is read at every scrape.
static DEVICES: Mutex<Vec<DeviceMemory>> = Mutex::new(Vec::new());

/// Publishes the GPUs' fixed allocations now and has every scrape refresh their free memory.
/// A GPU named twice (two engines on it) reports the sum of both engines' allocations.
pub fn register_devices(devices: &[DeviceMemory]) {
    let mut per_device: std::collections::BTreeMap<&str, (u64, u64)> = Default::default();
    for d in devices {
        let sums = per_device.entry(d.device.as_str()).or_default();
        sums.0 += d.weights_bytes;
        sums.1 += d.activations_bytes;
    }
    for (device, (weights, activations)) in per_device {
        let gauge = |kind: &'static str| gauge!(DEVICE_MEMORY_BYTES, "device" => device.to_string(), "kind" => kind);
        gauge("weights").set(weights as f64);
        gauge("activations").set(activations as f64);
    }
    DEVICES
        .lock()
        .expect("device list")
        .extend(devices.iter().cloned());
    refresh_devices();
}

fn refresh_devices() {
    // A GPU named twice runs two engines, each with its own graphs: one sum per device.
    let mut graphs: std::collections::BTreeMap<String, Vec<GraphStats>> = Default::default();
    for d in DEVICES.lock().expect("device list").iter() {
        // A failed read leaves the last values: a scrape must not fail because of it.
        if let Ok((free, total)) = d.probe.read() {
            gauge!(DEVICE_MEMORY_BYTES, "device" => d.device.clone(), "kind" => "free")
                .set(free as f64);
            gauge!(DEVICE_MEMORY_BYTES, "device" => d.device.clone(), "kind" => "total")
                .set(total as f64);
        }
        let stats = d.graphs.iter().map(|g| g.stats());
        graphs.entry(d.device.clone()).or_default().extend(stats);
    }
    for (device, stats) in graphs {
        if !stats.is_empty() {
            publish_graphs(&device, &stats.into_iter().sum());
        }
    }
}

/// The captured passes' counts of GPU `device`, as read at a scrape.
fn publish_graphs(device: &str, stats: &GraphStats) {
    let device = device.to_string();
    for (shape, replays) in &stats.replays {
        let bucket = shape.to_string();
        counter!(GRAPH_REPLAYS_TOTAL, "device" => device.clone(), "bucket" => bucket)
            .absolute(*replays);
    }
    counter!(GRAPH_MISSES_TOTAL, "device" => device.clone()).absolute(stats.misses);
    counter!(GRAPH_CAPTURES_TOTAL, "device" => device.clone()).absolute(stats.captures);
    gauge!(GRAPH_CAPTURE_SECONDS, "device" => device.clone()).set(stats.capture_seconds);
    gauge!(GRAPH_FAILED_SHAPES, "device" => device.clone()).set(stats.failed as f64);
    counter!(GRAPH_EVICTIONS_TOTAL, "device" => device.clone()).absolute(stats.evictions);
    gauge!(DEVICE_MEMORY_BYTES, "device" => device, "kind" => "graphs").set(stats.bytes as f64);
}

/// Counts one finished `/v1/systemone` request.
pub fn count_request(status: u16, code: &str) {
    counter!(REQUESTS_TOTAL, "status" => status.to_string(), "code" => code.to_string())
        .increment(1);
}

/// The text exposition, with the gauges that are read at scrape time refreshed first.
pub fn render() -> String {
    let handle = install();
    if let Some(bytes) = resident_bytes() {
        gauge!(PROCESS_RESIDENT_BYTES).set(bytes as f64);
    }
    refresh_devices();
    handle.render()
}

/// Resident set size from `/proc/self/statm` (Linux); `None` elsewhere.
fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[cfg(test)]
mod tests {
    use instinct_kernels::backend::{CarryShape, PassShape};
    use instinct_kernels::cuda::GraphStats;

    /// The captured passes' counts reach `/metrics` with their bucket labels, as set (counters
    /// hold the backend's totals).
    #[test]
    fn graph_counts_are_published_by_bucket() {
        let plain = PassShape {
            rows: 144,
            seqs: 1,
            carry: CarryShape::default(),
        };
        let carried = PassShape {
            carry: CarryShape {
                prefix_rows: 64,
                snapshot: true,
                snapshot_inside: false,
            },
            ..plain
        };
        let stats = GraphStats {
            held: vec![plain, carried],
            replays: vec![(plain, 7), (carried, 3)],
            misses: 2,
            captures: 2,
            capture_seconds: 0.25,
            bytes: 4 << 20,
            failed: 1,
            last_failure: Some("why".into()),
            evictions: 3,
        };
        super::install();
        super::publish_graphs("cuda:7", &stats);
        let text = super::render();
        for line in [
            r#"instinct_graph_replays_total{device="cuda:7",bucket="144x1"} 7"#,
            r#"instinct_graph_replays_total{device="cuda:7",bucket="144x1+p64+s"} 3"#,
            r#"instinct_graph_misses_total{device="cuda:7"} 2"#,
            r#"instinct_graph_captures_total{device="cuda:7"} 2"#,
            r#"instinct_graph_capture_seconds{device="cuda:7"} 0.25"#,
            r#"instinct_graph_failed_shapes{device="cuda:7"} 1"#,
            r#"instinct_graph_evictions_total{device="cuda:7"} 3"#,
            r#"instinct_device_memory_bytes{device="cuda:7",kind="graphs"} 4194304"#,
        ] {
            assert!(text.contains(line), "{line} not in:\n{text}");
        }
    }

    /// A device's language copies (text, screenshots) each capture their own graphs: their
    /// counts add up, a shape replayed by both once with the sum.
    #[test]
    fn graph_counts_of_a_devices_copies_add_up() {
        let shape = |rows| PassShape {
            rows,
            seqs: 1,
            carry: CarryShape::default(),
        };
        let text = GraphStats {
            held: vec![shape(144), shape(256)],
            replays: vec![(shape(144), 7), (shape(256), 1)],
            misses: 2,
            captures: 2,
            capture_seconds: 0.25,
            bytes: 2 << 20,
            ..GraphStats::default()
        };
        let screenshots = GraphStats {
            held: vec![shape(144)],
            replays: vec![(shape(144), 5)],
            misses: 1,
            captures: 1,
            capture_seconds: 0.5,
            bytes: 1 << 20,
            failed: 1,
            last_failure: Some("why".into()),
            evictions: 4,
        };
        let sum: GraphStats = [text, screenshots].into_iter().sum();
        assert_eq!(sum.held, vec![shape(144), shape(144), shape(256)]);
        assert_eq!(sum.replays, vec![(shape(144), 12), (shape(256), 1)]);
        assert_eq!((sum.misses, sum.captures, sum.bytes), (3, 3, 3 << 20));
        assert_eq!(sum.capture_seconds, 0.75);
        assert_eq!((sum.failed, sum.evictions), (1, 4));
        assert_eq!(sum.last_failure.as_deref(), Some("why"));
    }
}
