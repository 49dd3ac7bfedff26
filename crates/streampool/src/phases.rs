//! Where a process's start-up time goes: named phases timed with [`Instant`].
//!
//! A command creates one [`Phases`] when it starts and runs its loading inside
//! [`Phases::scope`]; library code on that thread wraps its slow steps in [`timed`] (the
//! CUDA backend's kernel build and cuBLAS handles, `streampool-nn`'s weight reading and
//! upload), which records into the scope's `Phases` or, outside any scope, only runs the
//! step. So the library needs no timer argument threaded through every loader, and a
//! program that never asks pays one thread-local read per step.
//!
//! A phase's time is its *own* time: a phase timed inside another on the same thread (the
//! cuBLAS handle created during a warm-up forward) is subtracted from the outer one, so the
//! phases of one thread add up to that thread's wall time. Phases on several threads (one
//! loader per GPU, a kernel build in the background) overlap; their times are summed per
//! name, and [`Phases::elapsed`] is the wall time.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::sync::{Arc, Mutex};

/// One named phase, as [`Phases::phases`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Phase {
    /// What ran, e.g. `"weights read"`.
    pub name: &'static str,
    /// Own wall time (nested phases of the same thread excluded), summed over its runs.
    pub time: Duration,
    /// How many times it ran.
    pub runs: u32,
    /// When it first began, since the start of the [`Phases`].
    pub began: Duration,
    /// When it last ended, since the start of the [`Phases`].
    pub ended: Duration,
}

/// Named phases of a start-up and when they ran (see the module documentation).
///
/// ```
/// use std::sync::Arc;
/// use streampool::phases::{timed, Phases};
///
/// let phases = Arc::new(Phases::new());
/// phases.scope(|| {
///     timed("weights read", || std::hint::black_box(vec![0u8; 1 << 10]));
///     timed("warm-up forward", || timed("cuBLAS handle", || ()));
/// });
/// timed("outside any scope", || ()); // not recorded
/// let names: Vec<_> = phases.phases().iter().map(|p| p.name).collect();
/// assert_eq!(names, ["weights read", "warm-up forward", "cuBLAS handle"]);
/// assert!(phases.summary().contains(" s: weights read "));
/// ```
#[derive(Debug)]
pub struct Phases {
    start: Instant,
    /// In the order the phases first began. Held only to update one entry.
    entries: Mutex<Vec<Phase>>,
}

impl Default for Phases {
    fn default() -> Self {
        Self::new()
    }
}

thread_local! {
    /// The `Phases` that [`timed`] records into on this thread, if any.
    static SCOPE: RefCell<Option<Arc<Phases>>> = const { RefCell::new(None) };
    /// Per open phase on this thread, the time of the phases nested in it so far.
    static NESTED: RefCell<Vec<Duration>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` as phase `name` of the current thread's [`Phases::scope`], if any; else just
/// runs it.
pub fn timed<R>(name: &'static str, f: impl FnOnce() -> R) -> R {
    match SCOPE.with(|s| s.borrow().clone()) {
        Some(phases) => phases.time(name, f),
        None => f(),
    }
}

/// The current thread's [`Phases::scope`], if any: for work this thread hands to others
/// (each runs it under [`Phases::scope`] to record there too).
pub fn current() -> Option<Arc<Phases>> {
    SCOPE.with(|s| s.borrow().clone())
}

/// Pops this thread's nesting entry when a phase ends, also if its closure panics.
struct Open;

impl Drop for Open {
    fn drop(&mut self) {
        NESTED.with(|n| n.borrow_mut().pop());
    }
}

impl Phases {
    /// Phases counted from now.
    pub fn new() -> Self {
        Self::starting_at(Instant::now())
    }

    /// Phases counted from `start` (e.g. the process's start, taken first thing in `main`).
    pub fn starting_at(start: Instant) -> Self {
        Self {
            start,
            entries: Mutex::new(Vec::new()),
        }
    }

    /// Wall time since the start.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Runs `f` as phase `name` and records its own time (nested phases excluded).
    pub fn time<R>(&self, name: &'static str, f: impl FnOnce() -> R) -> R {
        let began = Instant::now();
        NESTED.with(|n| n.borrow_mut().push(Duration::ZERO));
        let open = Open;
        let r = f();
        let nested = NESTED.with(|n| n.borrow().last().copied().unwrap_or_default());
        drop(open);
        let total = began.elapsed();
        NESTED.with(|n| {
            if let Some(outer) = n.borrow_mut().last_mut() {
                *outer += total;
            }
        });
        self.record(name, began, total.saturating_sub(nested));
        r
    }

    /// Records `time` spent in `name`, ending now (for a step timed by other means).
    pub fn add(&self, name: &'static str, time: Duration) {
        let now = Instant::now();
        self.record(name, now.checked_sub(time).unwrap_or(self.start), time);
    }

    fn record(&self, name: &'static str, began: Instant, time: Duration) {
        let since = |t: Instant| t.saturating_duration_since(self.start);
        let (began, ended) = (since(began), since(Instant::now()));
        let mut entries = self.entries.lock();
        match entries.iter_mut().find(|p| p.name == name) {
            Some(p) => {
                p.time += time;
                p.runs += 1;
                p.began = p.began.min(began);
                p.ended = p.ended.max(ended);
            }
            None => entries.push(Phase {
                name,
                time,
                runs: 1,
                began,
                ended,
            }),
        }
        // Nested phases end before their outer one: keep the order in which they began.
        entries.sort_by_key(|p| p.began);
    }

    /// Runs `f` with this as the current thread's scope: [`timed`] steps inside `f` (on this
    /// thread) record here. Scopes nest; the previous one is restored afterwards.
    pub fn scope<R>(self: &Arc<Self>, f: impl FnOnce() -> R) -> R {
        struct Restore(Option<Arc<Phases>>);
        impl Drop for Restore {
            fn drop(&mut self) {
                let previous = self.0.take();
                SCOPE.with(|s| *s.borrow_mut() = previous);
            }
        }
        let _restore = Restore(SCOPE.with(|s| s.borrow_mut().replace(self.clone())));
        f()
    }

    /// The phases so far, in the order they first began.
    pub fn phases(&self) -> Vec<Phase> {
        self.entries.lock().clone()
    }

    /// One line: `1.93 s: device context 412 ms (0.00-0.41 s), ...`: the wall time since the
    /// start, then each phase's own time and from when to when (since the start) it ran;
    /// `xN` when it ran N times.
    pub fn summary(&self) -> String {
        let secs = |d: Duration| d.as_secs_f64();
        let mut line = format!("{:.2} s:", secs(self.elapsed()));
        for (i, p) in self.phases().iter().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            let runs = if p.runs > 1 {
                format!(" x{}", p.runs)
            } else {
                String::new()
            };
            // Writing to a String cannot fail.
            let _ = write!(
                line,
                "{sep}{} {:.0} ms{runs} ({:.2}-{:.2} s)",
                p.name,
                secs(p.time) * 1e3,
                secs(p.began),
                secs(p.ended)
            );
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_time_is_subtracted_from_the_outer_phase() {
        let phases = Arc::new(Phases::new());
        phases.scope(|| {
            timed("outer", || {
                timed("inner", || std::thread::sleep(Duration::from_millis(30)));
            })
        });
        let p = phases.phases();
        assert_eq!(p.len(), 2);
        let (outer, inner) = (&p[0], &p[1]);
        assert_eq!((outer.name, inner.name), ("outer", "inner"));
        assert!(inner.time >= Duration::from_millis(30));
        // The outer phase did almost nothing itself; bound generously (loaded CI hosts).
        assert!(outer.time < inner.time, "{p:?}");
        assert!(
            outer.began <= inner.began && inner.ended <= outer.ended,
            "{p:?}"
        );
    }

    #[test]
    fn runs_add_up_and_scopes_restore() {
        let a = Arc::new(Phases::new());
        let b = Arc::new(Phases::new());
        a.scope(|| {
            timed("step", || ());
            b.scope(|| timed("step", || ()));
            timed("step", || ());
        });
        timed("step", || ());
        assert_eq!(a.phases()[0].runs, 2);
        assert_eq!(b.phases()[0].runs, 1);
        a.add("external", Duration::from_millis(5));
        let ext = a
            .phases()
            .into_iter()
            .find(|p| p.name == "external")
            .unwrap();
        assert_eq!(ext.time, Duration::from_millis(5));
        assert!(a.summary().contains(" x2 ("), "{}", a.summary());
    }

    #[test]
    fn a_panicking_phase_leaves_the_thread_clean() {
        let phases = Arc::new(Phases::new());
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            phases.scope(|| timed("boom", || panic!("in a phase")))
        }));
        assert!(caught.is_err());
        assert!(SCOPE.with(|s| s.borrow().is_none()));
        assert!(NESTED.with(|n| n.borrow().is_empty()));
    }
}
