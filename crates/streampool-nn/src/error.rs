//! The error type of the models crate.

use std::path::PathBuf;

use crate::accuracy::{AccuracyReport, AccuracyThresholds};
use crate::ComputeDType;

/// Everything that can go wrong while loading or running a model. Each variant names the
/// file, tensor or setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor operation failed (shape, dtype, device, memory, backend).
    #[error(transparent)]
    Tensor(#[from] streampool::Error),
    /// A file could not be opened or read.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A weights file is not valid safetensors (bad header, truncated data, ...).
    #[error("{}: not a valid safetensors file: {source}", path.display())]
    SafeTensors {
        path: PathBuf,
        source: safetensors::SafeTensorError,
    },
    /// A JSON file (such as `config.json`) does not parse.
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// A model configuration parses but cannot describe a model we can build.
    #[error("bad model config: {0}")]
    Config(String),
    /// A weights file lacks a tensor the model needs.
    #[error("{}: tensor {name:?} is missing", path.display())]
    MissingTensor { path: PathBuf, name: String },
    /// A tensor in a weights file has a shape other than the model needs.
    #[error("{}: tensor {name:?} has shape {got:?}, expected {expected:?}", path.display())]
    TensorShape {
        path: PathBuf,
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },
    /// A tensor in a weights file has an element type we cannot load as floats.
    #[error("{}: tensor {name:?} has dtype {dtype}, expected F32, F16 or BF16", path.display())]
    TensorDType {
        path: PathBuf,
        name: String,
        dtype: String,
    },
    /// The tokenizer could not be loaded or failed on an input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Inputs that do not fit the model (ids out of range, inconsistent lengths, ...).
    #[error("invalid input: {0}")]
    Input(String),
    /// A model folder could not be found; the message says where we looked and how to fix it.
    #[error("model not found: {0}")]
    NotFound(String),
    /// A compute dtype the device cannot run a model in (`int8` off the CPU backend).
    #[error("{dtype} is not available on {device}: {reason}")]
    UnsupportedDType {
        dtype: ComputeDType,
        device: String,
        reason: String,
    },
    /// A model in a quantized dtype misses the accuracy gate against its own f32
    /// ([`crate::accuracy`]); [`crate::accuracy::QuantizationGate::Force`] loads it anyway.
    #[error(
        "the model in {dtype} misses the accuracy gate against its f32 ({report}; needed: \
         min cosine >= {}, mean >= {}, top-{} agreement >= {}); load it with \
         QuantizationGate::Force to run it anyway, or use f32",
        thresholds.min_cosine,
        thresholds.mean_cosine,
        report.k,
        thresholds.top_k_agreement
    )]
    AccuracyGate {
        dtype: ComputeDType,
        report: AccuracyReport,
        thresholds: AccuracyThresholds,
    },
    /// The computed embeddings hold infinities or NaNs, e.g. an f16 activation past 65504;
    /// the message names the compute dtype and what to run instead.
    #[error("non-finite embeddings: {0}")]
    NonFinite(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
