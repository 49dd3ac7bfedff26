//! The models a server holds, each with its own batch queue.

mod embedder;
mod tensor;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use streampool_batch::{BatchModel, BatchQueue, StatsSnapshot};
use streampool_nn::SentenceEmbedder;

pub use embedder::EmbedderEndpoint;
pub use tensor::{ForwardFn, TensorEndpoint, TensorModel};

use crate::{Error, Result, ServeConfig};

/// A model to serve, before its queue exists.
pub enum ModelSpec {
    /// A sentence embedder: KServe `BYTES [N]` texts (or `INT64` token ids) to `FP32 [N, dim]`,
    /// and `/v1/embeddings`.
    Embedder {
        /// The name clients use (`/v2/models/{name}`, `"model"` of `/v1/embeddings`).
        name: String,
        /// The model.
        embedder: Arc<SentenceEmbedder>,
    },
    /// A row-wise tensor model: KServe `FP32 [N, in]` to `FP32 [N, out]`.
    Tensor {
        /// The name clients use.
        name: String,
        /// The model.
        model: TensorModel,
    },
}

impl ModelSpec {
    /// The name clients use.
    pub fn name(&self) -> &str {
        match self {
            ModelSpec::Embedder { name, .. } | ModelSpec::Tensor { name, .. } => name,
        }
    }
}

/// A model being served.
pub enum ServedModel {
    /// See [`ModelSpec::Embedder`].
    Embedder(Box<EmbedderEndpoint>),
    /// See [`ModelSpec::Tensor`].
    Tensor(TensorEndpoint),
}

impl ServedModel {
    /// Its queue's statistics.
    pub fn stats(&self) -> StatsSnapshot {
        match self {
            ServedModel::Embedder(e) => e.queue_stats(),
            ServedModel::Tensor(t) => t.queue_stats(),
        }
    }
}

/// The served models by name.
pub struct Registry {
    models: BTreeMap<String, Arc<ServedModel>>,
}

impl Registry {
    /// Starts one batch queue per model.
    pub fn new(specs: Vec<ModelSpec>, config: &ServeConfig) -> Result<Self> {
        let mut models = BTreeMap::new();
        for spec in specs {
            let name = spec.name().to_string();
            if name.is_empty() || name.contains('/') {
                return Err(Error::Config(format!("invalid model name {name:?}")));
            }
            let served = match spec {
                ModelSpec::Embedder { embedder, .. } => {
                    ServedModel::Embedder(Box::new(EmbedderEndpoint::new(embedder, config)?))
                }
                ModelSpec::Tensor { model, .. } => {
                    ServedModel::Tensor(TensorEndpoint::new(model, config)?)
                }
            };
            if models.insert(name.clone(), Arc::new(served)).is_some() {
                return Err(Error::Config(format!("two models named {name:?}")));
            }
        }
        if models.is_empty() {
            return Err(Error::Config("no models to serve".into()));
        }
        Ok(Self { models })
    }

    /// The model named `name`, or 404.
    pub fn get(&self, name: &str) -> Result<Arc<ServedModel>> {
        self.models
            .get(name)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("unknown model {name:?}")))
    }

    /// Every model, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &ServedModel)> {
        self.models.iter().map(|(k, v)| (k.as_str(), &**v))
    }

    /// The first embedder (the default of `/v1/embeddings`).
    pub fn first_embedder(&self) -> Option<&str> {
        self.iter()
            .find(|(_, m)| matches!(m, ServedModel::Embedder(_)))
            .map(|(n, _)| n)
    }
}

/// A boxed `Send` future.
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Submits every input before awaiting any (so they batch together and with other clients'
/// requests), then collects the outputs in order. A rejected submit answers the whole
/// request with its error; the inputs already queued are then skipped (their handles drop).
///
/// The future is boxed as `Send` here, where `M` is generic: rustc cannot prove the unboxed
/// future `Send` for every lifetime the router's handler bound asks about when `M` holds a
/// higher-ranked `Fn(&Tensor)`.
fn run_all<M: BatchModel>(
    queue: &BatchQueue<M>,
    inputs: Vec<M::Input>,
    deadline: Instant,
) -> BoxFuture<'_, Result<Vec<M::Output>>> {
    Box::pin(run_all_inner(queue, inputs, deadline))
}

async fn run_all_inner<M: BatchModel>(
    queue: &BatchQueue<M>,
    inputs: Vec<M::Input>,
    deadline: Instant,
) -> Result<Vec<M::Output>> {
    let mut handles = Vec::with_capacity(inputs.len());
    for input in inputs {
        handles.push(
            queue
                .submit_with_deadline(input, deadline)
                .map_err(Error::from_batch)?,
        );
    }
    let collect = async {
        let mut out = Vec::with_capacity(handles.len());
        for h in handles {
            out.push(h.await.map_err(Error::from_batch)?);
        }
        Ok(out)
    };
    // The queue drops a request still waiting at its deadline; this bounds the wait for one
    // already running too.
    tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), collect)
        .await
        .map_err(|_| Error::Timeout("no answer before the request timeout".into()))?
}
