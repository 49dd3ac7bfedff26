//! A router in front of several batch queues of one model: one replica per device, each
//! request to the replica with the least outstanding work.
//!
//! **Protocol.** Each replica is a whole [`BatchQueue`] (its own workers, streams and
//! statistics) over its own copy of the model, usually on its own device. A submit reads
//! every replica's [`BatchQueue::outstanding`] cost (the [`BatchModel::cost`] of requests
//! accepted and not yet answered: queued, forming and running) and submits to the least
//! loaded; ties go to the replica after the one the previous tie picked, so an idle set of
//! replicas is used round-robin. The read and the submit are not atomic together: two
//! callers may both see replica 0 as least loaded and both go there. That only makes the
//! balance approximate for a moment (the next submits see the new load); no request depends
//! on it. A replica that refuses (for load, or shut down) gives the input back and the
//! next least loaded is tried; only when every replica refused does the caller get the
//! refusal ([`BatchError::QueueFull`] with the soonest `retry_after` if any replica refused
//! for load).
//!
//! **Groups.** [`Replicas::submit_group`] routes a client request of several inputs as one:
//! the whole group goes to the least loaded replica that admits it (each replica admits by
//! its own capacity, see [`BatchConfig`]), so a group is all or none and counts once
//! wherever it lands.
//!
//! The answer comes back on the [`Handle`] of the replica that took the request, so routing
//! adds nothing to the answer path: every guarantee of [`BatchQueue`] (exactly one answer,
//! deadlines, a failing batch isolated to its callers) holds per replica, and a replica whose
//! model fails answers only the requests it took. Note that a replica failing *fast* has a
//! low outstanding cost and so attracts requests: watch the per-replica `failed` counts.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;

use crate::{BatchConfig, BatchError, BatchModel, BatchQueue, Handle, StatsSnapshot};

/// Several replicas of one model, each with its own [`BatchQueue`], behind one submit that
/// routes to the least loaded (see the module docs for the protocol).
///
/// ```
/// use streampool::{Device, DeviceConfig, Tensor};
/// use streampool_batch::{BatchConfig, Replicas, RowModel};
///
/// // Two separate CPU devices, one copy of the weights on each.
/// let replicas = Replicas::new(
///     (0..2).map(|i| {
///         let dev = Device::cpu_with(DeviceConfig::default()).unwrap();
///         let w = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 2.0], &[2, 2], &dev).unwrap();
///         (format!("cpu:{i}"), RowModel::new(dev, 2, move |x: &Tensor| x.matmul(&w)))
///     }),
///     BatchConfig::default(),
/// )
/// .unwrap();
/// assert_eq!(replicas.infer(vec![3.0, 4.0]).unwrap(), vec![3.0, 8.0]);
/// let routed: u64 = replicas.stats().iter().map(|r| r.routed).sum();
/// assert_eq!(routed, 1);
/// ```
pub struct Replicas<M: BatchModel> {
    replicas: Vec<Replica<M>>,
    /// Rotates where the search for the least loaded starts, so ties spread. Relaxed: any
    /// value is a valid starting point.
    next: AtomicUsize,
}

struct Replica<M: BatchModel> {
    label: String,
    queue: BatchQueue<M>,
    /// Inputs this replica accepted through the router. Relaxed: a statistic.
    routed: AtomicU64,
}

/// One replica's figures (see [`Replicas::stats`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplicaStats {
    /// The replica's label (e.g. its device, `cuda:1`).
    pub label: String,
    /// Inputs the router sent to it (and it accepted).
    pub routed: u64,
    /// Its outstanding cost at the time of the snapshot.
    pub outstanding: u64,
    /// Its queue's statistics, busy time included.
    pub queue: StatsSnapshot,
}

impl<M: BatchModel> Replicas<M> {
    /// Starts one [`BatchQueue`] with `config` per `(label, model)`. Fails with
    /// [`BatchError::Config`] when there is no replica or two share a label, or with what
    /// [`BatchQueue::new`] fails with (the queues already started are then shut down).
    pub fn new<L: Into<String>>(
        models: impl IntoIterator<Item = (L, M)>,
        config: BatchConfig,
    ) -> Result<Self, BatchError> {
        config.validate()?;
        let mut replicas: Vec<Replica<M>> = Vec::new();
        for (label, model) in models {
            let label = label.into();
            if replicas.iter().any(|r| r.label == label) {
                return Err(BatchError::Config(format!(
                    "two replicas labelled {label:?}"
                )));
            }
            replicas.push(Replica {
                label,
                queue: BatchQueue::new(model, config.clone())?,
                routed: AtomicU64::new(0),
            });
        }
        if replicas.is_empty() {
            return Err(BatchError::Config("no replicas".into()));
        }
        Ok(Self {
            replicas,
            next: AtomicUsize::new(0),
        })
    }

    /// Routes `input` to the least loaded replica and blocks until its output is back.
    pub fn infer(&self, input: M::Input) -> Result<M::Output, BatchError> {
        self.submit(input)?.wait()
    }

    /// Routes `inputs` as one group (see [`BatchQueue::submit_group`]) to the least loaded
    /// replica that admits it; one handle per input, in order.
    pub fn submit_group(
        &self,
        inputs: Vec<M::Input>,
    ) -> Result<Vec<Handle<M::Output>>, BatchError> {
        self.route(inputs, None)
    }

    /// [`Replicas::submit_group`] with a deadline (see
    /// [`BatchQueue::submit_group_with_deadline`]).
    pub fn submit_group_with_deadline(
        &self,
        inputs: Vec<M::Input>,
        deadline: Instant,
    ) -> Result<Vec<Handle<M::Output>>, BatchError> {
        self.route(inputs, Some(deadline))
    }

    /// The async [`Replicas::infer`]: never blocks, safe on any async runtime.
    pub async fn infer_async(&self, input: M::Input) -> Result<M::Output, BatchError> {
        self.submit(input)?.await
    }

    /// Routes `input` to the least loaded replica that accepts it and returns its [`Handle`].
    /// Fails at once when every replica refused (see the module docs), or with the first
    /// replica's refusal of the input itself ([`BatchError::InvalidInput`],
    /// [`BatchError::InputTooLong`]).
    pub fn submit(&self, input: M::Input) -> Result<Handle<M::Output>, BatchError> {
        self.route_one(input, None)
    }

    /// [`Replicas::submit`] with a deadline (see [`BatchQueue::submit_with_deadline`]).
    pub fn submit_with_deadline(
        &self,
        input: M::Input,
        deadline: Instant,
    ) -> Result<Handle<M::Output>, BatchError> {
        self.route_one(input, Some(deadline))
    }

    fn route_one(
        &self,
        input: M::Input,
        deadline: Option<Instant>,
    ) -> Result<Handle<M::Output>, BatchError> {
        let mut handles = self.route(vec![input], deadline)?;
        // One input in, one handle out.
        Ok(handles.pop().expect("one handle per input"))
    }

    fn route(
        &self,
        mut inputs: Vec<M::Input>,
        deadline: Option<Instant>,
    ) -> Result<Vec<Handle<M::Output>>, BatchError> {
        let n = self.replicas.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        // Replicas that refused this request; allocated only when one does.
        let mut refused: Vec<bool> = Vec::new();
        let mut last_error = BatchError::ShutDown;
        loop {
            // `min_by_key` keeps the first of equal minima: ties go to the replica nearest
            // after `start`.
            let pick = (0..n)
                .map(|k| (start + k) % n)
                .filter(|&i| !refused.get(i).copied().unwrap_or(false))
                .min_by_key(|&i| self.replicas[i].queue.outstanding());
            let Some(i) = pick else {
                return Err(last_error);
            };
            let replica = &self.replicas[i];
            let count = inputs.len() as u64;
            match replica.queue.try_submit_group(inputs, deadline) {
                Ok(handles) => {
                    replica.routed.fetch_add(count, Ordering::Relaxed);
                    return Ok(handles);
                }
                Err(r) => match r.inputs {
                    Some(back) => {
                        inputs = back;
                        if refused.is_empty() {
                            refused = vec![false; n];
                        }
                        refused[i] = true;
                        last_error = sooner(last_error, r.error);
                    }
                    None => return Err(r.error),
                },
            }
        }
    }

    /// Replicas served.
    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    /// Always `false`: there is at least one replica.
    pub fn is_empty(&self) -> bool {
        self.replicas.is_empty()
    }

    /// The queue of replica `i` (in the order given to [`Replicas::new`]).
    pub fn replica(&self, i: usize) -> Option<&BatchQueue<M>> {
        self.replicas.get(i).map(|r| &r.queue)
    }

    /// The replicas' labels, in order.
    pub fn labels(&self) -> impl Iterator<Item = &str> {
        self.replicas.iter().map(|r| r.label.as_str())
    }

    /// The outstanding cost summed over the replicas.
    pub fn outstanding(&self) -> u64 {
        self.replicas.iter().map(|r| r.queue.outstanding()).sum()
    }

    /// Requests waiting in all replicas' queues.
    pub fn queue_len(&self) -> usize {
        self.replicas.iter().map(|r| r.queue.queue_len()).sum()
    }

    /// Whether every replica still accepts requests.
    pub fn is_accepting(&self) -> bool {
        self.replicas.iter().all(|r| r.queue.is_accepting())
    }

    /// Each replica's figures, in order.
    pub fn stats(&self) -> Vec<ReplicaStats> {
        self.replicas
            .iter()
            .map(|r| ReplicaStats {
                label: r.label.clone(),
                routed: r.routed.load(Ordering::Relaxed),
                outstanding: r.queue.outstanding(),
                queue: r.queue.stats(),
            })
            .collect()
    }

    /// Clears every replica's statistics and routed count.
    pub fn reset_stats(&self) {
        for r in &self.replicas {
            r.queue.reset_stats();
            r.routed.store(0, Ordering::Relaxed);
        }
    }

    /// Graceful shutdown of every replica (see [`BatchQueue::shutdown`]); also done on drop.
    pub fn shutdown(&self) {
        // Close all first, so no replica keeps taking requests while another drains.
        for r in &self.replicas {
            r.queue.close(true);
        }
        for r in &self.replicas {
            r.queue.shutdown();
        }
    }

    /// [`BatchQueue::shutdown_now`] on every replica.
    pub fn shutdown_now(&self) {
        for r in &self.replicas {
            r.queue.shutdown_now();
        }
    }
}

/// Of two refusals, the one to answer when every replica refused: a load refusal over a
/// shutdown (the set is still serving), and of two load refusals the one that can be retried
/// sooner.
fn sooner(a: BatchError, b: BatchError) -> BatchError {
    match (a.retry_after(), b.retry_after()) {
        (Some(x), Some(y)) if y < x => b,
        (Some(_), _) => a,
        (None, _) => b,
    }
}

impl<M: BatchModel> std::fmt::Debug for Replicas<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicas")
            .field("labels", &self.labels().collect::<Vec<_>>())
            .field("outstanding", &self.outstanding())
            .finish()
    }
}
