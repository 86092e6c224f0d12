//! Driving the load: open loop (a fixed schedule, never waiting for answers) and closed loop
//! (a fixed number of clients, each sending its next request when the previous one is answered).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use indicatif::ProgressBar;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::client::{Client, Outcome, OutcomeKind};
use crate::schedule::{intended_offsets, Arrival};
use crate::workload::{RequestKind, Workload};

/// The load of one level.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LoadMode {
    /// Requests are sent at their scheduled times whatever the server does; latency counts from
    /// the scheduled (intended) send time, so a stalled server cannot hide its backlog.
    Open { arrival: Arrival, rate: f64 },
    /// `concurrency` clients, each waiting for its answer before sending again; latency counts
    /// from the actual send.
    Closed { concurrency: usize },
}

/// Limits shared by every level.
#[derive(Debug, Clone)]
pub struct RunLimits {
    /// At most this many measured requests per level.
    pub max_requests: u64,
    /// Open loop: no request is scheduled later than this. Closed loop: no request is started
    /// after this.
    pub duration: Duration,
    /// Per-request timeout (counted as a "timeout" error).
    pub timeout: Duration,
    /// Open loop: at most this many requests in flight; later ones wait (and their wait counts
    /// in their latency, which is measured from the intended send time).
    pub max_in_flight: usize,
    /// Requests sent one by one before each level and left out of its results.
    pub warmup: u64,
    pub seed: u64,
}

/// One measured request.
#[derive(Debug, Clone)]
pub struct Record {
    pub outcome: Outcome,
    /// The kind of the body sent (the report splits by it).
    pub kind: RequestKind,
    /// Open loop: the scheduled send time; closed loop: the actual send time.
    pub latency_origin: Instant,
}

impl Record {
    pub fn latency(&self) -> Duration {
        self.outcome
            .done_at
            .saturating_duration_since(self.latency_origin)
    }

    /// How late the request left compared to its schedule (zero in closed loop).
    pub fn send_lag(&self) -> Duration {
        self.outcome
            .sent_at
            .saturating_duration_since(self.latency_origin)
    }
}

/// What one level produced.
#[derive(Debug)]
pub struct LevelRun {
    pub mode: LoadMode,
    pub records: Vec<Record>,
    /// Requests started but not finished when the level's hard deadline passed.
    pub unfinished: u64,
    /// `unfinished` by the kind of their body.
    pub unfinished_by_kind: BTreeMap<RequestKind, u64>,
    pub warmup_sent: u64,
    pub warmup_ok: u64,
    /// Start of the measured phase (first scheduled send).
    pub started: Instant,
    /// When the last measured request finished.
    pub finished: Instant,
}

impl LevelRun {
    pub fn sent(&self) -> u64 {
        self.records.len() as u64 + self.unfinished
    }
}

/// Sends the warm-up requests (the first bodies), then the measured ones (the bodies after
/// them), and collects every outcome.
pub async fn run_level(
    client: &Client,
    workload: &Arc<Workload>,
    mode: LoadMode,
    limits: &RunLimits,
    progress: &ProgressBar,
) -> Result<LevelRun> {
    let (warmup_sent, warmup_ok) = warm_up(client, workload, 0, limits.warmup).await?;
    let mut run = run_measured(client, workload, limits.warmup, mode, limits, progress).await?;
    run.warmup_sent = warmup_sent;
    run.warmup_ok = warmup_ok;
    Ok(run)
}

/// Sends the measured requests of one level (no warm-up) and collects every outcome. Request
/// `i` sends body `first_body + i` (cycling), so that a run can go on through the bodies instead
/// of sending the same ones again (a screenshot sent twice would hit the server's image cache).
pub async fn run_measured(
    client: &Client,
    workload: &Arc<Workload>,
    first_body: u64,
    mode: LoadMode,
    limits: &RunLimits,
    progress: &ProgressBar,
) -> Result<LevelRun> {
    let started = Instant::now();
    let (records, unfinished) = match mode {
        LoadMode::Open { arrival, rate } => {
            open_loop(
                client, workload, first_body, arrival, rate, limits, progress,
            )
            .await?
        }
        LoadMode::Closed { concurrency } => (
            closed_loop(client, workload, first_body, concurrency, limits, progress).await?,
            0,
        ),
    };
    // Unfinished requests ran until the hard deadline, which is now.
    let finished = match records.iter().map(|r| r.outcome.done_at).max() {
        Some(last) if unfinished == 0 => last,
        _ => Instant::now(),
    };
    // The kinds of the unfinished: those of the bodies sent, less those answered.
    let mut unfinished_by_kind = BTreeMap::new();
    if unfinished > 0 {
        let sent = records.len() as u64 + unfinished;
        for i in first_body..first_body + sent {
            *unfinished_by_kind.entry(workload.get(i).kind).or_insert(0) += 1;
        }
        for record in &records {
            *unfinished_by_kind.entry(record.kind).or_insert(0) -= 1;
        }
        unfinished_by_kind.retain(|_, n| *n > 0);
    }
    Ok(LevelRun {
        mode,
        records,
        unfinished,
        unfinished_by_kind,
        warmup_sent: 0,
        warmup_ok: 0,
        started,
        finished,
    })
}

/// Sends `count` requests one by one (bodies `first_body`, `first_body + 1`, …) and returns
/// (sent, answered 200). Fails when every one was refused at connect: the server is not there.
pub async fn warm_up(
    client: &Client,
    workload: &Workload,
    first_body: u64,
    count: u64,
) -> Result<(u64, u64)> {
    let mut ok = 0;
    let mut refused = 0;
    for i in first_body..first_body + count {
        let spec = workload.get(i);
        let outcome = client.decide(spec.body.clone(), spec.questions).await;
        match outcome.kind {
            OutcomeKind::Ok => ok += 1,
            OutcomeKind::Error { key } if key == "connection" => refused += 1,
            _ => {}
        }
    }
    if count > 0 && refused == count {
        bail!(
            "cannot connect to {}: every warm-up request was refused (is the server running?)",
            client.target().base_url()
        );
    }
    Ok((count, ok))
}

async fn open_loop(
    client: &Client,
    workload: &Arc<Workload>,
    first_body: u64,
    arrival: Arrival,
    rate: f64,
    limits: &RunLimits,
    progress: &ProgressBar,
) -> Result<(Vec<Record>, u64)> {
    let offsets = intended_offsets(
        arrival,
        rate,
        limits.max_requests,
        limits.duration,
        limits.seed,
    )?;
    progress.set_length(offsets.len() as u64);
    let slots = Arc::new(Semaphore::new(limits.max_in_flight.max(1)));
    let mut tasks = JoinSet::new();
    // A short lead so the first sends are not late because of set-up.
    let start = Instant::now() + Duration::from_millis(5);
    for (i, offset) in offsets.iter().enumerate() {
        let intended = start + *offset;
        tokio::time::sleep_until(intended.into()).await;
        let client = client.clone();
        let spec = workload.get(first_body + i as u64).clone();
        let slots = slots.clone();
        let progress = progress.clone();
        tasks.spawn(async move {
            let _slot = slots
                .acquire_owned()
                .await
                .expect("the semaphore is never closed");
            let outcome = client.decide(spec.body, spec.questions).await;
            progress.inc(1);
            Record {
                outcome,
                kind: spec.kind,
                latency_origin: intended,
            }
        });
    }
    // Every request has its own timeout, but one waiting for a slot could wait many timeouts:
    // a hard deadline keeps the run bounded in time.
    let deadline = start + limits.duration + limits.timeout * 2 + Duration::from_secs(1);
    let mut records = Vec::with_capacity(offsets.len());
    loop {
        match tokio::time::timeout_at(deadline.into(), tasks.join_next()).await {
            Ok(Some(Ok(record))) => records.push(record),
            Ok(Some(Err(join_error))) => bail!("a request task failed: {join_error}"),
            Ok(None) => break,
            Err(_deadline) => {
                tasks.abort_all();
                break;
            }
        }
    }
    let unfinished = offsets.len() as u64 - records.len() as u64;
    Ok((records, unfinished))
}

async fn closed_loop(
    client: &Client,
    workload: &Arc<Workload>,
    first_body: u64,
    concurrency: usize,
    limits: &RunLimits,
    progress: &ProgressBar,
) -> Result<Vec<Record>> {
    if concurrency == 0 {
        bail!("the concurrency must be at least 1");
    }
    progress.set_length(limits.max_requests);
    let next = Arc::new(AtomicU64::new(0));
    let stop_at = Instant::now() + limits.duration;
    let mut workers = JoinSet::new();
    for _ in 0..concurrency {
        let client = client.clone();
        let workload = workload.clone();
        let next = next.clone();
        let progress = progress.clone();
        let max = limits.max_requests;
        workers.spawn(async move {
            let mut records = Vec::new();
            while Instant::now() < stop_at {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= max {
                    break;
                }
                let spec = workload.get(first_body + i);
                let outcome = client.decide(spec.body.clone(), spec.questions).await;
                progress.inc(1);
                let latency_origin = outcome.sent_at;
                records.push(Record {
                    outcome,
                    kind: spec.kind,
                    latency_origin,
                });
            }
            records
        });
    }
    let mut records = Vec::new();
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok(mut worker_records) => records.append(&mut worker_records),
            Err(join_error) => bail!("a client task failed: {join_error}"),
        }
    }
    Ok(records)
}
