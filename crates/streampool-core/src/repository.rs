//! The model repository: a folder of model folders, loaded into and unloaded from a
//! [`Registry`] while it serves.
//!
//! ```text
//!   models/                      a repository (`streampool serve --model-dir models`)
//!   ├── minilm/                  served as "minilm"
//!   │   ├── config.json, model.safetensors, tokenizer.json, ...
//!   │   └── streampool.toml      optional: dtype, priority, weight, batch limits
//!   └── rerank/
//! ```
//!
//! **Loading** reads a folder on the calling (blocking) thread: settings, a memory check,
//! weights on every device at once, a warm-up, then one swap in the registry, so requests to
//! the other models never wait for it. Loads run one at a time: the memory a model holds is
//! what its loading thread left allocated on the device (weights, graph pools its warm-up
//! captured), counted per thread so other models' requests running meanwhile do not blur it.
//! **Replacing** a model (loading a name already served) loads the new copy beside the old
//! one, swaps, then waits for the old one's in-flight requests before freeing it.
//! **Unloading** removes the name at once (new requests: not found), waits for the requests
//! holding it, frees it and returns the devices' idle cached memory to the driver.
//!
//! **Memory.** A load is refused ([`Error::InsufficientMemory`], before anything is read to
//! the device) when its weights, at the compute dtype, exceed what is free on a device:
//! within [`LoaderConfig::memory_budget`] less what the served models hold there, and (on
//! CUDA) within the driver's free memory plus this process's idle cached blocks. The
//! estimate counts weights only; leave the activations' room in the budget.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use streampool::{Device, DeviceKind};
use streampool_batch::Priority;
use streampool_nn::{BertConfig, Classifier, ComputeDType, SentenceEmbedder};

use crate::models::{retire, unix_now, LoadedModel, ModelInfo, ModelSpec, Registry};
use crate::{Error, ModelConfig, Result};

/// The file in a model folder that holds its serving settings.
pub const SETTINGS_FILE: &str = "streampool.toml";

/// A model folder's serving settings (`streampool.toml`); every field is optional and
/// overrides the server's setting for this model only.
///
/// ```
/// use streampool_core::ModelSettings;
/// let s = ModelSettings::parse("priority = \"high\"\nmax_batch_size = 32\n").unwrap();
/// assert_eq!(s.priority.as_deref(), Some("high"));
/// assert!(ModelSettings::parse("colour = \"red\"").is_err()); // unknown keys are refused
/// ```
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    /// Compute dtype: `f32`, `tf32`, `f16`, `bf16` or `int8`.
    pub dtype: Option<String>,
    /// Scheduling class on its devices: `high` (latency-critical), `normal` or `low`.
    pub priority: Option<String>,
    /// Weight within its class (>= 1).
    pub weight: Option<u32>,
    /// Batch worker threads per replica.
    pub workers: Option<usize>,
    /// Most inputs per batch.
    pub max_batch_size: Option<usize>,
    /// Most tokens per batch.
    pub max_batch_tokens: Option<usize>,
    /// Longest input in tokens.
    pub max_seq_len: Option<usize>,
    /// Whether longer inputs are truncated.
    pub truncate: Option<bool>,
}

impl ModelSettings {
    /// Settings from the text of a `streampool.toml`.
    pub fn parse(text: &str) -> Result<Self> {
        toml::from_str(text).map_err(|e| Error::Config(format!("{SETTINGS_FILE}: {e}")))
    }

    /// The settings in `dir`'s `streampool.toml`, or the defaults when it has none.
    pub fn read(dir: &Path) -> Result<Self> {
        let file = dir.join(SETTINGS_FILE);
        match std::fs::read_to_string(&file) {
            Ok(text) => {
                Self::parse(&text).map_err(|e| Error::Config(format!("{}: {e}", dir.display())))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(Error::Config(format!("reading {}: {e}", file.display()))),
        }
    }

    /// `base` with these settings applied.
    pub fn apply(&self, base: &ModelConfig) -> Result<ModelConfig> {
        let mut config = base.clone();
        if let Some(p) = &self.priority {
            config.batch.priority = p.parse::<Priority>().map_err(Error::Config)?;
        }
        let batch = &mut config.batch;
        batch.weight = self.weight.unwrap_or(batch.weight);
        batch.workers = self.workers.unwrap_or(batch.workers);
        batch.max_batch_size = self.max_batch_size.unwrap_or(batch.max_batch_size);
        batch.max_batch_tokens = self.max_batch_tokens.unwrap_or(batch.max_batch_tokens);
        batch
            .validate()
            .map_err(|e| Error::Config(format!("{SETTINGS_FILE}: {e}")))?;
        config.max_seq_len = self.max_seq_len.or(config.max_seq_len);
        config.truncate = self.truncate.unwrap_or(config.truncate);
        Ok(config)
    }

    /// The compute dtype it names, if any.
    pub fn dtype(&self) -> Result<Option<ComputeDType>> {
        self.dtype
            .as_deref()
            .map(|d| {
                d.parse::<ComputeDType>()
                    .map_err(|e| Error::Config(format!("{SETTINGS_FILE}: dtype: {e}")))
            })
            .transpose()
    }
}

/// How a [`ModelLoader`] loads.
#[derive(Debug, Clone)]
pub struct LoaderConfig {
    /// Compute dtype of a model whose settings name none; `None`: f16 on CUDA, f32
    /// elsewhere.
    pub dtype: Option<ComputeDType>,
    /// Warm up each replica after loading, tuning batches up to this many tokens (CUDA's
    /// cuBLASLt choices, read from the tuning cache when there); `None`: no warm-up, the
    /// first requests pay for it.
    pub warm_up: Option<usize>,
    /// Most device memory the served models may hold on one device, in bytes; `None`: no
    /// budget but the device's own free memory (where the backend reports it).
    pub memory_budget: Option<u64>,
    /// How long replacing or unloading a model waits for its in-flight requests before
    /// freeing it anyway.
    pub drain: Duration,
    /// The settings every model starts from; its `streampool.toml` overrides them.
    pub model: ModelConfig,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        Self {
            dtype: None,
            warm_up: None,
            memory_budget: None,
            drain: Duration::from_secs(30),
            model: ModelConfig::default(),
        }
    }
}

/// A model folder of the repository and whether it is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepositoryEntry {
    /// Its name: the folder's name.
    pub name: String,
    /// Whether it is served now.
    pub ready: bool,
}

/// Loads model folders onto the server's devices and unloads them (see the module docs).
///
/// ```
/// use streampool::Device;
/// use streampool_core::{LoaderConfig, ModelLoader, ModelConfig, Registry};
/// let registry = Registry::new(vec![], &ModelConfig::default()).unwrap();
/// let loader = ModelLoader::new(vec![Device::cpu()], LoaderConfig::default(), None);
/// let info = loader.load_dir(&registry, "tiny", &streampool_nn::tiny_bert_dir()).unwrap();
/// assert!(info.resident_total() > 0);
/// assert!(registry.contains("tiny"));
/// loader.unload(&registry, "tiny").unwrap();
/// assert!(!registry.contains("tiny"));
/// ```
pub struct ModelLoader {
    devices: Vec<Device>,
    config: LoaderConfig,
    repository: Option<PathBuf>,
    /// Held for a whole load or unload: one at a time, so each model's memory is measured
    /// alone and two loads never both pass the memory check for the same free bytes. Only
    /// loader threads take it; requests never do.
    serial: parking_lot::Mutex<()>,
}

impl ModelLoader {
    /// A loader onto `devices` (one replica per device), with `repository` the folder whose
    /// sub-folders [`load`](Self::load) finds by name.
    pub fn new(devices: Vec<Device>, config: LoaderConfig, repository: Option<PathBuf>) -> Self {
        Self {
            devices,
            config,
            repository,
            serial: parking_lot::Mutex::new(()),
        }
    }

    /// The repository folder, if any.
    pub fn repository(&self) -> Option<&Path> {
        self.repository.as_deref()
    }

    /// Its settings.
    pub fn config(&self) -> &LoaderConfig {
        &self.config
    }

    /// The repository's model folders (sub-folders holding a `config.json`), by name, and
    /// whether each is served; models served from elsewhere are listed too.
    pub fn index(&self, registry: &Registry) -> Result<Vec<RepositoryEntry>> {
        let mut entries = Vec::new();
        if let Some(root) = &self.repository {
            let dir = std::fs::read_dir(root).map_err(|e| {
                Error::Config(format!(
                    "reading the model repository {}: {e}",
                    root.display()
                ))
            })?;
            for entry in dir.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if valid_name(&name) && entry.path().join("config.json").is_file() {
                    entries.push(RepositoryEntry {
                        ready: registry.contains(&name),
                        name,
                    });
                }
            }
        }
        for (name, _) in registry.snapshot() {
            if !entries.iter().any(|e| e.name == name) {
                entries.push(RepositoryEntry { name, ready: true });
            }
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }

    /// Loads (or replaces) the repository's model `name`. Blocks for the whole load: call
    /// it off the async runtime.
    pub fn load(&self, registry: &Registry, name: &str) -> Result<ModelInfo> {
        let root = self.repository.as_ref().ok_or_else(|| {
            Error::NotFound(format!(
                "no model repository to load {} from",
                streampool_nn::Quoted(name)
            ))
        })?;
        let dir = root.join(name);
        if !valid_name(name) || !dir.join("config.json").is_file() {
            return Err(Error::NotFound(format!(
                "no model {} in the repository",
                streampool_nn::Quoted(name)
            )));
        }
        self.load_dir(registry, name, &dir)
    }

    /// Loads (or replaces) the model in `dir` under `name` (see the module docs).
    pub fn load_dir(&self, registry: &Registry, name: &str, dir: &Path) -> Result<ModelInfo> {
        let _serial = self.serial.lock();
        let loaded = self.prepare_locked(registry, name, dir)?;
        let info = loaded.info.clone();
        if let Some(old) = registry.insert(loaded)? {
            self.free(old);
        }
        Ok(info)
    }

    /// Reads the model in `dir` onto every device without serving it yet: what a server
    /// does for its start-up models before it opens its socket.
    pub fn prepare(&self, registry: &Registry, name: &str, dir: &Path) -> Result<LoadedModel> {
        let _serial = self.serial.lock();
        self.prepare_locked(registry, name, dir)
    }

    /// Stops serving `name`, waits for its in-flight requests (up to the drain time), frees
    /// it and returns the devices' idle cached memory. Blocks: call it off the async
    /// runtime.
    pub fn unload(&self, registry: &Registry, name: &str) -> Result<()> {
        let _serial = self.serial.lock();
        let model = registry.remove(name).ok_or_else(|| {
            Error::NotFound(format!("unknown model {}", streampool_nn::Quoted(name)))
        })?;
        self.free(model);
        Ok(())
    }

    fn free(&self, model: Arc<crate::ServedModel>) {
        if !retire(model, self.config.drain) {
            tracing::warn!(
                "a retired model still had requests in flight after {:?}; they keep it \
                 until they end",
                self.config.drain
            );
        }
        for dev in &self.devices {
            dev.empty_cache();
        }
    }

    fn prepare_locked(&self, registry: &Registry, name: &str, dir: &Path) -> Result<LoadedModel> {
        if !valid_name(name) {
            return Err(Error::Config(format!("invalid model name {name:?}")));
        }
        let settings = ModelSettings::read(dir)?;
        let config = settings.apply(&self.config.model)?;
        let dtype_of = |dev: &Device| -> Result<ComputeDType> {
            Ok(settings
                .dtype()?
                .or(self.config.dtype)
                .unwrap_or_else(|| default_dtype(dev)))
        };
        for dev in &self.devices {
            let needed = weight_bytes(dir, dtype_of(dev)?)?;
            self.check_fits(registry, dev, name, needed)?;
        }
        // Every device at once: a load is mostly copying weights to the device.
        let loads: Vec<Result<(ModelSpec, u64)>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .devices
                .iter()
                .map(|dev| {
                    let dtype = dtype_of(dev);
                    s.spawn(move || load_replica(dev, name, dir, dtype?, self.config.warm_up))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(Error::Model(format!("loading {name:?} panicked"))))
                })
                .collect()
        });
        let mut specs = Vec::new();
        let mut resident = Vec::new();
        for (dev, load) in self.devices.iter().zip(loads) {
            let (spec, bytes) = load?;
            resident.push((label(dev), bytes));
            specs.push(spec);
        }
        Ok(LoadedModel {
            name: name.to_string(),
            specs,
            info: ModelInfo {
                source: Some(dir.to_path_buf()),
                resident_bytes: resident,
                priority: config.batch.priority,
                weight: config.batch.weight,
                loaded_unix: unix_now(),
            },
            config,
        })
    }

    /// Refuses a load of `needed` bytes that `dev` has no room for.
    fn check_fits(&self, registry: &Registry, dev: &Device, name: &str, needed: u64) -> Result<()> {
        let here = label(dev);
        let mut free: Option<(u64, &str)> = None;
        if let Some(budget) = self.config.memory_budget {
            let held: u64 = registry
                .snapshot_info()
                .iter()
                .flat_map(|(_, _, info)| info.resident_bytes.iter())
                .filter(|(l, _)| *l == here)
                .map(|(_, b)| b)
                .sum();
            free = Some((budget.saturating_sub(held), "of the memory budget"));
        }
        if let Some(mem) = dev.memory_info() {
            let stats = dev.allocator_stats();
            let idle = stats.reserved.saturating_sub(stats.allocated) as u64;
            let device_free = mem.free as u64 + idle;
            if free.is_none_or(|(f, _)| device_free < f) {
                free = Some((device_free, "of the device's memory"));
            }
        }
        match free {
            Some((free, what)) if needed > free => Err(Error::InsufficientMemory {
                message: format!(
                    "model {} needs {} MiB on {here} for its weights; {} MiB {what} is free \
                     (unload a model or raise the budget)",
                    streampool_nn::Quoted(name),
                    needed.div_ceil(1 << 20),
                    free >> 20
                ),
                needed,
                free,
            }),
            _ => Ok(()),
        }
    }
}

/// A name a model may be served and found under: a plain folder name.
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The label `/metrics` and the registry give `dev`.
fn label(dev: &Device) -> String {
    match dev.kind() {
        DeviceKind::Cuda(n) => format!("cuda:{n}"),
        DeviceKind::Cpu => "cpu".into(),
        #[allow(unreachable_patterns)] // other backends may come
        _ => dev.name(),
    }
}

/// f16 on CUDA (tensor cores), f32 elsewhere.
pub fn default_dtype(dev: &Device) -> ComputeDType {
    match dev.kind() {
        DeviceKind::Cuda(_) => ComputeDType::F16,
        _ => ComputeDType::F32,
    }
}

/// The model in `dir` on `dev`, warmed up, and the device memory it holds.
fn load_replica(
    dev: &Device,
    name: &str,
    dir: &Path,
    dtype: ComputeDType,
    warm_up: Option<usize>,
) -> Result<(ModelSpec, u64)> {
    // This thread's own allocations: other models' requests allocate meanwhile.
    let before = streampool::allocator::thread_net_allocated();
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        Error::Config(format!(
            "{what} {name:?} from {} on {} as {dtype}: {e}",
            dir.display(),
            dev.name()
        ))
    };
    let config = BertConfig::from_file(dir.join("config.json"))
        .map_err(|e| failed("reading the config of", &e))?;
    let spec = if config.is_sequence_classifier() {
        let classifier =
            Classifier::load_with(dev, dir, dtype).map_err(|e| failed("loading", &e))?;
        if warm_up.is_some() {
            classifier
                .predict(&["warm-up"])
                .map_err(|e| failed("warming up", &e))?;
        }
        ModelSpec::Classifier {
            name: name.to_string(),
            classifier: Arc::new(classifier),
        }
    } else {
        let embedder =
            SentenceEmbedder::load_with(dev, dir, dtype).map_err(|e| failed("loading", &e))?;
        if let Some(max_tokens) = warm_up {
            embedder
                .warm_up()
                .and_then(|()| embedder.warm_up_tuning(max_tokens))
                .map_err(|e| failed("warming up", &e))?;
        }
        ModelSpec::Embedder {
            name: name.to_string(),
            embedder: Arc::new(embedder),
        }
    };
    let held = streampool::allocator::thread_net_allocated() - before;
    Ok((spec, held.max(0) as u64))
}

/// The bytes the weights in `dir`'s safetensors files take at `dtype` (half types: 2 per
/// parameter, others 4), from the files' headers alone.
pub fn weight_bytes(dir: &Path, dtype: ComputeDType) -> Result<u64> {
    let per_param: u64 = if dtype.is_half() { 2 } else { 4 };
    let read_err = |p: &Path, e: &dyn std::fmt::Display| {
        Error::Config(format!(
            "reading the weights' header of {}: {e}",
            p.display()
        ))
    };
    let mut params = 0u64;
    let entries = std::fs::read_dir(dir).map_err(|e| read_err(dir, &e))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("safetensors") {
            continue;
        }
        use std::io::Read;
        let mut file = std::fs::File::open(&path).map_err(|e| read_err(&path, &e))?;
        let mut len = [0u8; 8];
        file.read_exact(&mut len).map_err(|e| read_err(&path, &e))?;
        let len = u64::from_le_bytes(len);
        // safetensors caps its header at 100 MB; a larger length is a corrupt file.
        if len > 100 << 20 {
            return Err(read_err(&path, &"header larger than 100 MB"));
        }
        let mut header = vec![0u8; len as usize];
        file.read_exact(&mut header)
            .map_err(|e| read_err(&path, &e))?;
        let meta: std::collections::HashMap<String, HeaderEntry> =
            serde_json::from_slice(&header).map_err(|e| read_err(&path, &e))?;
        params += meta
            .values()
            .filter_map(|t| t.shape.as_ref())
            .map(|s| s.iter().product::<u64>())
            .sum::<u64>();
    }
    Ok(params * per_param)
}

/// One entry of a safetensors header (`__metadata__` has no shape).
#[derive(Deserialize)]
struct HeaderEntry {
    shape: Option<Vec<u64>>,
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use streampool_nn::tiny_bert_dir;

    use super::*;

    /// A repository folder holding copies of the tiny model under `names`, with optional
    /// settings text per name.
    fn repository(tag: &str, models: &[(&str, Option<&str>)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("sp-repo-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (name, settings) in models {
            let dir = root.join(name);
            std::fs::create_dir_all(&dir).unwrap();
            for f in std::fs::read_dir(tiny_bert_dir()).unwrap().flatten() {
                if f.path().is_file() {
                    std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
                }
            }
            if let Some(text) = settings {
                std::fs::write(dir.join(SETTINGS_FILE), text).unwrap();
            }
        }
        root
    }

    fn empty_registry() -> Registry {
        Registry::new(vec![], &ModelConfig::default()).unwrap()
    }

    #[test]
    fn settings_override_the_base_and_bad_ones_are_refused() {
        let base = ModelConfig::default();
        let s = ModelSettings::parse(
            "dtype = \"f32\"\npriority = \"low\"\nweight = 3\nmax_batch_size = 8\nworkers = 1\n\
             max_seq_len = 64\ntruncate = true\n",
        )
        .unwrap();
        let c = s.apply(&base).unwrap();
        assert_eq!(c.batch.priority, Priority::Low);
        assert_eq!(
            (c.batch.weight, c.batch.max_batch_size, c.batch.workers),
            (3, 8, 1)
        );
        assert_eq!(c.batch.max_batch_tokens, base.batch.max_batch_tokens);
        assert_eq!((c.max_seq_len, c.truncate), (Some(64), true));
        assert_eq!(s.dtype().unwrap(), Some(ComputeDType::F32));
        for bad in [
            "priority = \"urgent\"",
            "weight = 0",
            "workers = 0",
            "dtype = \"f8\"",
            "unknown = 1",
            "max_batch_size = \"many\"",
        ] {
            let parsed = ModelSettings::parse(bad);
            let applied = parsed.as_ref().map(|s| (s.apply(&base), s.dtype()));
            let refused = match applied {
                Err(_) => true,
                Ok((a, d)) => a.is_err() || d.is_err(),
            };
            assert!(refused, "{bad} was accepted");
        }
    }

    #[test]
    fn weight_bytes_count_every_parameter_at_the_compute_dtype() {
        let f32_bytes = weight_bytes(&tiny_bert_dir(), ComputeDType::F32).unwrap();
        let f16_bytes = weight_bytes(&tiny_bert_dir(), ComputeDType::F16).unwrap();
        assert!(f32_bytes > 0);
        assert_eq!(f32_bytes, 2 * f16_bytes);
        // The file holds the same parameters (stored as f16 or f32) plus a small header.
        let file = std::fs::metadata(tiny_bert_dir().join("model.safetensors"))
            .unwrap()
            .len();
        assert!(
            f16_bytes <= file && file <= f32_bytes + (64 << 10),
            "{f16_bytes}..{f32_bytes} vs {file}"
        );
    }

    #[test]
    fn load_replace_and_unload_change_the_live_set() {
        let root = repository("live", &[("a", None), ("b", Some("priority = \"high\"\n"))]);
        let registry = empty_registry();
        let loader = ModelLoader::new(
            vec![streampool::Device::cpu()],
            LoaderConfig::default(),
            Some(root.clone()),
        );
        let names = |r: &Registry| r.snapshot().into_iter().map(|(n, _)| n).collect::<Vec<_>>();
        let index = loader.index(&registry).unwrap();
        assert_eq!(index.len(), 2);
        assert!(index.iter().all(|e| !e.ready));
        let info = loader.load(&registry, "b").unwrap();
        assert_eq!(info.priority, Priority::High);
        assert!(info.resident_total() > 0);
        assert_eq!(names(&registry), ["b"]);
        // Replacing: a request holding the old model keeps it until it lets go.
        let old = registry.get("b").unwrap();
        let holder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(old);
        });
        let began = Instant::now();
        loader.load(&registry, "b").unwrap();
        assert!(
            began.elapsed() >= Duration::from_millis(150),
            "did not wait for the holder"
        );
        holder.join().unwrap();
        loader.load(&registry, "a").unwrap();
        assert_eq!(names(&registry), ["a", "b"]);
        loader.unload(&registry, "a").unwrap();
        assert_eq!(names(&registry), ["b"]);
        assert!(matches!(registry.get("a"), Err(Error::NotFound(_))));
        assert!(matches!(
            loader.unload(&registry, "a"),
            Err(Error::NotFound(_))
        ));
        for missing in ["c", "../a", ".hidden", ""] {
            assert!(
                matches!(loader.load(&registry, missing), Err(Error::NotFound(_))),
                "{missing}"
            );
        }
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn a_load_over_the_budget_is_refused_with_what_it_needs() {
        let root = repository("budget", &[("a", None), ("b", None)]);
        let need = weight_bytes(&root.join("a"), ComputeDType::F32).unwrap();
        let registry = empty_registry();
        // Room for one copy, not two.
        let loader = ModelLoader::new(
            vec![streampool::Device::cpu()],
            LoaderConfig {
                memory_budget: Some(need * 3 / 2),
                ..LoaderConfig::default()
            },
            Some(root.clone()),
        );
        loader.load(&registry, "a").unwrap();
        match loader.load(&registry, "b") {
            Err(Error::InsufficientMemory {
                needed, message, ..
            }) => {
                assert_eq!(needed, need);
                assert!(message.contains("MiB"), "{message}");
            }
            other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
        }
        assert!(!registry.contains("b"));
        // Unloading makes room.
        loader.unload(&registry, "a").unwrap();
        loader.load(&registry, "b").unwrap();
        std::fs::remove_dir_all(root).unwrap();
    }
}
