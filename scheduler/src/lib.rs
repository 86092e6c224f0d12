//! Bounded admission, backpressure, dynamic batching, cancellation, deadlines and one engine
//! thread per device. Model-agnostic: a device is anything that implements [`Engine`].
//!
//! ```text
//! let scheduler = Scheduler::start(config, vec![Box::new(cpu_engine)])?;
//! match scheduler.submit(questions, deadline) {
//!     Ok(ticket) => ticket.await,   // Result<Answer, Failure>; dropping the ticket cancels
//!     Err(rejection) => /* 503 + Retry-After: rejection.retry_after */,
//! }
//! scheduler.drain(); scheduler.drained().await;   // or shutdown(grace)
//! ```
//!
//! **Admission** ([`Scheduler::submit`]): a request is refused at once, never parked, when the
//! queue holds `max_queue_requests` requests or its tokens would take the queue over
//! `max_queue_tokens` (`Retry-After` = queued tokens / measured drain rate, clamped), when
//! draining, when one question is longer than the largest bucket or the request alone exceeds
//! `max_queue_tokens` (`TooLarge`: it could never run), or when it is empty (`Invalid`).
//!
//! **Batching** (engine threads): each question is one sequence. All engine threads pull from the
//! one queue. The next batch is chosen FIFO with first-fit backfill under the bucket shapes, whole
//! questions before chunks (the `batching` module states the ageing guarantees: the oldest queued
//! whole question is in the next batch unless an overdue chunk took its room; younger questions
//! only fill space no older one could use). A batch runs at
//! once when no engine is running one (an idle device never waits; what arrives while it computes
//! forms the next batch), when it is full (a queued question was left out for lack of room) or
//! when draining; otherwise, while another engine's batch runs, when its oldest question has
//! waited `max_wait`. Questions of one request may span
//! batches and engines; answers are reassembled in order. With `max_chunk_tokens`, a resumable
//! question longer than it (or than `chunk_over_tokens`) is queued as consecutive chunks: the next
//! chunk is queued only when the one before it has completed, and the engine carries its state
//! between them ([`ChunkInput`]). Chunks take the room whole questions leave: a batch that
//! carries one holds at most `max_chunk_tokens` tokens in all, later chunks cut to the room on
//! `chunk_grid`. Only the engine that ran a chunk takes the next one (the state
//! may be in its device's memory); a carry whose request goes while its next chunk is queued is
//! dropped by that engine's thread between batches, never by the thread that cancelled (a device
//! free from another thread could land inside a CUDA graph capture).
//!
//! **Failures**: a deadline passing while any question of the request has not started fails it
//! with `DeadlineExceeded` (its queued questions and chunks never run); a chunked question has
//! started with its first chunk, and then runs on as a whole question does; an engine error or panic fails exactly
//! the requests of that batch (counted by kind in `instinct_engine_failures_total`). An engine
//! that returns a [`FatalEngineError`] (its device is lost) also takes no more batches, and the
//! requests whose next chunk needs the state it held fail; once every
//! engine is lost, what is left fails, new requests are refused (`NoEngine`) and
//! [`Scheduler::all_engines_lost`] resolves. Every admitted request is replied to exactly once.

mod batching;
mod config;
mod drain_rate;
mod engine;
mod outcome;
mod queue;
mod scheduler;
mod shared;
mod stats;
pub mod telemetry;
mod ticket;
mod worker;

pub use config::{Bucket, Config, StartError};
pub use engine::{Batch, ChunkCarry, ChunkInput, Engine, FatalEngineError, SeqInput};
pub use outcome::{Answer, Failure, Question, RejectReason, Rejection, SeqContext};
pub use scheduler::Scheduler;
pub use stats::{EngineStats, Stats};
pub use ticket::Ticket;

#[cfg(test)]
mod tests {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}

    #[test]
    fn handles_can_cross_threads_and_tasks() {
        send_sync::<super::Scheduler>();
        send::<super::Ticket>();
        send_sync::<super::Rejection>();
        send_sync::<super::Failure>();
    }
}
