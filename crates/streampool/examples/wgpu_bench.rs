//! Measurements of the wgpu backend that `streampool bench` does not make.
//!
//! ```text
//! cargo run --release -p streampool --features wgpu --example wgpu_bench -- [encode] [matmul]
//!     [--ops N] [--secs S] [--max-mflop F]
//! ```
//!
//! - `encode`: concurrent host encoding on one queue (issue #12). 1, 2, 4, 8 and 16 threads,
//!   each on its own pooled stream, each run a chain of `--ops` small ops (`affine` on 16
//!   floats: the host cost of an op dominates); once with the quarantine lock off, once on.
//!   Reported per point (the median of 3 runs): encoded+submitted ops/s (all threads' ops
//!   over the time until the last thread has recorded and submitted its last op, with
//!   `Stream::record_event`) and end-to-end ops/s (until the GPU has finished them all). Each
//!   chain's result is checked.
//! - `matmul`: time per matmul for each kernel (`WgpuConfig::matmul_tile` 16, 32, 64, and the
//!   automatic choice) at square sizes and at the models' shapes (`x @ W^T` through the
//!   transposed weight view); `--secs` per point (default 0.3, at least 3 matmuls); shapes
//!   over `--max-mflop` million floating-point operations are left out (software Vulkan).
//!
//! The adapter is the default one (`STREAMPOOL_WGPU_ADAPTER` picks another). Figures from
//! Mesa's software Vulkan (lavapipe) check that the code runs; they say nothing of a GPU.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use streampool::{Device, StreamGuard, Tensor, WgpuConfig, WgpuQuarantine};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |flag: &str, default: f64| -> Res<f64> {
        match args.iter().position(|a| a == flag) {
            Some(i) => Ok(args.get(i + 1).ok_or("missing value")?.parse()?),
            None => Ok(default),
        }
    };
    let ops = value("--ops", 2000.0)? as usize;
    let secs = value("--secs", 0.3)?;
    let max_flop = value("--max-mflop", f64::INFINITY)? * 1e6;
    let all = !args.iter().any(|a| a == "encode" || a == "matmul");
    if all || args.iter().any(|a| a == "encode") {
        encode(ops)?;
    }
    if all || args.iter().any(|a| a == "matmul") {
        matmul(Duration::from_secs_f64(secs), max_flop)?;
    }
    Ok(())
}

/// One point of the encoding measurement: (encoded+submitted ops/s, end-to-end ops/s).
fn encode_point(dev: &Device, threads: usize, ops: usize) -> Res<(f64, f64)> {
    let barrier = Barrier::new(threads + 1);
    let (start, submitted, done) = std::thread::scope(|s| -> Res<_> {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                s.spawn(move || -> Res<(Instant, Instant)> {
                    // Stream 0 is the default stream; each thread takes its own pooled one.
                    let stream = dev.stream_at(1 + t)?;
                    let _guard = StreamGuard::new(&stream);
                    let mut x = Tensor::zeros(&[16], dev)?;
                    barrier.wait();
                    for _ in 0..ops {
                        x = x.affine(1.0, 1.0)?;
                    }
                    let event = stream.record_event()?;
                    let submitted = Instant::now();
                    event.synchronize()?;
                    let done = Instant::now();
                    let got = x.to_vec::<f32>()?;
                    if got.iter().any(|&v| v != ops as f32) {
                        return Err(format!("thread {t}: {:?} != {ops}", &got[..2]).into());
                    }
                    Ok((submitted, done))
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let mut submitted = start;
        let mut done = start;
        for h in handles {
            let (s, d) = h.join().map_err(|_| "a thread panicked")??;
            submitted = submitted.max(s);
            done = done.max(d);
        }
        Ok((start, submitted, done))
    })?;
    let total = (threads * ops) as f64;
    Ok((
        total / (submitted - start).as_secs_f64(),
        total / (done - start).as_secs_f64(),
    ))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn encode(ops: usize) -> Res<()> {
    println!(
        "## Concurrent host encoding: affine on 16 floats, {ops} ops per thread, median of 3\n"
    );
    println!("| quarantine | threads | encoded+submitted ops/s | end-to-end ops/s |");
    println!("|---|---:|---:|---:|");
    for (label, quarantine) in [("off", WgpuQuarantine::Off), ("on", WgpuQuarantine::On)] {
        let dev = Device::wgpu_with(WgpuConfig {
            quarantine,
            ..WgpuConfig::default()
        })?;
        if label == "off" {
            eprintln!("device: {}", dev.name());
        }
        // Builds the pipeline and every stream once, outside the timed runs.
        encode_point(&dev, 16, 10)?;
        for threads in [1, 2, 4, 8, 16] {
            let runs = (0..3)
                .map(|_| encode_point(&dev, threads, ops))
                .collect::<Res<Vec<_>>>()?;
            let sub = median(runs.iter().map(|r| r.0).collect());
            let e2e = median(runs.iter().map(|r| r.1).collect());
            println!("| {label} | {threads} | {sub:.0} | {e2e:.0} |");
        }
    }
    println!();
    Ok(())
}

/// Seconds per matmul of `a @ b`, enqueued back to back for at least `min` (and 3 calls).
fn time_matmul(a: &Tensor, b: &Tensor, min: Duration) -> Res<f64> {
    let stream = a.device().current_stream()?;
    a.matmul(b)?; // builds the pipeline
    stream.synchronize()?;
    let start = Instant::now();
    let mut n = 0u32;
    while n < 3 || start.elapsed() < min {
        a.matmul(b)?;
        n += 1;
        if n.is_multiple_of(8) {
            stream.synchronize()?;
        }
    }
    stream.synchronize()?;
    Ok(start.elapsed().as_secs_f64() / n as f64)
}

fn matmul(min: Duration, max_flop: f64) -> Res<()> {
    // (label, batch, m, k, n, right operand through W^T)
    let cases: Vec<(String, usize, usize, usize, usize, bool)> = [64, 128, 256, 512, 1024]
        .iter()
        .map(|&s| (format!("{s}^3"), 1, s, s, s, false))
        .chain([
            (
                "MLP batch 1: 1x256 @ W^T(256x1024)".to_string(),
                1,
                1,
                256,
                1024,
                true,
            ),
            (
                "MiniLM QKV, 64x32 tokens: 2048x384 @ W^T(384x1152)".to_string(),
                1,
                2048,
                384,
                1152,
                true,
            ),
            (
                "MiniLM scores, 64x12 heads: 768 x [32x32 @ 32x32]".to_string(),
                768,
                32,
                32,
                32,
                false,
            ),
        ])
        .collect();
    let tiles: [(&str, Option<u32>); 4] = [
        ("16x16 (before)", Some(16)),
        ("32x32, 2x2 per thread", Some(32)),
        ("64x64, 4x4 per thread", Some(64)),
        ("auto", None),
    ];
    let devs = tiles
        .iter()
        .map(|(_, t)| {
            Device::wgpu_with(WgpuConfig {
                matmul_tile: *t,
                ..WgpuConfig::default()
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    eprintln!("device: {}", devs[0].name());
    println!("## Matmul, f32: microseconds per call (GFLOP/s)\n");
    let head: Vec<&str> = tiles.iter().map(|t| t.0).collect();
    println!("| shape | {} |", head.join(" | "));
    println!("|---|{}", "---:|".repeat(tiles.len()));
    for (label, batch, m, k, n, wt) in cases {
        let flops = 2.0 * (batch * m * k * n) as f64;
        if flops > max_flop {
            continue;
        }
        let mut cells = Vec::new();
        for dev in &devs {
            let a = Tensor::randn(&[batch, m, k], 1, dev)?;
            let b = if wt {
                Tensor::randn(&[n, k], 2, dev)?.t()?
            } else {
                Tensor::randn(&[batch, k, n], 2, dev)?
            };
            let s = time_matmul(&a, &b, min)?;
            cells.push(format!("{:.1} ({:.1})", s * 1e6, flops / s / 1e9));
        }
        println!("| {label} | {} |", cells.join(" | "));
    }
    println!();
    Ok(())
}
