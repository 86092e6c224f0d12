//! What the scheduler needs from a device: run one packed batch of sequences.

use crate::config::Bucket;

/// One sequence (one question, or one chunk of a long one) of a batch.
#[derive(Clone, Copy, Debug)]
pub struct SeqInput<'a> {
    /// Prompt token ids (of this chunk only, for a chunk).
    pub ids: &'a [u32],
    /// How many answer options the question offers; the engine returns that many probabilities
    /// (none for a chunk that is not its question's last).
    pub n_options: usize,
    /// Engine-specific inputs beyond the ids (see [`SeqContext`](crate::SeqContext)).
    pub context: Option<&'a (dyn std::any::Any + Send + Sync)>,
    /// Set when the question runs as consecutive chunks ([`Config::max_chunk_tokens`]).
    ///
    /// [`Config::max_chunk_tokens`]: crate::Config::max_chunk_tokens
    pub chunk: Option<ChunkInput<'a>>,
}

impl SeqInput<'_> {
    /// Whether the engine answers this sequence: a whole question or its last chunk.
    pub fn answers(&self) -> bool {
        self.chunk.is_none_or(|c| c.last)
    }
}

/// A chunk of a question run as consecutive chunks in consecutive batches (chunked prefill): its
/// first token's place in the question, whether it is the last, and the engine's state between
/// chunks. A chunk runs only after the one before it has completed, so the engine finds in
/// `carry` what it left there at the end of the previous chunk (nothing before the first).
#[derive(Clone, Copy, Debug)]
pub struct ChunkInput<'a> {
    pub start: usize,
    pub last: bool,
    pub carry: &'a ChunkCarry,
}

/// What an engine keeps between the chunks of one question (its prefix state), opaque to the
/// scheduler. Dropped with the question: when it is answered, fails, expires or is cancelled.
#[derive(Default)]
pub struct ChunkCarry(parking_lot::Mutex<Option<Box<dyn std::any::Any + Send>>>);

impl ChunkCarry {
    /// Takes what the previous chunk left (`None` before the first chunk).
    pub fn take(&self) -> Option<Box<dyn std::any::Any + Send>> {
        self.0.lock().take()
    }

    /// Leaves `state` for the next chunk.
    pub fn put(&self, state: Box<dyn std::any::Any + Send>) {
        *self.0.lock() = Some(state);
    }
}

impl std::fmt::Debug for ChunkCarry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self.0.lock().is_some();
        f.debug_struct("ChunkCarry").field("held", &held).finish()
    }
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
/// `run_batch` returns, per sequence and in order, the probabilities of its `n_options` options
/// (an empty list for a chunk that is not its question's last: see [`SeqInput::answers`]).
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
