//! The settings of a batch queue.

use std::time::Duration;

use crate::BatchError;

/// How a [`BatchQueue`](crate::BatchQueue) forms and runs batches.
///
/// ```
/// use std::time::Duration;
/// use streampool_batch::BatchConfig;
/// let config = BatchConfig {
///     max_batch_size: 32,
///     max_wait: Duration::from_millis(2),
///     ..BatchConfig::default()
/// };
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchConfig {
    /// Most requests in one batch (>= 1).
    pub max_batch_size: usize,
    /// How long a worker holding a partial batch waits for more requests before running it.
    /// The window opens when the worker takes the batch's first request.
    pub max_wait: Duration,
    /// Most requests waiting in the queue (>= 1); a submit beyond it is rejected at once
    /// with [`BatchError::QueueFull`]. Requests already taken into a forming or running batch
    /// do not count.
    pub max_queue: usize,
    /// Worker threads (>= 1), each running batches on its own stream of the model's device.
    pub workers: usize,
    /// Sequence-length buckets for variable-length inputs, e.g. `[16, 32, 64, 128]`. Empty:
    /// no bucketing, any inputs may share a batch. Otherwise each request goes to the smallest
    /// bucket at least its [`BatchModel::input_len`](crate::BatchModel::input_len) (longer
    /// inputs are refused at submit with [`BatchError::InputTooLong`]), a batch holds requests
    /// of one bucket only, and the model pads them to that bucket's length.
    pub buckets: Vec<usize>,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_batch_size: 32,
            max_wait: Duration::from_millis(2),
            max_queue: 1024,
            workers: 2,
            buckets: Vec::new(),
        }
    }
}

impl BatchConfig {
    /// Checks the ranges documented on each field.
    pub fn validate(&self) -> Result<(), BatchError> {
        let positive = [
            ("max_batch_size", self.max_batch_size),
            ("max_queue", self.max_queue),
            ("workers", self.workers),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(BatchError::Config(format!("{name} must be at least 1")));
        }
        if self.buckets.contains(&0) {
            return Err(BatchError::Config("buckets must be positive".into()));
        }
        Ok(())
    }

    /// The bucket of an input of length `len`: the smallest bucket that fits it, `None` when
    /// no buckets are configured.
    pub(crate) fn bucket_for(&self, len: usize) -> Result<Option<usize>, BatchError> {
        if self.buckets.is_empty() {
            return Ok(None);
        }
        self.buckets
            .iter()
            .copied()
            .filter(|&b| b >= len)
            .min()
            .map(Some)
            .ok_or_else(|| BatchError::InputTooLong {
                len,
                max: self.buckets.iter().copied().max().unwrap_or(0),
            })
    }
}
