//! How far a CPU stream's worker has got, and waiting for a point in it.
//!
//! Events on the CPU backend are sequence numbers: event `n` on a stream has completed once
//! the worker has finished `n` jobs. `completed` is atomic so `query` never locks; the
//! worker bumps it under the lock and notifies, so a waiter that checked the count under the
//! same lock cannot miss the wake-up. (An earlier lock-free version used a Dekker-style
//! SeqCst handshake on a waiter count; the loom model could not prove it, so the simpler
//! always-lock protocol won: an uncontended `parking_lot` lock and a `notify_all` with no
//! waiters cost a few nanoseconds, next to microseconds per job.) Checked by a loom model.

use crate::sync::{AtomicU64, Condvar, Mutex, Ordering};

/// Completed-job counter of one stream.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    completed: AtomicU64,
    /// Orders count updates against waiters' check-then-sleep; held for a few instructions.
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
        let _guard = self.lock.lock();
        // Release: whatever the job wrote is visible to anyone who observes the new count.
        self.completed.fetch_add(1, Ordering::Release);
        self.cv.notify_all();
    }

    /// Blocks until at least `seq` jobs have completed.
    pub(crate) fn wait_for(&self, seq: u64) {
        if self.completed.load(Ordering::Acquire) >= seq {
            return;
        }
        let mut guard = self.lock.lock();
        while self.completed.load(Ordering::Acquire) < seq {
            guard = self.cv.wait(guard);
        }
        drop(guard);
    }
}
