//! Measurements of the wgpu backend that `streampool bench` does not make.
//!
//! ```text
//! cargo run --release -p streampool --features wgpu --example wgpu_bench -- [encode] [matmul]
//!     [--ops N] [--secs S] [--max-mflop F]
//! ```
//!
//! - `encode`: concurrent host encoding on one queue. 1, 2, 4, 8 and 16 threads,
//!   each on its own pooled stream, each run a chain of `--ops` small ops (`affine` on 16
//!   floats: the host cost of an op dominates); once with the quarantine lock off, once on.
//!   Reported per point (the median of 3 runs): encoded+submitted ops/s (all threads' ops
//!   over the time until the last thread has recorded and submitted its last op, with
//!   `Stream::record_event`) and end-to-end ops/s (until the GPU has finished them all). Each
//!   chain's result is checked.
//! - `matmul`: TFLOP/s per matmul kernel (the 16x16 tile, each blocked tile of `--blocks
//!   BMxBNxBK,...` through `WgpuConfig::matmul_block`, and the automatic choice) at square
//!   sizes and at MiniLM's GEMM shapes (`x @ W^T` through the transposed weight view), in f32
//!   and f16 storage (`--dtypes f32|f16|both`); with `--cuda` (a build with the `cuda`
//!   feature) the same matmuls on CUDA device 0 (cuBLAS) in a last column. The "fma auto"
//!   column is the automatic choice with cooperative matrices off; with `--coop` a column
//!   with them on (`WgpuCoopMatrix::On`: f16 on matrix units where the adapter has them,
//!   f32 as before) and one per tile of `--coop-blocks BMxBNxBK,...` (BM, BN 64 or 128, BK
//!   16 or 32) forced through `WgpuConfig::matmul_block`; `--coop-emulate` takes the
//!   emulated kernels instead (any adapter with `SHADER_F16`; a check, not a speed). Every
//!   kernel's
//!   result is first checked against the CPU's (the run fails on a mismatch). `--secs` per
//!   point (default 0.3, at least 3 matmuls); shapes over `--max-mflop` million
//!   floating-point operations are left out (software Vulkan).
//!
//! The adapter is the default one (`STREAMPOOL_WGPU_ADAPTER` picks another). Figures from
//! Mesa's software Vulkan (lavapipe) check that the code runs; they say nothing of a GPU.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use streampool::{DType, Device, StreamGuard, Tensor, WgpuConfig, WgpuCoopMatrix, WgpuQuarantine};

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
        matmul(Duration::from_secs_f64(secs), max_flop, &args)?;
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

/// Seconds per matmul of `a @ b`: after a warm-up (the pipeline's build) and a timed single
/// call, enough calls to fill `min` (at least 3) enqueued back to back with one synchronize
/// at the end; the best of 3 such runs.
fn time_matmul(a: &Tensor, b: &Tensor, min: Duration) -> Res<f64> {
    let stream = a.device().current_stream()?;
    a.matmul(b)?;
    stream.synchronize()?;
    let start = Instant::now();
    a.matmul(b)?;
    stream.synchronize()?;
    let one = start.elapsed().as_secs_f64();
    let n = ((min.as_secs_f64() / 3.0 / one) as usize).clamp(3, 20_000);
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let start = Instant::now();
        for _ in 0..n {
            a.matmul(b)?;
        }
        stream.synchronize()?;
        best = best.min(start.elapsed().as_secs_f64() / n as f64);
    }
    Ok(best)
}

/// `(label, batch, m, k, n, right operand through W^T)`.
type Case = (String, usize, usize, usize, usize, bool);

fn matmul_cases() -> Vec<Case> {
    let mut cases: Vec<Case> = [512, 1024, 2048]
        .iter()
        .map(|&s| (format!("{s}^3"), 1, s, s, s, false))
        .collect();
    cases.push((
        "MLP batch 1: 1x256 @ W^T(256x1024)".into(),
        1,
        1,
        256,
        1024,
        true,
    ));
    // MiniLM's four linear layers (hidden 384, intermediate 1536) at 64 sentences of 32 and
    // of 128 tokens: rows x in @ W^T(in x out).
    for rows in [2048, 8192] {
        for (what, k, n) in [
            ("QKV", 384, 1152),
            ("attn out", 384, 384),
            ("FFN up", 384, 1536),
            ("FFN down", 1536, 384),
        ] {
            cases.push((
                format!("MiniLM {what}: {rows}x{k} @ W^T({k}x{n})"),
                1,
                rows,
                k,
                n,
                true,
            ));
        }
    }
    cases.push((
        "MiniLM scores, 64x12 heads: 768 x [32x32 @ 32x32]".into(),
        768,
        32,
        32,
        32,
        false,
    ));
    cases
}

/// The operands of `case` in `dt` on `dev` (the same values on every device).
fn operands(dev: &Device, case: &Case, dt: DType) -> Res<(Tensor, Tensor)> {
    let (_, batch, m, k, n, wt) = *case;
    let a = Tensor::randn(&[batch, m, k], 1, dev)?.to_dtype(dt)?;
    let b = if wt {
        Tensor::randn(&[n, k], 2, dev)?.to_dtype(dt)?.t()?
    } else {
        Tensor::randn(&[batch, k, n], 2, dev)?.to_dtype(dt)?
    };
    Ok((a, b))
}

/// Seconds per matmul of `case` in `dt` on `dev`, after checking its result against
/// `want` (the CPU's, in f32 from the same rounded inputs): the norm-relative error must
/// stay under 1e-5 (f32 on wgpu) or 2e-3 (f16 storage; CUDA, which may take TF32), else the
/// run fails.
fn time_case(dev: &Device, case: &Case, dt: DType, want: &[f32], min: Duration) -> Res<f64> {
    let (a, b) = operands(dev, case, dt)?;
    let got = a.matmul(&b)?.to_dtype(DType::F32)?.to_vec::<f32>()?;
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    for (g, w) in got.iter().zip(want) {
        err += (*g as f64 - *w as f64).powi(2);
        norm += (*w as f64).powi(2);
    }
    let rel = (err / norm.max(1e-30)).sqrt();
    let tol = if dt == DType::F16 || !dev.name().starts_with("wgpu") {
        2e-3
    } else {
        1e-5
    };
    if got.len() != want.len() || rel.is_nan() || rel > tol {
        return Err(format!(
            "{} on {}: relative error {rel:.2e} over {tol:.0e}",
            case.0,
            dev.name()
        )
        .into());
    }
    time_matmul(&a, &b, min)
}

/// The CPU's result for `case` from inputs rounded to `dt`.
fn reference(case: &Case, dt: DType) -> Res<Vec<f32>> {
    let cpu = Device::cpu();
    let (a, b) = operands(&cpu, case, DType::F32)?;
    let round = |t: Tensor| -> Res<Tensor> { Ok(t.to_dtype(dt)?.to_dtype(DType::F32)?) };
    let (a, b) = if dt == DType::F32 {
        (a, b)
    } else {
        (round(a)?, round(b)?)
    };
    Ok(a.matmul(&b)?.to_vec::<f32>()?)
}

fn matmul(min: Duration, max_flop: f64, args: &[String]) -> Res<()> {
    let flag = |f: &str| {
        args.iter()
            .position(|a| a == f)
            .and_then(|i| args.get(i + 1))
    };
    // Blocked tiles to time besides the 16x16 kernel and the automatic choice.
    let tiles = |list: &str| -> Res<Vec<[u32; 3]>> {
        list.split(',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                let v: Vec<u32> = s.split('x').map(|p| p.parse()).collect::<Result<_, _>>()?;
                match v[..] {
                    [bm, bn, bk] => Ok([bm, bn, bk]),
                    _ => Err(format!("tile {s:?}: expected BMxBNxBK").into()),
                }
            })
            .collect()
    };
    let blocks = tiles(
        flag("--blocks")
            .map(String::as_str)
            .unwrap_or("64x64x16,128x64x16,128x128x16"),
    )?;
    let coop_blocks = tiles(flag("--coop-blocks").map(String::as_str).unwrap_or(""))?;
    let coop_mode = if args.iter().any(|a| a == "--coop-emulate") {
        WgpuCoopMatrix::Emulated
    } else {
        WgpuCoopMatrix::On
    };
    // Every FMA column with cooperative matrices off, whatever the adapter or environment.
    let fma = WgpuConfig {
        cooperative_matrix: WgpuCoopMatrix::Off,
        ..WgpuConfig::default()
    };
    let dtypes: Vec<DType> = match flag("--dtypes").map(String::as_str) {
        Some("f32") => vec![DType::F32],
        Some("f16") => vec![DType::F16],
        _ => vec![DType::F32, DType::F16],
    };
    let mut columns: Vec<(String, WgpuConfig)> = vec![(
        "16x16".into(),
        WgpuConfig {
            matmul_tile: Some(16),
            ..fma.clone()
        },
    )];
    for b in &blocks {
        columns.push((
            format!("{}x{}x{}", b[0], b[1], b[2]),
            WgpuConfig {
                // 1 workgroup is always reached: the named tile wherever a blocked one fits.
                matmul_block: Some(*b),
                ..fma.clone()
            },
        ));
    }
    columns.push(("fma auto".into(), fma.clone()));
    if args.iter().any(|a| a == "--coop" || a == "--coop-emulate") {
        // Cooperative matrices where the adapter has them (f16 only; f32 as fma auto).
        for b in &coop_blocks {
            columns.push((
                format!("coop {}x{}x{}", b[0], b[1], b[2]),
                WgpuConfig {
                    cooperative_matrix: coop_mode,
                    matmul_block: Some(*b),
                    ..WgpuConfig::default()
                },
            ));
        }
        columns.push((
            "coop auto".into(),
            WgpuConfig {
                cooperative_matrix: coop_mode,
                ..WgpuConfig::default()
            },
        ));
    }
    let devs = columns
        .iter()
        .map(|(_, c)| Device::wgpu_with(c.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    eprintln!("device: {}", devs[0].name());
    #[cfg(feature = "cuda")]
    let cuda = if args.iter().any(|a| a == "--cuda") {
        Some(Device::cuda(0)?)
    } else {
        None
    };
    let cases = matmul_cases();
    let shapes: Vec<_> = cases.iter().map(|c| (c.1, c.2, c.3, c.4)).collect();
    for &dt in &dtypes {
        if let Some(paths) = devs[devs.len() - 1].wgpu_matmul_paths(&shapes, dt) {
            println!("## Matmul paths the automatic choice takes, {dt:?}\n");
            for (shape, path) in paths {
                println!("- {shape}: {path}");
            }
            println!();
        }
    }
    for &dt in &dtypes {
        println!("## Matmul, {dt:?} storage: TFLOP/s (microseconds per call)\n");
        // Extended with the CUDA column in a build with that feature.
        #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
        let mut head: Vec<String> = columns.iter().map(|c| c.0.clone()).collect();
        #[cfg(feature = "cuda")]
        if cuda.is_some() {
            head.push("CUDA (cuBLAS)".into());
        }
        println!("| shape | {} |", head.join(" | "));
        println!("|---|{}", "---:|".repeat(head.len()));
        for case in &cases {
            let (label, batch, m, k, n, _) = case;
            let flops = 2.0 * (batch * m * k * n) as f64;
            if flops > max_flop {
                continue;
            }
            let want = reference(case, dt)?;
            let mut cells = Vec::new();
            #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
            let mut devices: Vec<&Device> = devs.iter().collect();
            #[cfg(feature = "cuda")]
            devices.extend(cuda.as_ref());
            for dev in devices {
                let s = time_case(dev, case, dt, &want, min)?;
                cells.push(format!("{:.2} ({:.1})", flops / s / 1e12, s * 1e6));
            }
            println!("| {label} | {} |", cells.join(" | "));
        }
        println!();
    }
    Ok(())
}
