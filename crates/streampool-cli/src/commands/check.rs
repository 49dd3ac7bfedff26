//! `streampool check`: a short self-test that exercises every runtime mechanism once.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use streampool::{Device, DeviceKind, Event, StreamGuard, Tensor};
use streampool_nn::accuracy::{gate_corpus, measure, AccuracyThresholds, QuantizationGate};
use streampool_nn::{ComputeDType, LoadOptions, SentenceEmbedder};

/// Arguments of `streampool check`.
#[derive(clap::Args)]
pub struct Args {
    /// Device to check: cpu, cuda, cuda:N, wgpu or wgpu:ADAPTER.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Threads used by the concurrent part.
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// A sentence-embedding model folder to run the accuracy gate on: int8 (CPU only),
    /// f16 and bf16 against the model's own f32 on the gate's corpus; int8 must pass.
    #[arg(long, value_name = "DIR")]
    accuracy: Option<PathBuf>,
}

fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= tol * (1.0 + y.abs()))
}

/// Shapes (`batch, m, k, n`) whose wgpu matmul kernel `check` reports: an MLP at batch 1,
/// 1024^3, MiniLM's QKV and FFN layers at 64 sentences of 32 tokens, its attention scores.
#[cfg(feature = "wgpu")]
const MATMUL_SHAPES: [(usize, usize, usize, usize); 5] = [
    (1, 1, 256, 1024),
    (1, 1024, 1024, 1024),
    (1, 2048, 384, 1152),
    (1, 2048, 1536, 384),
    (768, 32, 32, 32),
];

/// Runs the self-test; prints one line per step.
pub fn run(args: Args) -> Result<()> {
    let dev = super::device::open(&args.device)?;
    let start = Instant::now();
    let step = |name: &str, r: Result<()>| -> Result<()> {
        match &r {
            Ok(()) => println!("ok    {name}"),
            Err(e) => println!("FAIL  {name}: {e:#}"),
        }
        r.with_context(|| format!("check step {name:?} failed"))
    };
    println!(
        "streampool check on {} (pool of {} streams)",
        dev.name(),
        dev.pool_size()
    );
    #[cfg(feature = "wgpu")]
    for dtype in [streampool::DType::F32, streampool::DType::F16] {
        if let Some(paths) = dev.wgpu_matmul_paths(&MATMUL_SHAPES, dtype) {
            for (shape, path) in paths {
                println!("      matmul {dtype:?} {shape}: {path}");
            }
        }
    }
    #[cfg(feature = "wgpu")]
    if let Some((feature, configs)) = dev.wgpu_cooperative_matrix() {
        println!(
            "      cooperative matrix: EXPERIMENTAL_COOPERATIVE_MATRIX {}; configurations: {}",
            if feature { "reported" } else { "not reported" },
            if configs.is_empty() {
                "none".to_string()
            } else {
                configs.join(", ")
            }
        );
    }
    #[cfg(feature = "wgpu")]
    if let Some(state) = dev.wgpu_cooperative_matrix_use() {
        println!("      cooperative-matrix matmuls: {state}");
    }
    step("matmul against host reference", matmul_matches(&dev))?;
    step("events order two streams", events_order(&dev))?;
    step(
        "concurrent forwards agree with one thread",
        concurrent(&dev, args.threads),
    )?;
    step("bad input is an error, not a crash", bad_input(&dev))?;
    if let Some(dir) = &args.accuracy {
        step(
            "accuracy gate against f32 on the gate corpus",
            accuracy(&dev, dir),
        )?;
    }
    dev.synchronize()?;
    let s = dev.allocator_stats();
    println!(
        "all checks passed in {:.2?}; streams created {}, allocator: {} allocs, {} cache hits, peak reserved {} KiB",
        start.elapsed(),
        dev.streams_created(),
        s.allocs,
        s.cache_hits,
        s.peak_reserved / 1024
    );
    Ok(())
}

fn matmul_matches(dev: &Device) -> Result<()> {
    let (m, k, n) = (7, 13, 5);
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5 % 13) as f32 - 6.0) / 4.0)
        .collect();
    let mut want = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] = (0..k)
                .map(|p| a[i * k + p] as f64 * b[p * n + j] as f64)
                .sum::<f64>() as f32;
        }
    }
    let got = Tensor::from_vec(a, &[m, k], dev)?
        .matmul(&Tensor::from_vec(b, &[k, n], dev)?)?
        .to_vec::<f32>()?;
    ensure!(close(&got, &want, 1e-5), "matmul differs from reference");
    Ok(())
}

fn events_order(dev: &Device) -> Result<()> {
    let (s1, s2) = (dev.stream_at(1)?, dev.stream_at(2)?);
    let x = {
        let _g = StreamGuard::new(&s1);
        s1.debug_delay(std::time::Duration::from_millis(20))?;
        Tensor::full(3.0, &[1024], dev)?
    };
    let e = Event::record(&s1)?;
    s2.wait_event(&e)?;
    let _g = StreamGuard::new(&s2);
    let y = x.scale(2.0)?.to_vec::<f32>()?;
    ensure!(
        y.iter().all(|&v| v == 6.0),
        "stream 2 read before stream 1 wrote"
    );
    Ok(())
}

fn concurrent(dev: &Device, threads: usize) -> Result<()> {
    let w = Tensor::randn(&[64, 64], 7, dev)?;
    let reference: Vec<Vec<f32>> = (0..threads)
        .map(|t| -> Result<Vec<f32>> {
            Ok(Tensor::randn(&[4, 64], t as u64, dev)?
                .matmul(&w)?
                .gelu()?
                .to_vec::<f32>()?)
        })
        .collect::<Result<_>>()?;
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (w, dev) = (w.clone(), dev.clone());
                s.spawn(move || -> Result<Vec<f32>> {
                    let mut last = Vec::new();
                    for _ in 0..20 {
                        last = Tensor::randn(&[4, 64], t as u64, &dev)?
                            .matmul(&w)?
                            .gelu()?
                            .to_vec::<f32>()?;
                    }
                    Ok(last)
                })
            })
            .collect();
        for (t, h) in handles.into_iter().enumerate() {
            let got = h
                .join()
                .map_err(|_| anyhow::anyhow!("thread {t} panicked"))??;
            ensure!(
                close(&got, &reference[t], 1e-5),
                "thread {t} got a wrong result"
            );
        }
        Ok(())
    })
}

fn bad_input(dev: &Device) -> Result<()> {
    let a = Tensor::zeros(&[2, 3], dev)?;
    ensure!(a.matmul(&a).is_err(), "mismatched matmul was accepted");
    ensure!(
        Tensor::from_vec(vec![1.0f32; 5], &[2, 3], dev).is_err(),
        "wrong element count was accepted"
    );
    // The device still works after errors.
    ensure!(
        a.relu()?.to_vec::<f32>()? == vec![0.0; 6],
        "device broken after an error"
    );
    Ok(())
}

/// The accuracy gate's numbers for `dir` in int8 (on the CPU), f16 and bf16 against its
/// f32, one line each; an error when int8 misses the thresholds.
fn accuracy(dev: &Device, dir: &Path) -> Result<()> {
    let corpus = gate_corpus();
    let thresholds = AccuracyThresholds::default();
    let reference = SentenceEmbedder::load(dev, dir)
        .with_context(|| format!("loading {} in f32", dir.display()))?;
    let mut int8_passed = None;
    for dtype in [ComputeDType::Int8, ComputeDType::F16, ComputeDType::Bf16] {
        if dtype.is_quantized() && dev.kind() != DeviceKind::Cpu {
            println!("      {dtype}: CPU only, skipped on {}", dev.name());
            continue;
        }
        let opts = LoadOptions {
            dtype,
            gate: QuantizationGate::Force,
            ..LoadOptions::default()
        };
        let other = SentenceEmbedder::load_with_options(dev, dir, &opts)
            .with_context(|| format!("loading {} in {dtype}", dir.display()))?;
        let start = Instant::now();
        let report = measure(&reference, &other, &corpus)?;
        let verdict = if report.passes(&thresholds) {
            "passes"
        } else {
            "misses"
        };
        println!(
            "      {dtype} vs f32: {report} ({verdict} the gate; measured in {:.1?})",
            start.elapsed()
        );
        if dtype.is_quantized() {
            int8_passed = Some(report.passes(&thresholds));
        }
    }
    ensure!(
        int8_passed != Some(false),
        "int8 misses the accuracy gate (min cosine >= {}, mean >= {}, top-10 agreement >= {})",
        thresholds.min_cosine,
        thresholds.mean_cosine,
        thresholds.top_k_agreement
    );
    Ok(())
}
