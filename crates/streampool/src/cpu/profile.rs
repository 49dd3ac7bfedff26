//! Opt-in timing of every CPU kernel (`STREAMPOOL_CPU_PROFILE=1`): where a CPU forward
//! spends its time, per kernel and shape, without an external profiler (the GPU machine's
//! host has none). Off, it costs one relaxed atomic load per kernel.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use crate::kernel::Kernel;
use crate::profile::{label, work, KernelTime};
use parking_lot::Mutex;

/// Environment variable that turns the profile on (`1`).
pub const CPU_PROFILE_ENV: &str = "STREAMPOOL_CPU_PROFILE";

/// 0: not read yet, 1: off, 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);

/// Totals per kernel label. Locked once per kernel, only while profiling, never while a
/// kernel runs. `parking_lot` directly (not the `sync` shim): a `const` static, and not part
/// of what the loom models check.
static TOTALS: Mutex<Option<HashMap<String, Totals>>> = Mutex::new(None);

/// Calls, nanoseconds, flops, bytes.
type Totals = (u64, u128, u64, u64);

fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let on = std::env::var(CPU_PROFILE_ENV).is_ok_and(|v| v == "1");
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
    }
}

/// Runs `f` (the kernel `k`), timing it when profiling is on.
pub(crate) fn timed(k: &Kernel, f: impl FnOnce()) {
    if !enabled() {
        return f();
    }
    let start = Instant::now();
    f();
    let ns = start.elapsed().as_nanos();
    let (flops, bytes) = work(k);
    let mut totals = TOTALS.lock();
    let e = totals
        .get_or_insert_with(HashMap::new)
        .entry(label(k))
        .or_insert((0, 0, 0, 0));
    e.0 += 1;
    e.1 += ns;
    e.2 += flops;
    e.3 += bytes;
}

/// The CPU kernel profile so far, longest total first, and resets it. Empty unless
/// `STREAMPOOL_CPU_PROFILE=1` was set when the first kernel ran.
///
/// ```
/// let profile = streampool::cpu_kernel_profile();
/// assert!(profile.iter().all(|k| k.calls > 0));
/// ```
pub fn cpu_kernel_profile() -> Vec<KernelTime> {
    let mut v: Vec<KernelTime> = TOTALS
        .lock()
        .take()
        .unwrap_or_default()
        .into_iter()
        .map(|(label, (calls, total_ns, flops, bytes))| KernelTime {
            label,
            calls,
            total_ns,
            flops,
            bytes,
        })
        .collect();
    v.sort_by_key(|k| std::cmp::Reverse(k.total_ns));
    v
}
