//! `streampool`: self-check, benchmarks and tools for the streampool runtime.

mod commands;

use clap::{Parser, Subcommand};

/// Concurrent inference runtime: many threads, one device, no crashes.
#[derive(Parser)]
#[command(name = "streampool", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Threads of the CPU device's intra-op pool, which every stream shares: one call uses
    /// them all, and many callers share them rather than each starting its own [default:
    /// the cores this process may use]
    #[arg(long, global = true, env = streampool::CPU_THREADS_ENV, value_name = "N")]
    cpu_threads: Option<usize>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a short self-test of the runtime on a device and report pass/fail.
    Check(commands::check::Args),
    /// Benchmark forward throughput from many threads.
    Bench(commands::bench::Args),
    /// Print sentence embeddings from a BERT-family model (the shipped tiny model by default).
    Embed(commands::embed::Args),
    /// Serve models over HTTP: KServe v2, OpenAI-style /v1/embeddings, Prometheus /metrics.
    #[command(after_help = commands::serve::AFTER_HELP)]
    Serve(commands::serve::Args),
    /// Run many ops and forwards from many threads (with churn) and check every result.
    Soak(commands::soak::Args),
    /// Measure a never-seen mixed-length corpus's first pass against its steady state, and
    /// where a new batch shape's first-call time goes.
    FirstUse(commands::first_use::Args),
    /// Load a running server (OpenAI /v1/embeddings or TEI /embed) from N keep-alive
    /// connections and report served sentences/s, latency, errors by status and its own CPU.
    Loadgen(commands::loadgen::Args),
}

fn main() -> anyhow::Result<()> {
    // First thing: `serve` and `embed` time their start-up phases from here.
    let start = std::time::Instant::now();
    let cli = Cli::parse();
    if let Some(n) = cli.cpu_threads {
        streampool::set_cpu_threads(n)?;
    }
    match cli.command {
        Command::Check(a) => commands::check::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Embed(a) => commands::embed::run(a, start),
        Command::Serve(a) => commands::serve::run(a, start),
        Command::Soak(a) => commands::soak::run(a),
        Command::Loadgen(a) => commands::loadgen::run(a),
        Command::FirstUse(a) => commands::first_use::run(a, start),
    }
}
