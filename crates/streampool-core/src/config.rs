//! How a model is served: its input limits and its batch queue's settings.

use streampool_batch::BatchConfig;

/// The settings every replica of a served model shares: how long an input may be, whether
/// longer ones are cut or refused, how much of one text is read, and each replica's batch
/// queue. A front end builds it from its own flags (the server from `ServeConfig`, the
/// Python package from its constructor's arguments).
///
/// ```
/// use streampool_core::ModelConfig;
/// let config = ModelConfig { truncate: true, ..ModelConfig::default() };
/// assert_eq!(config.max_seq_len, None);
/// assert_eq!(config.batch.max_batch_size, 256);
/// ```
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// Longest input in tokens (special tokens included) a text model accepts. `None`: the
    /// model's own limit. Never above the model's own limit.
    pub max_seq_len: Option<usize>,
    /// Longer inputs are truncated to `max_seq_len` (`true`) or refused
    /// ([`Error::InputTooLong`](crate::Error::InputTooLong)); a request may choose for itself.
    pub truncate: bool,
    /// The most bytes of one text input read. `None`: derived from the token limit
    /// ([`streampool_nn::InputLimit::new`]: 32 bytes per token). Only as much of an input is
    /// read as its token limit needs, so this bounds only texts of very few tokens per byte.
    pub max_input_bytes: Option<usize>,
    /// Each replica's batch queue (a text model's length buckets are added to it).
    pub batch: BatchConfig,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            max_seq_len: None,
            truncate: false,
            max_input_bytes: None,
            // Continuous batching (no window), admission by capacity. Batches up to 256
            // inputs and 16,384 tokens: a GPU's forward keeps gaining throughput up to
            // hundreds of short sentences per batch, and the token budget keeps long inputs
            // to fewer rows.
            batch: BatchConfig {
                max_batch_size: 256,
                max_batch_tokens: 16_384,
                ..BatchConfig::default()
            },
        }
    }
}
