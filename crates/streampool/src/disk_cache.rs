//! An on-disk cache of byte blobs keyed by byte strings: what lets a process skip work an
//! earlier process on the same machine already did (the CUDA backend's NVRTC output, so a
//! second start loads a cubin instead of compiling `kernels.cu` again).
//!
//! It knows nothing of GPUs: the caller puts everything the value depends on into the key
//! (for kernels: the source, the compile options, the compiler's version and the GPU's
//! architecture), so a changed input is a different key, never a stale hit. The store
//! logic is tested on the CPU (`tests/it/disk_cache.rs`).
//!
//! How it stays safe with no lock:
//! - **One file per key**, named by a 128-bit SipHash of the key.
//! - **Atomic writes**: a value is written whole to a temporary file in the same folder
//!   (named by process, thread and time, so no two writers share one) and renamed over the
//!   entry. A reader sees the old entry, the new one or none, never half of one; concurrent
//!   writers of a key write the same bytes and the last rename wins.
//! - **Checked reads**: an entry starts with a header holding the key's hash, the value's
//!   length and the value's hash. A file that is truncated (a crash before the data reached
//!   the disk), corrupt or another key's is a miss, and the caller's next `put` replaces it.
//!   This matters for kernels: the driver's `cuModuleLoadData` takes a pointer with no
//!   length, so a truncated cubin must never reach it.
//! - **Failures are misses**: an unreadable or unwritable folder (a read-only home) costs
//!   the work the cache would have saved, never an error of the caller's operation;
//!   [`DiskCache::put`] returns the I/O error so the caller can log it.
//! - **Bounded**: after each write the oldest entries beyond [`DiskCache::max_entries`]
//!   are removed (a development machine rebuilding `kernels.cu` would otherwise gather one
//!   entry per edit), and leftover temporary files of crashed writers older than an hour.

use std::hash::Hasher;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use siphasher::sip128::{Hasher128, SipHasher13};

pub use crate::config::{CACHE_DIR_ENV, CACHE_ROOT_ENV, KERNEL_CACHE_ENV};

/// First bytes of every entry, and the format's version.
const MAGIC: &[u8; 4] = b"SPKC";
const FORMAT: u32 = 1;
/// Magic, format, key hash, value length, value hash.
const HEADER: usize = 4 + 4 + 16 + 8 + 16;
/// File name ending of entries and of temporary files.
const ENTRY_EXT: &str = "spk";
const TEMP_EXT: &str = "tmp";
/// A temporary file older than this is a crashed writer's leftover.
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// Where a device keeps compiled kernels between processes ([`DeviceConfig::kernel_cache`]
/// (crate::DeviceConfig::kernel_cache); used by the CUDA backend for its NVRTC cubins).
///
/// ```
/// use streampool::{DeviceConfig, KernelCacheDir};
/// let config = DeviceConfig { kernel_cache: KernelCacheDir::Off, ..DeviceConfig::default() };
/// assert_eq!(config.kernel_cache.resolve(), None);
/// let dir = KernelCacheDir::Dir("/var/cache/sp".into()).resolve().unwrap();
/// assert_eq!(dir.dir(), std::path::Path::new("/var/cache/sp"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum KernelCacheDir {
    /// As the process's tunables say ([`DiskCache::kernels_from_env`]: the environment's,
    /// unless the program set its own with [`config::set`](crate::config::set)): the default.
    #[default]
    FromEnv,
    /// This folder, whatever the environment says.
    Dir(PathBuf),
    /// No disk cache: every process compiles its kernels.
    Off,
}

impl KernelCacheDir {
    /// The cache this setting names, if any.
    pub fn resolve(&self) -> Option<DiskCache> {
        match self {
            KernelCacheDir::FromEnv => DiskCache::kernels_from_env(),
            KernelCacheDir::Dir(dir) => Some(DiskCache::new(dir)),
            KernelCacheDir::Off => None,
        }
    }
}

/// A folder of immutable values keyed by byte strings, safe to share between threads and
/// processes (see the module documentation for how).
///
/// ```
/// use streampool::DiskCache;
/// let dir = std::env::temp_dir().join(format!("sp-doc-{}", std::process::id()));
/// let cache = DiskCache::new(&dir);
/// assert_eq!(cache.get(b"kernels for sm_90"), None);
/// cache.put(b"kernels for sm_90", b"cubin bytes").unwrap();
/// assert_eq!(cache.get(b"kernels for sm_90").as_deref(), Some(&b"cubin bytes"[..]));
/// # std::fs::remove_dir_all(&dir).unwrap();
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskCache {
    dir: PathBuf,
    max_entries: usize,
}

impl DiskCache {
    /// Entries kept by default: a few GPU architectures times a few builds of the CUDA
    /// backend's kernel groups (a dozen entries each).
    pub const DEFAULT_MAX_ENTRIES: usize = 64;

    /// A cache in `dir`, created on the first [`put`](Self::put).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            max_entries: Self::DEFAULT_MAX_ENTRIES,
        }
    }

    /// The same cache keeping at most `n` entries (at least 1).
    pub fn with_max_entries(mut self, n: usize) -> Self {
        self.max_entries = n.max(1);
        self
    }

    /// The kernel cache the process's tunables name
    /// ([`CacheTuning::kernel_dir`](crate::config::CacheTuning::kernel_dir) of
    /// [`config::tuning`](crate::config::tuning), from the environment unless the program
    /// set them), or `None` when it is turned off (`STREAMPOOL_KERNEL_CACHE=0`) or no folder
    /// can be named. The folder is, first found: `$STREAMPOOL_CACHE_DIR`,
    /// `$STREAMPOOL_CACHE/kernels`, `$XDG_CACHE_HOME/streampool/kernels`,
    /// `$HOME/.cache/streampool/kernels`.
    ///
    /// ```
    /// // Whatever the environment, a cache (if any) is a folder path.
    /// if let Some(cache) = streampool::DiskCache::kernels_from_env() {
    ///     assert!(!cache.dir().as_os_str().is_empty());
    /// }
    /// ```
    pub fn kernels_from_env() -> Option<Self> {
        crate::config::tuning().cache.kernel_dir().map(Self::new)
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Most entries kept.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// The file that holds (or would hold) `key`'s value.
    pub fn path_for(&self, key: &[u8]) -> PathBuf {
        self.dir.join(format!("{}.{ENTRY_EXT}", hex(&hash(key))))
    }

    /// The value stored for `key`, or `None`: never stored, removed, unreadable, truncated
    /// or corrupt (the last three are logged; a later [`put`](Self::put) replaces the file).
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let path = self.path_for(key);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cache entry unreadable; ignored");
                return None;
            }
        };
        let value = decode(&bytes, &hash(key));
        if value.is_none() {
            tracing::warn!(path = %path.display(), "cache entry corrupt or truncated; ignored");
        }
        value
    }

    /// Stores `value` for `key`, atomically (whole or not at all, as seen by any reader),
    /// and returns the entry's path. An error (folder not creatable or not writable, disk
    /// full) leaves any earlier entry in place; callers log it and go on.
    pub fn put(&self, key: &[u8], value: &[u8]) -> io::Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path_for(key);
        let temp = self.dir.join(temp_name(&path));
        let written = write_new(&temp, &encode(&hash(key), value))
            .and_then(|()| std::fs::rename(&temp, &path));
        if let Err(e) = written {
            // Best effort: the temporary file may not exist.
            let _ = std::fs::remove_file(&temp);
            return Err(e);
        }
        self.prune(&path);
        Ok(path)
    }

    /// Removes the oldest entries beyond `max_entries` (never `keep`, the one just written,
    /// whatever the clock's resolution) and stale temporary files. Errors are ignored:
    /// another process may be pruning too, and a missing entry is a miss.
    fn prune(&self, keep: &Path) {
        let Ok(read) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let now = SystemTime::now();
        let mut entries = Vec::new();
        for e in read.flatten() {
            let path = e.path();
            let Some(modified) = e.metadata().ok().and_then(|m| m.modified().ok()) else {
                continue;
            };
            match path.extension().and_then(|x| x.to_str()) {
                Some(ENTRY_EXT) if path != keep => entries.push((modified, path)),
                Some(TEMP_EXT) if now.duration_since(modified).unwrap_or_default() > STALE_TEMP => {
                    let _ = std::fs::remove_file(&path);
                }
                _ => {}
            }
        }
        // `keep` takes one of the places.
        let others = self.max_entries - 1;
        if entries.len() <= others {
            return;
        }
        // Newest first; everything past the limit goes.
        entries.sort_by_key(|e| std::cmp::Reverse(e.0));
        for (_, path) in entries.drain(others..) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// SipHash-1-3 with fixed keys: the same on every machine and build (unlike `std`'s
/// `DefaultHasher`, whose algorithm may change between Rust releases).
fn hash(bytes: &[u8]) -> [u8; 16] {
    let mut h = SipHasher13::new_with_keys(0x7370_6b63_6163_6865, 0x6b65_726e_656c_7331);
    h.write(bytes);
    u128::from(h.finish128()).to_le_bytes()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn encode(key_hash: &[u8; 16], value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + value.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(key_hash);
    out.extend_from_slice(&(value.len() as u64).to_le_bytes());
    out.extend_from_slice(&hash(value));
    out.extend_from_slice(value);
    out
}

/// The value of an entry file, if the file is whole and holds `key_hash`'s value.
fn decode(bytes: &[u8], key_hash: &[u8; 16]) -> Option<Vec<u8>> {
    let (header, value) = bytes.split_at_checked(HEADER)?;
    let (magic, rest) = header.split_at(4);
    let (format, rest) = rest.split_at(4);
    let (stored_key, rest) = rest.split_at(16);
    let (len, value_hash) = rest.split_at(8);
    let ok = magic == MAGIC
        && format == FORMAT.to_le_bytes()
        && stored_key == key_hash
        && len == (value.len() as u64).to_le_bytes()
        && value_hash == hash(value);
    ok.then(|| value.to_vec())
}

/// A temporary name no other writer uses: process, thread and time.
fn temp_name(entry: &Path) -> String {
    let stem = entry.file_stem().map(|s| s.to_string_lossy().into_owned());
    let thread: String = format!("{:?}", std::thread::current().id())
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        ".{}.{}.{thread}.{nanos}.{TEMP_EXT}",
        stem.unwrap_or_default(),
        std::process::id()
    )
}

/// Writes `bytes` to a file that must not exist yet.
fn write_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    f.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_rejects_every_damaged_header() {
        let k = hash(b"key");
        let good = encode(&k, b"value");
        assert_eq!(decode(&good, &k).as_deref(), Some(&b"value"[..]));
        assert_eq!(decode(&good, &hash(b"other key")), None);
        assert_eq!(decode(&good[..good.len() - 1], &k), None);
        assert_eq!(decode(&good[..HEADER - 1], &k), None);
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x40;
            assert_eq!(decode(&bad, &k), None, "byte {i} flipped");
        }
    }

    #[test]
    fn hash_is_pinned() {
        // Entries written by one build must be found by the next: if this value changes
        // (another hash crate, other keys), every cache on every machine goes cold.
        assert_eq!(
            hex(&hash(b"streampool")),
            "73cfcd5bb3e180e73c6385eb7219ec9b"
        );
        assert_ne!(hash(b"a"), hash(b"b"));
    }
}
