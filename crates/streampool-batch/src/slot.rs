//! The one-shot answer slot between a caller and the worker that runs its request.
//!
//! A [`Responder`] (worker side) and a [`Handle`] (caller side) share one slot. The slot's
//! phase only moves forward, under its lock:
//!
//! ```text
//! Pending --claim--> Claimed --answer--> Answered --take--> Taken
//!    |                                      ^
//!    +------answer (expiry, shutdown)-------+
//!    +------caller's deadline passes--------+   (caller answers itself DeadlineExceeded)
//! ```
//!
//! The worker runs a request only after winning `claim`, so a request whose caller already
//! gave up on its deadline is never run, and a claimed one is always answered by the worker.
//! Every path ends in exactly one answer: a [`Responder`] dropped unanswered answers
//! [`BatchError::ShutDown`]. The blocking wait and the async `poll` read the same state, so
//! the loom model of the blocking path also covers the state machine the future uses.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use streampool::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::BatchError;

enum Phase<O> {
    Pending,
    Claimed,
    Answered(Result<O, BatchError>),
    Taken,
}

struct State<O> {
    phase: Phase<O>,
    /// The caller dropped its handle while the request was pending: nobody wants the answer.
    abandoned: bool,
    /// The task of the last `poll` that found no answer.
    waker: Option<Waker>,
}

struct Slot<O> {
    /// Protects the phase, the abandoned flag and the waker. Held only to read or move the
    /// phase (never while a model runs or across a device wait).
    state: Mutex<State<O>>,
    /// Notified once, when the phase becomes `Answered`.
    answered: Condvar,
}

/// Creates a slot: the worker's half and the caller's half. `deadline`, if any, lets the
/// caller stop waiting (and answer itself) once it passes while the request is pending.
pub(crate) fn slot<O>(deadline: Option<Instant>) -> (Responder<O>, Handle<O>) {
    let slot = Arc::new(Slot {
        state: Mutex::new(State {
            phase: Phase::Pending,
            abandoned: false,
            waker: None,
        }),
        answered: Condvar::new(),
    });
    (
        Responder {
            slot: Some(slot.clone()),
        },
        Handle { slot, deadline },
    )
}

/// What [`Responder::claim`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// The worker now owns the request: it must run it and answer.
    Won,
    /// The caller already answered itself (its deadline passed); do not run.
    Expired,
    /// The caller dropped its handle; do not run.
    Abandoned,
}

/// The worker's half of a slot: answers the request exactly once.
pub(crate) struct Responder<O> {
    /// `None` once answered (so `Drop` knows there is nothing left to do).
    slot: Option<Arc<Slot<O>>>,
}

impl<O> Responder<O> {
    /// Takes the request for running, unless its caller gave up on it.
    pub(crate) fn claim(&self) -> Claim {
        let Some(slot) = &self.slot else {
            return Claim::Expired;
        };
        let mut st = slot.state.lock();
        match st.phase {
            Phase::Pending if st.abandoned => Claim::Abandoned,
            Phase::Pending => {
                st.phase = Phase::Claimed;
                Claim::Won
            }
            // Only the caller's own deadline answers a pending slot without a responder.
            _ => Claim::Expired,
        }
    }

    /// Delivers `result` and wakes the caller. Returns `false` if the caller had already
    /// answered itself (the result is dropped).
    pub(crate) fn answer(mut self, result: Result<O, BatchError>) -> bool {
        match self.slot.take() {
            Some(slot) => deliver(&slot, result),
            None => false,
        }
    }
}

impl<O> Drop for Responder<O> {
    fn drop(&mut self) {
        // A request dropped unanswered (queue torn down, or a worker died outside the model
        // call) still gets exactly one answer.
        if let Some(slot) = self.slot.take() {
            deliver(&slot, Err(BatchError::ShutDown));
        }
    }
}

fn deliver<O>(slot: &Slot<O>, result: Result<O, BatchError>) -> bool {
    let waker = {
        let mut st = slot.state.lock();
        match st.phase {
            Phase::Pending | Phase::Claimed => st.phase = Phase::Answered(result),
            Phase::Answered(_) | Phase::Taken => return false,
        }
        st.waker.take()
    };
    slot.answered.notify_all();
    // Woken outside the lock: a waker may run code that polls the slot again.
    if let Some(w) = waker {
        w.wake();
    }
    true
}

/// The caller's half: wait for the answer, blocking ([`Handle::wait`]) or as a future
/// (`handle.await`, usable from any async runtime; it never blocks the runtime's threads).
///
/// Dropping a handle before its request ran tells the queue to skip the request.
pub struct Handle<O> {
    slot: Arc<Slot<O>>,
    deadline: Option<Instant>,
}

impl<O> Handle<O> {
    /// Blocks until the answer arrives and returns it. If the request carries a deadline and
    /// it passes while the request still waits in the queue, returns
    /// [`BatchError::DeadlineExceeded`] at the deadline and the request is never run; once a
    /// worker has started the request, waits for its real answer.
    pub fn wait(self) -> Result<O, BatchError> {
        let mut st = self.slot.state.lock();
        loop {
            if let Some(answer) = take_answer(&mut st) {
                return answer;
            }
            match (&st.phase, self.deadline) {
                (Phase::Pending, Some(deadline)) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let (guard, timed_out) =
                        self.slot.answered.wait_timeout(&self.slot.state, st, left);
                    st = guard;
                    // `timed_out` is trusted as "the deadline passed" instead of re-reading the
                    // clock: under loom a timed wait always times out, with no clock moving.
                    if timed_out && matches!(st.phase, Phase::Pending) {
                        st.phase = Phase::Taken;
                        return Err(BatchError::DeadlineExceeded);
                    }
                }
                _ => st = self.slot.answered.wait(st),
            }
        }
    }

    /// Waits at most `timeout` for the answer; `true` once it is there ([`Handle::wait`] then
    /// returns it at once). Does not apply the request's deadline.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut st = self.slot.state.lock();
        loop {
            if matches!(st.phase, Phase::Answered(_) | Phase::Taken) {
                return true;
            }
            let left = end.saturating_duration_since(Instant::now());
            let (guard, timed_out) = self.slot.answered.wait_timeout(&self.slot.state, st, left);
            st = guard;
            if timed_out {
                return matches!(st.phase, Phase::Answered(_) | Phase::Taken);
            }
        }
    }

    /// Whether the answer has arrived.
    pub fn is_ready(&self) -> bool {
        matches!(
            self.slot.state.lock().phase,
            Phase::Answered(_) | Phase::Taken
        )
    }
}

fn take_answer<O>(st: &mut MutexGuard<'_, State<O>>) -> Option<Result<O, BatchError>> {
    match std::mem::replace(&mut st.phase, Phase::Taken) {
        Phase::Answered(answer) => Some(answer),
        // Polled again after completion: futures may not be, so this is a caller bug; answer
        // it rather than hang.
        Phase::Taken => Some(Err(BatchError::ShutDown)),
        other => {
            st.phase = other;
            None
        }
    }
}

/// The async wait: resolves to the answer. The request's deadline is applied by the worker
/// (an expired request is answered `DeadlineExceeded` when dequeued); to bound the wait
/// itself, wrap the future in your runtime's timeout.
impl<O> Future for Handle<O> {
    type Output = Result<O, BatchError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut st = self.slot.state.lock();
        match take_answer(&mut st) {
            Some(answer) => Poll::Ready(answer),
            None => {
                if !st.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    st.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }
}

impl<O> Drop for Handle<O> {
    fn drop(&mut self) {
        let mut st = self.slot.state.lock();
        if matches!(st.phase, Phase::Pending) {
            st.abandoned = true;
        }
    }
}

impl<O> std::fmt::Debug for Handle<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("ready", &self.is_ready())
            .field("deadline", &self.deadline)
            .finish()
    }
}
