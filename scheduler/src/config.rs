//! Scheduler configuration and its validation.

use std::time::Duration;

use crate::outcome::Question;

/// A batch shape: at most `tokens` tokens in at most `seqs` sequences.
///
/// The scheduler plans every batch to fit at least one bucket and labels it with the smallest
/// bucket (fewest tokens, then fewest sequences) that holds it; the engine gets that label with
/// the batch ([`Batch::bucket`](crate::Batch::bucket)) and checks the batch against the shape it
/// allocated. Engines never split a batch: the plan is the only place batch shape is decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Bucket {
    pub tokens: usize,
    pub seqs: usize,
}

impl Bucket {
    pub const fn new(tokens: usize, seqs: usize) -> Self {
        Self { tokens, seqs }
    }

    /// Whether a batch of `tokens` tokens in `seqs` sequences fits this bucket.
    pub fn holds(&self, tokens: usize, seqs: usize) -> bool {
        tokens <= self.tokens && seqs <= self.seqs
    }
}

/// Everything the scheduler can be tuned with. `Config::default()` is a sane CPU setting; the
/// runtime fills it from its command line.
#[derive(Clone, Debug)]
pub struct Config {
    /// Most requests waiting in the queue (a request counts while any of its questions is queued).
    pub max_queue_requests: usize,
    /// Most prompt tokens waiting in the queue, over all queued questions.
    pub max_queue_tokens: usize,
    /// Hard cap on the tokens of one batch (no bucket may exceed it).
    pub max_batch_tokens: usize,
    /// Hard cap on the sequences of one batch (no bucket may exceed it).
    pub max_batch_seqs: usize,
    /// Batch shapes. Empty means one bucket at `(max_batch_tokens, max_batch_seqs)`.
    pub buckets: Vec<Bucket>,
    /// Longest time the oldest queued question waits for its batch to fill while another
    /// engine is running a batch. An engine never waits when no batch runs anywhere: it starts at
    /// once on what is queued, and what arrives meanwhile forms the next batch.
    pub max_wait: Duration,
    /// Deadline applied to requests submitted without one; `None` means no deadline.
    pub default_deadline: Option<Duration>,
    /// How many queued questions batch formation looks at (bounds the work done under the lock).
    pub max_scan: usize,
    /// How often an idle engine thread wakes to refresh its heartbeat.
    pub heartbeat_interval: Duration,
    /// Chunked prefill: a resumable question longer than this runs as consecutive chunks of at
    /// most this many tokens, one per batch. Whole questions go first; a batch that carries a
    /// chunk holds at most this many tokens in all, so chunks are cut to the room the whole
    /// questions leave (the question with the least left first; one passed over by 8 batches in
    /// a row goes first, whole). However many long questions are in flight, a short question's
    /// batch is no longer than this (or than its whole questions alone). `None`: every question
    /// runs whole (and none may exceed the largest bucket).
    pub max_chunk_tokens: Option<usize>,
    /// Chunks start only at multiples of this many tokens (`max_chunk_tokens` is one; a chunk
    /// cut to the room left runs one): where the backend resumes a prompt exactly (the GPU's
    /// delta rule: 64; the CPU: anywhere, 1).
    pub chunk_grid: usize,
    /// With `max_chunk_tokens`: only questions longer than this run in chunks (`None`: those
    /// longer than `max_chunk_tokens`). Questions of moderate length then run whole, in one pass,
    /// while long ones still run in small chunks. At least `max_chunk_tokens`, at most the largest
    /// bucket.
    pub chunk_over_tokens: Option<usize>,
    /// Window over which the drain rate (tokens/s) is measured for `Retry-After`.
    pub drain_rate_window: Duration,
    /// `Retry-After` given before any batch has completed.
    pub retry_after_default: Duration,
    /// Bounds of every `Retry-After` given.
    pub retry_after_min: Duration,
    pub retry_after_max: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_queue_requests: 512,
            max_queue_tokens: 262_144,
            max_batch_tokens: 16_384,
            max_batch_seqs: 32,
            buckets: Vec::new(),
            max_wait: Duration::from_micros(1_500),
            default_deadline: None,
            max_scan: 1_024,
            heartbeat_interval: Duration::from_millis(100),
            max_chunk_tokens: None,
            chunk_grid: 1,
            chunk_over_tokens: None,
            drain_rate_window: Duration::from_secs(10),
            retry_after_default: Duration::from_secs(1),
            retry_after_min: Duration::from_secs(1),
            retry_after_max: Duration::from_secs(60),
        }
    }
}

/// Why the scheduler did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("invalid scheduler configuration: {0}")]
    Config(String),
    #[error("the scheduler needs at least one engine")]
    NoEngines,
    #[error("cannot start a scheduler thread: {0}")]
    Spawn(#[from] std::io::Error),
}

/// A checked configuration with its buckets sorted smallest first.
#[derive(Clone, Debug)]
pub(crate) struct Validated {
    pub config: Config,
    pub buckets: Vec<Bucket>,
    /// See [`Config::batch_capacity`]: its tokens are also the longest single question any batch
    /// can hold.
    pub capacity: Bucket,
}

impl Config {
    /// The chunk size `question` runs in, where it runs in chunks (it is resumable and longer
    /// than the threshold): what admission queues and what its chunk states are reserved by.
    pub fn chunk_size_for(&self, question: &Question) -> Option<usize> {
        let chunk = self.max_chunk_tokens?;
        let over = self.chunk_over_tokens.unwrap_or(chunk).max(chunk);
        (question.resumable && question.ids.len() > over).then_some(chunk)
    }

    /// The tokens of the largest bucket (`max_batch_tokens` without buckets): the longest
    /// question a batch can hold whole. Not checked: see [`batch_capacity`](Self::batch_capacity).
    pub fn largest_bucket_tokens(&self) -> usize {
        self.buckets
            .iter()
            .map(|b| b.tokens)
            .max()
            .unwrap_or(self.max_batch_tokens)
    }

    /// The largest batch the scheduler can hand an engine: the most tokens and the most sequences
    /// over all buckets (each reached by some bucket, not necessarily the same one). Engines
    /// allocate for it. Fails as [`Scheduler::start`](crate::Scheduler::start) would on a bad
    /// configuration.
    pub fn batch_capacity(&self) -> Result<Bucket, StartError> {
        Ok(self.validate()?.capacity)
    }

    pub(crate) fn validate(&self) -> Result<Validated, StartError> {
        let bad = |msg: String| Err(StartError::Config(msg));
        if self.max_queue_requests == 0 || self.max_queue_tokens == 0 {
            return bad("max_queue_requests and max_queue_tokens must be positive".into());
        }
        if self.max_batch_tokens == 0 || self.max_batch_seqs == 0 {
            return bad("max_batch_tokens and max_batch_seqs must be positive".into());
        }
        if self.max_scan == 0 {
            return bad("max_scan must be positive".into());
        }
        if self.heartbeat_interval.is_zero() || self.drain_rate_window.is_zero() {
            return bad("heartbeat_interval and drain_rate_window must be positive".into());
        }
        if self.retry_after_min > self.retry_after_max {
            return bad("retry_after_min must not exceed retry_after_max".into());
        }
        let mut buckets = if self.buckets.is_empty() {
            vec![Bucket::new(self.max_batch_tokens, self.max_batch_seqs)]
        } else {
            self.buckets.clone()
        };
        for b in &buckets {
            if b.tokens == 0 || b.seqs == 0 {
                return bad(format!("bucket {b:?} is empty"));
            }
            if b.tokens > self.max_batch_tokens || b.seqs > self.max_batch_seqs {
                return bad(format!(
                    "bucket {b:?} exceeds max_batch_tokens {} / max_batch_seqs {}",
                    self.max_batch_tokens, self.max_batch_seqs
                ));
            }
        }
        buckets.sort();
        buckets.dedup();
        let capacity = Bucket::new(
            self.largest_bucket_tokens(),
            buckets.iter().map(|b| b.seqs).max().unwrap_or(0),
        );
        if self.chunk_grid == 0 {
            return bad("chunk_grid must be positive".into());
        }
        if let Some(chunk) = self.max_chunk_tokens {
            if chunk == 0 || chunk > capacity.tokens {
                return bad(format!(
                    "max_chunk_tokens {chunk} must be positive and fit the largest bucket ({} \
                     tokens)",
                    capacity.tokens
                ));
            }
            if !chunk.is_multiple_of(self.chunk_grid) {
                return bad(format!(
                    "max_chunk_tokens {chunk} must be a multiple of chunk_grid {} (where the \
                     backend resumes a prompt exactly)",
                    self.chunk_grid
                ));
            }
        }
        if let Some(over) = self.chunk_over_tokens {
            match self.max_chunk_tokens {
                Some(chunk) if over >= chunk && over <= capacity.tokens => {}
                chunk => {
                    return bad(format!(
                        "chunk_over_tokens {over} needs max_chunk_tokens ({chunk:?}) at most it \
                         and must fit the largest bucket ({} tokens)",
                        capacity.tokens
                    ))
                }
            }
        }
        Ok(Validated {
            config: self.clone(),
            buckets,
            capacity,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_buckets_mean_one_bucket_at_the_caps() {
        let v = Config::default().validate().unwrap();
        assert_eq!(v.buckets, vec![Bucket::new(16_384, 32)]);
        assert_eq!(v.capacity, Bucket::new(16_384, 32));
    }

    #[test]
    fn buckets_are_sorted_and_checked_against_the_caps() {
        let cfg = Config {
            max_batch_tokens: 4096,
            max_batch_seqs: 8,
            buckets: vec![Bucket::new(4096, 2), Bucket::new(1024, 8)],
            ..Config::default()
        };
        let v = cfg.validate().unwrap();
        assert_eq!(v.buckets, vec![Bucket::new(1024, 8), Bucket::new(4096, 2)]);
        assert_eq!(v.capacity, Bucket::new(4096, 8));
        assert_eq!(cfg.batch_capacity().unwrap(), Bucket::new(4096, 8));

        let too_big = Config {
            buckets: vec![Bucket::new(8192, 2)],
            ..cfg.clone()
        };
        assert!(matches!(too_big.validate(), Err(StartError::Config(_))));
        let zero = Config {
            max_queue_tokens: 0,
            ..cfg
        };
        assert!(matches!(zero.validate(), Err(StartError::Config(_))));
    }

    #[test]
    fn chunks_keep_to_the_grid() {
        let chunked = |chunk, grid| Config {
            max_chunk_tokens: Some(chunk),
            chunk_grid: grid,
            ..Config::default()
        };
        assert!(chunked(1024, 64).validate().is_ok());
        assert!(chunked(1000, 1).validate().is_ok());
        let off = chunked(1000, 64).validate().unwrap_err().to_string();
        assert!(off.contains("multiple of chunk_grid 64"), "{off}");
        assert!(matches!(
            chunked(1024, 0).validate(),
            Err(StartError::Config(_))
        ));
    }
}
