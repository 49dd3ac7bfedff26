//! The error type of the batch queue.

use std::time::Duration;

/// Everything a request can be answered with instead of a result, and what
/// [`BatchQueue::new`](crate::BatchQueue::new) can fail with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BatchError {
    /// The queue refused the request at once, without blocking (backpressure: retry later
    /// or shed load): see [`Overload`] for why. `retry_after` is the estimated time until the
    /// queue has drained enough to admit it (from the measured service rate; one second
    /// before anything has been measured), what a server puts in `Retry-After`.
    #[error("batch queue full: {reason} (retry in about {} ms)", retry_after.as_millis())]
    QueueFull {
        /// Which limit refused it.
        reason: Overload,
        /// When to retry, estimated.
        retry_after: Duration,
    },
    /// The request's deadline passed before it was run; it was not run.
    #[error("deadline exceeded before the request was run")]
    DeadlineExceeded,
    /// The model returned an error or panicked on the batch holding this request; every
    /// request of that batch gets the same message, and the queue keeps serving.
    #[error("model failed on this batch: {0}")]
    Model(String),
    /// The queue was shut down before the request was answered (or a submit came after it).
    #[error("batch queue shut down")]
    ShutDown,
    /// The input is longer than the largest configured bucket.
    #[error("input length {len} exceeds the largest bucket {max}")]
    InputTooLong {
        /// The input's length as the model measures it.
        len: usize,
        /// The largest bucket.
        max: usize,
    },
    /// The model refused the input at submit (see
    /// [`BatchModel::check_input`](crate::BatchModel::check_input)); it was not queued.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A [`BatchConfig`](crate::BatchConfig) value is out of range.
    #[error("invalid batch config: {0}")]
    Config(String),
    /// A worker thread could not be started.
    #[error("could not start a worker thread: {0}")]
    Spawn(String),
    /// The runtime failed while setting up a worker (e.g. creating its stream).
    #[error("runtime error: {0}")]
    Runtime(#[from] streampool::Error),
}

impl BatchError {
    /// For a load refusal ([`BatchError::QueueFull`]), the estimated time until a retry
    /// would be admitted; `None` for every other error.
    ///
    /// ```
    /// use std::time::Duration;
    /// use streampool_batch::{BatchError, Overload};
    /// let e = BatchError::QueueFull {
    ///     reason: Overload::Requests { capacity: 8 },
    ///     retry_after: Duration::from_millis(40),
    /// };
    /// assert_eq!(e.retry_after(), Some(Duration::from_millis(40)));
    /// assert_eq!(BatchError::ShutDown.retry_after(), None);
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            BatchError::QueueFull { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

/// Which admission limit refused a request (see
/// [`BatchConfig`](crate::BatchConfig)'s admission rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Overload {
    /// `max_queue` requests already wait.
    #[error("{capacity} requests already waiting")]
    Requests {
        /// The configured `max_queue`.
        capacity: usize,
    },
    /// Admitting the request would take the tokens waiting past `max_queue_tokens`.
    #[error("{queued} tokens waiting, {asked} more would pass the limit of {capacity}")]
    Tokens {
        /// Tokens waiting when it was refused.
        queued: usize,
        /// The request's tokens.
        asked: usize,
        /// The configured `max_queue_tokens`.
        capacity: usize,
    },
    /// The estimated wait before the request would start exceeds its deadline or
    /// `max_queue_wait`, whichever is sooner.
    #[error(
        "estimated queue wait {} ms exceeds the limit of {} ms",
        estimated.as_millis(),
        limit.as_millis()
    )]
    Wait {
        /// Tokens queued ahead of it over the measured service rate.
        estimated: Duration,
        /// The time left to its deadline, or `max_queue_wait`, whichever is shorter.
        limit: Duration,
    },
}

/// The error type a [`BatchModel`](crate::BatchModel) returns from a batch: any error.
pub type ModelError = Box<dyn std::error::Error + Send + Sync + 'static>;
