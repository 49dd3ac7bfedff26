//! The state every caller and worker of one queue shares, and the two halves of the
//! hand-off: [`Shared::submit`] (caller) and [`Shared::serve`] / [`Shared::run_batch`]
//! (worker), or, for a model with a preparation step, [`Shared::serve_preparing`] and
//! [`Shared::serve_running`] (a worker's two stages, joined by a [`Handoff`]). [`BatchQueue`](crate::BatchQueue) adds the threads and streams around it; the
//! loom model drives this same code with loom threads.

use std::panic::{catch_unwind, AssertUnwindSafe};
// std, not the loom shim: the outstanding cost is a load figure for routing, read without
// any hand-off depending on it, so modelling it would only multiply loom's states.
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use streampool::sync::Arc;

use crate::handoff::Handoff;
use crate::queue::{PushError, RequestQueue};
use crate::slot::{slot, Claim, Handle, Responder};
use crate::stats::{Outcome, Stats};
use crate::{BatchConfig, BatchContext, BatchError, BatchModel, Prepared};

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

/// A claimed batch: its inputs, its callers (answer slot and submit time), its total cost.
struct Claimed<M: BatchModel> {
    inputs: Vec<M::Input>,
    waiting: Vec<(Responder<M::Output>, Instant)>,
    cost: u64,
    ctx: BatchContext,
}

/// A claimed and prepared batch, handed from a worker's preparing stage to its running stage.
pub(crate) struct Ready<M: BatchModel> {
    prepared: Prepared,
    waiting: Vec<(Responder<M::Output>, Instant)>,
    cost: u64,
    ctx: BatchContext,
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
        while let Some(batch) = self.take_batch() {
            self.run_batch(batch, worker);
        }
    }

    fn take_batch(&self) -> Option<Vec<Request<M>>> {
        let (max, wait) = (self.config.max_batch_size, self.config.max_wait);
        self.queue.take_batch(max, wait, |r| r.bucket.unwrap_or(0))
    }

    /// Answers expired and abandoned requests without running them, runs the rest as one
    /// batch, and answers each caller with its own output (or the batch's error).
    pub(crate) fn run_batch(&self, batch: Vec<Request<M>>, worker: usize) {
        let Some(claimed) = self.claim(batch, worker) else {
            return;
        };
        let Claimed {
            inputs,
            waiting,
            cost,
            ctx,
        } = claimed;
        let started = Instant::now();
        self.stats.batch_started(started);
        // A panic inside the model must not take the worker (and every later request) down:
        // the model is only read through `&self`, and a panicking batch's inputs are gone, so
        // nothing half-updated is observed afterwards except what the model itself guards.
        let result = catch_unwind(AssertUnwindSafe(|| self.model.forward_batch(inputs, &ctx)));
        let done = Instant::now();
        self.stats.batch_finished(done);
        self.stats.ran(done.duration_since(started));
        self.answer(waiting, cost, flatten(result), done);
    }

    /// The preparing stage of a pipelined worker: once `handoff` is vacant, forms the next
    /// batch, claims it, runs [`BatchModel::prepare_batch`] and puts the result in. Ends when
    /// the queue is closed and empty (then finishes the hand-off) or the runner is gone.
    pub(crate) fn serve_preparing(&self, worker: usize, handoff: &Handoff<Ready<M>>) {
        while handoff.wait_vacant() {
            let Some(batch) = self.take_batch() else {
                break;
            };
            let Some(claimed) = self.claim(batch, worker) else {
                continue;
            };
            let Claimed {
                inputs,
                waiting,
                cost,
                ctx,
            } = claimed;
            let started = Instant::now();
            // Caught for the same reason as a panic in `forward_batch` (see `run_batch`).
            let prepared =
                catch_unwind(AssertUnwindSafe(|| self.model.prepare_batch(inputs, &ctx)));
            let done = Instant::now();
            self.stats.prepared(done.duration_since(started));
            match flatten(prepared) {
                Ok(prepared) => {
                    let ready = Ready {
                        prepared,
                        waiting,
                        cost,
                        ctx,
                    };
                    // Refused only when the runner is gone: dropping the batch answers each
                    // of its (claimed) requests `ShutDown` through its responder's drop.
                    if let Err(ready) = handoff.put(ready) {
                        self.drop_ready(ready);
                        break;
                    }
                }
                Err(msg) => self.answer(waiting, cost, Err(msg), done),
            }
        }
        handoff.finish();
    }

    /// The running stage of a pipelined worker: runs each prepared batch through
    /// [`BatchModel::forward_prepared`] and answers its callers, until the preparing stage
    /// finishes.
    pub(crate) fn serve_running(&self, handoff: &Handoff<Ready<M>>) {
        // Closes the hand-off however this stage ends, so the preparer never waits on a
        // runner that is gone; a batch left in the slot is answered `ShutDown` (dropped).
        struct CloseOnDrop<'a, M: BatchModel>(&'a Shared<M>, &'a Handoff<Ready<M>>);
        impl<M: BatchModel> Drop for CloseOnDrop<'_, M> {
            fn drop(&mut self) {
                if let Some(ready) = self.1.close() {
                    self.0.drop_ready(ready);
                }
            }
        }
        let _close = CloseOnDrop(self, handoff);
        while let Some(Ready {
            prepared,
            waiting,
            cost,
            ctx,
        }) = handoff.take()
        {
            let started = Instant::now();
            self.stats.batch_started(started);
            // See `run_batch` on catching panics.
            let result = catch_unwind(AssertUnwindSafe(|| {
                self.model.forward_prepared(prepared, &ctx)
            }));
            let done = Instant::now();
            self.stats.batch_finished(done);
            self.stats.ran(done.duration_since(started));
            self.answer(waiting, cost, flatten(result), done);
        }
    }

    /// A prepared batch that will not run (its runner is gone): settled, counted, and
    /// answered `ShutDown` by its responders' drop.
    pub(crate) fn drop_ready(&self, ready: Ready<M>) {
        self.stats
            .count(Outcome::ShutDown, ready.waiting.len() as u64);
        self.settle(ready.cost);
    }

    /// Answers expired and abandoned requests of `batch` and claims the rest for running;
    /// `None` when none is left.
    fn claim(&self, batch: Vec<Request<M>>, worker: usize) -> Option<Claimed<M>> {
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
            return None;
        }
        let started = Instant::now();
        self.stats
            .batch_formed(live.iter().map(|r| started.duration_since(r.submitted)));
        let n = live.len();
        let mut inputs = Vec::with_capacity(n);
        let mut waiting = Vec::with_capacity(n);
        let mut cost = 0;
        for r in live {
            inputs.push(r.input);
            cost += r.cost;
            waiting.push((r.responder, r.submitted));
        }
        Some(Claimed {
            inputs,
            waiting,
            cost,
            ctx: BatchContext { padded_len, worker },
        })
    }

    /// Settles a claimed batch and answers each caller with its own output or the batch's
    /// error.
    fn answer(
        &self,
        waiting: Vec<(Responder<M::Output>, Instant)>,
        cost: u64,
        result: Result<Vec<M::Output>, String>,
        done: Instant,
    ) {
        let n = waiting.len();
        // Settled before the answers go out, so a caller that got its answer no longer sees
        // its request as outstanding.
        self.settle(cost);
        let outputs = match result {
            Ok(outputs) if outputs.len() == n => Ok(outputs),
            Ok(outputs) => Err(format!(
                "model returned {} outputs for a batch of {n}",
                outputs.len()
            )),
            Err(msg) => Err(msg),
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

/// A model call's outcome, errors and panics alike as the message every caller gets.
fn flatten<T>(r: std::thread::Result<Result<T, crate::ModelError>>) -> Result<T, String> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(panic) => Err(format!("model panicked: {}", panic_message(&*panic))),
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
