//! Counters, the batch-size histogram and latency percentiles of a batch queue.

use std::collections::VecDeque;
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;

/// Latency samples kept per series: the most recent ones (a sliding window), so percentiles
/// describe recent traffic and memory stays bounded.
pub const LATENCY_WINDOW: usize = 1 << 16;

/// A point-in-time copy of a queue's statistics (see [`BatchQueue::stats`](crate::BatchQueue::stats)).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StatsSnapshot {
    /// Requests accepted into the queue.
    pub submitted: u64,
    /// Requests answered with a model output.
    pub completed: u64,
    /// Submits refused with `QueueFull`.
    pub rejected: u64,
    /// Requests answered `DeadlineExceeded` (by a worker or by the waiting caller); never run.
    pub expired: u64,
    /// Requests answered `Model(..)` because their batch failed or panicked.
    pub failed: u64,
    /// Requests skipped because their caller dropped its handle before they ran.
    pub cancelled: u64,
    /// Requests answered `ShutDown` while still queued.
    pub shut_down: u64,
    /// Batches run (a batch that failed counts too).
    pub batches: u64,
    /// `batch_sizes[n]` is the number of batches that ran `n` requests (index 0 is unused).
    pub batch_sizes: Vec<u64>,
    /// Mean requests per batch.
    pub mean_batch_size: f64,
    /// Time from submit until a worker started the request's batch.
    pub queue_wait: Percentiles,
    /// Time from submit until the answer was delivered, for completed requests.
    pub latency: Percentiles,
    /// Requests waiting in the queue at the time of the snapshot.
    pub queue_len: usize,
}

/// Percentiles in microseconds over the most recent [`LATENCY_WINDOW`] samples.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct Percentiles {
    /// Samples the percentiles are computed from.
    pub samples: usize,
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Largest sample.
    pub max_us: f64,
}

impl Percentiles {
    fn of(window: &VecDeque<u64>) -> Self {
        if window.is_empty() {
            return Self::default();
        }
        let mut v: Vec<u64> = window.iter().copied().collect();
        v.sort_unstable();
        // Nearest-rank percentile.
        let at = |p: f64| {
            let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
            v[rank.clamp(1, v.len()) - 1] as f64 / 1000.0
        };
        Self {
            samples: v.len(),
            p50_us: at(50.0),
            p90_us: at(90.0),
            p99_us: at(99.0),
            max_us: at(100.0),
        }
    }
}

#[derive(Default)]
struct Inner {
    submitted: u64,
    completed: u64,
    rejected: u64,
    expired: u64,
    failed: u64,
    cancelled: u64,
    shut_down: u64,
    batch_sizes: Vec<u64>,
    /// Nanoseconds.
    queue_wait: VecDeque<u64>,
    /// Nanoseconds.
    latency: VecDeque<u64>,
}

/// The live statistics; every method takes the lock once, briefly.
#[derive(Default)]
pub(crate) struct Stats {
    /// Protects all counters and windows. Held only to bump a counter or copy them out
    /// (sorting for percentiles happens on the copy, outside the lock).
    inner: Mutex<Inner>,
}

/// What happened to one request, for the counters.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Outcome {
    Submitted,
    Rejected,
    Expired,
    Failed,
    Cancelled,
    ShutDown,
}

fn push_sample(window: &mut VecDeque<u64>, d: Duration) {
    if window.len() == LATENCY_WINDOW {
        window.pop_front();
    }
    window.push_back(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
}

impl Stats {
    pub(crate) fn count(&self, outcome: Outcome, n: u64) {
        let mut s = self.inner.lock();
        let c = match outcome {
            Outcome::Submitted => &mut s.submitted,
            Outcome::Rejected => &mut s.rejected,
            Outcome::Expired => &mut s.expired,
            Outcome::Failed => &mut s.failed,
            Outcome::Cancelled => &mut s.cancelled,
            Outcome::ShutDown => &mut s.shut_down,
        };
        *c += n;
    }

    /// A batch of `waits.len()` requests started; `waits` are their queue waits.
    pub(crate) fn batch_started(&self, waits: impl Iterator<Item = Duration>) {
        let mut s = self.inner.lock();
        let mut n = 0;
        for w in waits {
            push_sample(&mut s.queue_wait, w);
            n += 1;
        }
        if s.batch_sizes.len() <= n {
            s.batch_sizes.resize(n + 1, 0);
        }
        s.batch_sizes[n] += 1;
    }

    /// Requests completed with these end-to-end latencies.
    pub(crate) fn completed(&self, latencies: impl Iterator<Item = Duration>) {
        let mut s = self.inner.lock();
        for l in latencies {
            push_sample(&mut s.latency, l);
            s.completed += 1;
        }
    }

    pub(crate) fn reset(&self) {
        *self.inner.lock() = Inner::default();
    }

    pub(crate) fn snapshot(&self, queue_len: usize) -> StatsSnapshot {
        let (mut snap, queue_wait, latency) = {
            let s = self.inner.lock();
            let snap = StatsSnapshot {
                submitted: s.submitted,
                completed: s.completed,
                rejected: s.rejected,
                expired: s.expired,
                failed: s.failed,
                cancelled: s.cancelled,
                shut_down: s.shut_down,
                batches: s.batch_sizes.iter().sum(),
                batch_sizes: s.batch_sizes.clone(),
                mean_batch_size: 0.0,
                queue_wait: Percentiles::default(),
                latency: Percentiles::default(),
                queue_len,
            };
            (snap, s.queue_wait.clone(), s.latency.clone())
        };
        let requests: u64 = snap
            .batch_sizes
            .iter()
            .enumerate()
            .map(|(n, &c)| n as u64 * c)
            .sum();
        if snap.batches > 0 {
            snap.mean_batch_size = requests as f64 / snap.batches as f64;
        }
        snap.queue_wait = Percentiles::of(&queue_wait);
        snap.latency = Percentiles::of(&latency);
        snap
    }
}

impl StatsSnapshot {
    /// The largest batch that ran (0 if none).
    pub fn max_batch_seen(&self) -> usize {
        self.batch_sizes.iter().rposition(|&c| c > 0).unwrap_or(0)
    }
}
