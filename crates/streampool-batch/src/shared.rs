//! The state every caller and worker of one queue shares, and the two halves of the
//! hand-off: [`Shared::submit`] (caller) and [`Shared::serve`] / [`Shared::run_batch`]
//! (worker). [`BatchQueue`](crate::BatchQueue) adds the threads and streams around it; the
//! loom model drives this same code with loom threads.

use std::panic::{catch_unwind, AssertUnwindSafe};
// std, not the loom shim: the outstanding cost is a load figure for routing, read without
// any hand-off depending on it, so modelling it would only multiply loom's states.
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use streampool::sync::Arc;

use crate::queue::{PushError, RequestQueue};
use crate::slot::{slot, Claim, Handle, Responder};
use crate::stats::{Outcome, Stats};
use crate::{BatchConfig, BatchContext, BatchError, BatchModel};

/// One queued request.
pub(crate) struct Request<M: BatchModel> {
    input: M::Input,
    /// The request's bucket length (`None` without buckets).
    bucket: Option<usize>,
    submitted: Instant,
    deadline: Option<Instant>,
    /// [`BatchModel::cost`] of the input, added to `outstanding` until the request is settled.
    cost: u64,
    responder: Responder<M::Output>,
}

/// A submit the queue refused, with the input when the refusal was for fullness or
/// shutdown (another queue may take it).
pub(crate) struct Refused<I> {
    pub(crate) error: BatchError,
    pub(crate) input: Option<I>,
}

pub(crate) struct Shared<M: BatchModel> {
    pub(crate) model: Arc<M>,
    pub(crate) config: BatchConfig,
    pub(crate) queue: RequestQueue<Request<M>>,
    pub(crate) stats: Stats,
    /// Sum of the costs of requests accepted and not yet settled (answered, expired,
    /// cancelled or shut down). Relaxed: a router reads it as a hint, and nothing else
    /// is published through it.
    outstanding: AtomicU64,
}

impl<M: BatchModel> Shared<M> {
    pub(crate) fn new(model: Arc<M>, config: BatchConfig) -> Result<Self, BatchError> {
        config.validate()?;
        Ok(Self {
            model,
            queue: RequestQueue::new(config.max_queue),
            config,
            stats: Stats::default(),
            outstanding: AtomicU64::new(0),
        })
    }

    /// See the `outstanding` field.
    pub(crate) fn outstanding(&self) -> u64 {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Requests of total cost `cost` are settled: they no longer count as outstanding.
    fn settle(&self, cost: u64) {
        self.outstanding.fetch_sub(cost, Ordering::Relaxed);
    }

    /// Queues `input`; never blocks beyond a brief lock.
    pub(crate) fn submit(
        &self,
        input: M::Input,
        deadline: Option<Instant>,
    ) -> Result<Handle<M::Output>, BatchError> {
        self.try_submit(input, deadline).map_err(|r| r.error)
    }

    /// [`Shared::submit`], but a request refused because the queue is full or closed gives
    /// its input back, so a router can offer it to another queue.
    pub(crate) fn try_submit(
        &self,
        input: M::Input,
        deadline: Option<Instant>,
    ) -> Result<Handle<M::Output>, Refused<M::Input>> {
        let refuse = |error| Refused { error, input: None };
        self.model
            .check_input(&input)
            .map_err(|e| refuse(BatchError::InvalidInput(e.to_string())))?;
        let bucket = if self.config.buckets.is_empty() {
            None
        } else {
            self.config
                .bucket_for(self.model.input_len(&input))
                .map_err(refuse)?
        };
        let cost = self.model.cost(&input);
        let (responder, handle) = slot(deadline);
        let request = Request {
            input,
            bucket,
            submitted: Instant::now(),
            deadline,
            cost,
            responder,
        };
        // Counted before the push: once pushed, a worker may settle it at any moment.
        self.outstanding.fetch_add(cost, Ordering::Relaxed);
        match self.queue.push(request) {
            Ok(()) => {
                self.stats.count(Outcome::Submitted, 1);
                Ok(handle)
            }
            Err(refused) => {
                self.settle(cost);
                let (request, error) = match refused {
                    PushError::Full(r) => {
                        self.stats.count(Outcome::Rejected, 1);
                        let capacity = self.config.max_queue;
                        (r, BatchError::QueueFull { capacity })
                    }
                    PushError::Closed(r) => (r, BatchError::ShutDown),
                };
                // The caller gets the error from this call; the unused slot answers nobody.
                request.responder.answer(Err(error.clone()));
                Err(Refused {
                    error,
                    input: Some(request.input),
                })
            }
        }
    }

    /// A worker's loop: takes and runs batches until the queue is closed and empty.
    pub(crate) fn serve(&self, worker: usize) {
        let (max, wait) = (self.config.max_batch_size, self.config.max_wait);
        while let Some(batch) = self.queue.take_batch(max, wait, |r| r.bucket.unwrap_or(0)) {
            self.run_batch(batch, worker);
        }
    }

    /// Answers expired and abandoned requests without running them, runs the rest as one
    /// batch, and answers each caller with its own output (or the batch's error).
    pub(crate) fn run_batch(&self, batch: Vec<Request<M>>, worker: usize) {
        let padded_len = batch.first().and_then(|r| r.bucket);
        let now = Instant::now();
        let mut live = Vec::with_capacity(batch.len());
        for r in batch {
            if r.deadline.is_some_and(|d| now >= d) {
                // Counted here whether or not the caller already answered itself at its
                // deadline (then this answer is dropped): either way it expired once.
                self.stats.count(Outcome::Expired, 1);
                self.settle(r.cost);
                r.responder.answer(Err(BatchError::DeadlineExceeded));
                continue;
            }
            match r.responder.claim() {
                Claim::Won => live.push(r),
                Claim::Expired => {
                    self.stats.count(Outcome::Expired, 1);
                    self.settle(r.cost);
                }
                Claim::Abandoned => {
                    self.stats.count(Outcome::Cancelled, 1);
                    self.settle(r.cost);
                }
            }
        }
        if live.is_empty() {
            return;
        }
        let started = Instant::now();
        self.stats.batch_started(
            live.iter().map(|r| started.duration_since(r.submitted)),
            started,
        );
        let n = live.len();
        let mut inputs = Vec::with_capacity(n);
        let mut waiting = Vec::with_capacity(n);
        let mut cost = 0;
        for r in live {
            inputs.push(r.input);
            cost += r.cost;
            waiting.push((r.responder, r.submitted));
        }
        let ctx = BatchContext { padded_len, worker };
        // A panic inside the model must not take the worker (and every later request) down:
        // the model is only read through `&self`, and a panicking batch's inputs are gone, so
        // nothing half-updated is observed afterwards except what the model itself guards.
        let result = catch_unwind(AssertUnwindSafe(|| self.model.forward_batch(inputs, &ctx)));
        let done = Instant::now();
        self.stats.batch_finished(done);
        // Settled before the answers go out, so a caller that got its answer no longer sees
        // its request as outstanding.
        self.settle(cost);
        let outputs = match result {
            Ok(Ok(outputs)) if outputs.len() == n => Ok(outputs),
            Ok(Ok(outputs)) => Err(format!(
                "model returned {} outputs for a batch of {n}",
                outputs.len()
            )),
            Ok(Err(e)) => Err(e.to_string()),
            Err(panic) => Err(format!("model panicked: {}", panic_message(&*panic))),
        };
        match outputs {
            Ok(outputs) => {
                // Stats are recorded before the answers go out, so a caller that got its
                // answer sees itself counted.
                self.stats
                    .completed(waiting.iter().map(|(_, s)| done.duration_since(*s)));
                for ((responder, _), out) in waiting.into_iter().zip(outputs) {
                    // Every responder here was claimed, so each answer is delivered.
                    responder.answer(Ok(out));
                }
            }
            Err(msg) => {
                self.stats.count(Outcome::Failed, n as u64);
                for (responder, _) in waiting {
                    responder.answer(Err(BatchError::Model(msg.clone())));
                }
            }
        }
    }

    /// Closes the queue. With `drain`, workers run what is queued; without, queued requests
    /// are answered [`BatchError::ShutDown`] here.
    pub(crate) fn close(&self, drain: bool) {
        let removed = self.queue.close(drain);
        if !removed.is_empty() {
            self.stats.count(Outcome::ShutDown, removed.len() as u64);
            self.settle(removed.iter().map(|r| r.cost).sum());
        }
        for r in removed {
            r.responder.answer(Err(BatchError::ShutDown));
        }
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}
