//! What a caller gets back: a rejection at submit, or a failure after admission.

use std::time::Duration;

/// What a sequence carries besides its token ids, opaque to the scheduler and read by the engine
/// (for a screenshot question: the image features and the 3-D positions). Shared, so the
/// questions of one request, and cache hits, do not copy it.
pub type SeqContext = std::sync::Arc<dyn std::any::Any + Send + Sync>;

/// One question of a request: its prompt token ids and its number of options.
#[derive(Clone, Debug)]
pub struct Question {
    pub ids: Vec<u32>,
    pub n_options: usize,
    /// Engine-specific inputs beyond the ids; `None` for plain text.
    pub context: Option<SeqContext>,
    /// Whether the engine can run it as consecutive chunks when it is longer than
    /// [`Config::max_chunk_tokens`](crate::Config::max_chunk_tokens).
    pub resumable: bool,
}

impl Question {
    /// A plain-text question (resumable).
    pub fn text(ids: Vec<u32>, n_options: usize) -> Self {
        Self {
            ids,
            n_options,
            context: None,
            resumable: true,
        }
    }
}

impl PartialEq for Question {
    fn eq(&self, other: &Self) -> bool {
        self.ids == other.ids
            && self.n_options == other.n_options
            && self.resumable == other.resumable
            && match (&self.context, &other.context) {
                (None, None) => true,
                (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
                _ => false,
            }
    }
}

/// The answer to an admitted request.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    /// Per question, in request order, its option probabilities.
    pub probabilities: Vec<Vec<f32>>,
    /// Admission to the start of the first batch that held one of its questions (`Server-Timing`
    /// queue).
    pub queued: Duration,
    /// Start of that first batch to the end of the last one (`Server-Timing` infer); `queued +
    /// infer` is the request's whole time in the scheduler.
    pub infer: Duration,
}

/// Why a request was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// The queue holds `max_queue_requests` requests.
    QueueFullRequests,
    /// The request's tokens would take the queue over `max_queue_tokens`.
    QueueFullTokens,
    /// The scheduler is draining (shutting down); go to another replica.
    Draining,
    /// Every engine is lost to a fatal device error; the process is about to exit and be
    /// restarted: go to another replica.
    NoEngine,
    /// A question is longer than any batch can hold, or the request alone exceeds
    /// `max_queue_tokens`: it can never be served, retrying is pointless.
    TooLarge,
    /// No questions, an empty question, or a question with zero options.
    Invalid,
}

impl RejectReason {
    /// Stable label for metrics and error codes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::QueueFullRequests => "queue_full_requests",
            Self::QueueFullTokens => "queue_full_tokens",
            Self::Draining => "draining",
            Self::NoEngine => "no_engine",
            Self::TooLarge => "too_large",
            Self::Invalid => "invalid",
        }
    }
}

/// A request refused at submit. Nothing of it was queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("request rejected: {}", reason.as_str())]
pub struct Rejection {
    pub reason: RejectReason,
    /// When it is worth retrying (`Retry-After`): set for the queue-full reasons, `Draining` and `NoEngine`,
    /// `None` for `TooLarge` and `Invalid`.
    pub retry_after: Option<Duration>,
}

/// Why an admitted request was not answered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// The request's deadline passed while some of its questions were still queued; none of the
    /// queued ones reached the model.
    #[error("the request's deadline passed before it reached the model")]
    DeadlineExceeded,
    /// The engine failed (error, panic, or a result of the wrong shape) on a batch that held one
    /// of the request's questions.
    #[error("inference failed: {0}")]
    Internal(String),
    /// The scheduler was stopped before the request was served.
    #[error("the scheduler shut down before the request was served")]
    ShuttingDown,
}
