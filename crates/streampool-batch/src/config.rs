//! The settings of a batch queue.

use std::time::Duration;

use crate::{BatchError, Priority};

/// How a [`BatchQueue`](crate::BatchQueue) forms, runs and admits batches.
///
/// **Forming (continuous batching).** A free worker takes whatever is queued at once, up to
/// `max_batch_size` requests and `max_batch_tokens` tokens; requests accumulate into larger
/// batches only while every worker is busy. Nothing waits for a window unless `max_wait` is
/// set. A pipelined worker ([`BatchModel::prepares`](crate::BatchModel::prepares)) forms its
/// next batch while the current one runs, but not earlier than it needs to: see
/// [`BatchQueue`](crate::BatchQueue).
///
/// **Tokens.** An input counts `max(1, input_len)` tokens
/// ([`BatchModel::input_len`](crate::BatchModel::input_len)), so a model without lengths
/// counts one per input. A batch costs `rows x longest input` tokens: what the forward of a
/// batch padded to its longest input computes (the server's embedder pads that way; a model
/// that pads to its bucket computes up to `rows x bucket`).
///
/// **Admission.** A submit (one input, or a group of inputs through
/// [`BatchQueue::submit_group`](crate::BatchQueue::submit_group), which counts as one
/// request) is refused with [`BatchError::QueueFull`] only when
/// - the estimated wait before it starts (tokens queued ahead of it over the measured service
///   rate) exceeds its deadline or `max_queue_wait`, or
/// - `max_queue` requests or `max_queue_tokens` tokens already wait (memory caps).
///
/// A request is never refused while nothing waits in the queue (a worker is free or about to
/// be), whatever its size.
///
/// ```
/// use std::time::Duration;
/// use streampool_batch::BatchConfig;
/// let config = BatchConfig {
///     max_batch_size: 64,
///     max_batch_tokens: 8192,
///     max_queue_wait: Some(Duration::from_millis(500)),
///     ..BatchConfig::default()
/// };
/// assert!(config.validate().is_ok());
/// assert!(config.max_wait.is_zero(), "no batching window by default");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchConfig {
    /// Most requests (inputs) in one batch (>= 1).
    pub max_batch_size: usize,
    /// Most tokens in one batch, counted as `rows x longest input` (>= 1; see the type's
    /// docs). A single input longer than this still runs, alone. Default 16,384 (TEI's).
    pub max_batch_tokens: usize,
    /// Opt-in upper bound on how long a worker holding a partial batch waits for more
    /// requests before running it (the window opens when it takes the batch's first request).
    /// Default zero: a free worker runs what is queued at once. Set it only where waiting
    /// measurably raises throughput (e.g. closed-loop callers that would otherwise split into
    /// alternating small and large batches).
    pub max_wait: Duration,
    /// Most requests waiting in the queue (>= 1): a memory cap. A group of inputs counts once;
    /// requests taken into a forming or running batch do not count.
    pub max_queue: usize,
    /// Most tokens waiting in the queue (>= 1): a memory cap (see the type's docs for how
    /// inputs count).
    pub max_queue_tokens: usize,
    /// Refuse a request whose estimated wait before it starts exceeds this (its own deadline,
    /// if earlier, bounds it too). `None`: only deadlines and the memory caps refuse.
    pub max_queue_wait: Option<Duration>,
    /// Worker threads (>= 1), each running batches on its own stream of the model's device.
    pub workers: usize,
    /// Sequence-length buckets for variable-length inputs, e.g. `[16, 32, 64, 128]`. Empty:
    /// no bucketing, any inputs may share a batch. Otherwise each request goes to the smallest
    /// bucket at least its [`BatchModel::input_len`](crate::BatchModel::input_len) (longer
    /// inputs are refused at submit with [`BatchError::InputTooLong`]), a batch holds requests
    /// of one bucket only, and the model pads them to that bucket's length.
    pub buckets: Vec<usize>,
    /// The queue's class on its device, shared with the other queues there (see
    /// [`DeviceScheduler`](crate::DeviceScheduler)): a [`Priority::High`] queue's batches
    /// never wait for another queue's and run on the device's high-priority streams;
    /// waiting normal batches go before low ones. Default normal.
    pub priority: Priority,
    /// The queue's weight within its class (>= 1): saturating queues of one class share
    /// the device's tokens in proportion to their weights. Default 1.
    pub weight: u32,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_batch_size: 32,
            max_batch_tokens: 16_384,
            max_wait: Duration::ZERO,
            max_queue: 1024,
            max_queue_tokens: 1 << 20,
            max_queue_wait: None,
            workers: 2,
            buckets: Vec::new(),
            priority: Priority::Normal,
            weight: 1,
        }
    }
}

impl BatchConfig {
    /// Checks the ranges documented on each field.
    pub fn validate(&self) -> Result<(), BatchError> {
        let positive = [
            ("max_batch_size", self.max_batch_size),
            ("max_batch_tokens", self.max_batch_tokens),
            ("max_queue", self.max_queue),
            ("max_queue_tokens", self.max_queue_tokens),
            ("workers", self.workers),
        ];
        if self.weight == 0 {
            return Err(BatchError::Config("weight must be at least 1".into()));
        }
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
