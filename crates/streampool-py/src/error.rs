//! The crate's one error type, and how each kind becomes a Python exception.

use pyo3::exceptions::{
    PyFileNotFoundError, PyMemoryError, PyRuntimeError, PyTypeError, PyValueError,
};
use pyo3::PyErr;

/// Everything the binding can fail with before it reaches Python.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The model library refused or failed (bad model files, bad input, device errors).
    #[error(transparent)]
    Nn(#[from] streampool_nn::Error),
    /// The batch queue refused or failed a request.
    #[error(transparent)]
    Batch(#[from] streampool_batch::BatchError),
    /// The inference core refused or failed a request (by kind: see the conversion below).
    #[error(transparent)]
    Core(#[from] streampool_core::Error),
    /// A bad argument from Python (an empty list, an unknown device or dtype).
    #[error("{0}")]
    Value(String),
    /// An argument of the wrong Python type (a non-string sentence).
    #[error("{0}")]
    Type(String),
    /// The model folder does not exist.
    #[error("{0}")]
    NotFound(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<streampool::Error> for Error {
    fn from(e: streampool::Error) -> Self {
        Error::Nn(e.into())
    }
}

/// The Python exception class for a runtime error: allocator exhaustion is `MemoryError`, a
/// refused argument `ValueError`, everything else (backend failures) `RuntimeError`.
fn runtime(e: &streampool::Error, msg: String) -> PyErr {
    match e {
        streampool::Error::OutOfMemory { .. } => PyMemoryError::new_err(msg),
        streampool::Error::InvalidArgument(_)
        | streampool::Error::Shape { .. }
        | streampool::Error::DType { .. } => PyValueError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        use streampool_batch::BatchError as B;
        use streampool_core::Error as C;
        use streampool_nn::Error as N;
        let msg = e.to_string();
        match e {
            Error::Value(_) => PyValueError::new_err(msg),
            Error::Type(_) => PyTypeError::new_err(msg),
            Error::NotFound(_) | Error::Nn(N::NotFound(_)) => PyFileNotFoundError::new_err(msg),
            Error::Nn(N::Io { ref source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                PyFileNotFoundError::new_err(msg)
            }
            Error::Nn(N::Tensor(ref t)) => runtime(t, msg),
            Error::Batch(B::Runtime(ref t)) => runtime(t, msg),
            // Half-precision overflow and device failures inside a batch: the input was
            // acceptable, the computation was not.
            Error::Nn(N::NonFinite(_)) | Error::Batch(B::Model(_)) => PyRuntimeError::new_err(msg),
            Error::Batch(B::Spawn(_) | B::ShutDown) => PyRuntimeError::new_err(msg),
            // Overload and deadlines: the caller may retry; `RuntimeError` with the estimate
            // in the message.
            Error::Batch(B::QueueFull { .. } | B::DeadlineExceeded) => PyRuntimeError::new_err(msg),
            Error::Core(C::DeviceOutOfMemory { .. }) => PyMemoryError::new_err(msg),
            // Bad input, or queue settings the core refuses (workers 0, ...).
            Error::Core(
                C::InvalidInput(_) | C::InputTooLong(_) | C::InputTooLarge(_) | C::Config(_),
            ) => PyValueError::new_err(msg),
            // Overload, deadlines, shutdown, non-finite rows and model failures: the input
            // was acceptable, the computation or the moment was not.
            Error::Core(_) => PyRuntimeError::new_err(msg),
            // Bad model files, bad inputs, bad queue settings.
            Error::Nn(_) | Error::Batch(_) => PyValueError::new_err(msg),
        }
    }
}
