//! `streampool embed`: sentence embeddings from a model folder of any supported family (the
//! folder's own pooling and prompts).
//!
//! Which model: `--model DIR` if given; `--minilm` for all-MiniLM-L6-v2 installed by
//! `scripts/fetch-minilm.sh` (or named by `STREAMPOOL_MINILM_DIR`); otherwise the tiny model
//! shipped in the repository, `models/tiny-bert`, looked up under the current directory and
//! its parents, then under the parents of this executable (so `target/release/streampool` of a
//! checkout finds it from anywhere), then in the source tree the binary was built from.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use streampool::phases::{timed, Phases};
use streampool_nn::{find_minilm, find_tiny_bert, ComputeDType, SentenceEmbedder};

/// Arguments of `streampool embed`.
#[derive(clap::Args)]
pub struct Args {
    /// Device: cpu, cuda, cuda:N, wgpu or wgpu:ADAPTER.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Model folder with config.json, model.safetensors and tokenizer.json
    /// [default: the shipped tiny model, models/tiny-bert].
    #[arg(long, value_name = "DIR", conflicts_with = "minilm")]
    model: Option<PathBuf>,
    /// Use all-MiniLM-L6-v2 (install it with scripts/fetch-minilm.sh, or set
    /// STREAMPOOL_MINILM_DIR).
    #[arg(long)]
    minilm: bool,
    /// Compute dtype of weights and activations: f32, tf32 (f32 with TF32 tensor-core
    /// matmuls on CUDA), f16 or bf16 (fused attention and pooling, f32 statistics). The
    /// wgpu backend runs f32, tf32 (as f32) and f16 (where the adapter has SHADER_F16), not
    /// bf16. Embeddings are printed as f32 in every case. [default: f16 on cuda, f32 on cpu
    /// and wgpu]
    #[arg(long, value_name = "DTYPE")]
    dtype: Option<ComputeDType>,
    /// Prepend the model's prompt of this name (config_sentence_transformers.json), e.g.
    /// "query".
    #[arg(long, value_name = "NAME", conflicts_with = "prompt")]
    prompt_name: Option<String>,
    /// Prepend this text to every input (sentence-transformers' prompt).
    #[arg(long, value_name = "TEXT")]
    prompt: Option<String>,
    /// Print every embedding in full, as JSON.
    #[arg(long)]
    json: bool,
    /// Values shown per embedding without --json.
    #[arg(long, default_value_t = 6)]
    show: usize,
    /// Texts to embed (one batch).
    #[arg(required = true, value_name = "TEXT")]
    texts: Vec<String>,
}

/// Embeds the texts and prints the vectors; the start-up phases (from `start`) go to
/// stderr as one `startup:` line.
pub fn run(args: Args, start: Instant) -> Result<()> {
    let phases = Arc::new(Phases::starting_at(start));
    phases.scope(|| embed(args, &phases))
}

fn embed(args: Args, phases: &Arc<Phases>) -> Result<()> {
    let dev = timed("device context", || super::device::open(&args.device))?;
    let (dir, shipped) = match (&args.model, args.minilm) {
        (Some(dir), _) => (dir.clone(), false),
        (None, true) => (find_minilm()?, false),
        (None, false) => (find_tiny_bert()?, true),
    };
    let dtype = args
        .dtype
        .unwrap_or_else(|| super::device::default_dtype(&dev));
    let emb = super::startup::load_with_kernels(phases, &dev, || {
        SentenceEmbedder::load_with(&dev, &dir, dtype)
            .with_context(|| format!("loading the model in {} as {dtype}", dir.display()))
    })?;
    if shipped && !args.json {
        eprintln!(
            "note: {} has random weights (a test model, no setup needed); \
             use --minilm for meaningful embeddings",
            dir.display()
        );
    }
    let texts: Vec<&str> = args.texts.iter().map(String::as_str).collect();
    let prompt = emb.resolve_prompt(args.prompt_name.as_deref(), args.prompt.as_deref())?;
    let vectors = timed("embed", || emb.embed_with_prompt(&texts, prompt))?;
    eprintln!("startup: done after {}", phases.summary());
    if args.json {
        let embeddings: Vec<_> = texts
            .iter()
            .zip(&vectors)
            .map(|(t, v)| serde_json::json!({ "text": t, "embedding": v }))
            .collect();
        let out = serde_json::json!({
            "model": dir.display().to_string(),
            "device": dev.name(),
            "dim": emb.dim(),
            "embeddings": embeddings,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let pooling = emb.pooling();
    println!(
        "model {} ({:?}) on {}: {} dims, {:?} pooling{}{}",
        dir.display(),
        emb.model().family(),
        dev.name(),
        emb.dim(),
        pooling.mode,
        if pooling.normalize {
            ", L2-normalised"
        } else {
            ""
        },
        prompt
            .map(|p| format!(", prompt {p:?}"))
            .unwrap_or_default()
    );
    for (i, (t, v)) in texts.iter().zip(&vectors).enumerate() {
        let shown: Vec<String> = v
            .iter()
            .take(args.show)
            .map(|x| format!("{x:.6}"))
            .collect();
        let more = if v.len() > args.show { ", ..." } else { "" };
        println!("[{i}] {t:?}");
        println!("    [{}{more}] ({} values)", shown.join(", "), v.len());
    }
    Ok(())
}
