//! The error type of the runtime.

use crate::DType;

/// Everything that can go wrong in `streampool`. Bad input is always an `Err`, never a panic,
/// and an error on one thread never poisons the device for other threads.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Shapes that do not fit the operation.
    #[error("{op}: shape mismatch: {msg}")]
    Shape { op: &'static str, msg: String },
    /// An operand has the wrong element type.
    #[error("{op}: dtype mismatch: expected {expected:?}, got {got:?}")]
    DType {
        op: &'static str,
        expected: DType,
        got: DType,
    },
    /// Operands live on different devices.
    #[error("{op}: device mismatch: {lhs} vs {rhs}")]
    Device {
        op: &'static str,
        lhs: String,
        rhs: String,
    },
    /// The caching allocator could not satisfy a request.
    #[error(
        "out of memory on {device}: requested {requested} bytes, {allocated} bytes in live tensors, \
         {reserved} bytes reserved, limit {limit:?}"
    )]
    OutOfMemory {
        device: String,
        requested: usize,
        allocated: usize,
        reserved: usize,
        limit: Option<usize>,
    },
    /// An argument is out of range or otherwise invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A kernel or copy failed inside a backend (reported at the next synchronization).
    #[error("backend error on {device}: {msg}")]
    Backend { device: String, msg: String },
    /// The requested device or feature is not available in this build or on this machine.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn shape(op: &'static str, msg: impl Into<String>) -> Self {
        Error::Shape {
            op,
            msg: msg.into(),
        }
    }
}
