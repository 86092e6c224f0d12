//! What the scheduler needs from a device: run one packed batch of sequences.

use crate::config::Bucket;

/// One sequence (one question) of a batch.
#[derive(Clone, Copy, Debug)]
pub struct SeqInput<'a> {
    /// Prompt token ids.
    pub ids: &'a [u32],
    /// How many answer options the question offers; the engine returns that many probabilities.
    pub n_options: usize,
    /// Engine-specific inputs beyond the ids (see [`SeqContext`](crate::SeqContext)).
    pub context: Option<&'a (dyn std::any::Any + Send + Sync)>,
}

/// A batch as handed to an engine: its sequences in order, and the bucket it was planned for (the
/// smallest configured bucket that holds it). The batch always fits its bucket; an engine picks
/// the buffers it allocated by the bucket and runs the batch whole, in one pass.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    pub seqs: &'a [SeqInput<'a>],
    pub bucket: Bucket,
    /// Total tokens over all sequences.
    pub tokens: usize,
}

impl Batch<'_> {
    /// Whether the batch fits the bucket it was planned for (it always should).
    pub fn fits_its_bucket(&self) -> bool {
        self.bucket.holds(self.tokens, self.seqs.len())
    }
}

/// One device's model. One value per device is moved into its engine thread, so it may keep
/// mutable scratch state (`&mut self`).
///
/// `run_batch` returns, per sequence and in order, the probabilities of its `n_options` options.
/// An error, a panic, or a result of the wrong shape fails exactly the requests of that batch with
/// [`Failure::Internal`](crate::Failure::Internal); the thread keeps serving. (Catching the panic
/// needs `panic = "unwind"`, the default.) An error whose chain holds a [`FatalEngineError`]
/// fails the batch the same way and retires the engine for good (see there).
pub trait Engine: Send + 'static {
    fn run_batch(&mut self, batch: &Batch<'_>) -> anyhow::Result<Vec<Vec<f32>>>;

    /// The device it runs on (`cpu`, `cuda:N`), for the `device` label of the per-engine metrics
    /// and for logs.
    fn device(&self) -> String {
        "unnamed".to_string()
    }
}

/// The device behind an engine can never run again (a sticky CUDA error: the context is lost).
/// Return it (anywhere in an `anyhow` chain) from [`Engine::run_batch`]: the batch's requests
/// fail, the engine takes no more batches and is reported lost. Once every engine is lost, the
/// scheduler fails what is left and refuses new requests, and [`crate::Scheduler::all_engines_lost`]
/// resolves so the process can exit and be restarted.
#[derive(Debug, thiserror::Error)]
#[error("the device is lost: {0}")]
pub struct FatalEngineError(pub String);

impl FatalEngineError {
    /// Whether `error` says the engine's device is lost.
    pub fn is_in(error: &anyhow::Error) -> bool {
        error.chain().any(|cause| cause.is::<FatalEngineError>())
    }
}
