//! The served models, each with one batch queue per replica, and the registry that names
//! them.

mod classifier;
mod embedder;
mod tensor;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use streampool::{Device, DeviceKind};
use streampool_batch::{BatchModel, ReplicaStats, Replicas, StatsSnapshot};
use streampool_nn::{Classifier, SentenceEmbedder};

pub use classifier::{ClassifierEndpoint, ClassifyBatch, ClassifyInput};
pub use embedder::{l2_normalize, wait_row, EmbedBatch, EmbedInput, EmbedderEndpoint, Launched};
pub use tensor::{ForwardFn, TensorEndpoint, TensorModel};

use crate::{Error, ModelConfig, Result};

/// A model to serve, before its queue exists.
///
/// **Replicas:** several specs with the same name are replicas of one model, usually one per
/// device (`streampool serve --device cuda:all` gives one per GPU). Each replica gets its own
/// batch queue, and a router sends each request to the replica with the least outstanding
/// work (rows for tensor models, tokens for embedders; see
/// [`Replicas`](streampool_batch::Replicas)). Replicas must agree in kind and shape.
pub enum ModelSpec {
    /// A sentence embedder: texts (or token ids) to embeddings `[N, dim]`.
    Embedder {
        /// The name callers use (over HTTP: `/v2/models/{name}`, `"model"` of
        /// `/v1/embeddings`).
        name: String,
        /// The model.
        embedder: Arc<SentenceEmbedder>,
    },
    /// A sequence classifier (a `*ForSequenceClassification` checkpoint: cross-encoder
    /// reranker or classifier): texts and text pairs to logits `[N, labels]`.
    Classifier {
        /// The name clients use.
        name: String,
        /// The model.
        classifier: Arc<Classifier>,
    },
    /// A row-wise tensor model: `f32` rows `[N, in]` to `[N, out]`.
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
            ModelSpec::Embedder { name, .. }
            | ModelSpec::Classifier { name, .. }
            | ModelSpec::Tensor { name, .. } => name,
        }
    }

    /// The device of this replica.
    pub fn device(&self) -> &Device {
        match self {
            ModelSpec::Embedder { embedder, .. } => embedder.model().device(),
            ModelSpec::Classifier { classifier, .. } => classifier.model().device(),
            ModelSpec::Tensor { model, .. } => model.device(),
        }
    }
}

/// Labels for the replicas on `devices`, as `/metrics` shows them: `cuda:N` for a GPU, and
/// `cpu` for a lone CPU replica or `cpu:0`, `cpu:1`, ... (in order) for several.
fn device_labels(devices: &[&Device]) -> Vec<String> {
    let cpus = devices
        .iter()
        .filter(|d| d.kind() == DeviceKind::Cpu)
        .count();
    let mut next_cpu = 0;
    devices
        .iter()
        .map(|d| match d.kind() {
            DeviceKind::Cpu if cpus == 1 => "cpu".to_string(),
            DeviceKind::Cpu => {
                next_cpu += 1;
                format!("cpu:{}", next_cpu - 1)
            }
            DeviceKind::Cuda(n) => format!("cuda:{n}"),
            #[allow(unreachable_patterns)] // other backends may come
            _ => d.name(),
        })
        .collect()
}

/// A model being served.
pub enum ServedModel {
    /// See [`ModelSpec::Embedder`].
    Embedder(Box<EmbedderEndpoint>),
    /// See [`ModelSpec::Classifier`].
    Classifier(Box<ClassifierEndpoint>),
    /// See [`ModelSpec::Tensor`].
    Tensor(TensorEndpoint),
}

impl ServedModel {
    /// Its queues' statistics summed over the replicas (latency percentiles: the largest
    /// replica's, an upper bound of the whole's).
    pub fn stats(&self) -> StatsSnapshot {
        streampool_batch::StatsSnapshot::sum(self.replica_stats().iter().map(|r| &r.queue))
    }

    /// Each replica's routing count, outstanding work and queue statistics.
    pub fn replica_stats(&self) -> Vec<ReplicaStats> {
        match self {
            ServedModel::Embedder(e) => e.replicas().stats(),
            ServedModel::Classifier(c) => c.replicas().stats(),
            ServedModel::Tensor(t) => t.replicas().stats(),
        }
    }

    /// The replicas' device labels, in order.
    pub fn labels(&self) -> Vec<String> {
        match self {
            ServedModel::Embedder(e) => e.replicas().labels().map(str::to_string).collect(),
            ServedModel::Classifier(c) => c.replicas().labels().map(str::to_string).collect(),
            ServedModel::Tensor(t) => t.replicas().labels().map(str::to_string).collect(),
        }
    }

    /// Whether every replica's queue accepts requests.
    pub fn is_accepting(&self) -> bool {
        match self {
            ServedModel::Embedder(e) => e.replicas().is_accepting(),
            ServedModel::Classifier(c) => c.replicas().is_accepting(),
            ServedModel::Tensor(t) => t.replicas().is_accepting(),
        }
    }
}

/// What the registry knows of a served model besides its queues: where it came from, the
/// device memory it holds and its scheduling class.
#[derive(Debug, Clone, Default)]
pub struct ModelInfo {
    /// The folder it was loaded from, if any (`None`: built in code).
    pub source: Option<std::path::PathBuf>,
    /// Device memory each replica holds, by device label (`cuda:0`, `cpu`): what the
    /// replica's loading thread left allocated across its load and warm-up (weights, and the
    /// graph pools its warm-up captured). Empty when not measured.
    pub resident_bytes: Vec<(String, u64)>,
    /// Its class on its devices' schedulers.
    pub priority: streampool_batch::Priority,
    /// Its weight within that class.
    pub weight: u32,
    /// When it was loaded, in Unix seconds.
    pub loaded_unix: u64,
}

impl ModelInfo {
    /// Device memory held on all replicas together, in bytes.
    pub fn resident_total(&self) -> u64 {
        self.resident_bytes.iter().map(|(_, b)| b).sum()
    }
}

/// A model ready to be added to a [`Registry`]: its replicas, the settings its queues run
/// with, and what is known of it.
pub struct LoadedModel {
    /// The name callers use.
    pub name: String,
    /// One spec per replica (all with `name`).
    pub specs: Vec<ModelSpec>,
    /// Its input limits and batch settings.
    pub config: ModelConfig,
    /// Where it came from and what it holds.
    pub info: ModelInfo,
}

#[derive(Clone)]
struct Entry {
    model: Arc<ServedModel>,
    info: ModelInfo,
}

/// The served models by name: a live set. Requests look a model up by name on every call
/// (one `Arc` clone under a read lock); loading, replacing and unloading change the set
/// while requests run. A request keeps the model it looked up until it is answered, so a
/// model replaced or removed finishes its in-flight requests with the old queues (see
/// [`retire`]).
pub struct Registry {
    /// Read on every request; written only to add, replace or remove a model. Held only to
    /// clone or swap entries, never across a wait.
    models: parking_lot::RwLock<BTreeMap<String, Entry>>,
}

impl Registry {
    /// Starts one batch queue per replica; specs sharing a name are replicas of one model.
    /// An empty list gives an empty registry (models may be loaded later).
    pub fn new(specs: Vec<ModelSpec>, config: &ModelConfig) -> Result<Self> {
        let mut groups: BTreeMap<String, Vec<ModelSpec>> = BTreeMap::new();
        for spec in specs {
            groups
                .entry(spec.name().to_string())
                .or_default()
                .push(spec);
        }
        let registry = Self {
            models: parking_lot::RwLock::new(BTreeMap::new()),
        };
        for (name, group) in groups {
            let info = ModelInfo {
                priority: config.batch.priority,
                weight: config.batch.weight,
                loaded_unix: unix_now(),
                ..ModelInfo::default()
            };
            registry.insert(LoadedModel {
                name,
                specs: group,
                config: config.clone(),
                info,
            })?;
        }
        Ok(registry)
    }

    /// Starts `loaded`'s queues and serves it under its name, replacing (and returning) a
    /// model of that name: requests from now on reach the new one, while those already
    /// holding the old one finish on it (pass it to [`retire`] to wait for them).
    pub fn insert(&self, loaded: LoadedModel) -> Result<Option<Arc<ServedModel>>> {
        let LoadedModel {
            name,
            specs,
            config,
            mut info,
        } = loaded;
        let served = build(&name, specs, &config)?;
        info.priority = config.batch.priority;
        info.weight = config.batch.weight;
        let entry = Entry {
            model: Arc::new(served),
            info,
        };
        Ok(self.models.write().insert(name, entry).map(|e| e.model))
    }

    /// Stops serving `name`: new requests get [`Error::NotFound`]; the model is returned so
    /// the caller can wait for its in-flight requests ([`retire`]).
    pub fn remove(&self, name: &str) -> Option<Arc<ServedModel>> {
        self.models.write().remove(name).map(|e| e.model)
    }

    /// The model named `name`, or [`Error::NotFound`].
    pub fn get(&self, name: &str) -> Result<Arc<ServedModel>> {
        self.models
            .read()
            .get(name)
            .map(|e| e.model.clone())
            .ok_or_else(|| {
                Error::NotFound(format!("unknown model {}", streampool_nn::Quoted(name)))
            })
    }

    /// What is known of `name`, if it is served.
    pub fn info(&self, name: &str) -> Option<ModelInfo> {
        self.models.read().get(name).map(|e| e.info.clone())
    }

    /// Whether a model named `name` is served.
    pub fn contains(&self, name: &str) -> bool {
        self.models.read().contains_key(name)
    }

    /// Every model now served, by name (a snapshot: the set may change right after).
    pub fn snapshot(&self) -> Vec<(String, Arc<ServedModel>)> {
        self.models
            .read()
            .iter()
            .map(|(k, e)| (k.clone(), e.model.clone()))
            .collect()
    }

    /// Every model now served with what is known of it, by name.
    pub fn snapshot_info(&self) -> Vec<(String, Arc<ServedModel>, ModelInfo)> {
        self.models
            .read()
            .iter()
            .map(|(k, e)| (k.clone(), e.model.clone(), e.info.clone()))
            .collect()
    }

    /// Models now served.
    pub fn len(&self) -> usize {
        self.models.read().len()
    }

    /// Whether no model is served.
    pub fn is_empty(&self) -> bool {
        self.models.read().is_empty()
    }

    /// The first classifier by name (what TEI's `/rerank` and `/predict` serve).
    pub fn first_classifier(&self) -> Option<String> {
        self.models
            .read()
            .iter()
            .find(|(_, e)| matches!(*e.model, ServedModel::Classifier(_)))
            .map(|(n, _)| n.clone())
    }

    /// The first embedder by name (the default of `/v1/embeddings`).
    pub fn first_embedder(&self) -> Option<String> {
        self.models
            .read()
            .iter()
            .find(|(_, e)| matches!(*e.model, ServedModel::Embedder(_)))
            .map(|(n, _)| n.clone())
    }
}

/// Waits up to `drain` for every other holder of `model` (requests in flight on it) to let
/// go, then drops it: its queues answer what is still queued, stop their workers, and its
/// weights are freed. Blocks: call it off the async runtime. Returns whether it drained in
/// time; past `drain` the model is still dropped here (requests still holding it keep it
/// alive until they end).
pub fn retire(model: Arc<ServedModel>, drain: std::time::Duration) -> bool {
    let until = Instant::now() + drain;
    let mut drained = true;
    while Arc::strong_count(&model) > 1 {
        if Instant::now() >= until {
            drained = false;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    drop(model);
    drained
}

/// Now, in Unix seconds (0 if the clock is before 1970).
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// One model's queues from its replicas' specs.
fn build(name: &str, group: Vec<ModelSpec>, config: &ModelConfig) -> Result<ServedModel> {
    if name.is_empty() || name.contains('/') {
        return Err(Error::Config(format!("invalid model name {name:?}")));
    }
    if let Some(other) = group.iter().find(|s| s.name() != name) {
        return Err(Error::Config(format!(
            "model {name:?}: a replica is named {:?}",
            other.name()
        )));
    }
    let devices: Vec<&Device> = group.iter().map(ModelSpec::device).collect();
    if let Some(dup) = (1..devices.len()).find(|&i| devices[..i].iter().any(|d| d.same(devices[i])))
    {
        return Err(Error::Config(format!(
            "model {name:?}: two replicas on one device ({})",
            devices[dup].name()
        )));
    }
    let labels = device_labels(&devices);
    let mismatch = || Error::Config(format!("model {name:?}: replicas differ in kind"));
    Ok(match group.first() {
        Some(ModelSpec::Embedder { .. }) => {
            let embedders = labels
                .into_iter()
                .zip(group)
                .map(|(label, spec)| match spec {
                    ModelSpec::Embedder { embedder, .. } => Ok((label, embedder)),
                    _ => Err(mismatch()),
                })
                .collect::<Result<Vec<_>>>()?;
            ServedModel::Embedder(Box::new(EmbedderEndpoint::new(embedders, config)?))
        }
        Some(ModelSpec::Tensor { .. }) => {
            let tensors = labels
                .into_iter()
                .zip(group)
                .map(|(label, spec)| match spec {
                    ModelSpec::Tensor { model, .. } => Ok((label, model)),
                    _ => Err(mismatch()),
                })
                .collect::<Result<Vec<_>>>()?;
            ServedModel::Tensor(TensorEndpoint::new(tensors, &config.batch)?)
        }
        Some(ModelSpec::Classifier { .. }) => {
            let classifiers = labels
                .into_iter()
                .zip(group)
                .map(|(label, spec)| match spec {
                    ModelSpec::Classifier { classifier, .. } => Ok((label, classifier)),
                    _ => Err(mismatch()),
                })
                .collect::<Result<Vec<_>>>()?;
            ServedModel::Classifier(Box::new(ClassifierEndpoint::new(classifiers, config)?))
        }
        None => return Err(Error::Config(format!("model {name:?} has no replica"))),
    })
}

/// A boxed `Send` future.
type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Submits the request's inputs as one group (admitted or refused as one request, see
/// [`Replicas::submit_group`]: to the least loaded replica that admits it, so a bulk request
/// is never shed while a replica has room), then collects the outputs in order. A refused
/// group answers the whole request with the refusal ([`Error::Overloaded`], with the queue's
/// estimate of when to retry).
///
/// The future is boxed as `Send` here, where `M` is generic: rustc cannot prove the unboxed
/// future `Send` for every lifetime the router's handler bound asks about when `M` holds a
/// higher-ranked `Fn(&Tensor)`.
fn run_all<M: BatchModel>(
    queue: &Replicas<M>,
    inputs: Vec<M::Input>,
    deadline: Instant,
) -> BoxFuture<'_, Result<Vec<M::Output>>> {
    Box::pin(run_all_inner(queue, inputs, deadline))
}

async fn run_all_inner<M: BatchModel>(
    queue: &Replicas<M>,
    inputs: Vec<M::Input>,
    deadline: Instant,
) -> Result<Vec<M::Output>> {
    let handles = queue
        .submit_group_with_deadline(inputs, deadline)
        .map_err(Error::from_batch)?;
    collect(handles, deadline).await
}

/// Awaits `handles` in order, the first error failing the whole, within `deadline`.
async fn collect<O: Send + 'static>(
    handles: Vec<streampool_batch::Handle<O>>,
    deadline: Instant,
) -> Result<Vec<O>> {
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
        .map_err(|_| Error::DeadlineExceeded("no answer before the request's deadline".into()))?
}

/// One input's output row of a text model, or why it has none: a non-finite row (e.g. a
/// half-precision overflow) fails its own request only, not the others of its batch.
pub type RowOutput = std::result::Result<Vec<f32>, Error>;

/// [`run_all`] for text models' rows: a row that failed becomes the request's error
/// ([`Error::NonFinite`] naming the input's index in the request), never NaN in an answer.
fn run_rows<M: BatchModel<Output = RowOutput>>(
    queue: &Replicas<M>,
    inputs: Vec<M::Input>,
    deadline: Instant,
) -> impl Future<Output = Result<Vec<Vec<f32>>>> + Send + '_ {
    let answers = run_all(queue, inputs, deadline);
    async move {
        answers
            .await?
            .into_iter()
            .enumerate()
            .map(|(i, row)| row.map_err(|e| at_input(e, i)))
            .collect()
    }
}

/// `e` for input `i` of its request.
fn at_input(e: Error, i: usize) -> Error {
    match e {
        Error::NonFinite { message, .. } => Error::NonFinite { input: i, message },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use streampool_batch::{BatchConfig, BatchContext, ModelError};

    use super::*;

    /// Rows of `[x]`: a non-finite row for a negative input, a failed batch (the model's
    /// own error) for 0.
    struct Rows;

    impl BatchModel for Rows {
        type Input = f32;
        type Output = RowOutput;

        fn forward_batch(
            &self,
            xs: Vec<f32>,
            _: &BatchContext,
        ) -> std::result::Result<Vec<RowOutput>, ModelError> {
            if xs.contains(&0.0) {
                return Err("weights gone".into());
            }
            Ok(xs
                .into_iter()
                .map(|x| {
                    if x < 0.0 {
                        Err(Error::NonFinite {
                            input: 0,
                            message: "overflow".into(),
                        })
                    } else {
                        Ok(vec![x])
                    }
                })
                .collect())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_bad_row_fails_its_own_request_naming_its_input() {
        // One batch holds both requests (a window, one worker).
        let config = BatchConfig {
            max_wait: Duration::from_millis(100),
            workers: 1,
            ..BatchConfig::default()
        };
        let replicas = Replicas::new([("cpu".to_string(), Rows)], config).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let (good, bad) = tokio::join!(
            run_rows(&replicas, vec![1.0, 2.0], deadline),
            run_rows(&replicas, vec![3.0, -1.0], deadline)
        );
        assert_eq!(good.unwrap(), vec![vec![1.0], vec![2.0]]);
        assert_eq!(
            bad.unwrap_err(),
            Error::NonFinite {
                input: 1,
                message: "overflow".into()
            }
        );
        // A failed batch: every request of it gets the model's message as a model failure.
        let failed = run_rows(&replicas, vec![0.0], deadline).await.unwrap_err();
        assert!(
            matches!(&failed, Error::Model(m) if m.contains("weights gone")),
            "{failed:?}"
        );
        // And the queue goes on serving.
        let again = run_rows(&replicas, vec![4.0], deadline).await.unwrap();
        assert_eq!(again, vec![vec![4.0]]);
    }
}
