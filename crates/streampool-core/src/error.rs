//! The error type of the core: every way a request can fail, by kind, the same for every
//! front end. A front end maps a kind to its protocol's status (HTTP 400/413/422/503/504,
//! a Python exception); the core never speaks a protocol.

use std::time::Duration;

use streampool_batch::{BatchError, ModelFailure};

/// Why a request (or starting a model) failed. Cloneable: a batch's failure reaches every
/// caller of that batch intact, kind and message alike.
///
/// ```
/// use std::time::Duration;
/// use streampool_core::Error;
/// let e = Error::DeviceOutOfMemory {
///     message: "out of memory on cpu".into(),
///     retry_after: Duration::from_secs(1),
/// };
/// assert_eq!(e.retry_after(), Some(Duration::from_secs(1)));
/// assert!(e.clone().is_retryable());
/// assert!(!Error::InvalidInput("empty".into()).is_retryable());
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request is malformed: no tokens, a token id outside the vocabulary, an unknown
    /// prompt name, a `dimensions` the model cannot give. (HTTP: 400.)
    #[error("{0}")]
    InvalidInput(String),
    /// An input has more tokens than the limit and the request does not truncate.
    /// (HTTP: 400; 413 on TEI's routes.)
    #[error("{0}")]
    InputTooLong(String),
    /// An input has more bytes than the model reads (`max_input_bytes`) and the request
    /// does not truncate. (HTTP: 413.)
    #[error("{0}")]
    InputTooLarge(String),
    /// No model of that name, or not one of the kind asked for. (HTTP: 404.)
    #[error("{0}")]
    NotFound(String),
    /// The model's answer for input `input` of the request is not finite (a half-precision
    /// overflow, inputs that overflow its arithmetic): that input's request fails, the other
    /// requests of its batch do not. (HTTP: 422.)
    #[error("input {input}: {message}")]
    NonFinite {
        /// The input's index within its request.
        input: usize,
        /// Why, and what to do about it.
        message: String,
    },
    /// No replica admits the request now (its estimated wait exceeds the deadline, or a
    /// queue limit is reached); retry after `retry_after`. (HTTP: 503 with `Retry-After`;
    /// 429 on TEI's routes.)
    #[error("{message}")]
    Overloaded {
        /// Which limit refused it.
        message: String,
        /// When a retry would be admitted, estimated from the measured service rate.
        retry_after: Duration,
    },
    /// The device ran out of memory on the batch holding this request: every request of
    /// that batch fails with this, the model keeps serving, and a retry (in a smaller batch,
    /// once memory is free) may succeed. (HTTP: 503 with `Retry-After`.)
    #[error("{message}")]
    DeviceOutOfMemory {
        /// The allocator's account: what was asked, held and the limit.
        message: String,
        /// When to retry.
        retry_after: Duration,
    },
    /// The model is shutting down (or unloaded): retry elsewhere. (HTTP: 503.)
    #[error("{0}")]
    Unavailable(String),
    /// The request's deadline passed before it was answered; pending work for it was
    /// dropped. (HTTP: 504.)
    #[error("{0}")]
    DeadlineExceeded(String),
    /// Nobody waits for the answer any more (the caller went away): the work stopped early.
    #[error("the request was cancelled: its caller went away")]
    Cancelled,
    /// The model failed on the batch that held this request for another reason (a bug, a
    /// device fault): every request of the batch gets the message. (HTTP: 500.)
    #[error("{0}")]
    Model(String),
    /// A model does not fit: loading it would need more device memory than its device has
    /// free within the budget. Nothing was loaded; the models already served are
    /// untouched. (HTTP: 507.)
    #[error("{message}")]
    InsufficientMemory {
        /// What it needs, what is free, and on which device.
        message: String,
        /// Bytes the load needs on the device that refused it.
        needed: u64,
        /// Bytes free there.
        free: u64,
    },
    /// A model could not be served: replicas that disagree, an invalid batch setting, a
    /// prompt of the model's that cannot be read.
    #[error("{0}")]
    Config(String),
}

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How long a caller refused for memory should wait: the batch that ran out has freed its
/// memory by the time the answer arrives, so the next one can run once the queue ahead of
/// it drains; a second is the least `Retry-After` can say.
const OUT_OF_MEMORY_RETRY: Duration = Duration::from_secs(1);

impl Error {
    /// When a caller should retry: the queue's estimate for a load refusal, a second after
    /// a device out-of-memory or while shutting down; `None` for errors a retry would not
    /// cure.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Overloaded { retry_after, .. }
            | Error::DeviceOutOfMemory { retry_after, .. } => Some(*retry_after),
            Error::Unavailable(_) => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    /// Whether the same request could succeed if sent again later.
    pub fn is_retryable(&self) -> bool {
        self.retry_after().is_some()
    }

    /// The answer a caller gets from the batch queue's error: a load refusal, a passed
    /// deadline, a refused input, or the model's failure on the batch, by its kind (a device
    /// out of memory anywhere in the model's error chain is [`Error::DeviceOutOfMemory`]).
    pub fn from_batch(e: BatchError) -> Self {
        match e {
            BatchError::QueueFull { retry_after, .. } => Error::Overloaded {
                message: e.to_string(),
                retry_after,
            },
            BatchError::ShutDown => Error::Unavailable(e.to_string()),
            BatchError::DeadlineExceeded => Error::DeadlineExceeded(e.to_string()),
            BatchError::InputTooLong { .. } => Error::InputTooLong(e.to_string()),
            BatchError::InvalidInput(msg) => Error::InvalidInput(msg),
            BatchError::Model(failure) => Self::from_failure(&failure),
            other => Error::Model(other.to_string()),
        }
    }

    /// A batch's failure by its kind: an error of this crate passes through as it was, a
    /// device out of memory becomes [`Error::DeviceOutOfMemory`], anything else
    /// [`Error::Model`] with its message.
    fn from_failure(failure: &ModelFailure) -> Self {
        if let Some(e) = failure.downcast_ref::<Error>() {
            return e.clone();
        }
        if let Some(oom) = out_of_memory(failure.error()) {
            return Error::DeviceOutOfMemory {
                message: oom.to_string(),
                retry_after: OUT_OF_MEMORY_RETRY,
            };
        }
        Error::Model(format!("model failed on this batch: {failure}"))
    }
}

/// The runtime's out-of-memory error in `e` or its sources, if any.
fn out_of_memory<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a streampool::Error> {
    let mut next = Some(e);
    while let Some(e) = next {
        let runtime = e.downcast_ref::<streampool::Error>().or_else(|| match e
            .downcast_ref::<streampool_nn::Error>()
        {
            Some(streampool_nn::Error::Tensor(r)) => Some(r),
            _ => None,
        });
        if let Some(r @ streampool::Error::OutOfMemory { .. }) = runtime {
            return Some(r);
        }
        next = e.source();
    }
    None
}

/// Maps a tokenizer's refusal of an input: too long, too large to read, anything else about
/// the input invalid.
pub(crate) fn refusal(e: streampool_nn::Error) -> Error {
    match e {
        streampool_nn::Error::InputTooLong { .. } => Error::InputTooLong(e.to_string()),
        streampool_nn::Error::InputTooLarge { .. } => Error::InputTooLarge(e.to_string()),
        streampool_nn::Error::Input(msg) => Error::InvalidInput(msg),
        other => Error::InvalidInput(format!("tokenizing: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use streampool_batch::{ModelError, Overload};

    fn failed(e: ModelError) -> Error {
        Error::from_batch(BatchError::Model(ModelFailure::from(e)))
    }

    #[test]
    fn a_batch_error_keeps_its_kind() {
        let oom = streampool::Error::OutOfMemory {
            device: "cpu".into(),
            requested: 1 << 20,
            allocated: 0,
            reserved: 0,
            limit: Some(1024),
        };
        // Directly, and wrapped by the model layer.
        for e in [
            failed(Box::new(oom.clone())),
            failed(Box::new(streampool_nn::Error::from(oom))),
        ] {
            assert!(matches!(e, Error::DeviceOutOfMemory { .. }), "{e:?}");
            assert_eq!(e.retry_after(), Some(OUT_OF_MEMORY_RETRY));
        }
        // The core's own error passes through unchanged.
        let own = Error::NonFinite {
            input: 3,
            message: "overflow".into(),
        };
        assert_eq!(failed(Box::new(own.clone())), own);
        // Anything else is a model failure with its message; a panic too.
        let e = failed("weights gone".into());
        assert!(
            matches!(&e, Error::Model(m) if m.contains("weights gone")),
            "{e:?}"
        );
        assert!(e.retry_after().is_none());
        let e = Error::from_batch(BatchError::Model(ModelFailure::panicked("bug")));
        assert!(
            matches!(&e, Error::Model(m) if m.contains("panicked: bug")),
            "{e:?}"
        );
        // Load refusals carry the queue's estimate.
        let e = Error::from_batch(BatchError::QueueFull {
            reason: Overload::Requests { capacity: 2 },
            retry_after: Duration::from_millis(2500),
        });
        assert_eq!(e.retry_after(), Some(Duration::from_millis(2500)));
        assert!(matches!(
            Error::from_batch(BatchError::DeadlineExceeded),
            Error::DeadlineExceeded(_)
        ));
        assert!(matches!(
            Error::from_batch(BatchError::ShutDown),
            Error::Unavailable(_)
        ));
    }
}
