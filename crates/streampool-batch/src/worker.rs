//! The worker's half of the hand-off: taking batches from the queue, running them and
//! answering each caller. A plain worker is one loop ([`Shared::serve`]); a worker of a model
//! with a preparation step is two, joined by a one-batch [`Handoff`]: the preparing stage
//! ([`Shared::serve_preparing`]) forms and prepares batch N+1 while the running stage
//! ([`Shared::serve_running`]) runs batch N. The preparing stage forms with a hold (see
//! `queue.rs`): at once while its runner is idle, else once a full batch waits or the running
//! batch is about to end, so the next batch is as large as what arrived while it ran.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use crate::handoff::Handoff;
use crate::queue::Hold;
use crate::shared::{Request, Shared};
use crate::slot::{Claim, Responder};
use crate::stats::Outcome;
use crate::{BatchContext, BatchError, BatchModel, ModelFailure, Prepared};

/// A claimed batch: its inputs, its callers (answer slot and submit time), its total cost
/// and tokens.
struct Claimed<M: BatchModel> {
    inputs: Vec<M::Input>,
    waiting: Vec<(Responder<M::Output>, Instant)>,
    cost: u64,
    tokens: usize,
    ctx: BatchContext,
}

/// A claimed and prepared batch, handed from a worker's preparing stage to its running stage.
pub(crate) struct Ready<M: BatchModel> {
    prepared: Prepared,
    waiting: Vec<(Responder<M::Output>, Instant)>,
    cost: u64,
    tokens: usize,
    ctx: BatchContext,
}

impl<M: BatchModel> Shared<M> {
    /// A worker's loop: takes and runs batches until the queue is closed and empty.
    pub(crate) fn serve(&self, worker: usize) {
        while let Some(batch) = self.queue.take_batch(self.limits(), None) {
            self.run_batch(batch, worker);
        }
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
            tokens,
            ctx,
        } = claimed;
        // The device's turn: taken after the claim (so a batch that expired while waiting is
        // not run) and held until the forward returns.
        let _turn = self.share.as_ref().map(|s| s.turn(tokens));
        let started = Instant::now();
        self.stats.batch_started(started);
        // A panic inside the model must not take the worker (and every later request) down:
        // the model is only read through `&self`, and a panicking batch's inputs are gone, so
        // nothing half-updated is observed afterwards except what the model itself guards.
        let result = catch_unwind(AssertUnwindSafe(|| self.model.forward_batch(inputs, &ctx)));
        let done = Instant::now();
        drop(_turn);
        self.ran(tokens, started, done);
        self.answer(waiting, cost, flatten(result), done);
    }

    /// Records a batch's run in the statistics and the estimates.
    fn ran(&self, tokens: usize, started: Instant, done: Instant) {
        self.stats.batch_finished(done);
        self.stats.ran(done.duration_since(started));
        self.estimates.finished(tokens, started, done);
    }

    /// The preparing stage of pipelined worker `worker`: once `handoff` is vacant, forms the
    /// next batch (with a hold on its runner), claims it, runs [`BatchModel::prepare_batch`]
    /// and puts the result in. Ends when the queue is closed and empty (then finishes the
    /// hand-off) or the runner is gone.
    pub(crate) fn serve_preparing(&self, worker: usize, handoff: &Handoff<Ready<M>>) {
        while handoff.wait_vacant() {
            let hold = Hold {
                worker,
                lead: self.estimates.lead(),
            };
            let Some(batch) = self.queue.take_batch(self.limits(), Some(hold)) else {
                break;
            };
            let Some(claimed) = self.claim(batch, worker) else {
                continue;
            };
            let Claimed {
                inputs,
                waiting,
                cost,
                tokens,
                ctx,
            } = claimed;
            let started = Instant::now();
            // Caught for the same reason as a panic in `forward_batch` (see `run_batch`).
            let prepared =
                catch_unwind(AssertUnwindSafe(|| self.model.prepare_batch(inputs, &ctx)));
            let done = Instant::now();
            let took = done.duration_since(started);
            self.stats.prepared(took);
            self.estimates.prepared(took);
            match flatten(prepared) {
                Ok(prepared) => {
                    let ready = Ready {
                        prepared,
                        waiting,
                        cost,
                        tokens,
                        ctx,
                    };
                    // Before the put: once the slot holds it, the runner may take it, run it
                    // and report it finished at any moment.
                    self.queue.handed(worker, done);
                    // Refused only when the runner is gone: dropping the batch answers each
                    // of its (claimed) requests `ShutDown` through its responder's drop.
                    if let Err(ready) = handoff.put(ready) {
                        self.queue.finished(worker);
                        self.drop_ready(ready);
                        break;
                    }
                }
                Err(msg) => self.answer(waiting, cost, Err(msg), done),
            }
        }
        handoff.finish();
    }

    /// The running stage of pipelined worker `worker`: runs each prepared batch through
    /// [`BatchModel::forward_prepared`] and answers its callers, until the preparing stage
    /// finishes.
    pub(crate) fn serve_running(&self, worker: usize, handoff: &Handoff<Ready<M>>) {
        // Closes the hand-off however this stage ends, so the preparer never waits on a
        // runner that is gone; a batch left in the slot is answered `ShutDown` (dropped).
        struct CloseOnDrop<'a, M: BatchModel>(&'a Shared<M>, &'a Handoff<Ready<M>>, usize);
        impl<M: BatchModel> Drop for CloseOnDrop<'_, M> {
            fn drop(&mut self) {
                if let Some(ready) = self.1.close() {
                    self.0.queue.finished(self.2);
                    self.0.drop_ready(ready);
                }
            }
        }
        let _close = CloseOnDrop(self, handoff, worker);
        while let Some(Ready {
            prepared,
            waiting,
            cost,
            tokens,
            ctx,
        }) = handoff.take()
        {
            // The device's turn, held until the forward returns (see `run_batch`).
            let turn = self.share.as_ref().map(|s| s.turn(tokens));
            let started = Instant::now();
            self.queue.started(worker, started);
            self.stats.batch_started(started);
            // See `run_batch` on catching panics.
            let result = catch_unwind(AssertUnwindSafe(|| {
                self.model.forward_prepared(prepared, &ctx)
            }));
            let done = Instant::now();
            drop(turn);
            // Idle before answering, so a preparing stage holding for this runner forms at
            // once, while the answers go out.
            self.queue.finished(worker);
            self.ran(tokens, started, done);
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
        let n = live.len();
        // What the batch costs the device: rows x the longest, or its tokens when packed.
        let tokens = if self.model.packs() {
            live.iter().map(|r| r.tokens).sum()
        } else {
            n * live.iter().map(|r| r.tokens).max().unwrap_or(0)
        };
        self.stats.batch_formed(
            live.iter().map(|r| started.duration_since(r.submitted)),
            tokens,
        );
        let mut inputs = Vec::with_capacity(n);
        let mut waiting = Vec::with_capacity(n);
        let (mut cost, mut tokens) = (0, 0);
        for r in live {
            inputs.push(r.input);
            cost += r.cost;
            tokens += r.tokens;
            waiting.push((r.responder, r.submitted));
        }
        Some(Claimed {
            inputs,
            waiting,
            cost,
            tokens,
            ctx: BatchContext { padded_len, worker },
        })
    }

    /// Settles a claimed batch and answers each caller with its own output or the batch's
    /// error.
    fn answer(
        &self,
        waiting: Vec<(Responder<M::Output>, Instant)>,
        cost: u64,
        result: Result<Vec<M::Output>, ModelFailure>,
        done: Instant,
    ) {
        let n = waiting.len();
        // Settled before the answers go out, so a caller that got its answer no longer sees
        // its request as outstanding.
        self.settle(cost);
        let outputs = match result {
            Ok(outputs) if outputs.len() == n => Ok(outputs),
            Ok(outputs) => Err(ModelFailure::message(format!(
                "model returned {} outputs for a batch of {n}",
                outputs.len()
            ))),
            Err(failure) => Err(failure),
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
            Err(failure) => {
                self.stats.count(Outcome::Failed, n as u64);
                for (responder, _) in waiting {
                    responder.answer(Err(BatchError::Model(failure.clone())));
                }
            }
        }
    }
}

/// A model call's outcome, errors and panics alike as the failure every caller gets (the
/// error itself, shared, so callers can still tell its kind).
fn flatten<T>(r: std::thread::Result<Result<T, crate::ModelError>>) -> Result<T, ModelFailure> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(ModelFailure::from(e)),
        Err(panic) => Err(ModelFailure::panicked(panic_message(&*panic))),
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
