//! # streampool-serve
//!
//! An HTTP inference server over the streampool runtime (axum on tokio). Every model replica
//! (one per device) gets its own [`BatchQueue`](streampool_batch::BatchQueue) behind a
//! least-loaded router ([`Replicas`](streampool_batch::Replicas)): concurrent requests are
//! batched, each runs on a worker's own stream, and each client gets its own answer back.
//! Handlers never block the async workers: they submit to the queue and await its answer.
//!
//! | route | what |
//! |-------|------|
//! | `GET /v2/health/live`, `GET /v2/health/ready` | KServe v2 health |
//! | `GET /v2`, `GET /v2/models/{name}`, `GET /v2/models/{name}/ready` | server and model metadata, readiness |
//! | `POST /v2/models/{name}/infer` | KServe v2 inference: JSON tensors or the binary-data extension |
//! | `POST /v1/embeddings` | OpenAI-compatible embeddings (strings or token ids; float or base64) |
//! | `GET /v1/models`, `GET /v1/models/{id}` | OpenAI model list and lookup |
//! | `POST /v1/rerank` | Cohere/Jina-style rerank (`query`, `documents`, `top_n`, `return_documents`) on a reranker |
//! | `POST /embed` (and `POST /`), `GET /info`, `GET /health` | text-embeddings-inference (TEI) compatible |
//! | `GET /metrics` | Prometheus (`prometheus-client`): requests, errors, latency, and per model and device queue depth, outstanding work, batch sizes, busy time |
//!
//! Models ([`ModelSpec`]): a sentence embedder (`text` BYTES `[N]`, or `input_ids` INT64
//! `[N, S]` with an optional `attention_mask`, to `embedding` FP32 `[N, dim]`) and row-wise
//! tensor models such as the demo MLP (`input` FP32 `[N, in]` to `output` FP32 `[N, out]`).
//!
//! Several [`ModelSpec`]s with one name are replicas of one model (one per device).
//!
//! Keys ([`tenants`]): none, one [`ApiKey`], or a file of tenants, each with its key, the
//! models it may call and optional limits, re-read while serving.
//!
//! Errors ([`Error`]): bad input 400 (`{"error": "..."}`), missing or wrong API key 401,
//! unknown model (or one the key's tenant may not call) 404, body not received in time 408,
//! body or tensors over the limit 413, a non-finite model answer 422 (never `null` under
//! 200), the key's tenant over one of its limits 429 with `Retry-After`, a handler panic 500
//! (that request only), full queue 503 with `Retry-After`, timeout 504; TEI's routes answer in TEI's
//! format and statuses (413/422/429/424, see `tei.rs`). Shutdown
//! ([`ServerHandle::shutdown`], or SIGINT/SIGTERM with [`ServerHandle::run_until_signal`])
//! drains: new connections are refused, every request already accepted is answered, within
//! [`ServeConfig::drain_timeout`].
//!
//! The server is stateless: no sessions, no state kept between requests, and an inference
//! request has no side effect (the same input gives the same answer on any replica of the
//! same model). Replicas can therefore sit behind any load balancer, and a balancer may
//! retry a failed inference `POST` on another replica (`deploy/` has an nginx config that
//! does, and Kubernetes manifests).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use std::sync::Arc;
//! use streampool::Device;
//! use streampool_nn::{tiny_bert_dir, SentenceEmbedder};
//! use streampool_serve::{ModelSpec, ServeConfig, Server};
//!
//! let embedder = Arc::new(SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap());
//! let config = ServeConfig { addr: "127.0.0.1:0".parse().unwrap(), ..Default::default() };
//! let server = Server::start(config, vec![ModelSpec::Embedder { name: "tiny-bert".into(), embedder }])
//!     .await
//!     .unwrap();
//! println!("listening on {}", server.addr());
//! server.shutdown().await.unwrap();
//! # }
//! ```

mod auth;
mod body;
mod config;
mod connections;
mod deadline;
mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod kserve;
mod metrics;
mod openai;
mod rerank;
mod server;
mod state;
mod tei;
pub mod tenants;

pub use auth::ApiKey;
pub use body::Body;
pub use config::ServeConfig;
pub use deadline::Arrival;
pub use error::{Error, Result, Shed};
pub use metrics::Metrics;
pub use server::{harden, router, routes, Server, ServerHandle};
pub use state::AppState;
/// The batch-queue settings of [`ServeConfig::batch`], re-exported for convenience.
pub use streampool_batch::BatchConfig;
/// The served models and their endpoints live in the inference core; re-exported here, so
/// a server is configured from this crate alone.
pub use streampool_core::{
    ClassifierEndpoint, EmbedderEndpoint, ForwardFn, ModelSpec, Registry, ServedModel,
    TensorEndpoint, TensorModel,
};
pub use tenants::{Caller, Tenant, Tenants};
