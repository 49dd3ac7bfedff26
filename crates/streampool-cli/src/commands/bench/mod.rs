//! `streampool bench`: every scenario in one process, one JSON file, one table, one PNG.
//!
//! Scenarios, per workload (`mlp`: 256-1024-GELU-256; `minilm32`/`minilm128`: the sentence
//! encoder on sentences of exactly 32/128 tokens, tokenization included), and for the minilm
//! workloads per compute dtype (`--dtypes f32,tf32,f16,bf16`):
//! - `ceiling`: one thread calling the model on pre-formed batches (end to end: for minilm,
//!   tokenization, forward, pooling, read-back);
//! - `forward` (minilm only): the pre-tokenized ceiling: one batch tokenized once outside the
//!   timed loop, each call uploading it, running forward + mean-pool + normalize and reading
//!   the embeddings back (the counting of PyTorch's forward in `bench/torch_baseline.py`);
//!   before the loop it times tokenizing that batch in host ns per token (the pool path
//!   `embed` uses, the fast path on one thread, `tokenizers`' own `encode_batch`), and each
//!   minilm `ceiling` point records its share of the `forward` point at the same batch;
//! - `threading`: N threads calling the shared model at batch 1;
//! - `batching`: N callers through a BatchQueue, a sweep over callers at one configuration and
//!   every `max_batch` x `max_wait` pair at the most callers;
//! - `overhead` (once, not per workload): per-op host cost and a large matmul against
//!   single-threaded `matrixmultiply::sgemm`.
//!
//! Every call reads its result back to the host. Throughput is counted over a fixed window
//! after a warm-up; latencies are per call (per request through the queue). The JSON schema
//! is shared with `bench/torch_baseline.py`; `bench/compare.py` puts the two side by side.

mod measure;
mod plot;
mod profiles;
mod report;
mod scenarios;
mod workloads;

pub use workloads::mix_lengths;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Result};
use indicatif::{ProgressBar, ProgressStyle};
use streampool::{Device, DeviceKind};
use streampool_nn::ComputeDType;

use measure::Window;
pub use report::utc_now;
use report::{Record, Report};
use scenarios::QueueSetup;
use workloads::{EncoderWorkload, MlpWorkload, Workload};

/// Arguments of `streampool bench`. Defaults that depend on the device are chosen so that a
/// CPU run on a small machine takes a few minutes.
#[derive(clap::Args)]
pub struct Args {
    /// Device to run on: cpu, cuda, cuda:N, wgpu or wgpu:ADAPTER.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Workloads: mlp, minilm32, minilm128, minilmN (N tokens, up to the model's positions),
    /// minilm-mix (mixed lengths, 8-256 tokens; see `workloads::mix_lengths`).
    #[arg(long, value_delimiter = ',', default_value = "mlp,minilm32,minilm128")]
    workloads: Vec<String>,
    /// Scenarios: threading, batching, ceiling, forward, overhead.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "threading,batching,ceiling,forward,overhead"
    )]
    scenarios: Vec<String>,
    /// Thread (and batching caller) counts [default: cuda 1,2,4,8,16,32,64; cpu 1,2,4,8].
    #[arg(long, value_delimiter = ',')]
    threads: Option<Vec<usize>>,
    /// Seconds measured per point, after a warm-up [default: cuda 1.5, cpu 1.0].
    #[arg(long)]
    seconds: Option<f64>,
    /// BatchQueue max_batch_size values [default: cuda 16,64; cpu 4,8].
    #[arg(long, value_delimiter = ',')]
    max_batch: Option<Vec<usize>>,
    /// BatchQueue max_wait values in milliseconds (0: continuous batching, the queue's
    /// default; the first value is the one the callers sweep uses).
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    max_wait_ms: Vec<f64>,
    /// BatchQueue max_batch_tokens (rows x longest input per batch).
    #[arg(long, default_value_t = streampool_batch::BatchConfig::default().max_batch_tokens)]
    max_batch_tokens: usize,
    /// BatchQueue worker threads.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Batch sizes of the ceiling scenario [default: 1 and the max_batch values; on cuda the
    /// minilm workloads add 32,128,256,512].
    #[arg(long, value_delimiter = ',')]
    ceiling_batches: Option<Vec<usize>>,
    /// Batch sizes of the forward scenario [default: cuda and wgpu 64,512; cpu the largest
    /// max_batch value].
    #[arg(long, value_delimiter = ',')]
    forward_batches: Option<Vec<usize>>,
    /// Sentence-encoder folder for the minilm workloads, any supported family (BERT,
    /// XLM-RoBERTa, MPNet, GTE, Qwen3; sentences are grown to exactly the workload's tokens
    /// with its tokenizer) [default: the installed all-MiniLM-L6-v2, else the shipped
    /// tiny-bert].
    #[arg(long, value_name = "DIR")]
    minilm: Option<PathBuf>,
    /// Compute dtype of the minilm workloads: f32, tf32, f16, bf16 or int8 [default: f16 on
    /// cuda, f32 on cpu and wgpu (wgpu: f32, tf32 as f32, and f16 where the adapter has
    /// SHADER_F16; no bf16; int8 on cpu only)]. The mlp workload is always f32.
    #[arg(long, value_name = "DTYPE", conflicts_with = "dtypes")]
    dtype: Option<ComputeDType>,
    /// Several compute dtypes: the minilm workloads run once per dtype, in this order, in one
    /// invocation (e.g. f32,tf32,f16,bf16, or f32,int8 on the CPU); every JSON point records
    /// its dtype.
    #[arg(long, value_delimiter = ',', value_name = "DTYPES")]
    dtypes: Option<Vec<ComputeDType>>,
    /// Shape buckets of the encoder workloads: steps per octave the batch shapes (packed
    /// token totals, padded rows and lengths) are rounded up on (0: off, every batch at its
    /// own shape) [default: the embedder's].
    #[arg(long, value_name = "STEPS")]
    buckets: Option<u32>,
    /// Texts per device batch in the embedder's direct calls (ceiling, threading): a larger
    /// call runs in chunks, tokenizing each while the device runs the one before.
    #[arg(long, default_value_t = streampool_nn::DEFAULT_EMBED_CHUNK)]
    embed_chunk: usize,
    /// Folder for streampool.json and streampool.png.
    #[arg(long, default_value = "bench/results/latest")]
    out: PathBuf,
    /// Short run: fewer points, shorter windows.
    #[arg(long)]
    quick: bool,
}

/// What one point of the run measures.
enum Point {
    Ceiling(usize, usize),
    Forward(usize, usize),
    ForwardPadded(usize, usize),
    Threading(usize, usize),
    Batching(usize, QueueSetup),
    Overhead,
}

impl Point {
    /// The index of the workload this point runs (none for the op overhead).
    fn workload(&self) -> Option<usize> {
        match self {
            Point::Ceiling(i, _)
            | Point::Forward(i, _)
            | Point::ForwardPadded(i, _)
            | Point::Threading(i, _)
            | Point::Batching(i, _) => Some(*i),
            Point::Overhead => None,
        }
    }
}

/// The resolved settings of a run.
struct Plan {
    threads: Vec<usize>,
    window: Window,
    max_batch: Vec<usize>,
    max_wait: Vec<f64>,
    overhead_ops: usize,
    matmul_n: usize,
}

impl Plan {
    fn resolve(args: &Args, gpu: bool) -> Result<Self> {
        let pick = |cuda: &[usize], cpu: &[usize]| if gpu { cuda.to_vec() } else { cpu.to_vec() };
        let threads = args
            .threads
            .clone()
            .unwrap_or_else(|| match (gpu, args.quick) {
                (true, false) => vec![1, 2, 4, 8, 16, 32, 64],
                (true, true) => vec![1, 8, 64],
                (false, false) => vec![1, 2, 4, 8],
                (false, true) => vec![1, 2, 4],
            });
        let seconds = args.seconds.unwrap_or(match (gpu, args.quick) {
            (true, false) => 1.5,
            (true, true) => 0.5,
            (false, false) => 1.0,
            (false, true) => 0.2,
        });
        let mut max_batch = args
            .max_batch
            .clone()
            .unwrap_or_else(|| pick(&[16, 64], &[4, 8]));
        let mut max_wait = args.max_wait_ms.clone();
        if args.quick {
            max_batch = max_batch.iter().copied().max().into_iter().collect();
            max_wait.truncate(1);
        }
        if threads.contains(&0) || max_batch.contains(&0) || args.workers == 0 {
            bail!("--threads, --max-batch and --workers take positive values");
        }
        if !seconds.is_finite()
            || seconds <= 0.0
            || max_wait.iter().any(|w| !w.is_finite() || *w < 0.0)
        {
            bail!("--seconds must be positive and --max-wait-ms non-negative");
        }
        Ok(Self {
            threads,
            window: Window {
                warm: Duration::from_secs_f64((0.2 * seconds).max(0.15)),
                measure: Duration::from_secs_f64(seconds),
            },
            max_batch,
            max_wait,
            overhead_ops: if args.quick { 10_000 } else { 50_000 },
            matmul_n: if args.quick { 512 } else { 1024 },
        })
    }
}

/// Runs the benchmark and writes `streampool.json` and `streampool.png` under `--out`.
pub fn run(args: Args) -> Result<()> {
    for s in &args.scenarios {
        if !["threading", "batching", "ceiling", "forward", "overhead"].contains(&s.as_str()) {
            bail!(
                "unknown scenario {s:?}: expected threading, batching, ceiling, forward, overhead"
            );
        }
    }
    let dev = super::device::open(&args.device)?;
    let gpu = dev.kind() != DeviceKind::Cpu;
    let plan = Plan::resolve(&args, gpu)?;
    let has = |s: &str| args.scenarios.iter().any(|x| x == s);

    let dtypes = args
        .dtypes
        .clone()
        .or(args.dtype.map(|d| vec![d]))
        .unwrap_or_else(|| vec![super::device::default_dtype(&dev)]);
    let mut loaded: Vec<(Workload, Option<String>)> = Vec::new();
    let mut labels: Vec<String> = Vec::new();
    let mut choice = None;
    for name in &args.workloads {
        if name == "mlp" {
            loaded.push((Workload::Mlp(Arc::new(MlpWorkload::new(&dev)?)), None));
        } else if !name.starts_with("minilm") {
            bail!("unknown workload {name:?}: expected mlp, minilm32, minilm128");
        }
    }
    // Per dtype, every minilm workload of the list, sharing one encoder per dtype.
    for &dtype in &dtypes {
        let mut encoder = None;
        for name in args.workloads.iter().filter(|n| n.starts_with("minilm")) {
            let seq: Option<usize> = match &name["minilm".len()..] {
                "-mix" => None,
                n => Some(n.parse().map_err(|_| {
                    anyhow::anyhow!(
                        "bad workload {name:?}: expected minilm32, minilm128, minilmN or minilm-mix"
                    )
                })?),
            };
            if choice.is_none() {
                choice = Some(workloads::choose_encoder(args.minilm.clone())?);
            }
            let choice = choice.as_ref().expect("chosen just above");
            if encoder.is_none() {
                let emb =
                    EncoderWorkload::load(&dev, choice, dtype, args.embed_chunk, args.buckets)?;
                let label = format!("{} {dtype}", choice.label);
                labels.push(label.clone());
                encoder = Some((emb, label));
            }
            let (emb, label) = encoder.as_ref().expect("loaded just above");
            let e = match seq {
                Some(seq) => EncoderWorkload::with_seq(emb.clone(), seq)?,
                None => EncoderWorkload::mixed(emb.clone())?,
            };
            loaded.push((Workload::Encoder(Arc::new(e)), Some(label.clone())));
        }
    }

    let mut points = Vec::new();
    let sweep_batch = plan.max_batch.iter().copied().max().unwrap_or(1);
    let sweep_wait = plan.max_wait.first().copied().unwrap_or(0.0);
    let most = plan.threads.iter().copied().max().unwrap_or(1);
    for (i, (w, _)) in loaded.iter().enumerate() {
        if has("forward") && matches!(w, Workload::Encoder(_)) {
            let batches = args.forward_batches.clone().unwrap_or_else(|| {
                if gpu {
                    vec![64, 512]
                } else {
                    vec![sweep_batch]
                }
            });
            let mix = matches!(w, Workload::Encoder(e) if e.mix);
            for b in batches {
                points.push(Point::Forward(i, b));
                if mix {
                    points.push(Point::ForwardPadded(i, b));
                }
            }
        }
        if has("ceiling") || has("batching") {
            let mut batches = args.ceiling_batches.clone().unwrap_or_else(|| {
                let mut b = vec![1];
                b.extend(&plan.max_batch);
                if gpu && matches!(w, Workload::Encoder(_)) && !args.quick {
                    b.extend([32, 128, 256, 512]);
                }
                b
            });
            if has("batching") {
                batches.extend(&plan.max_batch);
            }
            batches.sort_unstable();
            batches.dedup();
            points.extend(batches.into_iter().map(|b| Point::Ceiling(i, b)));
        }
        if has("threading") {
            points.extend(plan.threads.iter().map(|&t| Point::Threading(i, t)));
        }
        if has("batching") {
            let setup = |callers, max_batch, wait: f64| QueueSetup {
                callers,
                max_batch,
                max_wait: Duration::from_secs_f64(wait / 1e3),
                max_batch_tokens: args.max_batch_tokens,
                workers: args.workers,
            };
            for &c in &plan.threads {
                points.push(Point::Batching(i, setup(c, sweep_batch, sweep_wait)));
            }
            for &mb in &plan.max_batch {
                for &mw in &plan.max_wait {
                    if (mb, mw) != (sweep_batch, sweep_wait) {
                        points.push(Point::Batching(i, setup(most, mb, mw)));
                    }
                }
            }
        }
    }
    if has("overhead") {
        points.push(Point::Overhead);
    }

    println!(
        "streampool bench: {} points on {}, {:.2} s per point after {:.2} s warm-up; minilm model: {}",
        points.len(),
        dev.name(),
        plan.window.measure.as_secs_f64(),
        plan.window.warm.as_secs_f64(),
        if labels.is_empty() {
            "-".to_string()
        } else {
            labels.join(", ")
        }
    );
    let bar = ProgressBar::new(points.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {elapsed} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    std::fs::create_dir_all(&args.out)?;
    let json = args.out.join("streampool.json");
    let mut report = Report {
        system: "streampool".into(),
        device: dev.name(),
        date: report::utc_now(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        cpu_threads: (dev.kind() == streampool::DeviceKind::Cpu).then(streampool::cpu_threads),
        cpu_bf16_path: (dev.kind() == streampool::DeviceKind::Cpu)
            .then(|| streampool::cpu_bf16_path().name().to_string()),
        host: Some(report::host_description()),
        results: Vec::new(),
        checks: Vec::new(),
        errors: Vec::new(),
    };
    for (n, p) in points.iter().enumerate() {
        // A failing point is reported and skipped, so one bad configuration does not lose
        // the rest of a long (and, on a GPU machine, scarce) run.
        match run_point(&dev, p, &loaded, &plan, &report.results, &bar) {
            Ok(new) => {
                for r in &new {
                    bar.suspend(|| eprintln!("  {}", one_line(r)));
                }
                // STREAMPOOL_CPU_PROFILE=1 / STREAMPOOL_WGPU_PROFILE=1: where this point's
                // time went, per kernel (warm-up included), longest first.
                profiles::print(&bar);
                report.results.extend(new);
            }
            Err(e) => {
                let msg = format!("{}: {e:#}", bar.message());
                bar.suspend(|| eprintln!("  FAILED {msg}"));
                report.errors.push(msg);
            }
        }
        // A workload whose last point this was gives its graphs' memory back.
        if let Some(i) = p.workload() {
            if points[n + 1..].iter().all(|q| q.workload() != Some(i)) {
                loaded[i].0.release_graphs();
                dev.empty_cache();
            }
        }
        // Written after every point: a run cut short still leaves its figures.
        report.checks = report::checks(&report.results, !gpu);
        report.write(&json)?;
        bar.inc(1);
    }
    bar.finish_and_clear();

    report::print(&report);
    let png = args.out.join("streampool.png");
    let title = format!("streampool bench, {} ({})", report.device, report.date);
    match plot::draw(&png, &title, &report.results, (sweep_batch, sweep_wait)) {
        Ok(true) => println!("\nwrote {} and {}", json.display(), png.display()),
        Ok(false) => println!(
            "\nwrote {} and {} (no font found: plot drawn without text; set {})",
            json.display(),
            png.display(),
            plot::FONT_ENV
        ),
        Err(e) => println!("\nwrote {}; the plot failed: {e}", json.display()),
    }
    if !report.errors.is_empty() {
        bail!(
            "{} of {} points failed (listed above and in the JSON)",
            report.errors.len(),
            points.len()
        );
    }
    Ok(())
}

fn run_point(
    dev: &Device,
    p: &Point,
    loaded: &[(Workload, Option<String>)],
    plan: &Plan,
    done: &[Record],
    bar: &ProgressBar,
) -> Result<Vec<Record>> {
    let with_model = |mut r: Record, i: usize| {
        r.model = loaded[i].1.clone();
        r
    };
    // The record of `scenario` at `batch` rows measured earlier in this run for workload `w`
    // in its dtype (forward points run before the ceiling and batching points of their
    // workload).
    let earlier = |w: &Workload, scenario: &str, batch: usize| {
        let dtype = w.dtype().to_string();
        done.iter().find(|r| {
            r.workload == w.name()
                && r.dtype.as_deref() == Some(dtype.as_str())
                && r.scenario == scenario
                && r.batch == batch
        })
    };
    Ok(match p {
        Point::Ceiling(i, b) => {
            let w = &loaded[*i].0;
            bar.set_message(format!("{} ceiling batch {b}", w.name()));
            let mut rec = scenarios::ceiling(dev, w, *b, plan.window)?;
            rec.forward_fraction =
                earlier(w, "forward", *b).map(|f| rec.throughput_per_s / f.throughput_per_s);
            vec![with_model(rec, *i)]
        }
        Point::Forward(i, b) => {
            bar.set_message(format!("{} forward batch {b}", loaded[*i].0.name()));
            vec![with_model(
                scenarios::forward(dev, &loaded[*i].0, *b, plan.window)?,
                *i,
            )]
        }
        Point::ForwardPadded(i, b) => {
            bar.set_message(format!(
                "{} forward (padded) batch {b}",
                loaded[*i].0.name()
            ));
            vec![with_model(
                scenarios::forward_padded(dev, &loaded[*i].0, *b, plan.window)?,
                *i,
            )]
        }
        Point::Threading(i, t) => {
            bar.set_message(format!("{} threading {t} threads", loaded[*i].0.name()));
            vec![with_model(
                scenarios::threading(dev, &loaded[*i].0, *t, plan.window)?,
                *i,
            )]
        }
        Point::Batching(i, setup) => {
            let w = &loaded[*i].0;
            bar.set_message(format!(
                "{} batching {} callers, max_batch {}, max_wait {:?}",
                w.name(),
                setup.callers,
                setup.max_batch,
                setup.max_wait
            ));
            let ceiling = earlier(w, "ceiling", setup.max_batch);
            let forward = earlier(w, "forward", setup.max_batch);
            let mut rec = scenarios::batching(dev, w, *setup, plan.window, ceiling)?;
            rec.forward_fraction = forward.map(|f| rec.throughput_per_s / f.throughput_per_s);
            vec![with_model(rec, *i)]
        }
        Point::Overhead => {
            bar.set_message("overhead");
            scenarios::overhead(dev, plan.overhead_ops, plan.matmul_n, 5)?
        }
    })
}

fn one_line(r: &Record) -> String {
    let who = match (r.threads, r.callers) {
        (_, Some(c)) => format!("{c} callers"),
        (Some(t), _) => format!("{t} threads"),
        _ => String::new(),
    };
    match r.scenario.as_str() {
        "overhead" => format!(
            "overhead {}: {:.2} us/op{}",
            r.op.as_deref().unwrap_or(""),
            r.us_per_op.unwrap_or(0.0),
            r.ratio
                .map_or(String::new(), |x| format!(", {x:.2}x sgemm"))
        ),
        _ => format!(
            "{} {} {who} batch {}: {:.0} rows/s, p50 {:.3} ms, p99 {:.3} ms{}",
            r.series(),
            r.scenario,
            r.batch,
            r.throughput_per_s,
            r.latency_ms.p50,
            r.latency_ms.p99,
            r.mean_batch_size
                .map_or(String::new(), |m| format!(", mean batch {m:.1}"))
        ),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use streampool_nn::ComputeDType;

    use super::Args;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(flags: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(flags.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn dtype_axis_and_single_dtype_flags() {
        let a = parse(&["--dtypes", "f32,tf32,f16,bf16"]).unwrap();
        assert_eq!(
            a.dtypes,
            Some(vec![
                ComputeDType::F32,
                ComputeDType::Tf32,
                ComputeDType::F16,
                ComputeDType::Bf16
            ])
        );
        assert_eq!(
            parse(&["--dtype", "bf16"]).unwrap().dtype,
            Some(ComputeDType::Bf16)
        );
        assert!(parse(&["--dtype", "f16", "--dtypes", "f32"]).is_err());
        assert!(parse(&["--dtypes", "f8"]).is_err());
        let a = parse(&[]).unwrap();
        assert!(a.scenarios.iter().any(|s| s == "forward"));
        assert_eq!(a.embed_chunk, streampool_nn::DEFAULT_EMBED_CHUNK);
    }
}
