//! The one place `streampool` gets its synchronization primitives from.
//!
//! Normal builds use `parking_lot` locks and `std` atomics; `--cfg loom` builds use
//! `loom`'s models, so the loom tests in `crate::loom_tests` run the real code paths
//! (stream-slot assignment, allocator reuse, event hand-off) over every interleaving.
//! This mirrors `tokio/src/loom/`. `parking_lot` (not `std::sync`) is used because it is
//! compiled from source and therefore visible to ThreadSanitizer, whose build does not
//! instrument the standard library (`scripts/tsan.sh`).
//!
//! The wrappers give both worlds one API: `lock()` returns the guard directly and
//! `Condvar::wait` takes and returns the guard.

#[cfg(loom)]
mod imp {
    pub use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
    pub use loom::sync::MutexGuard;

    /// A mutex whose `lock` never reports poisoning (a panicking holder is a bug we surface elsewhere).
    #[derive(Debug, Default)]
    pub struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }
        pub fn lock(&self) -> MutexGuard<'_, T> {
            // loom only poisons after a panic inside the model, which fails the model anyway.
            self.0.lock().unwrap()
        }
        pub fn get_mut(&mut self) -> &mut T {
            // As `lock`: poisoning only follows a model panic.
            self.0.get_mut().unwrap()
        }
    }

    /// Condition variable paired with [`Mutex`].
    #[derive(Debug, Default)]
    pub struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub fn new() -> Self {
            Self(loom::sync::Condvar::new())
        }
        pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            // See `Mutex::lock`: poisoning only follows a model panic.
            self.0.wait(guard).unwrap()
        }
        /// Under loom a timed wait releases the lock, relocks (a scheduling point, where any
        /// other thread may run first) and reports a timeout: loom has no clock, and its own
        /// `wait_timeout` never times out, which would deadlock code that relies on the
        /// timeout. That is one legal outcome of a real timed wait (time ran out while others
        /// ran); callers must treat `true` as "the time is up" rather than re-read a clock.
        /// This is why `mutex` is passed.
        pub fn wait_timeout<'a, T>(
            &self,
            mutex: &'a Mutex<T>,
            guard: MutexGuard<'a, T>,
            _timeout: std::time::Duration,
        ) -> (MutexGuard<'a, T>, bool) {
            drop(guard);
            (mutex.lock(), true)
        }
        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

#[cfg(not(loom))]
mod imp {
    pub use parking_lot::MutexGuard;
    pub use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

    /// A `parking_lot` mutex (never poisoned).
    #[derive(Debug, Default)]
    pub struct Mutex<T>(parking_lot::Mutex<T>);

    impl<T> Mutex<T> {
        pub fn new(value: T) -> Self {
            Self(parking_lot::Mutex::new(value))
        }
        #[inline]
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock()
        }
        /// The value, through exclusive access (no locking: no one else can hold it).
        #[inline]
        pub fn get_mut(&mut self) -> &mut T {
            self.0.get_mut()
        }
    }

    /// Condition variable paired with [`Mutex`].
    #[derive(Debug, Default)]
    pub struct Condvar(parking_lot::Condvar);

    impl Condvar {
        pub fn new() -> Self {
            Self(parking_lot::Condvar::new())
        }
        pub fn wait<'a, T>(&self, mut guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0.wait(&mut guard);
            guard
        }
        /// Waits for a notification or until `timeout` has passed, releasing `guard` (a guard
        /// of `mutex`, which only the loom build needs) meanwhile; `true` means it timed out.
        pub fn wait_timeout<'a, T>(
            &self,
            _mutex: &'a Mutex<T>,
            mut guard: MutexGuard<'a, T>,
            timeout: std::time::Duration,
        ) -> (MutexGuard<'a, T>, bool) {
            let timed_out = self.0.wait_for(&mut guard, timeout).timed_out();
            (guard, timed_out)
        }
        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

pub use imp::*;
/// `Arc` is always `std`'s: trait objects need unsized coercion, which loom's `Arc` lacks,
/// and reference counting is not what the models check.
pub use std::sync::Arc;
