//! `streampool`: self-check, benchmarks and tools for the streampool runtime.

mod commands;

use clap::{Parser, Subcommand};

/// Concurrent inference runtime: many threads, one device, no crashes.
#[derive(Parser)]
#[command(name = "streampool", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
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
}

fn main() -> anyhow::Result<()> {
    // First thing: `serve` and `embed` time their start-up phases from here.
    let start = std::time::Instant::now();
    let cli = Cli::parse();
    match cli.command {
        Command::Check(a) => commands::check::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Embed(a) => commands::embed::run(a, start),
        Command::Serve(a) => commands::serve::run(a, start),
        Command::Soak(a) => commands::soak::run(a),
    }
}
