//! The threads: one engine thread per device, and one deadline thread.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use metrics::histogram;
use parking_lot::MutexGuard;

use crate::engine::{Batch, Engine, SeqInput};
use crate::queue::{check_shape, Next, TakenBatch};
use crate::shared::Shared;
use crate::telemetry as names;

/// Pulls batches from the shared queue and runs them on `engine` until the scheduler stops.
/// Never holds the queue lock while the engine runs.
pub(crate) fn engine_loop(shared: Arc<Shared>, index: usize, mut engine: Box<dyn Engine>) {
    let heartbeat = shared.config.config.heartbeat_interval;
    let mut state = shared.state.lock();
    loop {
        let now = Instant::now();
        shared.beat(index, now);
        if state.is_stopping() {
            break;
        }
        if state.expire_overdue(now) > 0 {
            shared.after_change(&state);
        }
        match state.next_batch(now) {
            Next::Idle => {
                shared.work.wait_for(&mut state, heartbeat);
            }
            Next::WaitUntil(at) => {
                shared.work.wait_until(&mut state, at.min(now + heartbeat));
            }
            Next::Run(batch) => {
                // Let another idle engine take what is left.
                if state.has_queued() {
                    shared.work.notify_one();
                }
                let (outcome, start, end) = MutexGuard::unlocked(&mut state, || {
                    run_batch(&shared, index, engine.as_mut(), &batch)
                });
                state.complete(&batch, outcome, start, end);
                shared.after_change(&state);
            }
        }
    }
    drop(state);
    shared.engines[index].lock().exited = true;
}

/// Runs one batch, turning an error or a panic into a message.
fn run_batch(
    shared: &Shared,
    index: usize,
    engine: &mut dyn Engine,
    batch: &TakenBatch,
) -> (Result<Vec<Vec<f32>>, String>, Instant, Instant) {
    let inputs: Vec<SeqInput<'_>> = batch
        .seqs
        .iter()
        .map(|s| SeqInput {
            ids: &s.question.ids,
            n_options: s.question.n_options,
            context: s.question.context.as_deref(),
        })
        .collect();
    let view = Batch {
        seqs: &inputs,
        bucket: batch.bucket,
        tokens: batch.tokens,
    };
    let start = Instant::now();
    shared.engines[index].lock().busy_since = Some(start);
    // The plan fits its bucket by construction; a batch that did not would be a scheduler bug,
    // refused here rather than handed to an engine sized for the bucket.
    let result = if view.fits_its_bucket() {
        catch_unwind(AssertUnwindSafe(|| engine.run_batch(&view)))
    } else {
        Ok(Err(anyhow::anyhow!(
            "scheduler bug: a batch of {} tokens in {} sequences was planned for bucket {:?}",
            view.tokens,
            view.seqs.len(),
            view.bucket
        )))
    };
    let end = Instant::now();
    histogram!(names::INFER_SECONDS).record((end - start).as_secs_f64());
    let outcome = match result {
        Ok(Ok(outputs)) => check_shape(batch, outputs).map_err(|e| format!("engine {index}: {e}")),
        Ok(Err(error)) => Err(format!("engine {index}: {error:#}")),
        Err(panic) => Err(format!(
            "engine {index} panicked: {}",
            panic_message(&*panic)
        )),
    };
    let mut status = shared.engines[index].lock();
    status.busy_since = None;
    status.last_heartbeat = end;
    status.batches += 1;
    if outcome.is_err() {
        status.failed_batches += 1;
    }
    (outcome, start, end)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

/// Fails requests whose deadline passes while queued, even when every engine is busy.
pub(crate) fn deadline_loop(shared: Arc<Shared>) {
    let mut state = shared.state.lock();
    while !state.is_stopping() {
        if state.expire_overdue(Instant::now()) > 0 {
            shared.after_change(&state);
        }
        match state.earliest_deadline() {
            Some(at) => {
                shared.sweep.wait_until(&mut state, at);
            }
            None => shared.sweep.wait(&mut state),
        }
    }
}
