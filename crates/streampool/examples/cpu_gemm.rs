//! Rate of single CPU kernels at the shapes a MiniLM forward runs them, through the public
//! tensor API (the path a model takes: a `Linear`'s weight packed once, then reused), so the
//! intra-op pool's scaling and the microkernel's efficiency can be read apart: run it at
//! `STREAMPOOL_CPU_THREADS=1, 2, 4, 8, 16` and compare GFLOP/s per thread.
//!
//! Rows (`CPU_GEMM_SHAPES`, comma-separated; default MiniLM's four products at 32 tokens x
//! batch 64 and its attention):
//! - `MxNxK` (optionally `:gelu`): `act(a @ w + bias)`, `a` `[M, K]`, `w` `[K, N]`
//!   contiguous (as a `Linear` keeps `W^T`), `bias` `[N]`; GFLOP/s counts `2 M N K`.
//! - `attnBxS` (12 heads of 32): fused attention on a `[B, S, 1152]` QKV with a mask;
//!   GFLOP/s counts the two products, `4 B S^2 384`.
//!
//! Each row: 3 warm-up calls (the first packs the weight), then 7 runs of `CPU_GEMM_REPS`
//! calls (default 20) with the device synchronized after each run; the median run's time
//! per call. Inputs are random normal (never zeros).
//!
//! `cargo run --release -p streampool --example cpu_gemm`; one line per row:
//! `threads T  shape  ms/call  GFLOP/s  GFLOP/s per thread`.

use std::time::Instant;

use streampool::{Activation, Device, MatmulMath, Result, Tensor};

/// One row of the table: what to run and how many floating-point operations a call does.
enum Row {
    Product {
        m: usize,
        n: usize,
        k: usize,
        act: Activation,
    },
    Attention {
        batch: usize,
        seq: usize,
    },
}

fn parse(spec: &str) -> Option<Row> {
    if let Some(rest) = spec.strip_prefix("attn") {
        let (b, s) = rest.split_once('x')?;
        return Some(Row::Attention {
            batch: b.parse().ok()?,
            seq: s.parse().ok()?,
        });
    }
    let (dims, act) = match spec.split_once(':') {
        Some((d, "gelu")) => (d, Activation::Gelu),
        Some(_) => return None,
        None => (spec, Activation::Identity),
    };
    let v: Vec<usize> = dims
        .split('x')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    match v[..] {
        [m, n, k] => Some(Row::Product { m, n, k, act }),
        _ => None,
    }
}

/// Median seconds per call of `call` over 7 runs of `reps` calls.
fn time(dev: &Device, reps: usize, mut call: impl FnMut() -> Result<Tensor>) -> Result<f64> {
    for _ in 0..3 {
        call()?;
    }
    dev.synchronize()?;
    let mut runs = Vec::new();
    for _ in 0..7 {
        let t = Instant::now();
        let mut keep = Vec::with_capacity(reps);
        for _ in 0..reps {
            keep.push(call()?);
        }
        dev.synchronize()?;
        runs.push(t.elapsed().as_secs_f64() / reps as f64);
    }
    runs.sort_by(f64::total_cmp);
    Ok(runs[3])
}

fn main() -> Result<()> {
    let dev = Device::cpu();
    let threads = streampool::cpu_threads();
    let reps = std::env::var("CPU_GEMM_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let shapes = std::env::var("CPU_GEMM_SHAPES").unwrap_or_else(|_| {
        "2048x1152x384,2048x384x384,2048x1536x384:gelu,2048x384x1536,attn64x32".into()
    });
    for spec in shapes.split(',') {
        let Some(row) = parse(spec) else {
            eprintln!("cpu_gemm: cannot read the shape {spec:?} (MxNxK[:gelu] or attnBxS)");
            std::process::exit(2);
        };
        let (secs, flop) = match row {
            Row::Product { m, n, k, act } => {
                let a = Tensor::randn(&[m, k], 1, &dev)?;
                let w = Tensor::randn(&[k, n], 2, &dev)?.scale(1.0 / (k as f32).sqrt())?;
                let b = Tensor::randn(&[n], 3, &dev)?;
                let s = time(&dev, reps, || {
                    a.matmul_bias_act(&w, &b, act, MatmulMath::Exact)
                })?;
                (s, 2.0 * (m * n * k) as f64)
            }
            Row::Attention { batch, seq } => {
                let qkv = Tensor::randn(&[batch, seq, 3 * 384], 4, &dev)?;
                let mask = Tensor::ones(&[batch, seq], &dev)?;
                let s = time(&dev, reps, || qkv.attention(Some(&mask), 12))?;
                (s, 4.0 * (batch * seq * seq * 384) as f64)
            }
        };
        let gflops = flop / secs / 1e9;
        println!(
            "threads {threads:>2}  {spec:<18} {:>8.3} ms/call {gflops:>8.1} GFLOP/s {:>7.1} per thread",
            secs * 1e3,
            gflops / threads as f64
        );
    }
    Ok(())
}
