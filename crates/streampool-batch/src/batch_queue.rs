//! The public queue: worker threads, each on its own stream, around the shared hand-off.

use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::Mutex;
use streampool::sync::Arc;
use streampool::{Stream, StreamGuard};

use crate::handoff::Handoff;
use crate::shared::Shared;
use crate::{BatchConfig, BatchError, BatchModel, Handle, StatsSnapshot};

/// Dynamic batching over a model: many threads (or tasks) submit requests (one input, or a
/// group of inputs), worker threads run them in batches, and every caller gets its own
/// output back.
///
/// **Continuous batching.** A free worker runs whatever is queued at once (up to
/// `max_batch_size` inputs and `max_batch_tokens` tokens); batches grow only while every
/// worker is busy, from what arrived meanwhile. Nothing waits for a window unless
/// [`BatchConfig::max_wait`] is set. Admission is by capacity: see [`BatchConfig`].
///
/// A model with a host preparation step ([`BatchModel::prepares`], e.g. tokenization) gets
/// two threads per worker instead of one, sharing the worker's stream: one forms and prepares
/// the next batch while the other runs the current one, so the host work of batch N+1 is
/// hidden behind the device work of batch N. The preparing stage does not form batch N+1 as
/// soon as batch N starts (it would hold only what had arrived by then, and everything
/// arriving behind it would wait a whole extra batch): it forms at once only while its
/// runner is idle, else once a full batch is waiting or batch N is expected to end within
/// the time preparing takes (both times measured over recent batches).
///
/// Each of the `workers` threads owns one stream of the model's device (see
/// [`BatchModel::device`]) and makes it current for its whole life, so while one worker's
/// batch runs on its stream the next worker is already forming and launching the next batch
/// on another. Distinct workers get distinct streams while `workers < pool_size` (they take
/// consecutive pooled slots); beyond that they share streams round-robin, which is correct,
/// only less parallel.
///
/// Shutdown (explicit or on drop) is graceful: new submits fail with
/// [`BatchError::ShutDown`], everything already queued is still run and answered, then the
/// workers are joined. [`BatchQueue::shutdown_now`] instead answers the queued requests
/// `ShutDown` and only finishes the batches already running.
///
/// ```
/// use std::time::Duration;
/// use streampool_batch::{BatchConfig, BatchContext, BatchModel, BatchQueue, ModelError};
///
/// struct Square;
/// impl BatchModel for Square {
///     type Input = i64;
///     type Output = i64;
///     fn forward_batch(&self, xs: Vec<i64>, _: &BatchContext) -> Result<Vec<i64>, ModelError> {
///         Ok(xs.into_iter().map(|x| x * x).collect())
///     }
/// }
///
/// let config = BatchConfig { max_batch_size: 8, ..Default::default() };
/// let queue = BatchQueue::new(Square, config).unwrap();
/// std::thread::scope(|s| {
///     for i in 0..4i64 {
///         let queue = &queue;
///         s.spawn(move || assert_eq!(queue.infer(i).unwrap(), i * i));
///     }
/// });
/// assert_eq!(queue.stats().completed, 4);
/// // A client request of several inputs is admitted (or refused) as one.
/// let handles = queue.submit_group(vec![5, 6, 7]).unwrap();
/// let outs: Vec<i64> = handles.into_iter().map(|h| h.wait().unwrap()).collect();
/// assert_eq!(outs, vec![25, 36, 49]);
/// ```
pub struct BatchQueue<M: BatchModel> {
    shared: Arc<Shared<M>>,
    /// Protects the worker join handles; taken only to join them at shutdown.
    workers: Mutex<Vec<JoinHandle<()>>>,
}

impl<M: BatchModel> BatchQueue<M> {
    /// Starts `config.workers` worker threads serving `model`. To keep a handle on the model
    /// (e.g. to share it with other queues), pass an `Arc<M>`: it is a model too.
    pub fn new(model: M, config: BatchConfig) -> Result<Self, BatchError> {
        config.validate()?;
        let model = Arc::new(model);
        let streams = worker_streams(model.device(), config.workers, config.priority)?;
        let shared = Arc::new(Shared::new(model, config)?);
        let queue = Self {
            shared,
            workers: Mutex::new(Vec::new()),
        };
        let pipelined = queue.shared.model.prepares();
        for (i, stream) in streams.into_iter().enumerate() {
            if pipelined {
                queue.spawn_pipelined(i, stream)?;
                continue;
            }
            let shared = queue.shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("streampool-batch-{i}"))
                .spawn(move || {
                    // The worker's stream is current for every batch it runs, so the model's
                    // ops queue there and not on a stream another worker uses.
                    let _guard = stream.as_ref().map(StreamGuard::new);
                    shared.serve(i);
                });
            queue.keep(spawned)?;
        }
        Ok(queue)
    }

    /// Starts worker `i` as two threads joined by a one-batch hand-off (see
    /// [`BatchModel::prepares`]): the preparing stage forms and prepares batch N+1 while the
    /// running stage runs batch N. Both have the worker's stream current.
    fn spawn_pipelined(&self, i: usize, stream: Option<Stream>) -> Result<(), BatchError> {
        let handoff = Arc::new(Handoff::new());
        let (shared, ready, run_stream) = (self.shared.clone(), handoff.clone(), stream.clone());
        let running = std::thread::Builder::new()
            .name(format!("streampool-batch-{i}"))
            .spawn(move || {
                let _guard = run_stream.as_ref().map(StreamGuard::new);
                shared.serve_running(i, &ready);
            });
        self.keep(running)?;
        let (shared, prep) = (self.shared.clone(), handoff.clone());
        let preparing = std::thread::Builder::new()
            .name(format!("streampool-prep-{i}"))
            .spawn(move || {
                let _guard = stream.as_ref().map(StreamGuard::new);
                shared.serve_preparing(i, &prep);
            });
        if preparing.is_err() {
            // Without its preparer the runner would wait for batches for ever: finish the
            // hand-off as a drained preparer does, so the runner ends.
            handoff.finish();
        }
        self.keep(preparing)
    }

    /// Keeps a spawned worker thread's handle for joining at shutdown.
    fn keep(&self, spawned: std::io::Result<JoinHandle<()>>) -> Result<(), BatchError> {
        match spawned {
            Ok(handle) => {
                self.workers.lock().push(handle);
                Ok(())
            }
            // Dropping the queue shuts down and joins the workers already started.
            Err(e) => Err(BatchError::Spawn(e.to_string())),
        }
    }

    /// Runs `input` in some batch and blocks until its output is back.
    pub fn infer(&self, input: M::Input) -> Result<M::Output, BatchError> {
        self.submit(input)?.wait()
    }

    /// Like [`BatchQueue::infer`], but gives up with [`BatchError::DeadlineExceeded`] once
    /// `deadline` passes before the request started (it is then never run).
    pub fn infer_with_deadline(
        &self,
        input: M::Input,
        deadline: Instant,
    ) -> Result<M::Output, BatchError> {
        self.submit_with_deadline(input, deadline)?.wait()
    }

    /// Queues `input` and returns at once with a [`Handle`] to wait on (blocking or `.await`).
    /// Fails immediately with [`BatchError::QueueFull`] when admission refuses it (see
    /// [`BatchConfig`]: a memory cap, or `max_queue_wait` exceeded by the estimated wait;
    /// never while nothing waits), with [`BatchError::InputTooLong`] when no bucket fits, and
    /// with [`BatchError::ShutDown`] after shutdown.
    pub fn submit(&self, input: M::Input) -> Result<Handle<M::Output>, BatchError> {
        self.shared.submit(input, None)
    }

    /// Like [`BatchQueue::submit`], with a deadline: a request still queued when it passes is
    /// answered [`BatchError::DeadlineExceeded`] and never run.
    pub fn submit_with_deadline(
        &self,
        input: M::Input,
        deadline: Instant,
    ) -> Result<Handle<M::Output>, BatchError> {
        self.shared.submit(input, Some(deadline))
    }

    /// Queues `inputs` as one request, all or none: admission (see [`BatchConfig`]) counts
    /// the group once against `max_queue` and by its tokens against `max_queue_tokens`, and a
    /// group is never refused while nothing waits, however many inputs it has. One input the
    /// model refuses ([`BatchError::InvalidInput`], [`BatchError::InputTooLong`]) refuses the
    /// group. The inputs are then batched like any others (with each other and with other
    /// callers' inputs, possibly over several batches); one handle per input, in order.
    pub fn submit_group(
        &self,
        inputs: Vec<M::Input>,
    ) -> Result<Vec<Handle<M::Output>>, BatchError> {
        self.shared.submit_group(inputs, None)
    }

    /// [`BatchQueue::submit_group`] with a deadline for every input: refused when the
    /// estimated wait exceeds the time left to it, and an input still queued when it passes
    /// is answered [`BatchError::DeadlineExceeded`] and never run.
    pub fn submit_group_with_deadline(
        &self,
        inputs: Vec<M::Input>,
        deadline: Instant,
    ) -> Result<Vec<Handle<M::Output>>, BatchError> {
        self.shared.submit_group(inputs, Some(deadline))
    }

    /// Runs `inputs` as one group (see [`BatchQueue::submit_group`]) and blocks until every
    /// output is back; the first error (in input order) answers the call.
    pub fn infer_group(&self, inputs: Vec<M::Input>) -> Result<Vec<M::Output>, BatchError> {
        self.submit_group(inputs)?
            .into_iter()
            .map(Handle::wait)
            .collect()
    }

    /// The router's submit: like [`BatchQueue::submit_group_with_deadline`], but a group
    /// refused for load or by a closed queue gives its inputs back.
    pub(crate) fn try_submit_group(
        &self,
        inputs: Vec<M::Input>,
        deadline: Option<Instant>,
    ) -> Result<Vec<Handle<M::Output>>, crate::shared::Refused<M::Input>> {
        self.shared.try_submit_group(inputs, deadline)
    }

    /// The async [`BatchQueue::infer`]: submitting never blocks, and waiting is a future that
    /// a worker wakes, so it is safe to call from any async runtime (tokio included).
    pub async fn infer_async(&self, input: M::Input) -> Result<M::Output, BatchError> {
        self.submit(input)?.await
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> StatsSnapshot {
        self.shared
            .stats
            .snapshot(self.shared.queue.load(), self.shared.estimates.rate())
    }

    /// Clears counters, histogram and latency windows (e.g. after a warm-up).
    pub fn reset_stats(&self) {
        self.shared.stats.reset();
    }

    /// Inputs waiting now (not counting batches being formed or run).
    pub fn queue_len(&self) -> usize {
        self.shared.queue.load().inputs
    }

    /// Requests waiting now (a group counts once; see [`BatchQueue::submit_group`]).
    pub fn queued_requests(&self) -> usize {
        self.shared.queue.load().requests
    }

    /// Tokens waiting now (see [`BatchConfig`] on how inputs count).
    pub fn queued_tokens(&self) -> usize {
        self.shared.queue.load().tokens
    }

    /// The total [`BatchModel::cost`] of the requests accepted and not yet answered (queued,
    /// forming or running): the load figure a [`Replicas`](crate::Replicas) router balances.
    pub fn outstanding(&self) -> u64 {
        self.shared.outstanding()
    }

    /// Whether the queue still accepts requests (it has not been shut down).
    pub fn is_accepting(&self) -> bool {
        !self.shared.queue.is_closed()
    }

    /// The configuration.
    pub fn config(&self) -> &BatchConfig {
        &self.shared.config
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.shared.model
    }

    /// Stops accepting requests, runs and answers everything already queued, and joins the
    /// workers. Idempotent; also done on drop.
    pub fn shutdown(&self) {
        self.shared.close(true);
        self.join_workers();
    }

    /// Stops accepting requests, answers everything still queued with
    /// [`BatchError::ShutDown`], lets running batches finish, and joins the workers.
    pub fn shutdown_now(&self) {
        self.shared.close(false);
        self.join_workers();
    }

    /// Closes the queue without joining the workers (see [`Shared::close`]).
    pub(crate) fn close(&self, drain: bool) {
        self.shared.close(drain);
    }

    fn join_workers(&self) {
        let handles = std::mem::take(&mut *self.workers.lock());
        let me = std::thread::current().id();
        for h in handles {
            // A model that drops the last reference to its own queue runs this on a worker;
            // that worker ends by itself once the queue is drained.
            if h.thread().id() != me {
                // A worker only ends by returning: model panics are caught inside it.
                let _ = h.join();
            }
        }
    }
}

impl<M: BatchModel> Drop for BatchQueue<M> {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl<M: BatchModel> std::fmt::Debug for BatchQueue<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchQueue")
            .field("config", &self.shared.config)
            .field("queue_len", &self.queue_len())
            .finish()
    }
}

/// One stream per worker: consecutive pooled slots starting at the pool's next one, so
/// workers never share a stream while there are at least as many pooled slots as workers.
fn worker_streams(
    device: Option<streampool::Device>,
    workers: usize,
    priority: crate::Priority,
) -> Result<Vec<Option<Stream>>, BatchError> {
    let Some(device) = device else {
        return Ok(vec![None; workers]);
    };
    if priority == crate::Priority::High {
        // Latency-critical: the device's high-priority streams (see `DeviceScheduler`),
        // consecutive ones per queue so two such queues share none while there are enough.
        static NEXT_HIGH: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        // Relaxed: the counter only spreads queues over streams.
        let first = NEXT_HIGH.fetch_add(workers, std::sync::atomic::Ordering::Relaxed);
        return (0..workers)
            .map(|i| Ok(Some(device.high_priority_stream(first + i)?)))
            .collect();
    }
    let pooled = device.pool_size() - 1;
    let first = device.stream_from_pool()?.index() - 1;
    (0..workers)
        .map(|i| Ok(Some(device.stream_at(1 + (first + i) % pooled)?)))
        .collect()
}
