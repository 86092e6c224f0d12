//! The threads: one engine thread per device, and one deadline thread.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

use metrics::{counter, gauge, histogram};
use parking_lot::MutexGuard;

use crate::engine::{Batch, ChunkInput, Engine, FatalEngineError, SeqInput};
use crate::queue::{check_shape, Next, TakenBatch};
use crate::shared::Shared;
use crate::telemetry as names;

/// Pulls batches from the shared queue and runs them on `engine` until the scheduler stops.
/// Never holds the queue lock while the engine runs.
pub(crate) fn engine_loop(shared: Arc<Shared>, index: usize, mut engine: Box<dyn Engine>) {
    let heartbeat = shared.config.config.heartbeat_interval;
    let mut state = shared.state.lock();
    loop {
        let orphans = state.take_orphaned_carries(index);
        if !orphans.is_empty() {
            MutexGuard::unlocked(&mut state, || drop(orphans));
        }
        let now = Instant::now();
        shared.beat(index, now);
        if state.is_stopping() {
            break;
        }
        if state.expire_overdue(now) > 0 {
            shared.after_change(&state);
        }
        match state.next_batch(now, index) {
            // Carries left for this engine while it dropped the last ones (their wake-up came
            // before it waited): drop them first.
            Next::Idle | Next::WaitUntil(_) if state.has_orphaned_carries_of(index) => {}
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
                let lost = match &outcome {
                    Err(failure) if failure.kind == FailureKind::Fatal => {
                        Some(failure.message.clone())
                    }
                    _ => None,
                };
                state.complete(index, batch, outcome.map_err(|f| f.message), start, end);
                if state.has_queued() {
                    // A chunk's successor may have been queued: any idle engine may take it.
                    shared.work.notify_one();
                }
                if let Some(why) = lost {
                    lose_engine(&shared, &mut state, index, &why);
                    shared.after_change(&state);
                    break;
                }
                shared.after_change(&state);
            }
        }
    }
    // Left by requests failed as this engine stopped (the last engine lost fails everything).
    let orphans = state.take_orphaned_carries(index);
    drop(state);
    drop(orphans);
    shared.engines[index].lock().exited = true;
}

/// Retires engine `index` after a fatal error; when it was the last one, fails everything left
/// and tells [`crate::Scheduler::all_engines_lost`] waiters.
fn lose_engine(shared: &Shared, state: &mut crate::queue::QueueState, index: usize, why: &str) {
    shared.engines[index].lock().lost = true;
    let lost = shared.engines.iter().filter(|e| e.lock().lost).count();
    gauge!(names::ENGINES_LOST).set(lost as f64);
    tracing::error!(
        engine = index,
        device = %shared.labels[index].device,
        lost,
        engines = shared.engines.len(),
        "engine lost for good: {why}"
    );
    if lost == shared.engines.len() {
        state.lose_all_engines(why);
        shared.all_lost.send_replace(true);
    } else {
        state.lose_engine(index, why);
        if state.has_queued() {
            // What this engine would have taken goes to the others.
            shared.work.notify_all();
        }
    }
}

/// How an engine call failed (the `kind` label of `instinct_engine_failures_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FailureKind {
    Error,
    Panic,
    Shape,
    Fatal,
}

impl FailureKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Error => "error",
            Self::Panic => "panic",
            Self::Shape => "shape",
            Self::Fatal => "fatal",
        }
    }
}

#[derive(Debug)]
struct EngineFailure {
    kind: FailureKind,
    message: String,
}

/// Runs one batch, turning an error or a panic into a message of its kind.
fn run_batch(
    shared: &Shared,
    index: usize,
    engine: &mut dyn Engine,
    batch: &TakenBatch,
) -> (Result<Vec<Vec<f32>>, EngineFailure>, Instant, Instant) {
    let inputs: Vec<SeqInput<'_>> = batch
        .seqs
        .iter()
        .map(|s| SeqInput {
            ids: s.ids(),
            n_options: s.question.n_options,
            context: s.question.context.as_deref(),
            chunk: s.chunk.as_ref().map(|c| ChunkInput {
                start: c.start,
                last: s.answers(),
                carry: &c.carry,
            }),
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
    let labels = &shared.labels[index];
    let (engine_label, device_label) = (labels.engine.clone(), labels.device.clone());
    histogram!(names::INFER_SECONDS, names::ENGINE_LABEL => engine_label.clone(),
        names::DEVICE_LABEL => device_label.clone())
    .record((end - start).as_secs_f64());
    counter!(names::ENGINE_BATCHES_TOTAL, names::ENGINE_LABEL => engine_label.clone(),
        names::DEVICE_LABEL => device_label.clone())
    .increment(1);
    let failure = |kind, message| EngineFailure { kind, message };
    let outcome = match result {
        Ok(Ok(outputs)) => check_shape(batch, outputs)
            .map_err(|e| failure(FailureKind::Shape, format!("engine {index}: {e}"))),
        Ok(Err(error)) => {
            let kind = if FatalEngineError::is_in(&error) {
                FailureKind::Fatal
            } else {
                FailureKind::Error
            };
            Err(failure(kind, format!("engine {index}: {error:#}")))
        }
        Err(panic) => Err(failure(
            FailureKind::Panic,
            format!("engine {index} panicked: {}", panic_message(&*panic)),
        )),
    };
    let mut status = shared.engines[index].lock();
    status.busy_since = None;
    status.last_heartbeat = end;
    status.batches += 1;
    if let Err(f) = &outcome {
        status.failed_batches += 1;
        counter!(names::ENGINE_FAILURES_TOTAL, names::KIND_LABEL => f.kind.as_str(),
            names::ENGINE_LABEL => engine_label, names::DEVICE_LABEL => device_label)
        .increment(1);
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
