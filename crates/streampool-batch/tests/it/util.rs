//! Test models, a gate to hold a batch inside the model until the test lets it go, and the
//! crate's one closeness check.

use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use streampool_batch::{BatchContext, BatchModel, ModelError};

/// Long enough that no healthy run reaches it; it only turns a hang into a failure.
pub const HANG_GUARD: Duration = Duration::from_secs(60);

/// A latch the model waits on: closed until `open`. Counts how many batches entered it.
#[derive(Default)]
pub struct Gate {
    /// (open, batches that entered). Held briefly; waits release it.
    state: Mutex<(bool, usize)>,
    changed: Condvar,
}

impl Gate {
    pub fn open(&self) {
        self.state.lock().0 = true;
        self.changed.notify_all();
    }

    /// Blocks the calling batch until the gate opens (or the hang guard passes); `true` if
    /// it opened.
    pub fn pass(&self) -> bool {
        let end = Instant::now() + HANG_GUARD;
        let mut st = self.state.lock();
        st.1 += 1;
        self.changed.notify_all();
        while !st.0 && Instant::now() < end {
            self.changed.wait_until(&mut st, end);
        }
        st.0
    }

    /// Waits until `n` batches have entered the gate; `false` if the hang guard passed first.
    pub fn wait_entered(&self, n: usize) -> bool {
        let end = Instant::now() + HANG_GUARD;
        let mut st = self.state.lock();
        while st.1 < n {
            if self.changed.wait_until(&mut st, end).timed_out() {
                return false;
            }
        }
        true
    }
}

/// Polls `cond` until it holds; `false` if the hang guard passed first.
pub fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + HANG_GUARD;
    while Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

/// Answers tag `t` with `2 * t + 1` and records every batch it ran (in order). Its first
/// `gated` batches wait on `gate`. Fails a batch holding `fail_on` with an error, panics on
/// a batch holding `panic_on`, and returns one output too few for a batch holding
/// `short_on`.
#[derive(Default)]
pub struct Tagger {
    pub gate: Gate,
    pub gated: usize,
    pub fail_on: Option<u64>,
    pub panic_on: Option<u64>,
    pub short_on: Option<u64>,
    pub batches: Mutex<Vec<Vec<u64>>>,
}

impl Tagger {
    pub fn gated(n: usize) -> Self {
        Self {
            gated: n,
            ..Self::default()
        }
    }

    pub fn ran(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.batches.lock().iter().flatten().copied().collect();
        v.sort_unstable();
        v
    }
}

impl BatchModel for Tagger {
    type Input = u64;
    type Output = u64;

    fn forward_batch(&self, tags: Vec<u64>, _: &BatchContext) -> Result<Vec<u64>, ModelError> {
        let index = {
            let mut b = self.batches.lock();
            b.push(tags.clone());
            b.len()
        };
        if index <= self.gated {
            assert!(self.gate.pass(), "gate never opened");
        }
        let has = |t: Option<u64>| t.is_some_and(|t| tags.contains(&t));
        if has(self.fail_on) {
            return Err(Box::new(std::io::Error::other("tag refused")));
        }
        if has(self.panic_on) {
            panic!("tag exploded");
        }
        let mut out: Vec<u64> = tags.iter().map(|t| 2 * t + 1).collect();
        if has(self.short_on) {
            out.pop();
        }
        Ok(out)
    }
}

/// Whether `a` equals `b` up to float rounding: every element within `1e-5 * (1 + |b|)`, a
/// relative bound for large values and an absolute one near zero.
pub fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= 1e-5 * (1.0 + y.abs()))
}
