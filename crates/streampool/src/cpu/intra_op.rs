//! The intra-op pool: parallelism inside one CPU kernel.
//!
//! Two levels of parallelism meet on the CPU backend:
//!
//! - **Between calls**, streams: each stream is one worker thread running its kernels in
//!   order ([`super::stream`]), so callers on different streams never queue behind each
//!   other's jobs, and events and the allocator's cross-stream rules work as on a GPU.
//! - **Inside a kernel**, this pool: one `rayon` pool per process, sized to the host's cores,
//!   shared by every stream of every CPU device. A stream worker that runs a large kernel
//!   hands its pieces to the pool and waits for them (it is not a pool thread, so waiting is
//!   plain blocking; pool threads never wait on a stream, so no cycle can form).
//!
//! So one caller uses every core, and 64 callers start 64 stream workers (at most 32 per
//! device: the stream pool's size) plus one pool, not 64 pools: the thread count is
//! `streams + cores`. When many streams are busy at once the pool interleaves their pieces;
//! a small kernel (under [`MIN_PARALLEL_WORK`]) runs on its stream's worker without touching
//! the pool, where the hand-off would cost more than the work.
//!
//! The size comes from [`set_cpu_threads`], else the tunables' `cpu.threads`
//! (`STREAMPOOL_CPU_THREADS`, [`crate::config`]), else the number of cores the process may
//! use; it is fixed when the first kernel needs the pool.

use std::ops::Range;
use std::sync::OnceLock;

use crate::config::CPU_THREADS_ENV;
use crate::{Error, Result};

/// Below this much work (elements touched, or multiply-adds) a kernel runs on its stream's
/// worker alone: handing pieces to the pool and waking its threads costs tens of
/// microseconds on a VM, the time one core takes for about this many vectorized element
/// operations (measured: a 32x384 LayerNorm took 76 us through a 16-thread pool).
pub(crate) const MIN_PARALLEL_WORK: usize = 1 << 17;

/// The size asked for by [`set_cpu_threads`] before the pool existed.
static REQUESTED: OnceLock<usize> = OnceLock::new();

/// The pool, built on first use. `None` when the host cannot spawn its threads: kernels
/// then run on their stream's worker, correct but single-threaded (logged once).
static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();

/// Sets how many threads the CPU backend's intra-op pool has (default: the cores this
/// process may use, or `STREAMPOOL_CPU_THREADS`).
///
/// Call it before the first CPU kernel runs; the pool is built once, on first use.
///
/// # Errors
/// [`Error::InvalidArgument`] for 0, or when the pool already exists with another size.
///
/// # Example
/// ```
/// streampool::set_cpu_threads(streampool::cpu_threads()).unwrap();
/// assert!(streampool::cpu_threads() >= 1);
/// ```
pub fn set_cpu_threads(threads: usize) -> Result<()> {
    if threads == 0 {
        return Err(Error::InvalidArgument(
            "the CPU intra-op pool needs at least one thread".into(),
        ));
    }
    let _ = REQUESTED.set(threads);
    let have = cpu_threads();
    if have != threads {
        return Err(Error::InvalidArgument(format!(
            "the CPU intra-op pool already runs {have} threads; set its size before the first \
             CPU kernel (or with {CPU_THREADS_ENV})"
        )));
    }
    Ok(())
}

/// The number of threads of the CPU backend's intra-op pool (building it if needed).
///
/// # Example
/// ```
/// assert!(streampool::cpu_threads() >= 1);
/// ```
pub fn cpu_threads() -> usize {
    pool().map_or(1, rayon::ThreadPool::current_num_threads)
}

fn wanted_threads() -> usize {
    if let Some(&n) = REQUESTED.get() {
        return n;
    }
    if let Some(n) = crate::config::tuning().cpu.threads.filter(|&n| n > 0) {
        return n;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

pub(crate) fn pool() -> Option<&'static rayon::ThreadPool> {
    POOL.get_or_init(|| {
        let threads = wanted_threads();
        match rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("sp-cpu-op{i}"))
            .build()
        {
            Ok(pool) => Some(pool),
            Err(e) => {
                tracing::warn!("CPU intra-op pool of {threads} threads not started ({e}): kernels run single-threaded");
                None
            }
        }
    })
    .as_ref()
}

/// Runs `f` inside the pool (so rayon calls in `f`, and libraries using rayon's current
/// pool, spread over it) when `work` is large enough; else on the calling thread.
pub(crate) fn run<R: Send>(work: usize, f: impl FnOnce() -> R + Send) -> R {
    match pool() {
        Some(pool) if work >= MIN_PARALLEL_WORK && pool.current_num_threads() > 1 => {
            pool.install(f)
        }
        _ => f(),
    }
}

/// Calls `f` on disjoint ranges covering `0..items`, in parallel on the pool when
/// `items * work_per_item` is large enough. Ranges are contiguous and at least as long as
/// needed to make each piece worth a hand-off.
pub(crate) fn for_ranges(items: usize, work_per_item: usize, f: impl Fn(Range<usize>) + Sync) {
    if items == 0 {
        return;
    }
    let work = items.saturating_mul(work_per_item.max(1));
    let threads = match pool() {
        Some(pool) if work >= MIN_PARALLEL_WORK => pool.current_num_threads(),
        _ => 1,
    };
    if threads <= 1 {
        f(0..items);
        return;
    }
    // A few pieces per thread evens out threads that start late (another stream's kernel
    // may hold some), but no piece smaller than MIN_PARALLEL_WORK / 4.
    let min_items = (MIN_PARALLEL_WORK / 4)
        .div_ceil(work_per_item.max(1))
        .max(1);
    let pieces = (threads * 4).min(items.div_ceil(min_items)).max(1);
    let per = items.div_ceil(pieces);
    run(work, || {
        use rayon::prelude::*;
        (0..items.div_ceil(per))
            .into_par_iter()
            .for_each(|p| f(p * per..((p + 1) * per).min(items)));
    });
}

/// Calls `f` on disjoint contiguous ranges covering `0..items`, claimed from one shared
/// counter by one task per pool thread (on the calling thread alone when the work is under
/// [`MIN_PARALLEL_WORK`]). Claims are guided: a task takes an even share of what is left
/// (`left / (2 * threads)`, at least `grain` items), so the first ranges are long (their
/// items share operands: a product's units of one row block) and the last ones short, and
/// a thread that starts late (busy with another stream's kernel) takes what is left rather
/// than holding a fixed share: the tasks finish within one short claim of each other.
///
/// Where [`for_ranges`]' fixed pieces (four per thread) left a thread one piece behind the
/// others, this evens the end out: on MiniLM's products at batch 64 (416 units over 16
/// threads) the fixed pieces were 7 units, 26 per thread on average but 28 for some.
pub(crate) fn for_ranges_guided(
    items: usize,
    work_per_item: usize,
    grain: usize,
    f: impl Fn(Range<usize>) + Sync,
) {
    // `std`'s atomic, not the `sync` shim's: a counter local to one call, outside what the
    // loom models check (they would need a loom runtime around every kernel).
    use std::sync::atomic::{AtomicUsize, Ordering};
    if items == 0 {
        return;
    }
    let work = items.saturating_mul(work_per_item.max(1));
    let pool = match pool() {
        Some(pool) if work >= MIN_PARALLEL_WORK && pool.current_num_threads() > 1 => pool,
        _ => return f(0..items),
    };
    let threads = pool.current_num_threads();
    let grain = grain.max(1);
    let next = AtomicUsize::new(0);
    let claim = || -> Option<Range<usize>> {
        let mut start = next.load(Ordering::Relaxed);
        loop {
            if start >= items {
                return None;
            }
            let take = ((items - start) / (2 * threads)).max(grain);
            let end = (start + take).min(items);
            // Relaxed suffices: the counter only hands out disjoint ranges; the items' data
            // is ordered by the pool's join (every task finishes before `install` returns).
            match next.compare_exchange_weak(start, end, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(start..end),
                Err(now) => start = now,
            }
        }
    };
    // One task per thread through the pool's own splitting (not `broadcast`, which would
    // wait for every thread, a busy one too): a task that starts after the counter ran out
    // returns at once.
    pool.install(|| {
        use rayon::prelude::*;
        (0..threads).into_par_iter().for_each(|_| {
            while let Some(r) = claim() {
                f(r);
            }
        });
    });
}
