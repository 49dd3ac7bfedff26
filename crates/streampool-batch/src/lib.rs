//! # streampool-batch
//!
//! Continuous batching over any model. Many threads or async tasks each submit a request (one
//! input, or a group of inputs admitted as one); worker threads run them in batches on the
//! worker's own stream and hand each caller its own output.
//!
//! **The policy.** A free worker runs whatever is queued at once, up to `max_batch_size`
//! inputs and `max_batch_tokens` tokens (`rows x longest input`); batches grow only while
//! every worker is busy, so a lone request never waits for a window (`max_wait` is an
//! opt-in upper bound). Admission is by capacity: a request is refused
//! ([`BatchError::QueueFull`], with a `retry_after` estimate) only when the estimated wait
//! before it starts, from the service rate the queue measures, exceeds its deadline or
//! `max_queue_wait`, or a memory cap on waiting requests or tokens is reached; never while
//! nothing waits. [`Replicas`] applies the same policy across devices.
//!
//! | piece              | what it does                                                          |
//! |--------------------|-----------------------------------------------------------------------|
//! | [`BatchQueue`]     | the queue and its workers: `infer`, `submit`, `submit_group`, `stats` |
//! | [`BatchConfig`]    | batch size and token budget, opt-in window, admission bounds, workers |
//! | [`BatchModel`]     | what a model implements: `forward_batch` (+ optional lengths, checks) |
//! | [`Prepared`]       | a batch after the model's optional host step (`prepare_batch`)        |
//! | [`RowModel`]       | a ready `BatchModel` for `[batch, features] -> [batch, out]` tensors  |
//! | [`Replicas`]       | one queue per replica (device), each request to the least loaded     |
//! | [`DeviceScheduler`]| which queue's batch runs next on a shared device: [`Priority`] class, then weighted token share |
//! | [`Handle`]         | one submitted input: `wait`, `wait_timeout`, or `.await`              |
//! | [`BatchError`]     | `QueueFull` (with [`Overload`] and `retry_after`), `DeadlineExceeded`, ... |
//! | [`StatsSnapshot`]  | counts, batch-size and token histograms, busy time, queue load, service rate, p50/p90/p99 |
//!
//! Guarantees: every accepted request is answered exactly once, with its own output or an
//! error; a refused request is refused at once, never blocked; a request past its deadline is
//! never run; a batch whose model call errors or panics answers all its requests with
//! [`BatchError::Model`] and the queue keeps serving. A model with a host preparation step
//! (tokenization: [`BatchModel::prepares`]) gets two threads per worker, one preparing batch
//! N+1 while the other runs batch N, with the same guarantees; the preparing thread forms
//! batch N+1 only when its runner can take it soon (see [`BatchQueue`]). The hand-off (bounded
//! queue + one-shot answer slot) is built on `streampool::sync`, so a loom model checks it
//! over every interleaving
//! (`RUSTFLAGS="--cfg loom" cargo test --release -p streampool-batch --lib loom`).
//!
//! ```
//! use streampool::{Device, Tensor};
//! use streampool_batch::{BatchConfig, BatchQueue, RowModel};
//!
//! let dev = Device::cpu();
//! let w = Tensor::randn(&[4, 3], 7, &dev).unwrap();
//! let queue = BatchQueue::new(
//!     RowModel::new(dev, 4, move |x: &Tensor| x.matmul(&w)?.relu()),
//!     BatchConfig::default(),
//! ).unwrap();
//! let out = queue.infer(vec![1.0, 2.0, 3.0, 4.0]).unwrap();
//! assert_eq!(out.len(), 3);
//! ```

mod batch_queue;
mod config;
mod error;
mod estimate;
mod handoff;
mod model;
mod queue;
mod replicas;
mod row_model;
mod scheduler;
mod shared;
mod slot;
mod stats;
mod worker;

#[cfg(all(test, loom))]
mod loom_tests;

pub use batch_queue::BatchQueue;
pub use config::BatchConfig;
pub use error::{BatchError, ModelError, ModelFailure, ModelPanic, Overload};
pub use model::{BatchContext, BatchModel, Prepared};
pub use replicas::{ReplicaStats, Replicas};
pub use row_model::RowModel;
pub use scheduler::{DeviceScheduler, Priority, SchedulerStats, Share, Turn};
pub use slot::Handle;
pub use stats::{Percentiles, StatsSnapshot, LATENCY_WINDOW};
