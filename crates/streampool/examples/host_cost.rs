//! Host cost of queuing ops, on one thread and on many (any backend; CPU by default).
//!
//! Tables:
//! - `perop`: the bench's overhead point (`streampool bench`, scenario `overhead`): a chain of
//!   `affine` ops on a `[16]` tensor queued on this thread's stream, then one read-back; the
//!   median over 5 runs of the host time per queued op. Each op allocates its output and
//!   frees the previous one, so this is the whole per-op path: stream lookup, allocator
//!   hand-out and free, storage tracking, launch. Also per op: the heap allocations the
//!   queuing thread made (a counting global allocator; the CPU backend's job box is one of
//!   them, CUDA has none), and `burst`: the same ops queued 256 at a time with the stream
//!   synchronized between bursts (outside the timed part), so a device queue that fills up
//!   during a long chain (CUDA's launch queue blocks the host once it is full) cannot hide
//!   in the host figure.
//! - `threads`: N threads, each on its own pooled stream (round-robin, as any thread gets),
//!   queue ops that allocate and free (`affine` on `[16]`, result dropped) for a fixed window,
//!   synchronizing their stream every 256 ops; total ops/s at 1, 2, 8, 16 and 64 threads.
//! - `driver` (CUDA only, `HOST_COST_DEVICE=cuda` with `--features cuda`): the driver's floor
//!   under `perop`, through cudarc with no tensor, allocator or tracking: host time per
//!   `cuLaunchKernel` of an empty kernel with `sp_unary`'s parameter list and launch shape on
//!   one stream (a chain as long as `perop`'s, and in bursts), per `cuEventRecord`, and per
//!   `cuCtxGetCurrent` (the context check every launch of ours makes). Without a GPU it says
//!   so and skips.
//!
//! Rows: a device of its own (`cpu_with`/`cuda_with`) under each event policy, `auto` (the
//! backend's choice: eager on the CPU, lazy on CUDA) and `lazy` (what CUDA uses: no event per
//! op or per free, so the CPU run exercises CUDA's host path), and `pwide`: the process-wide
//! device (`Device::cpu()`/`Device::cuda(0)`, what the CLI and the bench use).
//!
//! `cargo run --release -p streampool --example host_cost [perop] [threads] [driver]` (all
//! when no argument is given). `HOST_COST_DEVICE=cuda` (with `--features cuda`) runs it on
//! GPU 0; `HOST_COST_EVENTS=auto|lazy|pwide` runs one row only; `HOST_COST_OPS` sets the chain
//! length (default 50000), `HOST_COST_WINDOW_MS` the window per thread count (default 1000),
//! `HOST_COST_THREADS` the counts (`1,2,8,16,64`).
//! Under `valgrind --tool=callgrind --toggle-collect='*queue_chain*'` the instruction count of
//! `perop` divided by the ops queued is the per-op host cost in instructions.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use streampool::{Device, DeviceConfig, EventPolicy, Result, Tensor};

/// Counts the heap allocations of each thread (`realloc` included: it may move the block),
/// so `perop` can say how many the queuing thread makes per op.
struct CountingAlloc;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count_alloc() {
    // `try_with`: an allocation during thread teardown is not counted rather than a panic.
    let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
}

/// Heap allocations made by the calling thread so far.
fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting touches only
// a thread-local integer (const-initialized, no destructor, so it never allocates itself).
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_alloc();
        // SAFETY: the caller's contract is the one `System.alloc` needs.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_alloc();
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_alloc();
        // SAFETY: `ptr` came from this allocator, i.e. from `System`, with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A device of its own with this event policy, or (`None`) the process-wide one.
fn device(events: Option<EventPolicy>) -> Result<Device> {
    let cuda = std::env::var("HOST_COST_DEVICE").as_deref() == Ok("cuda");
    let Some(events) = events else {
        #[cfg(feature = "cuda")]
        if cuda {
            return Device::cuda(0);
        }
        return Ok(Device::cpu());
    };
    let config = DeviceConfig {
        events,
        ..DeviceConfig::default()
    };
    #[cfg(feature = "cuda")]
    if cuda {
        return Device::cuda_with(0, config);
    }
    let _ = cuda; // without the feature, only the CPU
    Device::cpu_with(config)
}

/// Queues `pairs` pairs of ops (each allocates an output, frees the previous one) and returns
/// the last tensor. Not inlined, so callgrind can count exactly this.
#[inline(never)]
fn queue_chain(x: &Tensor, pairs: usize) -> Result<Tensor> {
    let mut y = x.clone();
    for _ in 0..pairs {
        y = y.affine(1.0, 0.5)?.affine(1.0, -0.5)?;
    }
    Ok(y)
}

/// Queues `ops` single ops (no read-back). Not inlined, and outside `queue_chain`, so
/// callgrind's count of the chain leaves it out.
#[inline(never)]
fn queue_burst(x: &Tensor, ops: usize) -> Result<()> {
    for _ in 0..ops {
        drop(x.affine(1.0, 0.5)?);
    }
    Ok(())
}

/// What `perop` measures for one row.
struct PerOp {
    /// Median host time per queued op in a chain (us).
    us: f64,
    /// Heap allocations per queued op on the queuing thread (in the median run's chain).
    allocs: f64,
    /// Median host time per op queued in bursts of `BURST`, synchronized between (us).
    burst_us: f64,
}

/// Ops per burst: well below a CUDA stream's launch queue, so the host never waits on it.
const BURST: usize = 256;

/// Median host time per queued op over `reps` chains of `ops` ops, and the same in bursts.
fn per_op(dev: &Device, ops: usize, reps: usize) -> Result<PerOp> {
    let x = Tensor::full(1.0, &[16], dev)?;
    queue_chain(&x, 500)?.to_vec::<f32>()?; // warm: streams, cache, thread-locals
    let pairs = (ops / 2).max(1);
    let mut runs = Vec::with_capacity(reps);
    for _ in 0..reps {
        let a = allocs();
        let t = Instant::now();
        let y = queue_chain(&x, pairs)?;
        let secs = t.elapsed().as_secs_f64();
        let n = allocs() - a;
        runs.push((secs, n));
        let v = y.to_vec::<f32>()?;
        assert!(v.iter().all(|&e| e == 1.0), "chain gave wrong values");
    }
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (secs, n) = runs[runs.len() / 2];
    let stream = dev.current_stream()?;
    let bursts = (ops / BURST).max(1);
    let mut burst_secs = Vec::with_capacity(reps);
    for _ in 0..reps {
        let mut total = 0.0;
        for _ in 0..bursts {
            stream.synchronize()?;
            let t = Instant::now();
            queue_burst(&x, BURST)?;
            total += t.elapsed().as_secs_f64();
        }
        burst_secs.push(total);
    }
    stream.synchronize()?;
    burst_secs.sort_by(f64::total_cmp);
    Ok(PerOp {
        us: secs * 1e6 / (2 * pairs) as f64,
        allocs: n as f64 / (2 * pairs) as f64,
        burst_us: burst_secs[reps / 2] * 1e6 / (bursts * BURST) as f64,
    })
}

/// Ops per second over all threads, each queuing alloc-and-free ops for `window`.
fn threads(dev: &Device, n: usize, window: Duration) -> Result<f64> {
    let stop = AtomicBool::new(false);
    let total = AtomicU64::new(0);
    let start = Barrier::new(n + 1);
    let elapsed = std::thread::scope(|sc| -> Result<f64> {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                let (stop, total, start) = (&stop, &total, &start);
                sc.spawn(move || -> Result<()> {
                    let x = Tensor::full(1.0, &[16], dev)?;
                    let stream = dev.current_stream()?;
                    x.affine(1.0, 0.0)?.to_vec::<f32>()?; // warm this thread's stream
                    start.wait();
                    let mut ops = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..256 {
                            drop(x.affine(1.0, 0.5)?);
                        }
                        stream.synchronize()?;
                        ops += 256;
                    }
                    total.fetch_add(ops, Ordering::Relaxed);
                    Ok(())
                })
            })
            .collect();
        start.wait();
        let t = Instant::now();
        std::thread::sleep(window);
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().expect("bench thread panicked")?;
        }
        Ok(t.elapsed().as_secs_f64())
    })?;
    Ok(total.load(Ordering::Relaxed) as f64 / elapsed)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let want = |m: &str| args.is_empty() || args.iter().any(|a| a == m);
    let only = std::env::var("HOST_COST_EVENTS").ok();
    let policies: Vec<_> = [
        ("auto", Some(EventPolicy::Auto)),
        ("lazy", Some(EventPolicy::Lazy)),
        ("pwide", None),
    ]
    .into_iter()
    .filter(|(name, _)| only.as_deref().is_none_or(|o| o == *name))
    .collect();
    if want("perop") {
        let ops = env_usize("HOST_COST_OPS", 50_000);
        println!("per-op host cost (affine [16] chain of {ops}, median of 5)");
        for &(name, policy) in &policies {
            let dev = device(policy)?;
            let p = per_op(&dev, ops, 5)?;
            println!(
                "  {:<5} {:>7.3} us/op  {:>5.2} allocs/op  burst of {BURST}: {:>7.3} us/op",
                name, p.us, p.allocs, p.burst_us
            );
        }
    }
    if want("threads") {
        let window = Duration::from_millis(env_usize("HOST_COST_WINDOW_MS", 1000) as u64);
        let counts: Vec<usize> = std::env::var("HOST_COST_THREADS")
            .unwrap_or_else(|_| "1,2,8,16,64".into())
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect();
        println!("alloc+free ops/s (affine [16], result dropped; sync every 256)");
        print!("  {:<5}", "");
        for n in &counts {
            print!(" {:>10}", format!("{n} thr"));
        }
        println!();
        for (name, policy) in policies {
            let dev = device(policy)?;
            print!("  {name:<5}");
            for &n in &counts {
                print!(" {:>10.0}", threads(&dev, n, window)?);
            }
            println!();
            let st = dev.allocator_stats();
            println!(
                "        allocs {} cache hits {} backend allocs {} peak reserved {} B",
                st.allocs, st.cache_hits, st.backend_allocs, st.peak_reserved
            );
        }
    }
    if want("driver") {
        if std::env::var("HOST_COST_DEVICE").as_deref() == Ok("cuda") {
            driver_floor(env_usize("HOST_COST_OPS", 50_000))?;
        } else if args.iter().any(|a| a == "driver") {
            println!("driver: CUDA only (HOST_COST_DEVICE=cuda, built with --features cuda)");
        }
    }
    Ok(())
}

/// Without CUDA in the build there is no driver to measure.
#[cfg(not(feature = "cuda"))]
fn driver_floor(_ops: usize) -> Result<()> {
    println!("driver: this build has no CUDA (rebuild with --features cuda)");
    Ok(())
}

/// The driver's floor under `perop`: raw cudarc calls on one non-blocking stream of GPU 0's
/// primary context (as our streams are), with no tensor, allocator or tracking. Skips, saying
/// why, where there is no driver, no NVRTC or no GPU.
#[cfg(feature = "cuda")]
fn driver_floor(ops: usize) -> Result<()> {
    use std::ffi::c_void;

    use cudarc::driver::{result, sys, CudaContext};
    use streampool::Error;

    /// `sp_unary`'s parameter list (`kernels.cu`), doing nothing: what a launch of ours
    /// hands the driver, less the work.
    const NOP: &str = "extern \"C\" __global__ void sp_nop(int code, const float* x, \
                       float* out, unsigned long long n, float mul, float add) {}";

    let skip = match Device::cuda_count() {
        Ok(0) => Some("no CUDA GPU".to_string()),
        Err(e) => Some(e.to_string()),
        // SAFETY: only tries to load the library; nothing is called through it.
        Ok(_) if !unsafe { cudarc::nvrtc::sys::is_culib_present() } => {
            Some("libnvrtc not found".to_string())
        }
        Ok(_) => None,
    };
    if let Some(why) = skip {
        println!("driver: skipped ({why})");
        return Ok(());
    }
    let err = |what: &str, e: &dyn std::fmt::Debug| Error::Backend {
        device: "cuda:0".into(),
        msg: format!("{what}: {e:?}"),
    };
    let ctx = CudaContext::new(0).map_err(|e| err("context", &e))?;
    ctx.bind_to_thread().map_err(|e| err("bind", &e))?;
    let stream = ctx.new_stream().map_err(|e| err("stream", &e))?;
    let ptx = cudarc::nvrtc::compile_ptx(NOP).map_err(|e| err("nvrtc", &e))?;
    let module = ctx.load_module(ptx).map_err(|e| err("module", &e))?;
    let f = module
        .load_function("sp_nop")
        .map_err(|e| err("function", &e))?;
    let (func, cu) = (f.cu_function(), stream.cu_stream());
    // What `Kernel::Unary` passes for `affine` on `[16]`; the pointers are never read.
    let (code, px, po, n, mul, add) = (8i32, 0u64, 0u64, 16u64, 1.0f32, 0.5f32);
    let launch = || -> Result<()> {
        let mut args = [
            &code as *const i32 as *mut c_void,
            &px as *const u64 as *mut c_void,
            &po as *const u64 as *mut c_void,
            &n as *const u64 as *mut c_void,
            &mul as *const f32 as *mut c_void,
            &add as *const f32 as *mut c_void,
        ];
        // SAFETY: `args` matches `sp_nop`'s parameters in number and type and points at live
        // locals; the kernel touches no memory; the function and stream are live, and the
        // context is bound to this thread.
        unsafe { result::launch_kernel(func, (1, 1, 1), (256, 1, 1), 0, cu, &mut args) }
            .map_err(|e| err("launch", &e))
    };
    let sync = || stream.synchronize().map_err(|e| err("synchronize", &e));
    let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
        .map_err(|e| err("event", &e))?;
    // SAFETY: the event and the stream are live until the end of this function.
    let record = || unsafe { result::event::record(event, cu) }.map_err(|e| err("record", &e));

    // Median over 5 runs of the host time per call: `ops` calls back to back, or in bursts of
    // `BURST` with the stream drained between bursts (outside the timed part).
    let median = |burst: bool, call: &dyn Fn() -> Result<()>| -> Result<f64> {
        let (size, count) = if burst {
            (BURST, (ops / BURST).max(1))
        } else {
            (ops.max(1), 1)
        };
        let mut runs = Vec::with_capacity(5);
        for _ in 0..5 {
            let mut secs = 0.0;
            for _ in 0..count {
                sync()?;
                let t = Instant::now();
                for _ in 0..size {
                    call()?;
                }
                secs += t.elapsed().as_secs_f64();
            }
            runs.push(secs * 1e6 / (size * count) as f64);
        }
        sync()?;
        runs.sort_by(f64::total_cmp);
        Ok(runs[2])
    };
    let ctx_get = || {
        result::ctx::get_current()
            .map(drop)
            .map_err(|e| err("ctx", &e))
    };
    for _ in 0..1000 {
        launch()?; // warm: the module's first launch, the stream's queue
    }
    let rows = [
        ("launch, chain", median(false, &launch)?),
        ("launch, burst", median(true, &launch)?),
        ("cuEventRecord, burst", median(true, &record)?),
        ("cuCtxGetCurrent", median(false, &ctx_get)?),
    ];
    // SAFETY: created above; the stream was synchronized, so no record of it is pending.
    unsafe { result::event::destroy(event) }.map_err(|e| err("event destroy", &e))?;
    println!("driver floor (cudarc, one stream, empty kernel of sp_unary's signature, 1x256)");
    for (name, us) in rows {
        println!("  {name:<21} {us:>7.3} us/call");
    }
    println!("  (chain: {ops} back to back, as perop; burst: {BURST} per burst, drained between)");
    Ok(())
}
