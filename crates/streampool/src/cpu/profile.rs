//! Opt-in timing of every CPU kernel (`STREAMPOOL_CPU_PROFILE=1`): where a CPU forward
//! spends its time, per kernel and shape, without an external profiler (the GPU machine's
//! host has none). On or off by the tunables' `cpu.profile` ([`crate::config`]); off, it
//! costs one read of that field per kernel.

use std::collections::HashMap;
use std::time::Instant;

use crate::kernel::Kernel;
use crate::profile::{label, work, KernelTime};
use parking_lot::Mutex;

/// Totals per kernel label. Locked once per kernel, only while profiling, never while a
/// kernel runs. `parking_lot` directly (not the `sync` shim): a `const` static, and not part
/// of what the loom models check.
static TOTALS: Mutex<Option<HashMap<String, Totals>>> = Mutex::new(None);

/// Calls, nanoseconds, flops, bytes.
type Totals = (u64, u128, u64, u64);

fn enabled() -> bool {
    crate::config::tuning().cpu.profile
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

/// The CPU kernel profile so far, longest total first, and resets it. Empty unless the
/// tunables' `cpu.profile` is on (`STREAMPOOL_CPU_PROFILE=1`, [`crate::config`]).
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
