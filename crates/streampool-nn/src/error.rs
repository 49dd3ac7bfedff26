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
    /// An input has more tokens than the limit and is not to be truncated.
    #[error("input of {tokens} tokens exceeds the maximum of {max} (not truncating)")]
    InputTooLong {
        /// Its tokens, special tokens included: exact when the whole input was read, else a
        /// lower bound (only as much of an input is read as the limit needs).
        tokens: TokenCount,
        /// The limit, special tokens included.
        max: usize,
    },
    /// An input is longer in bytes than the most a model of its token limit reads, and what
    /// was read of it does not settle its tokens (it is refused rather than read further).
    #[error(
        "input of {bytes} bytes exceeds the maximum of {max} bytes read per input \
         (its first {max} bytes hold fewer than the model's {max_tokens} tokens)"
    )]
    InputTooLarge {
        /// The input's size.
        bytes: usize,
        /// The most bytes read per input.
        max: usize,
        /// The model's token limit.
        max_tokens: usize,
    },
}

/// A client-supplied value as an error message quotes it: `Debug`-quoted, and past
/// [`Quoted::MAX_CHARS`] characters only its start and its size, so an error never echoes a
/// megabyte back (or into a log).
///
/// ```
/// use streampool_nn::Quoted;
/// assert_eq!(Quoted("query").to_string(), "\"query\"");
/// let long = "x".repeat(1 << 20);
/// assert_eq!(Quoted(&long).to_string(), format!("\"{}\"... (1048576 bytes)", "x".repeat(40)));
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Quoted<'a>(pub &'a str);

impl Quoted<'_> {
    /// The most characters quoted.
    pub const MAX_CHARS: usize = 40;
}

impl std::fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.char_indices().nth(Self::MAX_CHARS) {
            None => write!(f, "{:?}", self.0),
            Some((end, _)) => write!(f, "{:?}... ({} bytes)", &self.0[..end], self.0.len()),
        }
    }
}

/// A token count that is exact, or a lower bound where only part of an input was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenCount {
    /// Exactly this many.
    Exactly(usize),
    /// More than this many.
    MoreThan(usize),
}

impl std::fmt::Display for TokenCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenCount::Exactly(n) => write!(f, "{n}"),
            TokenCount::MoreThan(n) => write!(f, "more than {n}"),
        }
    }
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
