//! The scheduler handle: start, submit, drain, stats, shutdown.

use std::future::Future;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use tokio::sync::watch;

use crate::config::{Config, StartError};
use crate::engine::Engine;
use crate::outcome::{Question, Rejection};
use crate::queue::QueueState;
use crate::shared::{EngineLabels, Shared};
use crate::stats::{EngineStats, Stats};
use crate::telemetry as names;
use crate::ticket::Ticket;
use crate::worker;

/// Admission queue plus one engine thread per device. Share it as `Arc<Scheduler>`; every method
/// takes `&self`. Dropping it without [`Scheduler::shutdown`] stops the threads without waiting
/// and fails unanswered requests with `ShuttingDown`.
pub struct Scheduler {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Scheduler {
    /// Validates `config` and starts one engine thread per engine (in order: engine `i` is
    /// reported as `stats().engines[i]`) plus the deadline thread.
    pub fn start(config: Config, engines: Vec<Box<dyn Engine>>) -> Result<Self, StartError> {
        let validated = config.validate()?;
        if engines.is_empty() {
            return Err(StartError::NoEngines);
        }
        let now = Instant::now();
        let idle_engine = EngineStats {
            last_heartbeat: now,
            busy_since: None,
            batches: 0,
            failed_batches: 0,
            exited: false,
            lost: false,
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(QueueState::new(validated.clone())),
            config: validated,
            work: Condvar::new(),
            sweep: Condvar::new(),
            idle: Condvar::new(),
            drained: watch::Sender::new(false),
            all_lost: watch::Sender::new(false),
            engines: engines.iter().map(|_| Mutex::new(idle_engine)).collect(),
            labels: engines
                .iter()
                .enumerate()
                .map(|(i, e)| EngineLabels {
                    engine: i.to_string(),
                    device: e.device(),
                })
                .collect(),
        });
        publish_engine_series(&shared.labels);
        let scheduler = Self {
            shared: Arc::clone(&shared),
            threads: Mutex::new(Vec::new()),
        };
        let spawn_deadline = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("instinct-deadlines".into())
                .spawn(move || worker::deadline_loop(shared))?
        };
        scheduler.threads.lock().push(spawn_deadline);
        for (index, engine) in engines.into_iter().enumerate() {
            let shared = Arc::clone(&shared);
            // On failure `scheduler` is dropped, which stops the threads already started.
            let handle = std::thread::Builder::new()
                .name(format!("instinct-engine-{index}"))
                .spawn(move || worker::engine_loop(shared, index, engine))?;
            scheduler.threads.lock().push(handle);
        }
        Ok(scheduler)
    }

    /// Admits a request (one [`Question`] per question, all answered together) or rejects it at
    /// once. `deadline`: when to give up if questions are still queued (`None`: now +
    /// `default_deadline`, or never).
    pub fn submit(
        &self,
        questions: Vec<Question>,
        deadline: Option<Instant>,
    ) -> Result<Ticket, Rejection> {
        let mut state = self.shared.state.lock();
        let (id, receiver, new_earliest) = state.admit(questions, deadline, Instant::now())?;
        drop(state);
        self.shared.work.notify_one();
        if new_earliest {
            self.shared.sweep.notify_one();
        }
        Ok(Ticket::new(id, receiver, Arc::clone(&self.shared)))
    }

    /// Stops admitting (later submits get `Draining`); queued and running work goes on, without
    /// waiting to fill batches. Idempotent.
    pub fn drain(&self) {
        let mut state = self.shared.state.lock();
        state.start_draining();
        self.shared.after_change(&state);
        drop(state);
        self.shared.work.notify_all();
    }

    /// The chunk size of chunked prefill (`None`: questions run whole).
    pub fn max_chunk_tokens(&self) -> Option<usize> {
        self.shared.config.config.max_chunk_tokens
    }

    /// The most tokens a question run whole may have: the largest bucket's.
    pub fn longest_whole_question(&self) -> usize {
        self.shared.config.capacity.tokens
    }

    /// The chunk size `question` runs in, where it runs in chunks ([`Config::chunk_size_for`]).
    pub fn chunk_size_for(&self, question: &Question) -> Option<usize> {
        self.shared.config.config.chunk_size_for(question)
    }

    pub fn is_draining(&self) -> bool {
        self.shared.state.lock().is_draining()
    }

    /// After [`Scheduler::drain`]: blocks until every admitted request is answered and no batch
    /// runs, or `timeout` passes. Returns whether it is drained.
    pub fn wait_drained(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        let mut state = self.shared.state.lock();
        while !(state.is_draining() && state.is_idle()) {
            if self.shared.idle.wait_until(&mut state, until).timed_out() {
                return state.is_draining() && state.is_idle();
            }
        }
        true
    }

    /// After [`Scheduler::drain`]: resolves once every admitted request is answered and no batch
    /// runs.
    pub fn drained(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut receiver = self.shared.drained.subscribe();
        async move {
            // An error means the scheduler is gone, which is drained too.
            let _ = receiver.wait_for(|drained| *drained).await;
        }
    }

    /// Resolves once every engine is lost to a [`FatalEngineError`](crate::FatalEngineError):
    /// by then every unanswered request has failed and new ones are refused (`NoEngine`). The
    /// process should exit non-zero so its supervisor restarts it. Never resolves otherwise.
    pub fn all_engines_lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut receiver = self.shared.all_lost.subscribe();
        async move {
            if receiver.wait_for(|lost| *lost).await.is_err() {
                // The scheduler is gone without losing its engines: nothing to report, ever.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Per engine, in order, the device it runs on.
    pub fn engine_devices(&self) -> Vec<String> {
        self.shared
            .labels
            .iter()
            .map(|l| l.device.clone())
            .collect()
    }

    pub fn stats(&self) -> Stats {
        Stats {
            engines: self.shared.engines.iter().map(|e| *e.lock()).collect(),
            ..self.shared.state.lock().stats_without_engines()
        }
    }

    /// Drains for at most `grace`, then stops: anything still unanswered fails with
    /// `ShuttingDown`, and the threads are joined (an engine thread finishes the batch it is
    /// running first). Returns whether everything finished within `grace`. Idempotent.
    pub fn shutdown(&self, grace: Duration) -> bool {
        self.drain();
        let finished = self.wait_drained(grace);
        self.stop();
        let threads: Vec<JoinHandle<()>> = std::mem::take(&mut *self.threads.lock());
        for handle in threads {
            if handle.join().is_err() {
                tracing::error!("a scheduler thread panicked");
            }
        }
        finished
    }

    fn stop(&self) {
        let mut state = self.shared.state.lock();
        state.stop();
        self.shared.after_change(&state);
        drop(state);
        self.shared.work.notify_all();
        self.shared.sweep.notify_all();
        self.shared.idle.notify_all();
    }
}

/// Every per-engine series at zero, so dashboards and alerts see them before the first failure.
fn publish_engine_series(labels: &[EngineLabels]) {
    for l in labels {
        let (engine, device) = (l.engine.clone(), l.device.clone());
        for &kind in names::FAILURE_KINDS {
            metrics::counter!(names::ENGINE_FAILURES_TOTAL, names::KIND_LABEL => kind,
                names::ENGINE_LABEL => engine.clone(), names::DEVICE_LABEL => device.clone())
            .absolute(0);
        }
        metrics::counter!(names::ENGINE_BATCHES_TOTAL, names::ENGINE_LABEL => engine,
            names::DEVICE_LABEL => device)
        .absolute(0);
    }
    metrics::gauge!(names::ENGINES).set(labels.len() as f64);
    metrics::gauge!(names::ENGINES_LOST).set(0.0);
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("stats", &self.stats())
            .finish()
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.stop();
    }
}
