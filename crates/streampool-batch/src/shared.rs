//! The state every caller and worker of one queue shares, and the caller's half of the
//! hand-off: [`Shared::submit_group`] and its admission check. The worker's half
//! ([`Shared::serve`], or for a model with a preparation step [`Shared::serve_preparing`]
//! and [`Shared::serve_running`], a worker's two stages joined by a
//! [`Handoff`](crate::handoff::Handoff)) is in `worker.rs`. [`BatchQueue`](crate::BatchQueue)
//! adds the threads and streams around it; the loom model drives this same code with loom
//! threads.
//!
//! **Admission** (see [`BatchConfig`]): a group is refused only when something already
//! waits and either a memory cap (`max_queue` requests, `max_queue_tokens` tokens) would be
//! passed, or the estimated wait before it starts (the tokens waiting ahead of it over the
//! measured service rate, [`Estimates::rate`]) exceeds the time left to its deadline or
//! `max_queue_wait`. The check runs under the queue's lock, with the rate read just before.

// std, not the loom shim: the outstanding cost is a load figure for routing, read without
// any hand-off depending on it, so modelling it would only multiply loom's states.
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use streampool::sync::Arc;

use crate::estimate::{time_for, Estimates};
use crate::queue::{Item, Limits, Load, PushError, RequestQueue};
use crate::slot::{slot, Handle, Responder};
use crate::stats::{Outcome, Stats};
use crate::{BatchConfig, BatchError, BatchModel, Overload};

/// One queued request (one input).
pub(crate) struct Request<M: BatchModel> {
    pub(crate) input: M::Input,
    /// The request's bucket length (`None` without buckets).
    pub(crate) bucket: Option<usize>,
    /// Its tokens (`max(1, input_len)`), as the queue counted them.
    pub(crate) tokens: usize,
    pub(crate) submitted: Instant,
    pub(crate) deadline: Option<Instant>,
    /// [`BatchModel::cost`] of the input, added to `outstanding` until the request is settled.
    pub(crate) cost: u64,
    pub(crate) responder: Responder<M::Output>,
}

/// A submit the queue refused, with the inputs when the refusal was for load or shutdown
/// (another queue may take them).
pub(crate) struct Refused<I> {
    pub(crate) error: BatchError,
    pub(crate) inputs: Option<Vec<I>>,
}

/// Retry-After when nothing has been measured yet.
const RETRY_UNMEASURED: Duration = Duration::from_secs(1);

pub(crate) struct Shared<M: BatchModel> {
    pub(crate) model: Arc<M>,
    pub(crate) config: BatchConfig,
    pub(crate) queue: RequestQueue<Request<M>>,
    pub(crate) stats: Stats,
    pub(crate) estimates: Estimates,
    /// The queue's standing with its device's scheduler (none for a model without a
    /// device): every batch takes a turn before it runs.
    pub(crate) share: Option<crate::Share>,
    /// Sum of the costs of requests accepted and not yet settled (answered, expired,
    /// cancelled or shut down). Relaxed: a router reads it as a hint, and nothing else
    /// is published through it.
    outstanding: AtomicU64,
}

impl<M: BatchModel> Shared<M> {
    pub(crate) fn new(model: Arc<M>, config: BatchConfig) -> Result<Self, BatchError> {
        config.validate()?;
        let share = model.device().map(|dev| {
            crate::DeviceScheduler::for_device(&dev, config.workers.max(2))
                .share(config.priority, config.weight)
        });
        Ok(Self {
            model,
            share,
            queue: RequestQueue::new(config.workers),
            config,
            stats: Stats::default(),
            estimates: Estimates::default(),
            outstanding: AtomicU64::new(0),
        })
    }

    /// See the `outstanding` field.
    pub(crate) fn outstanding(&self) -> u64 {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Requests of total cost `cost` are settled: they no longer count as outstanding.
    pub(crate) fn settle(&self, cost: u64) {
        self.outstanding.fetch_sub(cost, Ordering::Relaxed);
    }

    /// The bounds every batch of this queue is formed within.
    pub(crate) fn limits(&self) -> Limits {
        Limits {
            rows: self.config.max_batch_size,
            tokens: self.config.max_batch_tokens,
            packed: self.model.packs(),
            max_wait: self.config.max_wait,
        }
    }

    /// Queues `input`; never blocks beyond a brief lock.
    pub(crate) fn submit(
        &self,
        input: M::Input,
        deadline: Option<Instant>,
    ) -> Result<Handle<M::Output>, BatchError> {
        let mut handles = self.submit_group(vec![input], deadline)?;
        // One input in, one handle out.
        Ok(handles.pop().expect("one handle per input"))
    }

    /// Queues `inputs` as one request, all or none; never blocks beyond a brief lock.
    pub(crate) fn submit_group(
        &self,
        inputs: Vec<M::Input>,
        deadline: Option<Instant>,
    ) -> Result<Vec<Handle<M::Output>>, BatchError> {
        self.try_submit_group(inputs, deadline).map_err(|r| r.error)
    }

    /// [`Shared::submit_group`], but a group refused for load or because the queue is
    /// closed gives its inputs back, so a router can offer them to another queue.
    pub(crate) fn try_submit_group(
        &self,
        inputs: Vec<M::Input>,
        deadline: Option<Instant>,
    ) -> Result<Vec<Handle<M::Output>>, Refused<M::Input>> {
        let refuse = |error| Refused {
            error,
            inputs: None,
        };
        // Every input is checked before any is queued: one bad input refuses the group.
        let mut metas = Vec::with_capacity(inputs.len());
        for input in &inputs {
            self.model
                .check_input(input)
                .map_err(|e| refuse(BatchError::InvalidInput(e.to_string())))?;
            let len = self.model.input_len(input);
            let bucket = if self.config.buckets.is_empty() {
                None
            } else {
                self.config.bucket_for(len).map_err(refuse)?
            };
            metas.push((bucket, len.max(1), self.model.cost(input)));
        }
        let n = inputs.len() as u64;
        let group_tokens: usize = metas.iter().map(|m| m.1).sum();
        let group_cost: u64 = metas.iter().map(|m| m.2).sum();
        let submitted = Instant::now();
        let mut handles = Vec::with_capacity(inputs.len());
        let items: Vec<Item<Request<M>>> = inputs
            .into_iter()
            .zip(metas)
            .map(|(input, (bucket, tokens, cost))| {
                let (responder, handle) = slot(deadline);
                handles.push(handle);
                Item {
                    key: bucket.unwrap_or(0),
                    tokens,
                    value: Request {
                        input,
                        bucket,
                        tokens,
                        submitted,
                        deadline,
                        cost,
                        responder,
                    },
                }
            })
            .collect();
        let rate = self.estimates.rate();
        let limit = wait_limit(deadline, submitted, self.config.max_queue_wait);
        // Counted before the push: once pushed, a worker may settle it at any moment.
        self.outstanding.fetch_add(group_cost, Ordering::Relaxed);
        let pushed = self.queue.push_group(items, |load| {
            self.admit(load, group_tokens, rate, limit)
                .map_err(|reason| (reason, load))
        });
        match pushed {
            Ok(()) => {
                self.stats.count(Outcome::Submitted, n);
                Ok(handles)
            }
            Err(refused) => {
                self.settle(group_cost);
                let (requests, error) = match refused {
                    PushError::Refused(requests, (reason, load)) => {
                        self.stats.count(Outcome::Rejected, n);
                        let retry_after = retry_after(reason, load, rate);
                        (
                            requests,
                            BatchError::QueueFull {
                                reason,
                                retry_after,
                            },
                        )
                    }
                    PushError::Closed(requests) => (requests, BatchError::ShutDown),
                };
                // The caller gets the error from this call; the unused slots answer nobody.
                let inputs = requests
                    .into_iter()
                    .map(|r| {
                        r.responder.answer(Err(error.clone()));
                        r.input
                    })
                    .collect();
                Err(Refused {
                    error,
                    inputs: Some(inputs),
                })
            }
        }
    }

    /// The admission check of a group of `tokens` tokens against what waits now (see the
    /// module docs). Never refuses while nothing waits.
    fn admit(
        &self,
        load: Load,
        tokens: usize,
        rate: Option<f64>,
        limit: Option<Duration>,
    ) -> Result<(), Overload> {
        if load.inputs == 0 {
            return Ok(());
        }
        let config = &self.config;
        if load.requests >= config.max_queue {
            return Err(Overload::Requests {
                capacity: config.max_queue,
            });
        }
        if load.tokens.saturating_add(tokens) > config.max_queue_tokens {
            return Err(Overload::Tokens {
                queued: load.tokens,
                asked: tokens,
                capacity: config.max_queue_tokens,
            });
        }
        if let (Some(rate), Some(limit)) = (rate, limit) {
            let estimated = time_for(load.tokens, rate);
            if estimated > limit {
                return Err(Overload::Wait { estimated, limit });
            }
        }
        Ok(())
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

/// How long a request submitted at `now` may wait before it starts: the time left to its
/// deadline or `bound`, whichever is shorter. `None` when neither applies, and when the
/// deadline has already passed (the request is then taken and answered
/// [`BatchError::DeadlineExceeded`] without running, as it always was: refusing it for load
/// would tell its caller to retry what cannot succeed).
fn wait_limit(
    deadline: Option<Instant>,
    now: Instant,
    bound: Option<Duration>,
) -> Option<Duration> {
    let left = match deadline {
        Some(d) if d <= now => return None,
        Some(d) => Some(d - now),
        None => None,
    };
    match (left, bound) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// When a refused request would be admitted if nothing else arrived: for an estimated wait
/// over its limit, the excess; for a memory cap, the time to serve what waits. One second
/// before anything was measured; at least a millisecond.
fn retry_after(reason: Overload, load: Load, rate: Option<f64>) -> Duration {
    let estimate = match (reason, rate) {
        (Overload::Wait { estimated, limit }, _) => estimated.saturating_sub(limit),
        (_, Some(rate)) => time_for(load.tokens, rate),
        (_, None) => RETRY_UNMEASURED,
    };
    estimate.max(Duration::from_millis(1))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_wait_limit_is_the_sooner_of_deadline_and_bound() {
        let now = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(wait_limit(None, now, None), None);
        assert_eq!(wait_limit(None, now, Some(s(2))), Some(s(2)));
        assert_eq!(wait_limit(Some(now + s(5)), now, None), Some(s(5)));
        assert_eq!(wait_limit(Some(now + s(5)), now, Some(s(2))), Some(s(2)));
        assert_eq!(wait_limit(Some(now + s(1)), now, Some(s(2))), Some(s(1)));
        assert_eq!(wait_limit(Some(now), now, Some(s(2))), None, "already late");
    }

    #[test]
    fn retry_after_follows_the_estimate() {
        let load = Load {
            requests: 3,
            inputs: 30,
            tokens: 3000,
        };
        let wait = Overload::Wait {
            estimated: Duration::from_millis(900),
            limit: Duration::from_millis(500),
        };
        assert_eq!(
            retry_after(wait, load, Some(1.0)),
            Duration::from_millis(400)
        );
        let cap = Overload::Requests { capacity: 3 };
        assert_eq!(
            retry_after(cap, load, Some(10_000.0)),
            Duration::from_millis(300)
        );
        assert_eq!(retry_after(cap, load, None), RETRY_UNMEASURED);
    }
}
