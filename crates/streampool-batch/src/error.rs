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
    /// request of that batch gets the same error (shared, with its type: see
    /// [`ModelFailure::downcast_ref`]), and the queue keeps serving.
    #[error("model failed on this batch: {0}")]
    Model(ModelFailure),
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

/// A model's failure on one batch, as every request of that batch receives it: the model's
/// own error, shared rather than flattened to text, so a caller can tell a device out of
/// memory from a bad weight file by its type ([`ModelFailure::downcast_ref`]). Cloning it
/// clones a reference.
///
/// ```
/// use streampool_batch::{ModelError, ModelFailure};
/// let e: ModelError = Box::new(std::io::Error::other("disk gone"));
/// let failure = ModelFailure::from(e);
/// assert!(failure.downcast_ref::<std::io::Error>().is_some());
/// assert_eq!(failure.to_string(), "disk gone");
/// assert!(ModelFailure::panicked("boom").is_panic());
/// ```
#[derive(Clone)]
pub struct ModelFailure(std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>);

/// The failure of a model call that panicked: the panic's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("model panicked: {0}")]
pub struct ModelPanic(pub String);

impl ModelFailure {
    /// A failure for a batch whose model call panicked with `message`.
    pub fn panicked(message: impl Into<String>) -> Self {
        Self(std::sync::Arc::new(ModelPanic(message.into())))
    }

    /// A failure described by `message` alone (e.g. a model that broke the batch contract).
    pub fn message(message: impl Into<String>) -> Self {
        let e: ModelError = message.into().into();
        Self::from(e)
    }

    /// The model's error as an `E`, if it is one.
    pub fn downcast_ref<E: std::error::Error + 'static>(&self) -> Option<&E> {
        self.0.downcast_ref::<E>()
    }

    /// Whether the model call panicked (a bug in the model, not a property of its inputs).
    pub fn is_panic(&self) -> bool {
        self.downcast_ref::<ModelPanic>().is_some()
    }

    /// The model's error itself.
    pub fn error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }
}

impl From<ModelError> for ModelFailure {
    fn from(e: ModelError) -> Self {
        Self(std::sync::Arc::from(e))
    }
}

impl std::fmt::Display for ModelFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::fmt::Debug for ModelFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

/// Two failures are equal when they say the same (errors themselves have no equality).
impl PartialEq for ModelFailure {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0) || self.to_string() == other.to_string()
    }
}
