//! Metric names (Prometheus, prefixed `instinct_`, times in seconds) and their descriptions.
//! The scheduler records through the `metrics` facade; the runtime installs the exporter and
//! should use [`LATENCY_BUCKETS_SECONDS`] and [`SIZE_BUCKETS`] for the histograms below.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

/// Histogram, per question: enqueue to the start of its batch.
pub const QUEUE_WAIT_SECONDS: &str = "instinct_queue_wait_seconds";
/// Histogram, per batch, labels `engine`, `device`: time in `Engine::run_batch`.
pub const INFER_SECONDS: &str = "instinct_infer_seconds";
/// Gauge: requests with at least one question queued.
pub const QUEUE_REQUESTS: &str = "instinct_queue_requests";
/// Gauge: prompt tokens of all queued questions.
pub const QUEUE_TOKENS: &str = "instinct_queue_tokens";
/// Gauge: admitted requests not answered yet (queued or running).
pub const INFLIGHT_REQUESTS: &str = "instinct_inflight_requests";
/// Histogram, per batch: sequences.
pub const BATCH_SEQUENCES: &str = "instinct_batch_sequences";
/// Histogram, per batch: tokens.
pub const BATCH_TOKENS: &str = "instinct_batch_tokens";
/// Histogram, per batch: batch tokens / tokens of the bucket it was run as.
pub const BATCH_FILL_RATIO: &str = "instinct_batch_fill_ratio";
/// Counter, label `reason` (see `RejectReason::as_str`).
pub const REJECTIONS_TOTAL: &str = "instinct_rejections_total";
/// Counter: admitted requests whose ticket was dropped before they were answered.
pub const CANCELLED_TOTAL: &str = "instinct_cancelled_total";
/// Counter: requests failed with `DeadlineExceeded`.
pub const DEADLINE_EXCEEDED_TOTAL: &str = "instinct_deadline_exceeded_total";
/// Counter: batches whose engine call failed (error, panic or wrong shape).
pub const BATCH_FAILURES_TOTAL: &str = "instinct_batch_failures_total";
/// Counter: chunks of long questions taken into batches (chunked prefill).
pub const PREFILL_CHUNKS_TOTAL: &str = "instinct_prefill_chunks_total";
/// Counter: of those, chunks cut to the room the batch's whole questions left.
pub const PREFILL_CHUNKS_CUT_TOTAL: &str = "instinct_prefill_chunks_cut_total";
/// Counter: of those, chunks that went first, whole, after being left out of 8 batches in a row
/// (long questions held back by a steady load of short ones).
pub const PREFILL_CHUNKS_OVERDUE_TOTAL: &str = "instinct_prefill_chunks_overdue_total";

/// Counter, labels `kind`, `engine`, `device`: engine calls that failed, by how (`error`,
/// `panic`, `shape`: a result of the wrong shape, `fatal`: the device is lost). One per failed
/// batch; every series starts at 0.
pub const ENGINE_FAILURES_TOTAL: &str = "instinct_engine_failures_total";
/// Counter, labels `engine`, `device`: batches an engine ran (failed ones included).
pub const ENGINE_BATCHES_TOTAL: &str = "instinct_engine_batches_total";
/// Gauge: engines lost to a fatal error since start (the process exits once all are).
pub const ENGINES_LOST: &str = "instinct_engines_lost";
/// Gauge: engines the scheduler started with.
pub const ENGINES: &str = "instinct_engines";

/// Label of [`ENGINE_FAILURES_TOTAL`]: how the call failed.
pub const KIND_LABEL: &str = "kind";
/// Label of the per-engine metrics: the engine's index, in the order the engines were given.
pub const ENGINE_LABEL: &str = "engine";
/// Label of the per-engine metrics: the engine's device (`cpu`, `cuda:N`).
pub const DEVICE_LABEL: &str = "device";
/// Every value of [`KIND_LABEL`].
pub const FAILURE_KINDS: &[&str] = &["error", "panic", "shape", "fatal"];
/// Label name of [`REJECTIONS_TOTAL`].
pub const REASON_LABEL: &str = "reason";

/// Histogram buckets fine enough for a 1 ms SLO: 50 µs to ~30 s, geometric ×1.5 then coarser.
pub const LATENCY_BUCKETS_SECONDS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.000_75, 0.001, 0.001_5, 0.002, 0.003, 0.005, 0.007_5,
    0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0, 30.0,
];

/// Buckets for batch sizes (sequences, tokens): powers of two.
pub const SIZE_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
    16384.0, 32768.0, 65536.0,
];

/// Buckets for [`BATCH_FILL_RATIO`].
pub const RATIO_BUCKETS: &[f64] = &[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0];

/// Registers help text and units with the installed recorder (call once after installing it).
pub fn describe() {
    describe_histogram!(
        QUEUE_WAIT_SECONDS,
        Unit::Seconds,
        "Per question: time from enqueue to the start of its batch"
    );
    describe_histogram!(INFER_SECONDS, Unit::Seconds, "Per batch: engine run time");
    describe_gauge!(
        QUEUE_REQUESTS,
        Unit::Count,
        "Requests with at least one question queued"
    );
    describe_gauge!(QUEUE_TOKENS, Unit::Count, "Prompt tokens queued");
    describe_gauge!(
        INFLIGHT_REQUESTS,
        Unit::Count,
        "Admitted requests not answered yet"
    );
    describe_histogram!(BATCH_SEQUENCES, Unit::Count, "Sequences per batch");
    describe_histogram!(BATCH_TOKENS, Unit::Count, "Tokens per batch");
    describe_histogram!(
        BATCH_FILL_RATIO,
        "Batch tokens divided by the tokens of its bucket"
    );
    describe_counter!(
        REJECTIONS_TOTAL,
        "Requests rejected at admission, by reason"
    );
    describe_counter!(
        CANCELLED_TOTAL,
        "Admitted requests cancelled by their client"
    );
    describe_counter!(
        DEADLINE_EXCEEDED_TOTAL,
        "Requests failed because their deadline passed while queued"
    );
    describe_counter!(BATCH_FAILURES_TOTAL, "Batches whose engine call failed");
    describe_counter!(
        PREFILL_CHUNKS_TOTAL,
        "Chunks of questions longer than --chunk-over-tokens taken into batches"
    );
    describe_counter!(
        PREFILL_CHUNKS_CUT_TOTAL,
        "Chunks cut to the room the whole questions of their batch left"
    );
    describe_counter!(
        PREFILL_CHUNKS_OVERDUE_TOTAL,
        "Chunks that went first, whole, after being left out of 8 batches in a row"
    );
    describe_counter!(
        ENGINE_FAILURES_TOTAL,
        "Failed engine calls by kind: error, panic, shape (wrong result shape), fatal (device lost)"
    );
    describe_counter!(ENGINE_BATCHES_TOTAL, "Batches run, per engine");
    describe_gauge!(ENGINES, Unit::Count, "Engines started");
    describe_gauge!(
        ENGINES_LOST,
        Unit::Count,
        "Engines lost to a fatal device error since start"
    );
}
