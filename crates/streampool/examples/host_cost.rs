//! Host cost of queuing ops, on one thread and on many (any backend; CPU by default).
//!
//! Two tables:
//! - `perop`: the bench's overhead point (`streampool bench`, scenario `overhead`): a chain of
//!   `affine` ops on a `[16]` tensor queued on this thread's stream, then one read-back; the
//!   median over 5 runs of the host time per queued op. Each op allocates its output and
//!   frees the previous one, so this is the whole per-op path: stream lookup, allocator
//!   hand-out and free, storage tracking, launch.
//! - `threads`: N threads, each on its own pooled stream (round-robin, as any thread gets),
//!   queue ops that allocate and free (`affine` on `[16]`, result dropped) for a fixed window,
//!   synchronizing their stream every 256 ops; total ops/s at 1, 2, 8, 16 and 64 threads.
//!
//! Rows: a device of its own (`cpu_with`/`cuda_with`) under each event policy, `auto` (the
//! backend's choice: eager on the CPU, lazy on CUDA) and `lazy` (what CUDA uses: no event per
//! op or per free, so the CPU run exercises CUDA's host path), and `pwide`: the process-wide
//! device (`Device::cpu()`/`Device::cuda(0)`, what the CLI and the bench use), default policy.
//!
//! `cargo run --release -p streampool --example host_cost [perop] [threads]` (both when no
//! argument is given). `HOST_COST_DEVICE=cuda` (with `--features cuda`) runs it on GPU 0;
//! `HOST_COST_EVENTS=auto|lazy|pwide` runs one row only; `HOST_COST_OPS` sets the chain
//! length (default 50000), `HOST_COST_WINDOW_MS` the window per thread count (default 1000),
//! `HOST_COST_THREADS` the counts (`1,2,8,16,64`).
//! Under `valgrind --tool=callgrind --toggle-collect='*queue_chain*'` the instruction count of
//! `perop` divided by the ops queued is the per-op host cost in instructions.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use streampool::{Device, DeviceConfig, EventPolicy, Result, Tensor};

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

/// Median host time per queued op (us) over `reps` chains of `ops` ops.
fn per_op(dev: &Device, ops: usize, reps: usize) -> Result<f64> {
    let x = Tensor::full(1.0, &[16], dev)?;
    queue_chain(&x, 500)?.to_vec::<f32>()?; // warm: streams, cache, thread-locals
    let pairs = (ops / 2).max(1);
    let mut times = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        let y = queue_chain(&x, pairs)?;
        times.push(t.elapsed().as_secs_f64());
        let v = y.to_vec::<f32>()?;
        assert!(v.iter().all(|&e| e == 1.0), "chain gave wrong values");
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2] * 1e6 / (2 * pairs) as f64)
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
            println!("  {:<5} {:>7.3} us/op", name, per_op(&dev, ops, 5)?);
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
    Ok(())
}
