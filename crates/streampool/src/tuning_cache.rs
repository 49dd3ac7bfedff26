//! Tuning results kept on disk, so that a GEMM shape is timed once per machine rather than
//! once per process: the CUDA backend times cuBLASLt's candidate algorithms for a large
//! shape on its first use (`cuda/blas_lt.rs`) and stores the winner here; the next process
//! on the same machine (a restarted or autoscaled replica) takes it without timing.
//!
//! An entry is keyed by everything the choice depends on: the GPU (its name and compute
//! capability), the library and its version, and the shape (the caller's text of it). A
//! different GPU, driver library or shape is a different key, never a stale hit. The store
//! is a [`DiskCache`] (atomic writes, checked reads: a truncated or corrupt file is a miss);
//! on top of it a value must parse as a choice of this format, and the caller still asks
//! the library to accept an algorithm for the exact shape before using it, so a bad entry
//! costs a re-tune, never a wrong or failed call. Tested on the CPU (`tests/it/tuning_cache.rs`).

use std::path::Path;

use crate::DiskCache;

/// Entries kept: a few models' GEMM shapes times their token buckets, on a few GPUs.
pub const DEFAULT_MAX_TUNING_ENTRIES: usize = 4096;

/// First bytes of a value, and the format's version (bumped if a value's meaning changes).
const VALUE_MAGIC: &[u8; 4] = b"SPT1";
/// Words in an algorithm's opaque description (`cublasLtMatmulAlgo_t` is 8 x u64).
pub const ALGO_WORDS: usize = 8;

/// What tuning settled on for a shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TunedChoice {
    /// Timing found nothing better to keep (fewer than two candidates ran): use the
    /// library's heuristic choice.
    Heuristic,
    /// The fastest algorithm measured, as the library's opaque words.
    Algorithm([u64; ALGO_WORDS]),
}

impl TunedChoice {
    /// The bytes stored for this choice.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = VALUE_MAGIC.to_vec();
        match self {
            TunedChoice::Heuristic => v.push(0),
            TunedChoice::Algorithm(words) => {
                v.push(1);
                for w in words {
                    v.extend_from_slice(&w.to_le_bytes());
                }
            }
        }
        v
    }

    /// The choice `bytes` hold, or `None` if they are not a value of this format.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let rest = bytes.strip_prefix(VALUE_MAGIC)?;
        match rest {
            [0] => Some(TunedChoice::Heuristic),
            [1, words @ ..] if words.len() == 8 * ALGO_WORDS => {
                let mut out = [0u64; ALGO_WORDS];
                for (o, chunk) in out.iter_mut().zip(words.chunks_exact(8)) {
                    let mut w = [0u8; 8];
                    w.copy_from_slice(chunk);
                    *o = u64::from_le_bytes(w);
                }
                Some(TunedChoice::Algorithm(out))
            }
            _ => None,
        }
    }
}

/// Whose tuning an entry is: the GPU and the library that timed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TuningScope {
    /// The GPU's name as the driver reports it (e.g. `NVIDIA H100 80GB HBM3`).
    pub gpu: String,
    /// Its compute capability.
    pub compute_capability: (i32, i32),
    /// The tuned library and its version (e.g. `cuBLASLt 130000`).
    pub library: String,
}

/// Tuning choices on disk for one [`TuningScope`].
///
/// ```
/// use streampool::{TunedChoice, TuningCache, TuningScope};
/// let dir = std::env::temp_dir().join(format!("sp-tuning-doc-{}", std::process::id()));
/// let scope = TuningScope {
///     gpu: "NVIDIA H100 80GB HBM3".into(),
///     compute_capability: (9, 0),
///     library: "cuBLASLt 130000".into(),
/// };
/// let cache = TuningCache::new(&dir, scope);
/// assert_eq!(cache.get("f16 gelu 1536x1024x384"), None);
/// cache.put("f16 gelu 1536x1024x384", TunedChoice::Algorithm([7; 8])).unwrap();
/// assert_eq!(cache.get("f16 gelu 1536x1024x384"), Some(TunedChoice::Algorithm([7; 8])));
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct TuningCache {
    disk: DiskCache,
    scope: TuningScope,
}

impl TuningCache {
    /// Choices of `scope` in folder `dir` (created on the first [`put`](Self::put)).
    pub fn new(dir: impl AsRef<Path>, scope: TuningScope) -> Self {
        Self {
            disk: DiskCache::new(dir.as_ref()).with_max_entries(DEFAULT_MAX_TUNING_ENTRIES),
            scope,
        }
    }

    /// The folder a kernel cache in `kernel_dir` keeps its tuning choices in: its `tuning`
    /// subfolder (so turning the kernel cache off or moving it takes tuning with it).
    pub fn dir_beside(kernel_dir: &Path) -> std::path::PathBuf {
        kernel_dir.join("tuning")
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        self.disk.dir()
    }

    /// Whose choices these are.
    pub fn scope(&self) -> &TuningScope {
        &self.scope
    }

    /// The store's key of `shape`: the format, the scope, then the shape.
    pub fn key(&self, shape: &str) -> Vec<u8> {
        let s = &self.scope;
        format!(
            "streampool tuning v1\ngpu {}\ncompute capability {}.{}\nlibrary {}\nshape {shape}",
            s.gpu, s.compute_capability.0, s.compute_capability.1, s.library
        )
        .into_bytes()
    }

    /// The choice stored for `shape`, or `None`: never stored, or the entry is unreadable,
    /// corrupt or not a choice of this format (logged; the next [`put`](Self::put) replaces
    /// it).
    pub fn get(&self, shape: &str) -> Option<TunedChoice> {
        let key = self.key(shape);
        let bytes = self.disk.get(&key)?;
        let choice = TunedChoice::decode(&bytes);
        if choice.is_none() {
            tracing::warn!(
                path = %self.disk.path_for(&key).display(),
                "tuning entry is not a choice of this format; ignored"
            );
        }
        choice
    }

    /// Stores `choice` for `shape` (atomically). An error (folder not writable, disk full)
    /// only means the next process tunes again; callers log it.
    pub fn put(&self, shape: &str, choice: TunedChoice) -> std::io::Result<()> {
        self.disk.put(&self.key(shape), &choice.encode()).map(drop)
    }
}
