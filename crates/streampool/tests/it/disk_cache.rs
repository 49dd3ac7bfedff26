//! The on-disk cache behind the CUDA kernel cache, on the CPU: round trips, damaged entries,
//! many writers and readers at once, folders that cannot be written, and the entry bound.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};

use streampool::DiskCache;

/// A fresh folder under the system's temporary folder, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "streampool-disk-cache-{what}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        Self(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Files in `dir`, split into entries and anything else.
fn files(dir: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .partition(|p| p.extension().is_some_and(|x| x == "spk"))
}

#[test]
fn round_trip_and_distinct_keys() {
    let tmp = TempDir::new("round-trip");
    let cache = DiskCache::new(tmp.path().join("nested/kernels"));
    assert_eq!(
        cache.get(b"a"),
        None,
        "empty cache (folder not even created)"
    );
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let path = cache.put(b"a", &big).unwrap();
    assert_eq!(path, cache.path_for(b"a"));
    cache.put(b"b", b"").unwrap();
    assert!(cache.get(b"a") == Some(big.clone()));
    assert_eq!(cache.get(b"b"), Some(Vec::new()));
    assert_eq!(cache.get(b"c"), None);
    // A second handle on the same folder (another process, in effect) sees the entries.
    let other = DiskCache::new(cache.dir());
    assert!(other.get(b"a") == Some(big));
    // Overwriting replaces the value.
    other.put(b"b", b"new").unwrap();
    assert_eq!(cache.get(b"b").as_deref(), Some(&b"new"[..]));
    // No temporary file is left behind.
    let (entries, rest) = files(cache.dir());
    assert_eq!((entries.len(), rest.len()), (2, 0), "{rest:?}");
}

#[test]
fn damaged_entries_are_misses_and_get_rebuilt() {
    let tmp = TempDir::new("corrupt");
    let cache = DiskCache::new(tmp.path());
    let value = b"a cubin, say".repeat(100);
    let path = cache.put(b"key", &value).unwrap();
    let good = std::fs::read(&path).unwrap();

    let damage: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("truncated header", good[..20].to_vec()),
        ("truncated value", good[..good.len() - 7].to_vec()),
        ("trailing bytes", [good.clone(), b"xx".to_vec()].concat()),
        ("flipped value byte", {
            let mut b = good.clone();
            let i = b.len() - 100;
            b[i] ^= 1;
            b
        }),
        ("flipped header byte", {
            let mut b = good.clone();
            b[10] ^= 0x80;
            b
        }),
        ("garbage", vec![0xAB; good.len()]),
    ];
    for (what, bytes) in damage {
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(cache.get(b"key"), None, "{what}");
        // The caller's rebuild replaces it.
        cache.put(b"key", &value).unwrap();
        assert_eq!(cache.get(b"key").as_deref(), Some(&value[..]), "{what}");
    }

    // Another key's entry copied under this key's name is not this key's value.
    let other = cache.put(b"other key", b"other value").unwrap();
    std::fs::copy(&other, &path).unwrap();
    assert_eq!(cache.get(b"key"), None);

    // An entry that is a folder (unreadable as a file) is a miss too, not an error.
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    assert_eq!(cache.get(b"key"), None);
}

#[test]
fn concurrent_writers_and_readers_never_see_half_an_entry() {
    let tmp = TempDir::new("concurrent");
    let cache = DiskCache::new(tmp.path());
    const THREADS: usize = 16;
    const ROUNDS: usize = 20;
    // Four keys; every writer of a key writes that key's one value (as processes compiling
    // the same kernels do), large enough that a torn write would be visible.
    let value =
        |k: usize| -> Vec<u8> { (0..200_000).map(|i| ((i + k * 31) % 253) as u8).collect() };
    let key = |k: usize| format!("key {k}").into_bytes();
    let barrier = Arc::new(Barrier::new(THREADS));
    let hits = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (cache, barrier, hits) = (&cache, barrier.clone(), &hits);
            s.spawn(move || {
                barrier.wait();
                for r in 0..ROUNDS {
                    let k = (t + r) % 4;
                    // Even threads write and read, odd threads only read.
                    if t % 2 == 0 {
                        cache.put(&key(k), &value(k)).unwrap();
                    }
                    match cache.get(&key(k)) {
                        None => {}
                        Some(v) => {
                            assert!(v == value(k), "thread {t} read a wrong value for key {k}");
                            hits.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    for k in 0..4 {
        assert!(cache.get(&key(k)) == Some(value(k)), "key {k}");
    }
    // Writers read their own key right after writing it: at least their reads hit.
    assert!(hits.load(Ordering::Relaxed) >= THREADS / 2 * ROUNDS);
    let (entries, rest) = files(cache.dir());
    assert_eq!(entries.len(), 4);
    assert!(rest.is_empty(), "temporary files left: {rest:?}");
}

#[test]
fn an_unwritable_folder_fails_put_and_misses_get() {
    let tmp = TempDir::new("unwritable");
    std::fs::create_dir_all(tmp.path()).unwrap();
    // A folder under a regular file can never be created, whoever runs the test (root
    // ignores permission bits, so a read-only folder alone would not do in CI containers).
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"not a folder").unwrap();
    let cache = DiskCache::new(file.join("kernels"));
    assert!(cache.put(b"k", b"v").is_err());
    assert_eq!(cache.get(b"k"), None);

    // A read-only folder, where permissions apply (not as root).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let ro = tmp.path().join("read-only");
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
        let enforced = std::fs::write(ro.join("probe"), b"").is_err();
        if enforced {
            let cache = DiskCache::new(&ro);
            assert!(cache.put(b"k", b"v").is_err());
            assert_eq!(cache.get(b"k"), None);
        }
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

#[test]
fn the_oldest_entries_beyond_the_bound_are_removed() {
    let tmp = TempDir::new("bound");
    let cache = DiskCache::new(tmp.path()).with_max_entries(5);
    for i in 0..12 {
        cache.put(format!("k{i}").as_bytes(), b"v").unwrap();
    }
    let (entries, _) = files(cache.dir());
    assert_eq!(entries.len(), 5);
    // The entry just written is always kept.
    assert_eq!(cache.get(b"k11").as_deref(), Some(&b"v"[..]));
}
