//! What a caller gets back: a rejection at submit, or a failure after admission.

use std::time::Duration;

/// One question of a request: its prompt token ids and its number of options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Question {
    pub ids: Vec<u32>,
    pub n_options: usize,
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
    /// When it is worth retrying (`Retry-After`): set for the queue-full reasons and `Draining`,
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
