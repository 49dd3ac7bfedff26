//! # streampool-core
//!
//! The protocol-neutral inference core: what a request *means* is decided here, once, for
//! every front end (the HTTP server's KServe, OpenAI and TEI routes, the Python package, the
//! bench). A front end decodes its protocol, calls the core, and encodes the answer.
//!
//! ```text
//!   HTTP routes (streampool-serve)   Python (streampool-py)   bench (streampool-cli)
//!   decode ─┐                         encode()/BatchQueue ─┐    queue workloads ─┐
//!           ▼                                              ▼                     ▼
//!   ┌───────────────────────────── streampool-core ──────────────────────────────────┐
//!   │ Registry: served models by name, replicas per device                          │
//!   │ text → ids: limits, prompts, truncation, the tokenization pool, deadlines     │
//!   │ one batch adapter per task: EmbedBatch · ClassifyBatch · rows of a tensor model│
//!   │ post-processing: unit length, finite check, dimensions                        │
//!   │ Error: one typed, cloneable kind per failure, reaching every caller of a batch│
//!   └───────────────┬────────────────────────────────────────────────────────────────┘
//!                   ▼
//!   streampool-batch (BatchQueue per replica, Replicas router)
//!                   ▼
//!   streampool-nn (SentenceEmbedder, Classifier: packed or padded forwards)
//!                   ▼
//!   streampool (Tensor ops on the worker's stream: CPU, CUDA, wgpu)
//! ```
//!
//! **The request path.** A front end hands the core texts (or token ids) with the request's
//! deadline. The core reads each text only as far as the model's token limit needs
//! (`InputLimit`), on the tokenization pool when the request is large, checking the deadline
//! and whether the caller still waits between inputs; prepends the prompt (read once per
//! request); submits the inputs as one group to the least-loaded replica's batch queue;
//! and awaits each input's row. The batch adapter runs one forward per batch, packed when
//! the batch's lengths differ and the model packs, and answers each input with its row or
//! its own error.
//!
//! **Errors keep their kind.** A model's failure on a batch reaches every caller of that
//! batch as the same [`Error`] kind: a device out of memory is
//! [`Error::DeviceOutOfMemory`] (retry later), a non-finite row [`Error::NonFinite`] for
//! that input alone, a load refusal [`Error::Overloaded`] with the queue's estimate of when
//! to retry. A front end maps kinds to statuses; it never parses messages.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::{Duration, Instant};
//! use streampool::Device;
//! use streampool_core::{EmbedderEndpoint, ModelConfig};
//! use streampool_nn::{tiny_bert_dir, SentenceEmbedder};
//!
//! let embedder = Arc::new(SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap());
//! let endpoint = EmbedderEndpoint::new(vec![("cpu".into(), embedder)], &ModelConfig::default())
//!     .unwrap();
//! let deadline = Instant::now() + Duration::from_secs(30);
//! let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
//! let vectors = rt.block_on(async {
//!     let ids = endpoint
//!         .tokenize_texts(vec!["one text".into(), "and another".into()], None, false, deadline)
//!         .await?;
//!     endpoint.embed(ids, deadline).await
//! });
//! assert_eq!(vectors.unwrap().len(), 2);
//! ```

mod config;
mod error;

/// The repository README's Rust examples, compiled and run as doc tests so they keep working.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
mod models;
mod repository;
mod text;

pub use config::ModelConfig;
pub use error::{Error, Result};
pub use models::{
    l2_normalize, retire, wait_row, ClassifierEndpoint, ClassifyBatch, ClassifyInput, EmbedBatch,
    EmbedInput, EmbedderEndpoint, ForwardFn, Launched, LoadedModel, ModelInfo, ModelSpec, Registry,
    RowOutput, ServedModel, TensorEndpoint, TensorModel,
};
pub use repository::{
    default_dtype, weight_bytes, LoaderConfig, ModelLoader, ModelSettings, RepositoryEntry,
    SETTINGS_FILE,
};
pub use streampool_batch::Priority;
