//! A point-in-time view of the scheduler for `/livez`, `/readyz` and logs.

use std::time::{Duration, Instant};

/// Queue depth, in-flight work and the engine threads' liveness.
#[derive(Clone, Debug)]
pub struct Stats {
    /// Requests with at least one question still queued.
    pub queued_requests: usize,
    /// Prompt tokens of all queued questions.
    pub queued_tokens: usize,
    /// Queued questions.
    pub queued_sequences: usize,
    /// Admitted requests not answered yet (queued or running).
    pub in_flight_requests: usize,
    /// Batches being run by engines right now.
    pub running_batches: usize,
    pub draining: bool,
    /// One per engine, in the order the engines were given.
    pub engines: Vec<EngineStats>,
}

impl Stats {
    /// Engines that can still take batches (not lost).
    pub fn serving_engines(&self) -> usize {
        self.engines.iter().filter(|e| !e.lost).count()
    }
}

/// Liveness of one engine thread.
#[derive(Clone, Copy, Debug)]
pub struct EngineStats {
    /// Last time the thread went round its loop or finished a batch. An idle thread refreshes it
    /// every `heartbeat_interval`; a running batch does not.
    pub last_heartbeat: Instant,
    /// Start of the batch it is running, if any.
    pub busy_since: Option<Instant>,
    pub batches: u64,
    pub failed_batches: u64,
    /// The thread has ended (after shutdown, or once the engine is lost).
    pub exited: bool,
    /// The engine returned a [`FatalEngineError`](crate::FatalEngineError): its device can never
    /// run again and it takes no more batches.
    pub lost: bool,
}

impl EngineStats {
    /// True if the thread has ended without being lost, or has not been heard of for more than
    /// `max_silence` (choose it above the longest legitimate batch time plus
    /// `heartbeat_interval`). A lost engine is not wedged: it failed fast and said so.
    pub fn is_wedged(&self, now: Instant, max_silence: Duration) -> bool {
        !self.lost
            && (self.exited || now.saturating_duration_since(self.last_heartbeat) > max_silence)
    }
}
