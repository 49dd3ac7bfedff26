//! How far a CPU stream's worker has got, and waiting for a point in it.
//!
//! Events on the CPU backend are sequence numbers: event `n` on a stream has completed once
//! the worker has finished `n` jobs. Completing a job is an atomic increment; a waiter
//! registers itself and sleeps on a condition variable, and the worker only takes the lock
//! to notify when someone is registered. This hand-off is checked by a loom model.

use crate::sync::{AtomicU64, AtomicUsize, Condvar, Mutex, Ordering};

/// Completed-job counter of one stream.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    completed: AtomicU64,
    waiters: AtomicUsize,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Progress {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Jobs finished so far.
    pub(crate) fn completed(&self) -> u64 {
        self.completed.load(Ordering::Acquire)
    }

    /// Called by the worker after each job.
    pub(crate) fn advance(&self) {
        // SeqCst pairs with the SeqCst `waiters` increment in `wait_for`: either the waiter
        // sees the new count, or we see the waiter and notify it (a Dekker-style handshake).
        self.completed.fetch_add(1, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            // Taking the lock orders this notify after the waiter's check-then-wait, which
            // it performs while holding the lock, so the wake-up cannot be lost.
            let _guard = self.lock.lock();
            self.cv.notify_all();
        }
    }

    /// Blocks until at least `seq` jobs have completed.
    pub(crate) fn wait_for(&self, seq: u64) {
        if self.completed.load(Ordering::Acquire) >= seq {
            return;
        }
        // Lock held only between checks and while parked; the worker never holds it long.
        let mut guard = self.lock.lock();
        self.waiters.fetch_add(1, Ordering::SeqCst);
        while self.completed.load(Ordering::SeqCst) < seq {
            guard = self.cv.wait(guard);
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        drop(guard);
    }
}
