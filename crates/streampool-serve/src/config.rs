//! Server settings: where to listen and the limits every request is held to.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use streampool_batch::BatchConfig;

use crate::auth::ApiKey;

/// How the server listens and what it accepts.
///
/// ```
/// use streampool_serve::ServeConfig;
/// let config = ServeConfig { max_inputs: 16, ..ServeConfig::default() };
/// assert!(config.validate().is_ok());
/// ```
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Address to bind; port 0 picks a free port (see [`ServerHandle::addr`](crate::ServerHandle::addr)).
    pub addr: SocketAddr,
    /// Largest request body accepted; larger ones are answered 413.
    pub max_body_bytes: usize,
    /// Most inputs (sentences, documents, tensor rows) in one request; more are answered 413.
    /// A request of more inputs than a batch holds is split into batches by its model's
    /// queue and answered as one (its inputs are admitted as one group: a large request is
    /// never half-served), so this bounds only the memory one request may hold: its inputs'
    /// token ids while queued and their answers (TEI's `max_client_batch_size`).
    pub max_inputs: usize,
    /// Most tensor elements in one KServe request, summed over its inputs. A request whose
    /// shapes declare more is answered 413 before anything is allocated for it (shapes are
    /// also checked against the data actually sent).
    pub max_elements: usize,
    /// How long a client may take to send a request's body once its headers arrived; past
    /// it the request is answered 408 and its connection closed, so a slow or stalled client
    /// holds no memory or task for long.
    pub body_timeout: Duration,

    // Connections: how long a connection may sit without a request, and how many may be open.
    /// How long a client may take to send a request's headers, counted from the connection's
    /// accept for its first request and from the first byte of each later one; past it the
    /// connection is closed without an answer (a client trickling its headers, or a
    /// connection opened and never used, holds a socket for at most this long).
    pub header_read_timeout: Duration,
    /// How long a keep-alive connection may stay idle between an answer and the next
    /// request before it is closed. Behind a load balancer that reuses connections, keep it
    /// longer than the balancer's own idle timeout, so the balancer never sends a request
    /// on a connection the server is closing.
    pub keep_alive_timeout: Duration,
    /// Most connections open at once. Past it a new connection is answered `503` with
    /// `Retry-After` and `Connection: close` (see [`Server::start`](crate::Server::start)),
    /// and the connections already open are served as before. Keep it below the process's
    /// open-file limit (`RLIMIT_NOFILE`) less a margin for the process's other files, so
    /// that accepting never fails for want of a descriptor.
    pub max_connections: usize,

    /// When set, every inference and model route requires `Authorization: Bearer <key>`
    /// (what the OpenAI, TEI and Triton clients send); others are answered 401. The health
    /// probes (`/v2/health/*`, `/health`) stay open, and `/metrics` too unless
    /// `protect_metrics`.
    pub api_key: Option<ApiKey>,
    /// Several API keys, one per tenant, from this TOML file (e.g. a mounted Kubernetes
    /// Secret): each tenant has a name, the models it may call (the others are answered as
    /// absent, 404) and optional limits (requests and tokens per second, concurrent
    /// requests; past them 429 with `Retry-After`). The file is re-read every
    /// `tenants_poll_interval` and its changes apply at once; a file that does not parse
    /// keeps the tenants in force. The format is in the README and in
    /// [`Tenants`](crate::Tenants). Exclusive with `api_key`; probes and `/metrics` as for it.
    pub tenants_file: Option<PathBuf>,
    /// How often `tenants_file` is re-read for changes.
    pub tenants_poll_interval: Duration,
    /// Whether `/metrics` needs a key as well (when keys are set).
    pub protect_metrics: bool,
    /// Longest input in tokens (special tokens included) an embedder accepts. `None`: the
    /// model's own limit. Never above the model's own limit.
    pub max_seq_len: Option<usize>,
    /// Longer inputs are truncated to `max_seq_len` (`true`) or answered 400 (`false`).
    pub truncate: bool,
    /// A request not answered within this time of its arrival is answered 504: the time
    /// counts reading its body, tokenizing and queueing, and work still pending for it then
    /// (tokenization, a queued batch) is dropped.
    pub request_timeout: Duration,
    /// The most bytes of one text input a text model reads. `None`: derived from the model's
    /// token limit ([`streampool_nn::InputLimit::new`]: 32 bytes per token, 16 KiB for a
    /// 512-token model), far above what natural text needs for that many tokens. Only as
    /// much of an input is read as its token limit needs, so this bounds only texts of very
    /// few tokens per byte (long whitespace runs, one enormous word): read to here, then
    /// truncated as if they ended there, or refused (413) when not truncating.
    pub max_input_bytes: Option<usize>,
    /// How long a graceful shutdown (SIGTERM, [`ServerHandle::shutdown`](crate::ServerHandle::shutdown))
    /// may take: after this, the requests still open are abandoned and shutdown returns
    /// [`Error::DrainTimeout`](crate::Error::DrainTimeout). Set it at least as long as
    /// `request_timeout`, so every accepted request gets its answer (or its 504) first, and
    /// shorter than the orchestrator's kill deadline (Kubernetes'
    /// `terminationGracePeriodSeconds`, less any preStop delay).
    pub drain_timeout: Duration,
    /// The batch queue of each model replica (each replica, one per model and device, gets
    /// its own queue with these settings). A client request's inputs are admitted as one
    /// group (see [`BatchConfig`]), with the request timeout as their deadline.
    pub batch: BatchConfig,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 8000)),
            max_body_bytes: 4 << 20,
            // Thousands, so clients need not split their batches; with the 4 MiB body limit
            // a request holds at most a few MB of token ids.
            max_inputs: 16_384,
            // 16 MiB of FP32: four times what the default body limit can carry in binary.
            max_elements: 4 << 20,
            body_timeout: Duration::from_secs(30),
            // A client that sends a request at all sends its headers in well under a second;
            // ten leaves room for a slow link.
            header_read_timeout: Duration::from_secs(10),
            // nginx's default, longer than the 60 s idle timeout of the common balancers.
            keep_alive_timeout: Duration::from_secs(75),
            // Well below the open-file limit a server is given in practice (the CLI raises
            // its soft limit to the hard limit, often 65,536 or more), and enough for a
            // balancer's pool and many direct clients.
            max_connections: 4096,
            api_key: None,
            tenants_file: None,
            // A Secret update takes up to a minute or so to reach the pod's file (the
            // kubelet's sync period); two seconds add little to that and cost nothing.
            tenants_poll_interval: Duration::from_secs(2),
            protect_metrics: false,
            max_seq_len: None,
            truncate: false,
            request_timeout: Duration::from_secs(30),
            max_input_bytes: None,
            drain_timeout: Duration::from_secs(30),
            // Continuous batching (no window), admission by capacity: the request timeout is
            // every request's deadline, so a request is shed only when its estimated queue
            // wait exceeds it or a memory cap is reached. Batches up to 256 inputs and 16,384
            // tokens: a GPU's forward keeps gaining throughput up to hundreds of short
            // sentences per batch, and the token budget keeps long inputs to fewer rows.
            batch: BatchConfig {
                max_batch_size: 256,
                max_batch_tokens: 16_384,
                ..BatchConfig::default()
            },
        }
    }
}

impl ServeConfig {
    /// What the inference core holds every served model to: the text limits and batch
    /// settings of this configuration.
    pub fn model_config(&self) -> streampool_core::ModelConfig {
        streampool_core::ModelConfig {
            max_seq_len: self.max_seq_len,
            truncate: self.truncate,
            max_input_bytes: self.max_input_bytes,
            batch: self.batch.clone(),
        }
    }

    /// Checks that every limit is positive and the batch settings are valid.
    pub fn validate(&self) -> crate::Result<()> {
        let positive = [
            ("max_body_bytes", self.max_body_bytes),
            ("max_inputs", self.max_inputs),
            ("max_elements", self.max_elements),
            ("max_connections", self.max_connections),
            ("max_seq_len", self.max_seq_len.unwrap_or(1)),
            ("max_input_bytes", self.max_input_bytes.unwrap_or(1)),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(crate::Error::Config(format!("{name} must be at least 1")));
        }
        if self.request_timeout.is_zero() {
            return Err(crate::Error::Config(
                "request_timeout must be positive".into(),
            ));
        }
        if self.body_timeout.is_zero() {
            return Err(crate::Error::Config("body_timeout must be positive".into()));
        }
        if self.header_read_timeout.is_zero() {
            return Err(crate::Error::Config(
                "header_read_timeout must be positive".into(),
            ));
        }
        if self.keep_alive_timeout.is_zero() {
            return Err(crate::Error::Config(
                "keep_alive_timeout must be positive".into(),
            ));
        }
        if self.api_key.is_some() && self.tenants_file.is_some() {
            return Err(crate::Error::Config(
                "api_key and tenants_file are exclusive: give the key as a tenant of the file"
                    .into(),
            ));
        }
        if self.tenants_poll_interval.is_zero() {
            return Err(crate::Error::Config(
                "tenants_poll_interval must be positive".into(),
            ));
        }
        if self.drain_timeout.is_zero() {
            return Err(crate::Error::Config(
                "drain_timeout must be positive".into(),
            ));
        }
        self.batch.validate().map_err(crate::Error::Batch)
    }
}
