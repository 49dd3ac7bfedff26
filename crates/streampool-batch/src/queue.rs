//! The bounded request queue that callers push to and workers take batches from.
//!
//! One worker at a time *forms* a batch: it takes the first waiting request, then keeps
//! taking requests of the same key (bucket) until the batch is full or `max_wait` has passed
//! since it took the first, and then runs the batch while the next worker forms the next
//! one. Other workers wait meanwhile, so arrivals are not split over several half-empty
//! batches.
//!
//! **Timed waits and loom.** Waiting for a first request is an untimed condvar wait. Only
//! the fill window is timed, through `Condvar::wait_timeout`; under `--cfg loom` that call
//! releases the lock, lets other threads run and then reports a timeout (loom has no clock),
//! so in the model every window ends after one round of other threads' pushes. The real
//! code's other outcome, a notification before the time is up, re-runs the same loop body.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use streampool::sync::{Condvar, Mutex};

/// Why a push was refused; the item comes back so the caller can answer it.
#[derive(Debug)]
pub(crate) enum PushError<T> {
    /// `capacity` items are already waiting.
    Full(T),
    /// The queue was closed.
    Closed(T),
}

struct State<T> {
    items: VecDeque<T>,
    closed: bool,
    /// A worker is forming a batch (between its first take and the end of its window).
    forming: bool,
}

/// A bounded FIFO of requests, closed once at shutdown.
pub(crate) struct RequestQueue<T> {
    /// Protects the items and the two flags. Held to push, to move items into a forming
    /// batch and while waiting on `changed`; never while a batch runs.
    state: Mutex<State<T>>,
    /// Notified on every push, on close, and when a worker stops forming.
    changed: Condvar,
    capacity: usize,
}

impl<T> RequestQueue<T> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            state: Mutex::new(State {
                items: VecDeque::new(),
                closed: false,
                forming: false,
            }),
            changed: Condvar::new(),
            capacity,
        }
    }

    /// Appends `item`, or gives it back at once if the queue is full or closed (never blocks
    /// beyond the brief lock).
    pub(crate) fn push(&self, item: T) -> Result<(), PushError<T>> {
        {
            let mut st = self.state.lock();
            if st.closed {
                return Err(PushError::Closed(item));
            }
            if st.items.len() >= self.capacity {
                return Err(PushError::Full(item));
            }
            st.items.push_back(item);
        }
        self.changed.notify_all();
        Ok(())
    }

    /// Waits for a batch: up to `max` items sharing the key of the oldest waiting item,
    /// gathered for at most `max_wait` after the first was taken. Returns `None` once the
    /// queue is closed and empty.
    pub(crate) fn take_batch(
        &self,
        max: usize,
        max_wait: Duration,
        key: impl Fn(&T) -> usize,
    ) -> Option<Vec<T>> {
        let mut st = self.state.lock();
        loop {
            if !st.forming && !st.items.is_empty() {
                break;
            }
            if st.closed && st.items.is_empty() {
                return None;
            }
            st = self.changed.wait(st);
        }
        st.forming = true;
        let window_end = Instant::now() + max_wait;
        // Non-empty: checked just above, under the same lock.
        let first = st.items.pop_front().expect("queue is non-empty");
        let k = key(&first);
        let mut batch = vec![first];
        loop {
            take_matching(&mut st.items, &mut batch, max, k, &key);
            if batch.len() >= max || st.closed {
                break;
            }
            let left = window_end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let (guard, timed_out) = self.changed.wait_timeout(&self.state, st, left);
            st = guard;
            if timed_out {
                take_matching(&mut st.items, &mut batch, max, k, &key);
                break;
            }
        }
        st.forming = false;
        let others_waiting = !st.items.is_empty();
        drop(st);
        if others_waiting {
            // Requests of other buckets (or beyond `max`) are waiting: let the next worker form.
            self.changed.notify_all();
        }
        Some(batch)
    }

    /// Closes the queue: later pushes fail with [`PushError::Closed`]. With `drain`, waiting
    /// items stay for the workers to run and nothing is returned; without, they are removed
    /// and returned for the caller to answer.
    pub(crate) fn close(&self, drain: bool) -> Vec<T> {
        let removed = {
            let mut st = self.state.lock();
            st.closed = true;
            if drain {
                Vec::new()
            } else {
                st.items.drain(..).collect()
            }
        };
        self.changed.notify_all();
        removed
    }

    /// Whether [`RequestQueue::close`] was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.state.lock().closed
    }

    /// Items waiting now.
    pub(crate) fn len(&self) -> usize {
        self.state.lock().items.len()
    }
}

/// Moves items with key `k` from `items` into `batch`, oldest first, until `batch` holds `max`.
fn take_matching<T>(
    items: &mut VecDeque<T>,
    batch: &mut Vec<T>,
    max: usize,
    k: usize,
    key: &impl Fn(&T) -> usize,
) {
    let mut i = 0;
    while batch.len() < max && i < items.len() {
        if key(&items[i]) == k {
            // In range: `i < items.len()` was just checked.
            batch.push(items.remove(i).expect("index in range"));
        } else {
            i += 1;
        }
    }
}
