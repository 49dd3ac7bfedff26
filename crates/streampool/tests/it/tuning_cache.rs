//! The on-disk tuning cache, on the CPU: keyed by GPU, compute capability and library
//! version; a value survives the round trip; truncated, corrupt or foreign entries are misses
//! that the next `put` repairs; an unwritable folder is an error for `put` and a miss for
//! `get`, never a panic.

use std::path::PathBuf;

use streampool::{TunedChoice, TuningCache, TuningScope};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sp-tuning-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn h100() -> TuningScope {
    TuningScope {
        gpu: "NVIDIA H100 80GB HBM3".into(),
        compute_capability: (9, 0),
        library: "cuBLASLt 130000".into(),
    }
}

const SHAPE: &str = "F16 GeluTanh ta=false tb=true m=1536 n=16384 k=384";

fn entries(d: &std::path::Path) -> Vec<PathBuf> {
    std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "spk"))
        .collect()
}

#[test]
fn choices_round_trip_and_are_keyed_by_gpu_and_library() {
    let d = dir("keys");
    let cache = TuningCache::new(&d, h100());
    let algo = TunedChoice::Algorithm([1, 2, 3, 4, 5, 6, 7, u64::MAX]);
    assert_eq!(cache.get(SHAPE), None);
    cache.put(SHAPE, algo).unwrap();
    cache.put("another shape", TunedChoice::Heuristic).unwrap();
    // A second process's cache of the same scope sees both.
    let again = TuningCache::new(&d, h100());
    assert_eq!(again.get(SHAPE), Some(algo));
    assert_eq!(again.get("another shape"), Some(TunedChoice::Heuristic));
    // Another GPU, compute capability or library version: a miss, never the H100's choice.
    let others = [
        TuningScope {
            gpu: "NVIDIA H200".into(),
            ..h100()
        },
        TuningScope {
            compute_capability: (8, 0),
            ..h100()
        },
        TuningScope {
            library: "cuBLASLt 130100".into(),
            ..h100()
        },
    ];
    for scope in others {
        let other = TuningCache::new(&d, scope.clone());
        assert_eq!(other.get(SHAPE), None, "{scope:?}");
        assert_ne!(other.key(SHAPE), cache.key(SHAPE));
    }
    assert_eq!(entries(&d).len(), 2);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn damaged_entries_are_misses_and_the_next_put_repairs_them() {
    let d = dir("damaged");
    let cache = TuningCache::new(&d, h100());
    let algo = TunedChoice::Algorithm([9; 8]);
    cache.put(SHAPE, algo).unwrap();
    let [path] = entries(&d).try_into().unwrap();
    let good = std::fs::read(&path).unwrap();
    let damaged: [Vec<u8>; 4] = [
        good[..good.len() - 5].to_vec(), // truncated
        Vec::new(),                      // empty
        {
            let mut flipped = good.clone(); // one bit of the value flipped
            let last = flipped.len() - 1;
            flipped[last] ^= 1;
            flipped
        },
        b"not an entry at all".to_vec(),
    ];
    for bytes in damaged {
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(cache.get(SHAPE), None, "{} bytes", bytes.len());
        cache.put(SHAPE, algo).unwrap();
        assert_eq!(cache.get(SHAPE), Some(algo));
    }
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn values_of_another_format_are_refused() {
    let good = TunedChoice::Algorithm([5; 8]).encode();
    assert_eq!(
        TunedChoice::decode(&good),
        Some(TunedChoice::Algorithm([5; 8]))
    );
    assert_eq!(
        TunedChoice::decode(&TunedChoice::Heuristic.encode()),
        Some(TunedChoice::Heuristic)
    );
    let mut wrong_tag = good.clone();
    wrong_tag[4] = 2;
    let mut long = good.clone();
    long.push(0);
    let mut magic = good.clone();
    magic[0] = b'X';
    for bad in [&good[..good.len() - 1], &wrong_tag, &long, &magic, &[][..]] {
        assert_eq!(TunedChoice::decode(bad), None, "{bad:?}");
    }
}

#[test]
fn an_unwritable_folder_costs_only_the_tuning() {
    let d = dir("unwritable");
    std::fs::create_dir_all(&d).unwrap();
    let file = d.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    // A folder under a regular file can be neither created nor read.
    let cache = TuningCache::new(file.join("tuning"), h100());
    assert!(cache.put(SHAPE, TunedChoice::Heuristic).is_err());
    assert_eq!(cache.get(SHAPE), None);
    assert_eq!(
        TuningCache::dir_beside(std::path::Path::new("/var/cache/sp/kernels")),
        PathBuf::from("/var/cache/sp/kernels/tuning")
    );
    let _ = std::fs::remove_dir_all(&d);
}
