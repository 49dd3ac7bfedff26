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
    // Logging before the settings, so that a variable that does not parse is reported.
    init_logging(matches!(cli.command, Command::Serve(_)));
    configure(cli.cpu_threads)?;
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

/// Fixes the process's settings before any device or model is touched: the environment's
/// (every variable in `docs/configuration.md`), with the command line's flags over them.
fn configure(cpu_threads: Option<usize>) -> anyhow::Result<()> {
    let mut tuning = streampool::config::Tuning::from_env();
    if let Some(n) = cpu_threads {
        anyhow::ensure!(
            n > 0,
            "--cpu-threads: the CPU pool needs at least one thread"
        );
        tuning.cpu.threads = Some(n);
    }
    streampool::config::set(tuning)?;
    streampool_nn::settings::set(streampool_nn::settings::Settings::from_env())?;
    Ok(())
}

/// Logs to stderr; `RUST_LOG` filters. Without it: `info` for `serve` (its start-up and
/// request logs), `warn` for the other commands, whose output is their report. The cuBLASLt
/// tuning log (a line per product shape timed on first use) is off unless `RUST_LOG` turns
/// it on or `STREAMPOOL_CUBLASLT_TUNE_LOG` is set.
fn init_logging(serve: bool) {
    use tracing_subscriber::EnvFilter;
    let tune_log = std::env::var_os("STREAMPOOL_CUBLASLT_TUNE_LOG").is_some();
    let target = streampool::config::CUBLASLT_TUNE_LOG_TARGET;
    let tune = format!("{target}={}", if tune_log { "info" } else { "warn" });
    let filter = match EnvFilter::try_from_default_env() {
        Ok(f) if tune_log => f.add_directive(tune.parse().expect("a valid directive")),
        Ok(f) => f,
        Err(_) => EnvFilter::new(format!("{},{tune}", if serve { "info" } else { "warn" })),
    };
    // Fails only when a subscriber is already set, which then keeps logging.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
