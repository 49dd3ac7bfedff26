//! The error type of the batch queue.

/// Everything a request can be answered with instead of a result, and what
/// [`BatchQueue::new`](crate::BatchQueue::new) can fail with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BatchError {
    /// The queue already holds `capacity` waiting requests; the request was rejected at once,
    /// without blocking (backpressure: retry later or shed load).
    #[error("batch queue full: {capacity} requests already waiting")]
    QueueFull {
        /// The configured `max_queue`.
        capacity: usize,
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

/// The error type a [`BatchModel`](crate::BatchModel) returns from a batch: any error.
pub type ModelError = Box<dyn std::error::Error + Send + Sync + 'static>;
