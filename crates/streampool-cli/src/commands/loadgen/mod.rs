//! `streampool loadgen`: an HTTP load generator for `streampool serve` (or any server with
//! OpenAI's `/v1/embeddings` or TEI's `/embed`), so the served figures are measured by the
//! project itself, on machines with no `wrk` and where a Python client would be the
//! bottleneck.
//!
//! N closed-loop clients, each on its own keep-alive HTTP/1.1 connection (no pipelining),
//! send requests of K sentences from a fixed-seed corpus (short: 10-16 tokens, long: 128),
//! over a warm-up and a measured window. Every 2xx answer is checked (count, order, width,
//! finite values) and a malformed one is an error. Reported per point: requests/s, served
//! sentences/s, latency percentiles of served answers, answers by status, transport errors,
//! bytes, the load generator's own CPU use in cores (so it is seen not to be the
//! bottleneck), and from the server's `/metrics` the batches, mean batch size, device busy
//! time and, with `serve --phase-timing`, the mean host time per phase of a request.
//! `--concurrency 1,16,64,256` sweeps; `--until-errors` stops a sweep at the first point
//! with errors (where 503s begin).
//!
//! A separate subcommand rather than `bench --served`: `bench` loads models in-process on a
//! device and shares its JSON schema with `bench/torch_baseline.py`; this one needs no
//! device and no model, only a server's address, and may run on another host.

mod check;
mod corpus;
mod http;
mod run;
mod server;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use check::Expect;
pub use corpus::{Corpus, Encoding, Route};
use run::{quantile_ms, Load, Measured, Target};
use server::ServerDelta;

/// Arguments of `streampool loadgen`.
#[derive(clap::Args)]
pub struct Args {
    /// Base URL of the server (http only).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// API: openai (POST /v1/embeddings) or tei (POST /embed).
    #[arg(long, value_enum, default_value = "openai")]
    route: Route,
    /// OpenAI's encoding_format: float or base64.
    #[arg(long, value_enum, default_value = "float")]
    encoding: Encoding,
    /// OpenAI's "model" field [default: omitted: the server's first embedder].
    #[arg(long)]
    model: Option<String>,
    /// Sentences per request (one: sent as a single string).
    #[arg(long, short = 'k', default_value_t = 1)]
    inputs_per_request: usize,
    /// Sentence lengths: short (10-16 tokens), long (128 tokens) or mixed (8-256 tokens,
    /// long-tailed: the lengths of `bench`'s minilm-mix workload).
    #[arg(long, value_enum, default_value = "short")]
    corpus: Corpus,
    /// Concurrent connections (clients); a list runs one point each, in order.
    #[arg(long, short = 'c', value_delimiter = ',', default_value = "1")]
    concurrency: Vec<usize>,
    /// Seconds measured per point, after the warm-up [default: 10, unless --requests].
    #[arg(long)]
    duration: Option<f64>,
    /// Requests measured per point (with --duration, whichever ends first).
    #[arg(long)]
    requests: Option<u64>,
    /// Seconds of warm-up per point (sent, checked, not counted).
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Seconds to wait for one answer before counting a transport error.
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
    /// Client threads [default: the cores this process may run on].
    #[arg(long)]
    threads: Option<usize>,
    /// Embedding width every answer must have [default: the first well-formed answer's].
    #[arg(long)]
    dim: Option<usize>,
    /// tokenizer.json (or a model folder) to count the corpus's tokens with [default: the
    /// shipped tiny-bert's, BERT's uncased vocabulary as all-MiniLM-L6-v2's].
    #[arg(long, value_name = "PATH")]
    tokenizer: Option<PathBuf>,
    /// Distinct request bodies per point (clients cycle through them).
    #[arg(long, default_value_t = 256)]
    pool: usize,
    /// Stop a --concurrency sweep after the first point with any error (e.g. 503s).
    #[arg(long)]
    until_errors: bool,
    /// The server's process id: its CPU use over each window is reported too.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Wait up to this many seconds for GET /health to answer 200 before starting.
    #[arg(long, default_value_t = 0.0)]
    wait_ready: f64,
    /// Write every point as JSON here (rewritten after each point).
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Token counts of the corpus's sentences (special tokens included).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Tokens {
    pub min: usize,
    pub mean: f64,
    pub max: usize,
}

/// Latency of served answers, milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Latency {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

/// Load generator CPU over the window.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Cpu {
    pub user_s: f64,
    pub sys_s: f64,
    /// (user + system) / window: cores busy on average.
    pub cores: f64,
}

/// One measured point, as printed and written to JSON.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub url: String,
    pub route: Route,
    pub path: &'static str,
    pub encoding: Encoding,
    pub corpus: Corpus,
    pub inputs_per_request: usize,
    pub tokens_per_input: Option<Tokens>,
    /// The embedding width answers had (0: no well-formed answer).
    pub dim: usize,
    pub concurrency: usize,
    pub client_threads: usize,
    pub warmup_s: f64,
    pub window_s: f64,
    /// Requests counted in the window: answered (any status) plus transport errors.
    pub requests: u64,
    /// Answers by HTTP status.
    pub answered: BTreeMap<u16, u64>,
    /// Connect failures, resets, answers cut short, timeouts.
    pub io_errors: u64,
    /// 2xx answers that failed the check (wrong count, order, width or values).
    pub malformed: u64,
    /// Non-2xx answers + transport errors + malformed answers.
    pub errors: u64,
    /// Well-formed 2xx answers.
    pub served: u64,
    /// `served * inputs_per_request`.
    pub sentences: u64,
    pub requests_per_s: f64,
    pub sentences_per_s: f64,
    pub latency_ms: Latency,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub loadgen_cpu: Cpu,
    pub server: Option<ServerDelta>,
    pub first_error: Option<String>,
}

/// What every point of a run shares.
pub struct Shape {
    pub url: String,
    pub route: Route,
    pub encoding: Encoding,
    pub corpus: Corpus,
    pub inputs_per_request: usize,
    pub tokens: Option<Tokens>,
    pub client_threads: usize,
}

/// Summarizes one point's measurements.
pub fn summarize(m: &Measured, shape: &Shape, load: &Load, dim: usize) -> Point {
    let secs = m.span.as_secs_f64().max(1e-9);
    let answered_2xx: u64 = m
        .statuses
        .iter()
        .filter(|(s, _)| (200..300).contains(*s))
        .map(|(_, n)| n)
        .sum();
    let answered: u64 = m.statuses.values().sum();
    let served = answered_2xx - m.malformed;
    let lat = &m.latencies_ns;
    let mean = if lat.is_empty() {
        0.0
    } else {
        lat.iter().sum::<u64>() as f64 / lat.len() as f64 / 1e6
    };
    let sentences = served * shape.inputs_per_request as u64;
    let has_metrics = m.server_before.series.is_some() && m.server_after.series.is_some();
    let has_cpu = m.server_before.cpu_s.is_some() && m.server_after.cpu_s.is_some();
    Point {
        url: shape.url.clone(),
        route: shape.route,
        path: shape.route.path(),
        encoding: shape.encoding,
        corpus: shape.corpus,
        inputs_per_request: shape.inputs_per_request,
        tokens_per_input: shape.tokens,
        dim,
        concurrency: load.concurrency,
        client_threads: shape.client_threads,
        warmup_s: load.warmup.as_secs_f64(),
        window_s: secs,
        requests: m.sent,
        answered: m.statuses.clone(),
        io_errors: m.io_errors,
        malformed: m.malformed,
        errors: (answered - answered_2xx) + m.io_errors + m.malformed,
        served,
        sentences,
        requests_per_s: m.sent as f64 / secs,
        sentences_per_s: sentences as f64 / secs,
        latency_ms: Latency {
            p50: quantile_ms(lat, 0.5),
            p90: quantile_ms(lat, 0.9),
            p99: quantile_ms(lat, 0.99),
            max: quantile_ms(lat, 1.0),
            mean,
        },
        bytes_sent: m.bytes_sent,
        bytes_received: m.bytes_received,
        loadgen_cpu: Cpu {
            user_s: m.cpu_user_s,
            sys_s: m.cpu_sys_s,
            cores: (m.cpu_user_s + m.cpu_sys_s) / secs,
        },
        server: (has_metrics || has_cpu).then(|| {
            ServerDelta::between(
                &m.server_before,
                &m.server_after,
                m.span,
                shape.route.path(),
            )
        }),
        first_error: m.first_error.clone(),
    }
}

/// The table's header.
pub fn header() -> String {
    format!(
        "{:<7} {:>3} {:<5} {:>5} {:>9} {:>10} {:>8} {:>8} {:>8} {:>6} {:>6} {:>6} {:>6} {:>6}  answers",
        "route", "K", "text", "conns", "req/s", "sent/s", "p50 ms", "p90 ms", "p99 ms",
        "errors", "lg cpu", "sv cpu", "batch", "busy"
    )
}

/// One table line (and, with phase timing, a second with the phases).
pub fn line(p: &Point) -> String {
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |x| format!("{x:.prec$}"));
    let server = p.server.as_ref();
    let answers: Vec<String> = p
        .answered
        .iter()
        .map(|(s, n)| format!("{s}:{n}"))
        .chain((p.io_errors > 0).then(|| format!("io:{}", p.io_errors)))
        .chain((p.malformed > 0).then(|| format!("malformed:{}", p.malformed)))
        .collect();
    let mut out = format!(
        "{:<7} {:>3} {:<5} {:>5} {:>9.0} {:>10.0} {:>8.3} {:>8.3} {:>8.3} {:>6} {:>6.2} {:>6} {:>6} {:>6}  {}",
        format!("{:?}", p.route).to_lowercase(),
        p.inputs_per_request,
        format!("{:?}", p.corpus).to_lowercase(),
        p.concurrency,
        p.requests_per_s,
        p.sentences_per_s,
        p.latency_ms.p50,
        p.latency_ms.p90,
        p.latency_ms.p99,
        p.errors,
        p.loadgen_cpu.cores,
        opt(server.and_then(|s| s.cpu_cores), 2),
        opt(server.and_then(|s| s.mean_batch_size), 1),
        opt(server.and_then(|s| s.device_busy_per_s), 2),
        answers.join(" ")
    );
    if let Some(s) = server.filter(|s| !s.phases.is_empty()) {
        let phases: Vec<String> = server::PHASES
            .iter()
            .filter_map(|ph| s.phases.get(*ph).map(|m| format!("{ph} {:.1}", m.mean_us)))
            .collect();
        out.push_str(&format!(
            "\n        host phases, mean us per request: {}",
            phases.join(", ")
        ));
    }
    if let Some(e) = &p.first_error {
        out.push_str(&format!("\n        first error: {e}"));
    }
    out
}

/// `http://host[:port]` to an address and a Host header.
async fn resolve(url: &str) -> Result<Target> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("--url {url:?}: expected http://HOST[:PORT]"))?;
    let authority = rest.split('/').next().unwrap_or(rest);
    let with_port = if authority
        .rsplit_once(':')
        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
    {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let addr: SocketAddr = tokio::net::lookup_host(&with_port)
        .await
        .with_context(|| format!("resolving {with_port}"))?
        .next()
        .with_context(|| format!("{with_port} resolves to no address"))?;
    Ok(Target {
        addr,
        host: authority.to_string(),
    })
}

fn seconds(what: &str, s: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(s)
        .with_context(|| format!("{what} must be a non-negative number of seconds"))
}

/// Runs the points and prints a line for each.
pub fn run(args: Args) -> Result<()> {
    if args.inputs_per_request == 0 || args.concurrency.contains(&0) || args.pool == 0 {
        bail!("--inputs-per-request, --concurrency and --pool take positive values");
    }
    if args.route == Route::Tei && args.encoding == Encoding::Base64 {
        bail!("TEI's /embed answers floats only: --encoding base64 needs --route openai");
    }
    let duration = match (args.duration, args.requests) {
        (None, None) => Some(Duration::from_secs(10)),
        (d, _) => d.map(|d| seconds("--duration", d)).transpose()?,
    };
    if duration.is_some_and(|d| d.is_zero()) || args.requests == Some(0) {
        bail!("--duration and --requests must be positive");
    }
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async {
        let target = resolve(&args.url).await?;
        if args.wait_ready > 0.0 {
            server::wait_ready(&target, seconds("--wait-ready", args.wait_ready)?).await?;
        }
        let tokenizer = args
            .tokenizer
            .clone()
            .or_else(|| streampool_nn::find_tiny_bert().ok());
        let tokens = match &tokenizer {
            Some(path) => {
                let texts = corpus::sentences(args.corpus, 1000);
                let (min, mean, max) = corpus::token_counts(path, &texts)?;
                Some(Tokens { min, mean, max })
            }
            None => None,
        };
        let shape = Shape {
            url: args.url.clone(),
            route: args.route,
            encoding: args.encoding,
            corpus: args.corpus,
            inputs_per_request: args.inputs_per_request,
            tokens,
            client_threads: threads,
        };
        let requests = Arc::new(corpus::requests(
            &target.host,
            args.route,
            args.encoding,
            args.model.as_deref(),
            args.corpus,
            args.inputs_per_request,
            args.pool,
        ));
        let expect = Arc::new(Expect::new(
            args.route,
            args.encoding,
            args.inputs_per_request,
            args.dim,
        ));
        println!(
            "streampool loadgen: {} {}{} x {} {} sentence(s){}, {threads} client threads, \
             warm-up {} s, window {}",
            args.url,
            args.route.path(),
            if args.route == Route::Openai {
                format!(" ({:?})", args.encoding).to_lowercase()
            } else {
                String::new()
            },
            args.inputs_per_request,
            format!("{:?}", args.corpus).to_lowercase(),
            tokens.map_or(String::new(), |t| format!(
                " ({}-{} tokens, mean {:.1})",
                t.min, t.max, t.mean
            )),
            args.warmup,
            match (duration, args.requests) {
                (Some(d), Some(n)) => format!("{} s or {n} requests", d.as_secs_f64()),
                (Some(d), None) => format!("{} s", d.as_secs_f64()),
                (None, Some(n)) => format!("{n} requests"),
                (None, None) => unreachable!("a duration is set when requests is not"),
            }
        );
        println!("{}", header());
        let mut points = Vec::new();
        for &concurrency in &args.concurrency {
            let load = Load {
                concurrency,
                warmup: seconds("--warmup", args.warmup)?,
                duration,
                requests: args.requests,
                timeout: seconds("--timeout", args.timeout)?,
            };
            let m = run::run_point(
                &target,
                &load,
                requests.clone(),
                expect.clone(),
                args.server_pid,
            )
            .await;
            let p = summarize(&m, &shape, &load, expect.dim());
            println!("{}", line(&p));
            let stop = args.until_errors && p.errors > 0;
            points.push(p);
            if let Some(path) = &args.json {
                write_json(path, &points)?;
            }
            if stop {
                println!("(stopping the sweep: errors at {concurrency} connections)");
                break;
            }
        }
        Ok(())
    })
}

fn write_json(path: &std::path::Path, points: &[Point]) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let doc = serde_json::json!({
        "tool": "streampool loadgen",
        "date": super::bench::utc_now(),
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "points": points,
    });
    std::fs::write(path, serde_json::to_vec_pretty(&doc)?)
        .with_context(|| format!("writing {}", path.display()))
}
