//! `streampool serve`: the HTTP inference server (KServe v2, OpenAI-style embeddings,
//! Prometheus metrics) on the embedding model(s) given, plus the demo MLP.
//!
//! With no `--model` it serves the tiny model shipped in the repository (`models/tiny-bert`,
//! found as `streampool embed` finds it), so it starts with no setup.
//!
//! `--device` may name several devices (`cuda:all`, `cuda:0,cuda:1`, `cpu:0,cpu:1`): every
//! model is then loaded once per device (in parallel), each copy gets its own batch queue,
//! and a router sends each request to the least loaded copy.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use streampool::phases::{timed, Phases};
use streampool_core::{LoaderConfig, ModelLoader};
use streampool_nn::{find_minilm, find_tiny_bert, ComputeDType};
use streampool_serve::{
    ApiKey, AppState, BatchConfig, ModelSpec, ServeConfig, Server, TensorModel,
};

/// `serve --help`'s closing text: start-up and the kernel cache.
pub const AFTER_HELP: &str = "\
Start-up: when ready, one `startup:` log line gives the time of each phase (device context, \
kernels, weights read/uploaded/converted, tokenizer, warm-up forward, socket bound).

Kernel cache (CUDA): compiled kernels (a cubin for the GPU's architecture) are kept on disk, \
so later starts skip NVRTC. Folder: $STREAMPOOL_CACHE_DIR, else $STREAMPOOL_CACHE/kernels, \
else $XDG_CACHE_HOME/streampool/kernels, else ~/.cache/streampool/kernels. \
STREAMPOOL_KERNEL_CACHE=off turns it off; an unwritable folder is logged, never an error.";

/// Arguments of `streampool serve`.
#[derive(clap::Args)]
pub struct Args {
    /// Device(s): cpu, cpu:N, cuda, cuda:N, cuda:all, wgpu,
    /// wgpu:ADAPTER, or a comma-separated list (one model
    /// replica per device, requests to the least loaded).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Model folder (config.json, model.safetensors, tokenizer.json; any supported family:
    /// BERT, XLM-RoBERTa/CamemBERT, MPNet, GTE, Qwen3); repeat to serve several, each under
    /// its folder's name. An embedder's folder also gives its pooling and prompts
    /// (sentence-transformers' files); a *ForSequenceClassification folder is served as a
    /// reranker/classifier (TEI's /rerank and /predict) [default: the shipped
    /// models/tiny-bert].
    #[arg(long, value_name = "DIR")]
    model: Vec<PathBuf>,
    /// A model repository: every sub-folder holding a config.json is a model, served under
    /// the folder's name and loaded at start-up. An optional streampool.toml in a model's
    /// folder sets its dtype, priority ("high": latency-critical, its batches never wait
    /// for other models' and run on high-priority streams; "normal"; "low": bulk), weight
    /// (its share of the device within its class), workers, max_batch_size,
    /// max_batch_tokens, max_seq_len and truncate. While serving, KServe's repository API
    /// loads, replaces and unloads models: POST /v2/repository/index,
    /// /v2/repository/models/NAME/load, /v2/repository/models/NAME/unload.
    #[arg(long, value_name = "DIR")]
    model_dir: Option<PathBuf>,
    /// Most device memory (MiB) the served models may hold per device; a load past it is
    /// refused with 507 and how much it needs. On CUDA the device's free memory bounds it
    /// too [default: no budget but the device's].
    #[arg(long, value_name = "MIB")]
    memory_budget_mb: Option<u64>,
    /// Also serve all-MiniLM-L6-v2 (installed by scripts/fetch-minilm.sh) as "all-MiniLM-L6-v2".
    #[arg(long)]
    minilm: bool,
    /// Do not serve the demo MLP ("mlp": FP32 [N, 256] -> [N, 256], seed 0).
    #[arg(long)]
    no_mlp: bool,
    /// Compute dtype of the embedding models: f32, tf32 (TF32 tensor-core matmuls on CUDA),
    /// f16 or bf16 (fused attention and pooling). The wgpu backend runs all but bf16 (f16
    /// where the adapter has SHADER_F16). Responses
    /// are f32 in every case; the MLP stays f32. [default: f16 on cuda, f32 on cpu and wgpu]
    #[arg(long, value_name = "DTYPE")]
    dtype: Option<ComputeDType>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to listen on (0: any free port; the log says which).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Largest request body, in bytes (larger: 413).
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// Most inputs per request (more: 413). A request of more inputs than a batch holds is
    /// split into batches and answered as one; this bounds the memory one request holds.
    #[arg(
        long,
        visible_alias = "max-client-batch-size",
        default_value_t = 16_384
    )]
    max_inputs: usize,
    /// Most tensor elements per KServe request, summed over its inputs (more: 413, checked
    /// before anything is allocated).
    #[arg(long, default_value_t = 4 << 20)]
    max_elements: usize,
    /// Seconds a client may take to send a request body (slower: 408, connection closed).
    #[arg(long, default_value_t = 30.0)]
    body_timeout_s: f64,
    /// Seconds a client may take to send a request's headers, from its connection's accept
    /// (first request) or from the first byte of a later request; slower: the connection is
    /// closed. Also closes connections opened and never used.
    #[arg(long, default_value_t = 10.0)]
    header_read_timeout_s: f64,
    /// Seconds a keep-alive connection may stay idle between requests before it is closed.
    /// Behind a load balancer that pools connections, keep it above the balancer's idle
    /// timeout (60 s on the common ones).
    #[arg(long, default_value_t = 75.0)]
    keep_alive_timeout_s: f64,
    /// Most connections open at once; past it a new connection is answered 503 with
    /// Retry-After and closed, while those open are served as before. Lowered at start-up
    /// (with a warning) to fit the open-file limit, which is first raised to its hard limit.
    #[arg(long, default_value_t = 4096)]
    max_connections: usize,
    /// Require `Authorization: Bearer <key>` on every inference and model route, with the
    /// key in the first line of this file (e.g. a mounted Kubernetes Secret). Health probes
    /// stay open; /metrics too unless --protect-metrics. Serve TLS in front (ingress,
    /// balancer): the key is otherwise sent in clear.
    #[arg(long, value_name = "FILE", conflicts_with = "api_key")]
    api_key_file: Option<PathBuf>,
    /// The API key itself, as --api-key-file describes. Prefer the environment variable or
    /// the file: a key on the command line shows in process listings.
    #[arg(
        long,
        value_name = "KEY",
        env = "STREAMPOOL_API_KEY",
        hide_env_values = true
    )]
    api_key: Option<String>,
    /// Several API keys, one per tenant, from this TOML file (e.g. a mounted Kubernetes
    /// Secret), instead of one key. Each `[[tenant]]` has a `name` (shown in /metrics,
    /// never the key), exactly one of `key = "..."` or `key_sha256 = "<64 hex digits>"`
    /// (the SHA-256 of the key: `printf %s "$KEY" | sha256sum`), and optionally
    /// `models = ["name", ...]` (absent or ["*"]: every model; any other model answers 404
    /// as if absent), `requests_per_second = 50.0`, `tokens_per_second = 200000.0` (token
    /// buckets of one second's burst) and `max_concurrent = 8`; past a limit: 429 with
    /// Retry-After. The file is re-read every --tenants-poll-s and its changes apply at
    /// once; a file that does not parse is logged and the tenants in force stay. Example:
    ///
    ///   [[tenant]]
    ///   name = "search"
    ///   key_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    ///   models = ["all-MiniLM-L6-v2"]
    ///   requests_per_second = 50.0
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with_all = ["api_key", "api_key_file"],
        verbatim_doc_comment
    )]
    tenants_file: Option<PathBuf>,
    /// Seconds between two reads of --tenants-file.
    #[arg(long, default_value_t = 2.0)]
    tenants_poll_s: f64,
    /// Require the API key (or a tenant's) on /metrics as well.
    #[arg(long)]
    protect_metrics: bool,
    /// Longest input in tokens [default: the model's own limit].
    #[arg(long)]
    max_seq_len: Option<usize>,
    /// Truncate longer inputs to --max-seq-len instead of answering 400.
    #[arg(long)]
    truncate: bool,
    /// Most bytes of one text input read [default: 32 per token of the model's limit, 16 KiB
    /// for 512 tokens]. Only as much of an input is read as its token limit needs, so this
    /// bounds only texts of very few tokens per byte (long whitespace runs, one enormous
    /// word): read this far, then truncated as if they ended there (--truncate) or refused
    /// with 413.
    #[arg(long, value_name = "BYTES")]
    max_input_bytes: Option<usize>,
    /// Most inputs (sentences, rows) per batch. Batching is continuous: a free worker runs
    /// whatever is queued at once, and batches grow only while the workers are busy.
    #[arg(long, default_value_t = 256)]
    max_batch_size: usize,
    /// Most tokens per batch, counted as rows x the longest input (what a padded batch
    /// computes); a single longer input still runs, alone. Rows of a tensor model count 1.
    #[arg(long, default_value_t = 16_384)]
    max_batch_tokens: usize,
    /// Opt-in: milliseconds a worker holding a partial batch may wait for more inputs
    /// before running it. 0 (the default) never waits while a worker is free.
    #[arg(long, default_value_t = 0.0)]
    max_wait_ms: f64,
    /// Memory cap: requests waiting per model replica (a request's inputs count once)
    /// before new ones get 503 (TEI route: 429). Never applies while nothing waits.
    #[arg(long, default_value_t = 1024)]
    max_queue: usize,
    /// Memory cap: tokens waiting per model replica before new requests get 503.
    #[arg(long, default_value_t = 1 << 20)]
    max_queue_tokens: usize,
    /// Refuse a request (503 / 429, Retry-After from the estimate) when its estimated queue
    /// wait, from the measured service rate, exceeds this many milliseconds [default: only
    /// when it exceeds --timeout-s].
    #[arg(long, value_name = "MS")]
    max_queue_wait_ms: Option<f64>,
    /// Batch worker threads per model replica.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Seconds before an unanswered request gets 504.
    #[arg(long, default_value_t = 30.0)]
    timeout_s: f64,
    /// Seconds SIGTERM/SIGINT may take to drain (stop accepting, answer every request in
    /// flight); past it the server exits with the rest unanswered (exit status 1). Keep it
    /// >= --timeout-s and below the orchestrator's kill deadline (deploy/README.md).
    #[arg(long, default_value_t = 30.0)]
    drain_timeout_secs: f64,
    /// Do not run the warm-up before listening: a forward, and one per power-of-two token
    /// bucket up to --max-batch-tokens to tune cuBLASLt (or read the tuning cache). Then the
    /// first requests pay for cuBLAS set-up, lazy kernel loading and tuning.
    #[arg(long)]
    no_warm_up: bool,
    /// Time each embedding request's host phases (read, JSON parse, tokenization, batch
    /// queue, response encoding) into the histogram streampool_http_phase_seconds of
    /// /metrics (`streampool loadgen` prints the breakdown). Off by default.
    #[arg(long)]
    phase_timing: bool,
}

/// Loads the models and serves until SIGINT or SIGTERM. Logs one `startup:` line when
/// ready, with the time of each start-up phase since `start`.
pub fn run(args: Args, start: Instant) -> Result<()> {
    // Before anything opens files: the limit applies to every descriptor of the process.
    let open_files = super::fd_limit::raise();
    let phases = Arc::new(Phases::starting_at(start));
    let devices =
        phases.scope(|| timed("device context", || super::device::open_all(&args.device)))?;
    // (name, folder): a --model folder is served under its folder name; MiniLM under its
    // own name, whatever folder pip installed it in; a repository's folders under theirs.
    let mut dirs = Vec::new();
    for dir in &args.model {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .with_context(|| format!("{} has no folder name to serve it under", dir.display()))?;
        dirs.push((name, dir.clone()));
    }
    if args.minilm {
        dirs.push(("all-MiniLM-L6-v2".to_string(), find_minilm()?));
    }
    if let Some(root) = &args.model_dir {
        let mut names: Vec<String> = std::fs::read_dir(root)
            .with_context(|| format!("reading the model repository {}", root.display()))?
            .flatten()
            .filter(|e| e.path().join("config.json").is_file())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        dirs.extend(names.into_iter().map(|n| (n.clone(), root.join(n))));
    }
    if dirs.is_empty() && args.model_dir.is_none() {
        dirs.push(("tiny-bert".to_string(), find_tiny_bert()?));
    }
    let api_key = match (&args.api_key_file, &args.api_key) {
        (Some(file), _) => Some(ApiKey::from_file(file)?),
        (None, Some(key)) => Some(ApiKey::new(key).context("--api-key / STREAMPOOL_API_KEY")?),
        (None, None) => None,
    };
    let keyed = api_key.is_some() || args.tenants_file.is_some();
    if args.protect_metrics && !keyed {
        anyhow::bail!(
            "--protect-metrics needs API keys (--api-key-file, --tenants-file or STREAMPOOL_API_KEY)"
        );
    }
    if !keyed && !args.host.is_loopback() {
        eprintln!(
            "warning: serving on {} without an API key: anyone who reaches the port may call \
             the models (--api-key-file, --tenants-file)",
            args.host
        );
    }
    let config = ServeConfig {
        addr: SocketAddr::new(args.host, args.port),
        max_body_bytes: args.max_body_bytes,
        max_inputs: args.max_inputs,
        max_elements: args.max_elements,
        body_timeout: Duration::try_from_secs_f64(args.body_timeout_s)
            .context("--body-timeout-s")?,
        header_read_timeout: Duration::try_from_secs_f64(args.header_read_timeout_s)
            .context("--header-read-timeout-s")?,
        keep_alive_timeout: Duration::try_from_secs_f64(args.keep_alive_timeout_s)
            .context("--keep-alive-timeout-s")?,
        max_connections: super::fd_limit::fit_connections(args.max_connections, open_files),
        api_key,
        tenants_file: args.tenants_file.clone(),
        tenants_poll_interval: Duration::try_from_secs_f64(args.tenants_poll_s)
            .context("--tenants-poll-s")?,
        protect_metrics: args.protect_metrics,
        max_seq_len: args.max_seq_len,
        truncate: args.truncate,
        request_timeout: Duration::try_from_secs_f64(args.timeout_s).context("--timeout-s")?,
        max_input_bytes: args.max_input_bytes,
        drain_timeout: Duration::try_from_secs_f64(args.drain_timeout_secs)
            .context("--drain-timeout-secs")?,
        batch: BatchConfig {
            max_batch_size: args.max_batch_size,
            max_batch_tokens: args.max_batch_tokens,
            max_wait: Duration::try_from_secs_f64(args.max_wait_ms / 1e3)
                .context("--max-wait-ms")?,
            max_queue: args.max_queue,
            max_queue_tokens: args.max_queue_tokens,
            max_queue_wait: args
                .max_queue_wait_ms
                .map(|ms| Duration::try_from_secs_f64(ms / 1e3))
                .transpose()
                .context("--max-queue-wait-ms")?,
            workers: args.workers,
            // Per model: its folder's streampool.toml sets its class and weight.
            ..BatchConfig::default()
        },
    };
    let loader = Arc::new(ModelLoader::new(
        devices.clone(),
        LoaderConfig {
            dtype: args.dtype,
            // The warm-up also tunes for batches up to max_batch_tokens.
            warm_up: (!args.no_warm_up).then_some(args.max_batch_tokens),
            memory_budget: args.memory_budget_mb.map(|mb| mb << 20),
            drain: config.drain_timeout,
            model: config.model_config(),
        },
        args.model_dir.clone(),
    ));
    let mlp = if args.no_mlp {
        Vec::new()
    } else {
        devices
            .iter()
            .map(|dev| {
                Ok(ModelSpec::Tensor {
                    name: "mlp".into(),
                    model: TensorModel::mlp(dev, 256, 0)?,
                })
            })
            .collect::<Result<Vec<_>>>()?
    };
    let state = AppState::with_loader(config, mlp, Some(loader.clone()))?;
    // The kernels build on every device while the weights load (both before the socket
    // opens); a failed build also fails the first load that needed it, which says more.
    std::thread::scope(|s| -> Result<()> {
        let kernels: Vec<_> = devices
            .iter()
            .map(|dev| s.spawn(|| phases.scope(|| dev.load_kernels())))
            .collect();
        let loaded = phases.scope(|| -> Result<()> {
            for (name, dir) in &dirs {
                timed("models loaded", || {
                    loader.load_dir(state.registry(), name, dir)
                })
                .with_context(|| format!("loading {name} from {}", dir.display()))?;
            }
            Ok(())
        });
        let built: Vec<_> = kernels.into_iter().map(|k| k.join()).collect();
        loaded?;
        for b in built {
            b.map_err(|_| anyhow::anyhow!("building the kernels panicked"))??;
        }
        Ok(())
    })?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let served = rt.block_on(async {
        let began = Instant::now();
        let server = Server::serve_state(state).await?;
        phases.add("queues started, socket bound", began.elapsed());
        // The figure an autoscaler waits for: launch to ready, phase by phase.
        tracing::info!("startup: ready after {}", phases.summary());
        server.state().metrics().set_phase_timing(args.phase_timing);
        // One plain line on stdout, so scripts can learn the port when it was 0.
        let names: Vec<String> = devices.iter().map(|d| d.name()).collect();
        println!(
            "listening on http://{} ({})",
            server.addr(),
            names.join(", ")
        );
        server.run_until_signal().await
    });
    if let Err(e @ streampool_serve::Error::DrainTimeout(_)) = served {
        // A connection task or a queue worker is still busy (that is why the drain timed
        // out): dropping the runtime, the models or the device would wait for it without
        // bound, so leave now, as the drain timeout promises.
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    served?;
    Ok(())
}
