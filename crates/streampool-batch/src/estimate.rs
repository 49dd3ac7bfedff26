//! What the queue has measured about its own service: the rate at which it serves tokens
//! (admission turns tokens waiting into an estimated wait) and how long a batch takes to run
//! and to prepare (a pipelined worker's preparing stage times its next batch by them).
//!
//! **Service rate.** Each finished batch is a sample of `tokens` served over the busy time
//! since the previous batch finished (or since it started, if the queue was idle between):
//! with two workers overlapping on one device, their finishes alternate and each sample
//! covers only the time since the other's, so the samples add up to the wall time of the
//! device's busy periods instead of counting overlap twice. The rate is the sum of the
//! tokens over the sum of the busy times of the last [`WINDOW`] batches: a ratio of sums, so
//! a sample with a tiny busy time (two finishes close together) weighs by its time, not by
//! its (huge) ratio, and an outlier (a first batch that paid for kernel compilation or graph
//! capture) leaves the estimate entirely after [`WINDOW`] batches. Admission uses it only
//! from [`MIN_SAMPLES`] batches on.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Batches the estimates are computed over.
pub(crate) const WINDOW: usize = 16;

/// Batches needed before the service rate is used to refuse requests.
pub(crate) const MIN_SAMPLES: usize = 4;

#[derive(Default)]
struct Inner {
    /// (tokens, busy seconds, forward seconds) of the last `WINDOW` batches.
    batches: VecDeque<(f64, f64, f64)>,
    /// Seconds spent preparing each of the last `WINDOW` prepared batches.
    prepares: VecDeque<f64>,
    /// When the last batch finished.
    last_finish: Option<Instant>,
}

/// The running estimates of one queue.
#[derive(Default)]
pub(crate) struct Estimates {
    /// Protects the sample windows. Held only to push a sample or sum a window (O(WINDOW)),
    /// never while any other lock is taken.
    inner: Mutex<Inner>,
}

fn push<T>(window: &mut VecDeque<T>, sample: T) {
    if window.len() == WINDOW {
        window.pop_front();
    }
    window.push_back(sample);
}

impl Estimates {
    /// A batch of `tokens` tokens ran from `started` to `done`.
    pub(crate) fn finished(&self, tokens: usize, started: Instant, done: Instant) {
        let mut s = self.inner.lock();
        let from = match s.last_finish {
            Some(t) if t > started => t,
            _ => started,
        };
        let busy = done.saturating_duration_since(from).as_secs_f64();
        let forward = done.saturating_duration_since(started).as_secs_f64();
        push(&mut s.batches, (tokens as f64, busy, forward));
        s.last_finish = Some(s.last_finish.map_or(done, |t| t.max(done)));
    }

    /// A pipelined worker spent `took` preparing a batch.
    pub(crate) fn prepared(&self, took: Duration) {
        push(&mut self.inner.lock().prepares, took.as_secs_f64());
    }

    /// Tokens served per second, once [`MIN_SAMPLES`] batches have finished.
    pub(crate) fn rate(&self) -> Option<f64> {
        let s = self.inner.lock();
        if s.batches.len() < MIN_SAMPLES {
            return None;
        }
        let (tokens, busy) = s
            .batches
            .iter()
            .fold((0.0, 0.0), |(t, b), &(tokens, busy, _)| {
                (t + tokens, b + busy)
            });
        // Busy time can only be zero on a clock too coarse to see a batch; treat the rate as
        // unknown rather than infinite.
        (busy > 0.0).then(|| tokens / busy)
    }

    /// How long after a batch starts running its worker's next batch should be formed, so
    /// that preparing it ends about when the running one does: the mean forward time less
    /// the mean preparation time (zero if preparing takes longer). `None` until both have
    /// been measured.
    pub(crate) fn lead(&self) -> Option<Duration> {
        let s = self.inner.lock();
        if s.batches.is_empty() || s.prepares.is_empty() {
            return None;
        }
        let forward = s.batches.iter().map(|b| b.2).sum::<f64>() / s.batches.len() as f64;
        let prepare = s.prepares.iter().sum::<f64>() / s.prepares.len() as f64;
        Some(Duration::from_secs_f64((forward - prepare).max(0.0)))
    }
}

/// The time `tokens` take to serve at `rate` tokens per second.
pub(crate) fn time_for(tokens: usize, rate: f64) -> Duration {
    // `rate` is positive (see `Estimates::rate`); the cap keeps absurd figures finite.
    Duration::from_secs_f64((tokens as f64 / rate).min(1e6))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn overlapping_batches_count_busy_time_once() {
        let e = Estimates::default();
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // Two workers, each batch 100 tokens over 10 ms, one starting every 5 ms (they
        // overlap by half): 200 tokens per 10 ms of device time, 20,000 tokens/s.
        for k in 0..9 {
            e.finished(100, ms(5 * k), ms(5 * k + 10));
        }
        let rate = e.rate().unwrap();
        // The first sample covers 10 ms alone, the rest 5 ms each: 900 tokens / 50 ms.
        assert!((rate - 18_000.0).abs() < 1.0, "{rate}");
    }

    #[test]
    fn an_outlier_leaves_the_window() {
        let e = Estimates::default();
        let t0 = Instant::now();
        let mut t = t0;
        // A first batch that paid 1 s of warm-up, then fast ones: 100 tokens per ms.
        e.finished(100, t, t + Duration::from_secs(1));
        t += Duration::from_secs(1);
        assert_eq!(e.rate(), None, "not used before MIN_SAMPLES batches");
        for _ in 0..WINDOW {
            e.finished(100, t, t + Duration::from_millis(1));
            t += Duration::from_millis(1);
        }
        let rate = e.rate().unwrap();
        assert!((rate - 100_000.0).abs() < 1.0, "{rate}");
        assert_eq!(time_for(50_000, rate), Duration::from_millis(500));
    }

    #[test]
    fn lead_is_forward_less_prepare() {
        let e = Estimates::default();
        assert_eq!(e.lead(), None);
        let t0 = Instant::now();
        e.finished(10, t0, t0 + Duration::from_millis(8));
        assert_eq!(e.lead(), None, "no preparation measured yet");
        e.prepared(Duration::from_millis(3));
        assert_eq!(e.lead(), Some(Duration::from_millis(5)));
        e.prepared(Duration::from_millis(21));
        assert_eq!(
            e.lead(),
            Some(Duration::ZERO),
            "preparing is the slower stage"
        );
    }
}
