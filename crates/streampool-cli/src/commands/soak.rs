//! `streampool soak`: many ops and model forwards from many threads, with thread churn, each
//! result checked against a single-threaded reference.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use streampool::{Activation, Device, GraphCache, Tensor};

/// Arguments of `streampool soak`.
#[derive(clap::Args)]
pub struct Args {
    /// Device: cpu, cuda, cuda:N, wgpu or wgpu:ADAPTER.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Total tensor ops to run (each task runs a fixed sequence of ops; see --help of tasks).
    #[arg(long, default_value_t = 100_000)]
    ops: u64,
    /// Thread counts as `MIN..MAX` (powers of two in between are each run) or a comma list.
    #[arg(long, default_value = "1..64")]
    threads: String,
    /// Thread churn: each thread exits after a few tasks and a fresh thread replaces it.
    #[arg(long)]
    churn: bool,
    /// Tasks per thread before it exits, with --churn.
    #[arg(long, default_value_t = 4)]
    churn_tasks: u64,
    /// Distinct task inputs (references are computed once for each).
    #[arg(long, default_value_t = 64)]
    variants: usize,
    /// Write a JSON summary here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// Ops one task runs (see `Task::run`).
const OPS_PER_TASK: u64 = 12;

/// Weights shared by every task: an MLP 64-256-GELU-64 plus LayerNorm parameters.
struct Weights {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
    gamma: Tensor,
    beta: Tensor,
    /// The model forward runs through graphs (per stream and row count) where the device has
    /// them: replays are checked against the same references (`STREAMPOOL_GRAPHS=0`: off).
    graphs: GraphCache,
}

impl Weights {
    fn new(dev: &Device) -> Result<Self> {
        Ok(Self {
            w1: Tensor::randn(&[64, 256], 11, dev)?.scale(0.125)?,
            b1: Tensor::randn(&[256], 12, dev)?,
            w2: Tensor::randn(&[256, 64], 13, dev)?.scale(0.0625)?,
            b2: Tensor::randn(&[64], 14, dev)?,
            gamma: Tensor::rand_uniform(&[64], 0.5, 1.5, 15, dev)?,
            beta: Tensor::randn(&[64], 16, dev)?,
            graphs: GraphCache::new(512),
        })
    }

    /// One task: a model forward (MLP + residual LayerNorm), then mixed ops. 12 ops in all,
    /// counting the input upload.
    fn run(&self, dev: &Device, variant: usize) -> Result<Vec<f32>> {
        let rows = 1 + variant % 8;
        let x = Tensor::randn(&[rows, 64], variant as u64, dev)?; // 1
        let z = self
            .graphs
            .run("soak-forward", &[&x], |i| {
                let x = &i[0];
                let h = x.matmul(&self.w1)?.bias_act(&self.b1, Activation::Gelu)?; // 3
                let y = h
                    .matmul(&self.w2)?
                    .bias_act(&self.b2, Activation::Identity)?; // 5
                Ok::<_, streampool::Error>(vec![y.add_layer_norm(
                    x,
                    &self.gamma,
                    &self.beta,
                    1e-5,
                )?])
                // 6
            })?
            .remove(0);
        let s = z.softmax()?; // 7
        let t = s.t()?.contiguous()?; // 8
        let m = t.mul(&t)?.sum(1, true)?; // 10
        let out = m.add(&t.mean(1, true)?)?; // 12
        Ok(out.to_vec::<f32>()?)
    }
}

fn parse_threads(spec: &str) -> Result<Vec<usize>> {
    let list = if let Some((a, b)) = spec.split_once("..") {
        let (lo, hi): (usize, usize) = (a.trim().parse()?, b.trim().parse()?);
        if lo == 0 || lo > hi {
            bail!("--threads {spec:?}: need 1 <= MIN <= MAX");
        }
        let mut v = Vec::new();
        let mut t = lo;
        while t < hi {
            v.push(t);
            t *= 2;
        }
        v.push(hi);
        v
    } else {
        spec.split(',')
            .map(|s| s.trim().parse::<usize>())
            .collect::<Result<Vec<_>, _>>()?
    };
    if list.is_empty() || list.contains(&0) {
        bail!("--threads {spec:?}: thread counts must be >= 1");
    }
    Ok(list)
}

#[derive(Default)]
struct Counters {
    tasks: AtomicU64,
    mismatches: AtomicU64,
    errors: AtomicU64,
    threads_spawned: AtomicU64,
}

/// Runs the soak; exits with an error if any result was wrong or any op failed.
pub fn run(args: Args) -> Result<()> {
    let dev = super::device::open(&args.device)?;
    let thread_counts = parse_threads(&args.threads)?;
    if args.variants == 0 {
        bail!("--variants must be >= 1");
    }
    let weights = Arc::new(Weights::new(&dev)?);
    // References: one thread, one stream, computed before any concurrency.
    let reference: Arc<Vec<Vec<f32>>> = Arc::new(
        (0..args.variants)
            .map(|v| weights.run(&dev, v))
            .collect::<Result<_>>()
            .context("reference")?,
    );
    // The CPU backend runs the same kernels in the same order on every stream: bit-exact.
    // GPU libraries may pick other algorithms per stream, so allow rounding there.
    let tol = if dev.kind() == streampool::DeviceKind::Cpu {
        0.0
    } else {
        1e-5
    };

    let total_tasks = args.ops.div_ceil(OPS_PER_TASK);
    let per_phase = total_tasks.div_ceil(thread_counts.len() as u64);
    let bar = ProgressBar::new(total_tasks * OPS_PER_TASK);
    bar.set_style(ProgressStyle::with_template(
        "{elapsed_precise} [{bar:40}] {pos}/{len} ops {per_sec} {msg}",
    )?);
    let counters = Arc::new(Counters::default());
    let start = Instant::now();
    let mut phases = Vec::new();
    for &threads in &thread_counts {
        bar.set_message(format!("{threads} threads"));
        let phase_start = Instant::now();
        let next = Arc::new(AtomicU64::new(0));
        run_phase(
            &dev, &weights, &reference, &counters, &next, per_phase, threads, &args, tol, &bar,
        )?;
        phases.push((threads, phase_start.elapsed()));
    }
    bar.finish();
    let elapsed = start.elapsed();
    let tasks = counters.tasks.load(Ordering::Relaxed);
    let (mismatches, errors) = (
        counters.mismatches.load(Ordering::Relaxed),
        counters.errors.load(Ordering::Relaxed),
    );
    let ops = tasks * OPS_PER_TASK;
    println!(
        "soak on {}: {ops} ops ({tasks} tasks) in {elapsed:.1?}, {:.0} ops/s; threads {:?}{}; {} threads spawned; \
         mismatches {mismatches}, errors {errors}",
        dev.name(),
        ops as f64 / elapsed.as_secs_f64(),
        thread_counts,
        if args.churn { " with churn" } else { "" },
        counters.threads_spawned.load(Ordering::Relaxed),
    );
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "device": dev.name(), "ops": ops, "tasks": tasks, "seconds": elapsed.as_secs_f64(),
            "threads": thread_counts, "churn": args.churn, "mismatches": mismatches, "errors": errors,
            "threads_spawned": counters.threads_spawned.load(Ordering::Relaxed),
            "phases": phases.iter().map(|(t, d)| serde_json::json!({"threads": t, "seconds": d.as_secs_f64()})).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("writing {path:?}"))?;
    }
    if mismatches > 0 || errors > 0 {
        bail!("soak failed: {mismatches} mismatches, {errors} errors");
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run_phase(
    dev: &Device,
    weights: &Arc<Weights>,
    reference: &Arc<Vec<Vec<f32>>>,
    counters: &Arc<Counters>,
    next: &Arc<AtomicU64>,
    tasks: u64,
    threads: usize,
    args: &Args,
    tol: f32,
    bar: &ProgressBar,
) -> Result<()> {
    let per_thread = if args.churn {
        args.churn_tasks.max(1)
    } else {
        u64::MAX
    };
    // Each worker takes task numbers until the phase is done or its churn quota is used; the
    // supervisor below replaces exited workers while tasks remain (thread churn).
    let worker = || {
        let (dev, weights, reference, counters, next, bar) = (
            dev.clone(),
            weights.clone(),
            reference.clone(),
            counters.clone(),
            next.clone(),
            bar.clone(),
        );
        counters.threads_spawned.fetch_add(1, Ordering::Relaxed);
        std::thread::spawn(move || {
            for _ in 0..per_thread {
                let task = next.fetch_add(1, Ordering::Relaxed);
                if task >= tasks {
                    return;
                }
                let variant = (task as usize * 7919) % reference.len();
                match weights.run(&dev, variant) {
                    Ok(got) => {
                        let want = &reference[variant];
                        let ok = got.len() == want.len()
                            && got
                                .iter()
                                .zip(want)
                                .all(|(a, b)| (a - b).abs() <= tol * (1.0 + b.abs()));
                        if !ok {
                            counters.mismatches.fetch_add(1, Ordering::Relaxed);
                            eprintln!("mismatch in task {task} (variant {variant})");
                        }
                    }
                    Err(e) => {
                        counters.errors.fetch_add(1, Ordering::Relaxed);
                        eprintln!("error in task {task}: {e}");
                    }
                }
                counters.tasks.fetch_add(1, Ordering::Relaxed);
                bar.inc(OPS_PER_TASK);
            }
        })
    };
    let mut live: Vec<std::thread::JoinHandle<()>> = (0..threads).map(|_| worker()).collect();
    while !live.is_empty() {
        let mut still = Vec::with_capacity(live.len());
        for h in live {
            if h.is_finished() {
                if h.join().is_err() {
                    counters.errors.fetch_add(1, Ordering::Relaxed);
                    eprintln!("a soak thread panicked");
                }
                if next.load(Ordering::Relaxed) < tasks {
                    still.push(worker());
                }
            } else {
                still.push(h);
            }
        }
        live = still;
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}
