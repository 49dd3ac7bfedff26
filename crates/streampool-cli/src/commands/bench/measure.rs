//! Closed-loop timing: N threads each repeat a call for a fixed window after a warm-up.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};
use serde::Serialize;

/// Latency percentiles in milliseconds (nearest rank).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Latency {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Latency {
    /// Percentiles of `samples` (nanoseconds); all zero when there are none.
    pub fn of(samples: &mut [u64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let at = |p: f64| {
            let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
            samples[rank.clamp(1, samples.len()) - 1] as f64 / 1e6
        };
        Self {
            p50: at(50.0),
            p90: at(90.0),
            p99: at(99.0),
        }
    }
}

/// What one closed-loop run measured.
#[derive(Debug, Clone)]
pub struct LoopResult {
    /// Calls completed in the measured window (all threads).
    pub calls: u64,
    /// Seconds from the first measured call's start to the last measured call's end (about
    /// the window: each thread measures calls until one ends past it).
    pub seconds: f64,
    /// Per-call latency percentiles.
    pub latency: Latency,
    /// Threads of this process at the end of the warm-up, when every calling thread, stream
    /// worker and pool thread of the point is alive (Linux; `None` elsewhere): the check that
    /// N callers do not start N pools.
    pub os_threads: Option<usize>,
}

impl LoopResult {
    /// Calls per second.
    pub fn calls_per_s(&self) -> f64 {
        self.calls as f64 / self.seconds
    }
}

/// The timing windows of one point.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// Warm-up before measuring (each thread's first call is never measured either).
    pub warm: Duration,
    /// The measured window.
    pub measure: Duration,
}

/// Runs `call(thread, i)` (`i`: the thread's call count so far) in a loop on `threads`
/// threads. A call counts when it starts after the warm-up and is not the thread's first;
/// each thread stops at the first call start past the window (or a window's length after
/// its first counted call, when that started late) once it has a counted call, so slow calls (a large batch on the CPU) still give a figure. The measured
/// span runs from the first counted call's start (the end of the warm-up, or later when a
/// thread's first call, which may compile kernels or capture a graph, outlasts the warm-up)
/// to the last counted call's end. `on_warm_end` runs on the calling thread when the warm-up ends (e.g. to reset a
/// queue's statistics).
pub fn closed_loop<F>(
    threads: usize,
    window: Window,
    on_warm_end: impl FnOnce(),
    call: F,
) -> Result<LoopResult>
where
    F: Fn(usize, usize) -> Result<()> + Sync,
{
    // One clock for all threads: spawning them takes well under the warm-up.
    let start = Instant::now();
    let warm_end = start + window.warm;
    let deadline = warm_end + window.measure;
    let call = &call;
    let per_thread = std::thread::scope(|s| -> Result<(Vec<ThreadRun>, Option<usize>)> {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                s.spawn(move || thread_loop(|i| call(thread, i), warm_end, deadline, window))
            })
            .collect();
        std::thread::sleep(warm_end.saturating_duration_since(Instant::now()));
        on_warm_end();
        let os_threads = os_threads();
        let runs = handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow!("a bench thread panicked"))?)
            .collect::<Result<Vec<_>>>()?;
        Ok((runs, os_threads))
    })?;
    let (per_thread, os_threads) = per_thread;
    let first = per_thread
        .iter()
        .filter_map(|p| p.first_start)
        .min()
        .unwrap_or(warm_end);
    let last = per_thread
        .iter()
        .map(|p| p.last_end)
        .max()
        .unwrap_or(deadline);
    let mut all: Vec<u64> = per_thread.into_iter().flat_map(|p| p.latency).collect();
    Ok(LoopResult {
        calls: all.len() as u64,
        seconds: last.saturating_duration_since(first).as_secs_f64(),
        latency: Latency::of(&mut all),
        os_threads,
    })
}

/// The number of threads of this process (`Threads:` of `/proc/self/status`; Linux only).
pub fn os_threads() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
}

/// What one thread of [`closed_loop`] measured.
struct ThreadRun {
    /// Start of its first counted call.
    first_start: Option<Instant>,
    /// End of its last counted call.
    last_end: Instant,
    /// Nanoseconds per counted call.
    latency: Vec<u64>,
}

/// One thread's loop of [`closed_loop`]. A thread whose first counted call starts late (its
/// first call outlasted the warm-up) still measures a whole window from there.
fn thread_loop(
    call: impl Fn(usize) -> Result<()>,
    warm_end: Instant,
    deadline: Instant,
    window: Window,
) -> Result<ThreadRun> {
    let mut run = ThreadRun {
        first_start: None,
        last_end: warm_end,
        latency: Vec::new(),
    };
    let mut end_by = deadline;
    for i in 0usize.. {
        let t = Instant::now();
        if t >= end_by && !run.latency.is_empty() {
            break;
        }
        call(i)?;
        let end = Instant::now();
        if t >= warm_end && i > 0 {
            if run.first_start.is_none() {
                run.first_start = Some(t);
                end_by = end_by.max(t + window.measure);
            }
            run.latency
                .push(u64::try_from((end - t).as_nanos()).unwrap_or(u64::MAX));
            run.last_end = run.last_end.max(end);
        }
    }
    Ok(run)
}

/// Median of `reps` timings of `f` (after one untimed call), in seconds.
pub fn median_time(reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A first call that outlasts the warm-up (a kernel compile, a graph capture) must not
    /// count as measured time: the span starts at the first measured call.
    #[test]
    fn a_slow_first_call_is_not_in_the_measured_span() {
        let window = Window {
            warm: Duration::from_millis(10),
            measure: Duration::from_millis(50),
        };
        let r = closed_loop(
            1,
            window,
            || {},
            |_, i| {
                std::thread::sleep(Duration::from_millis(if i == 0 { 300 } else { 2 }));
                Ok(())
            },
        )
        .unwrap();
        assert!(r.calls >= 10, "{} calls", r.calls);
        // Counting from the end of the warm-up would give at least 0.34 s.
        assert!(r.seconds < 0.25, "measured span {} s", r.seconds);
        assert!(r.seconds >= 0.05, "measured span {} s", r.seconds);
    }
}
