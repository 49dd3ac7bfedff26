//! The gate's verdicts kept on disk, so that a model is measured once per machine, not at
//! every load.
//!
//! What the gate measures depends only on the model's files, the dtype's arithmetic, the
//! corpus and this crate's code; the key holds all of them: a 128-bit SipHash of every file
//! the loader reads (the weights included, about 40 ms for MiniLM's 91 MB), the dtype and
//! [`MatmulMath::arithmetic`](streampool::MatmulMath::arithmetic) (which changes with the
//! quantized arithmetic), the corpus and `k`, and this crate's version. The value is the
//! [`AccuracyReport`] itself, not a pass/fail bit: the thresholds are applied to it at each
//! load, so a stricter caller is refused from the cache too. Storage is
//! [`streampool::DiskCache`]: one file per key, written atomically, checked on read, so a
//! torn or foreign file is a miss and the gate runs again.

use std::hash::Hasher;
use std::io::Read;
use std::path::{Path, PathBuf};

use siphasher::sip128::{Hasher128, SipHasher13};
use streampool::DiskCache;

use super::{AccuracyReport, CORPUS, GATE_TOP_K};
use crate::{ComputeDType, Result};

/// Where [`SentenceEmbedder::load_with_options`](crate::SentenceEmbedder::load_with_options)
/// keeps the gate's verdicts ([`LoadOptions::gate_cache`](super::LoadOptions::gate_cache)).
///
/// ```
/// use streampool_nn::accuracy::GateCache;
/// assert!(GateCache::Off.resolve().is_none());
/// let dir = GateCache::Dir("/var/cache/sp-gate".into()).resolve().unwrap();
/// assert_eq!(dir.dir(), std::path::Path::new("/var/cache/sp-gate"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GateCache {
    /// The `accuracy-gate` folder of streampool's cache root ([`crate::cache_dir`]: the one
    /// the model installer and the kernel cache use); none when no root can be named.
    #[default]
    Default,
    /// This folder.
    Dir(PathBuf),
    /// No cache: every load measures.
    Off,
}

impl GateCache {
    /// Entries kept: a few models times a few dtypes and builds.
    pub const MAX_ENTRIES: usize = 64;

    /// The cache this setting names, if any.
    pub fn resolve(&self) -> Option<DiskCache> {
        let dir = match self {
            GateCache::Default => crate::cache_dir()?.join("accuracy-gate"),
            GateCache::Dir(dir) => dir.clone(),
            GateCache::Off => return None,
        };
        Some(DiskCache::new(dir).with_max_entries(Self::MAX_ENTRIES))
    }
}

/// Files of a model folder the loader may read, besides the `config.json` of each module
/// folder (`1_Pooling/config.json`).
const MODEL_FILES: [&str; 9] = [
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
];

/// The key of `dir`'s model in `dtype` (see the module docs).
///
/// # Errors
/// [`crate::Error::Io`] when a file the folder lists cannot be read.
fn key(dir: &Path, dtype: ComputeDType) -> Result<Vec<u8>> {
    let mut key = Vec::new();
    let mut field = |name: &str, value: &[u8]| {
        key.extend_from_slice(name.as_bytes());
        key.push(0);
        key.extend_from_slice(&(value.len() as u64).to_le_bytes());
        key.extend_from_slice(value);
    };
    field(
        "streampool-nn accuracy gate",
        env!("CARGO_PKG_VERSION").as_bytes(),
    );
    field("dtype", dtype.to_string().as_bytes());
    field("arithmetic", dtype.math().arithmetic().as_bytes());
    field("corpus", &digest_bytes(CORPUS.as_bytes()));
    field("k", &(GATE_TOP_K as u64).to_le_bytes());
    for path in model_files(dir)? {
        let name = path.strip_prefix(dir).unwrap_or(&path).to_string_lossy();
        field(&name, &digest_file(&path)?);
    }
    Ok(key)
}

/// The files of `dir` that [`key`] hashes, in a fixed order.
fn model_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = MODEL_FILES
        .iter()
        .map(|f| dir.join(f))
        .filter(|p| p.is_file())
        .collect();
    let mut modules = Vec::new();
    let io = |e| crate::Error::io(dir, e);
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let sub = entry.map_err(io)?.path().join("config.json");
        if sub.is_file() {
            modules.push(sub);
        }
    }
    modules.sort();
    files.extend(modules);
    Ok(files)
}

/// A 128-bit SipHash of `bytes`.
fn digest_bytes(bytes: &[u8]) -> [u8; 16] {
    let mut h = SipHasher13::new();
    h.write(bytes);
    h.finish128().as_bytes()
}

/// A 128-bit SipHash of a file's bytes, read in pieces.
fn digest_file(path: &Path) -> Result<[u8; 16]> {
    let io = |e| crate::Error::io(path, e);
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut h = SipHasher13::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        h.write(&buf[..n]);
    }
    Ok(h.finish128().as_bytes())
}

/// One model's entry in the cache: where, and under which key.
pub(crate) struct GateStore {
    disk: DiskCache,
    key: Vec<u8>,
}

impl GateStore {
    /// The entry of `dir`'s model in `dtype` in the cache `setting` names (`None` when it
    /// names none).
    ///
    /// # Errors
    /// [`crate::Error::Io`] when a model file cannot be read.
    pub(crate) fn open(
        setting: &GateCache,
        dir: &Path,
        dtype: ComputeDType,
    ) -> Result<Option<Self>> {
        let Some(disk) = setting.resolve() else {
            return Ok(None);
        };
        Ok(Some(Self {
            disk,
            key: key(dir, dtype)?,
        }))
    }

    /// The stored report, if any (anything unreadable is a miss).
    pub(crate) fn get(&self) -> Option<AccuracyReport> {
        lookup(&self.disk, &self.key)
    }

    /// Stores `report` (see [`store`]).
    pub(crate) fn put(&self, report: &AccuracyReport) {
        store(&self.disk, &self.key, report);
    }
}

/// The report stored under `key`, if any (anything unreadable is a miss).
fn lookup(cache: &DiskCache, key: &[u8]) -> Option<AccuracyReport> {
    let bytes = cache.get(key)?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    // The bits, not the decimal: serde_json's parser may miss the last bit of a float.
    let f = |name: &str| Some(f64::from_bits(v.get(name)?.get("bits")?.as_u64()?));
    let u = |name: &str| usize::try_from(v.get(name)?.as_u64()?).ok();
    Some(AccuracyReport {
        sentences: u("sentences")?,
        min_cosine: f("min_cosine")?,
        mean_cosine: f("mean_cosine")?,
        top_k_agreement: f("top_k_agreement")?,
        k: u("k")?,
    })
}

/// Stores `report` under `key`; a failure (a read-only folder) only costs the next load a
/// measurement, and is logged.
fn store(cache: &DiskCache, key: &[u8], report: &AccuracyReport) {
    // Each measure as its bits (read back exactly) beside its value (for a reader).
    let f = |x: f64| serde_json::json!({ "value": x, "bits": x.to_bits() });
    let value = serde_json::json!({
        "sentences": report.sentences,
        "min_cosine": f(report.min_cosine),
        "mean_cosine": f(report.mean_cosine),
        "top_k_agreement": f(report.top_k_agreement),
        "k": report.k,
    });
    if let Err(e) = cache.put(key, value.to_string().as_bytes()) {
        tracing::warn!(
            "accuracy gate: could not keep the verdict in {}: {e}",
            cache.dir().display()
        );
    }
}
