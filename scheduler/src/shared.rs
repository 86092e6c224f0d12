//! The state the scheduler handle, the tickets and the threads share. Its own module so that
//! each of them depends on it and none on another.

use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use tokio::sync::watch;

use crate::config::Validated;
use crate::queue::QueueState;
use crate::stats::EngineStats;

/// State shared by the handle, the tickets and the threads.
pub(crate) struct Shared {
    pub config: Validated,
    pub state: Mutex<QueueState>,
    /// Engine threads wait here for work.
    pub work: Condvar,
    /// The deadline thread waits here for the earliest deadline.
    pub sweep: Condvar,
    /// `wait_drained` waits here.
    pub idle: Condvar,
    /// True once draining and idle (for async waiters).
    pub drained: watch::Sender<bool>,
    /// True once every engine is lost.
    pub all_lost: watch::Sender<bool>,
    pub engines: Vec<Mutex<EngineStats>>,
    /// Per engine, its `(engine, device)` metric labels.
    pub labels: Vec<EngineLabels>,
}

/// The `engine` and `device` labels of one engine's metrics.
#[derive(Clone, Debug)]
pub(crate) struct EngineLabels {
    pub engine: String,
    pub device: String,
}

impl Shared {
    pub fn beat(&self, engine: usize, now: Instant) {
        self.engines[engine].lock().last_heartbeat = now;
    }

    /// Wakes drain waiters if the last piece of work just finished, and an engine if carries
    /// wait for one to drop them.
    pub fn after_change(&self, state: &QueueState) {
        if state.has_orphaned_carries() {
            // Each carry is for its own engine to drop.
            self.work.notify_all();
        }
        if state.is_draining() && state.is_idle() {
            self.idle.notify_all();
            self.drained.send_replace(true);
        }
    }

    pub fn cancel(&self, id: u64) {
        let mut state = self.state.lock();
        if state.cancel(id) {
            self.after_change(&state);
        }
    }
}
