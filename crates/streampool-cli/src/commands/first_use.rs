//! `streampool first-use`: what a never-seen corpus costs on its first pass, against the same
//! corpus's steady state, in one process; and where a new batch shape's first-call time goes.
//!
//! 1. Start-up: the device opened with the flags' kernel and tuning settings, the model
//!    loaded (kernels built beside it), a one-sentence warm-up; the `startup:` phases.
//! 2. Passes: `--passes` calls of `SentenceEmbedder::embed` over the same mixed-length
//!    corpus (`--texts` texts of 3 to 220 words, drawn with `--seed`); the first is the
//!    first pass, the median of the third and later the steady state. Each pass's phases
//!    (cuBLASLt plans and tuning, `cuMemAlloc`, graph first calls and captures) are kept.
//! 3. With `--per-shape N`: N batches of a second corpus (another seed, so new shapes),
//!    each run three times in a row, synchronously: the first call of the shape, the call
//!    that captures its graph, a replay. The first call minus the replay is the shape's
//!    first-use cost, split by phases.
//!
//! Everything goes to `--json` as well as a table on stdout.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use streampool::phases::{timed, Phases};
use streampool::{Device, DeviceConfig, KernelCacheDir};
use streampool_nn::{ComputeDType, SentenceEmbedder, ShapeBuckets};

#[derive(clap::Args)]
pub struct Args {
    /// Model folder (safetensors, config.json, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// `cpu` or `cuda[:N]`.
    #[arg(long, default_value = "cuda")]
    device: String,
    /// Compute dtype [default: f16 on cuda, f32 on cpu].
    #[arg(long)]
    dtype: Option<ComputeDType>,
    /// Texts in the corpus.
    #[arg(long, default_value_t = 8192)]
    texts: usize,
    /// Texts per device batch (`SentenceEmbedder::with_chunk_size`).
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Seed of the corpus (another seed: other texts, other shapes).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Calls over the corpus; the steady state is the median of the third and later.
    #[arg(long, default_value_t = 5)]
    passes: usize,
    /// Shape buckets: steps per octave (0: off, every batch at its own shape).
    #[arg(long, default_value_t = ShapeBuckets::default().steps_per_octave)]
    buckets: u32,
    /// Load the kernels embedded at build time where the GPU runs them.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    embedded_kernels: bool,
    /// The kernel cache folder, or `off` [default: as the environment says].
    #[arg(long)]
    kernel_cache: Option<String>,
    /// Keep cuBLASLt tuning choices on disk beside the kernel cache.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    tuning_cache: bool,
    /// Before the passes, tune (or read from the tuning cache) every cuBLASLt bucket of
    /// batches up to this many tokens (`SentenceEmbedder::warm_up_tuning`) [default: batch x
    /// the tokenizer's length limit; 0: none, tuning then happens in the first pass].
    #[arg(long)]
    warm_up_tokens: Option<usize>,
    /// Batches of a second corpus to profile shape by shape (0: none).
    #[arg(long, default_value_t = 0)]
    per_shape: usize,
    /// Where to write the JSON report.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(args: Args, start: Instant) -> Result<()> {
    let phases = Arc::new(Phases::starting_at(start));
    let (emb, dev) = phases.scope(|| load(&args, &phases))?;
    let ready = phases.elapsed();
    eprintln!("startup: ready after {}", phases.summary());
    let startup = json!({
        "ready_s": ready.as_secs_f64(),
        "phases": phases_json(&phases),
    });

    let corpus = corpus(args.texts, args.seed);
    let texts: Vec<&str> = corpus.iter().map(String::as_str).collect();
    let mut passes = Vec::new();
    let mut first_out: Vec<Vec<f32>> = Vec::new();
    let mut min_cos_vs_first = 1.0f64;
    for pass in 1..=args.passes.max(1) {
        let p = Arc::new(Phases::new());
        let began = Instant::now();
        let out = p.scope(|| emb.embed(&texts))?;
        let secs = began.elapsed().as_secs_f64();
        if out.len() != texts.len() {
            bail!(
                "pass {pass}: {} embeddings for {} texts",
                out.len(),
                texts.len()
            );
        }
        // Every pass computes the same embeddings (eager first calls, captures, replays).
        if first_out.is_empty() {
            first_out = out;
        } else {
            for (a, b) in first_out.iter().zip(&out) {
                min_cos_vs_first = min_cos_vs_first.min(cos(a, b));
            }
        }
        println!(
            "pass {pass}: {:.1} ms, {:.0} texts/s; {}",
            secs * 1e3,
            texts.len() as f64 / secs,
            phase_line(&p)
        );
        passes.push(json!({
            "pass": pass,
            "seconds": secs,
            "texts_per_s": texts.len() as f64 / secs,
            "phases": phases_json(&p),
        }));
    }
    let rate = |p: &Value| p["texts_per_s"].as_f64().unwrap_or(0.0);
    let first = passes.first().map_or(0.0, rate);
    let mut steady: Vec<f64> = passes.iter().skip(2).map(rate).collect();
    steady.sort_by(f64::total_cmp);
    let steady = steady.get(steady.len() / 2).copied().unwrap_or(first);
    println!(
        "first pass {first:.0} texts/s, steady state {steady:.0} texts/s: {:.1}%; \
         min cosine of later passes to the first {min_cos_vs_first:.6}",
        100.0 * first / steady
    );

    let per_shape = if args.per_shape > 0 {
        per_shape(&emb, args.per_shape, args.batch, args.seed + 1)?
    } else {
        Vec::new()
    };

    if let Some(path) = &args.json {
        let report = json!({
            "device": dev.name(),
            "model": args.model.display().to_string(),
            "dtype": emb.model().dtype().to_string(),
            "texts": args.texts,
            "batch": args.batch,
            "seed": args.seed,
            "buckets_per_octave": args.buckets,
            "embedded_kernels": args.embedded_kernels,
            "kernel_cache": args.kernel_cache,
            "tuning_cache": args.tuning_cache,
            "warm_up_tokens": args.warm_up_tokens,
            "startup": startup,
            "passes": passes,
            "first_pass_texts_per_s": first,
            "steady_texts_per_s": steady,
            "first_over_steady": first / steady,
            "min_cosine_later_passes_vs_first": min_cos_vs_first,
            // To compare runs (embedded vs compiled kernels, buckets on vs off).
            "sample_embeddings": first_out.iter().take(16).collect::<Vec<_>>(),
            "per_shape": per_shape,
        });
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The device (with the flags' kernel and tuning settings) and the model, warmed up with
/// one sentence.
fn load(args: &Args, phases: &Arc<Phases>) -> Result<(SentenceEmbedder, Device)> {
    let config = DeviceConfig {
        kernel_cache: match args.kernel_cache.as_deref() {
            None => KernelCacheDir::FromEnv,
            Some("off") => KernelCacheDir::Off,
            Some(dir) => KernelCacheDir::Dir(dir.into()),
        },
        embedded_kernels: args.embedded_kernels,
        tuning_cache: args.tuning_cache,
        ..DeviceConfig::default()
    };
    let dev = timed("device context", || open(&args.device, config))?;
    let dtype = args
        .dtype
        .unwrap_or_else(|| super::device::default_dtype(&dev));
    let emb = super::startup::load_with_kernels(phases, &dev, || {
        SentenceEmbedder::load_with(&dev, &args.model, dtype)
            .with_context(|| format!("loading {} as {dtype}", args.model.display()))
    })?
    .with_chunk_size(args.batch)
    .with_shape_buckets(ShapeBuckets {
        steps_per_octave: args.buckets,
    });
    timed("warm-up forward", || emb.embed(&["a one-sentence warm-up"]))?;
    let tokens = args
        .warm_up_tokens
        .unwrap_or(args.batch * emb.tokenizer().max_len());
    emb.warm_up_tuning(tokens)?;
    Ok((emb, dev))
}

fn open(spec: &str, config: DeviceConfig) -> Result<Device> {
    if spec == "cpu" {
        return Ok(Device::cpu_with(config)?);
    }
    let Some(ordinal) = spec
        .strip_prefix("cuda")
        .map(|r| r.strip_prefix(':').unwrap_or(r))
    else {
        bail!("device {spec:?}: expected cpu, cuda or cuda:N");
    };
    let ordinal: usize = if ordinal.is_empty() {
        0
    } else {
        ordinal
            .parse()
            .with_context(|| format!("device {spec:?}"))?
    };
    open_cuda(ordinal, config)
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize, config: DeviceConfig) -> Result<Device> {
    Ok(Device::cuda_with(ordinal, config)?)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_ordinal: usize, _config: DeviceConfig) -> Result<Device> {
    bail!("this binary was built without CUDA support; rebuild with `--features cuda`")
}

/// `n` batches of `batch` texts of a corpus drawn with `seed`, each run three times in a
/// row and read back (synchronous): first call, capture, replay.
fn per_shape(emb: &SentenceEmbedder, n: usize, batch: usize, seed: u64) -> Result<Vec<Value>> {
    let corpus = corpus(n * batch, seed);
    let mut rows = Vec::new();
    println!("shape     rows x len (padded)  first ms  second ms  replay ms  first-use ms  phases of the first call");
    for chunk in corpus.chunks(batch) {
        let texts: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let input = emb.tokenize(&texts)?;
        let tokens: i64 = input.attention_mask().iter().sum();
        let mut calls = Vec::new();
        let mut first_phases = None;
        for _ in 0..3 {
            let p = Arc::new(Phases::new());
            let began = Instant::now();
            let flat =
                p.scope(|| -> Result<Vec<f32>> { Ok(emb.embed_input(&input)?.to_vec::<f32>()?) })?;
            calls.push(began.elapsed());
            if flat.len() != texts.len() * emb.dim() {
                bail!("{} values for {} texts", flat.len(), texts.len());
            }
            first_phases.get_or_insert(p);
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        // The loop above ran three times and set it on the first.
        let p = first_phases.expect("three calls ran");
        println!(
            "{:>4}      {:>4} x {:<4} {:>6}    {:>8.2}  {:>9.2}  {:>9.2}  {:>12.2}  {}",
            rows.len(),
            input.batch_size(),
            input.seq_len(),
            tokens,
            ms(calls[0]),
            ms(calls[1]),
            ms(calls[2]),
            ms(calls[0]) - ms(calls[2]),
            phase_line(&p)
        );
        rows.push(json!({
            "rows": input.batch_size(),
            "seq_len": input.seq_len(),
            "tokens": tokens,
            "first_ms": ms(calls[0]),
            "second_ms": ms(calls[1]),
            "replay_ms": ms(calls[2]),
            "first_use_ms": ms(calls[0]) - ms(calls[2]),
            "phases": phases_json(&p),
        }));
    }
    Ok(rows)
}

fn cos(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let n = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b)).max(1e-300)
}

fn phases_json(p: &Phases) -> Value {
    p.phases()
        .iter()
        .map(|ph| {
            json!({
                "name": ph.name,
                "ms": ph.time.as_secs_f64() * 1e3,
                "runs": ph.runs,
            })
        })
        .collect()
}

fn phase_line(p: &Phases) -> String {
    p.phases()
        .iter()
        .map(|ph| {
            format!(
                "{} {:.2} ms x{}",
                ph.name,
                ph.time.as_secs_f64() * 1e3,
                ph.runs
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `n` texts of 3 to 220 words (uniform), words drawn from a fixed list by a seeded
/// generator: a mixed-length corpus whose shapes depend on `seed`.
pub fn corpus(n: usize, seed: u64) -> Vec<String> {
    const WORDS: &[&str] = &[
        "the",
        "model",
        "server",
        "answers",
        "requests",
        "from",
        "many",
        "threads",
        "while",
        "a",
        "graph",
        "replays",
        "kernels",
        "on",
        "one",
        "stream",
        "of",
        "each",
        "device",
        "batch",
        "sentences",
        "vary",
        "in",
        "length",
        "and",
        "tokens",
        "cost",
        "time",
        "memory",
        "grows",
        "when",
        "shapes",
        "change",
        "quickly",
        "river",
        "mountain",
        "library",
        "window",
        "garden",
        "history",
        "science",
        "music",
        "weather",
        "market",
        "engine",
        "question",
        "reason",
        "people",
        "language",
        "number",
        "between",
        "under",
        "above",
        "through",
        "without",
        "because",
        "although",
        "however",
        "therefore",
        "embedding",
        "vector",
        "search",
        "retrieval",
        "ranking",
        "document",
        "paragraph",
        "ocean",
        "forest",
        "city",
        "village",
        "teacher",
        "student",
        "doctor",
        "patient",
        "computer",
        "network",
        "signal",
        "energy",
        "light",
        "shadow",
        "morning",
        "evening",
    ];
    // xorshift64*: deterministic across platforms, no dependency.
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    (0..n)
        .map(|_| {
            let words = 3 + (next() % 218) as usize;
            (0..words)
                .map(|_| WORDS[(next() % WORDS.len() as u64) as usize])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}
