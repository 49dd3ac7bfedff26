//! The CUDA backend's kernels on a real GPU. With the kernels embedded at build time off,
//! the on-disk cache: the first device compiles and stores (one entry per kernel group), the
//! next loads without compiling, a corrupt entry is compiled again and replaced, an
//! unwritable folder only costs the compile, and kernels from the cache compute what
//! compiled ones do. With them on (where the build embedded this GPU's architecture): no
//! compile, no cache entry, the same results. Returns early where there is no GPU (as
//! `cuda`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use streampool::phases::Phases;
use streampool::{Device, DeviceConfig, KernelCacheDir, Tensor};

/// A fresh device on GPU 0 with its kernel cache in `cache` and no embedded kernels (its
/// own kernel build: a `cuda_with` device shares no kernels with others); `None` without a
/// GPU.
fn device(cache: KernelCacheDir) -> Option<Device> {
    device_with(cache, false)
}

fn device_with(cache: KernelCacheDir, embedded_kernels: bool) -> Option<Device> {
    let config = DeviceConfig {
        kernel_cache: cache,
        embedded_kernels,
        ..DeviceConfig::default()
    };
    match Device::cuda_with(0, config) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("no CUDA device, skipping ({e})");
            None
        }
    }
}

/// The phase names `load_kernels` went through on `dev`.
fn build_phases(dev: &Device) -> Vec<&'static str> {
    let phases = Arc::new(Phases::new());
    phases.scope(|| dev.load_kernels()).unwrap();
    phases.phases().iter().map(|p| p.name).collect()
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|r| {
            r.map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "spk"))
                .collect()
        })
        .unwrap_or_default()
}

/// A small computation through several kernels (cast, bias + GELU, softmax, reduction).
fn compute(dev: &Device) -> Vec<f32> {
    let x = Tensor::from_vec(
        (0..64).map(|i| i as f32 / 16.0 - 2.0).collect(),
        &[8, 8],
        dev,
    )
    .unwrap();
    let b = Tensor::from_vec(vec![0.25f32; 8], &[8], dev).unwrap();
    x.to_dtype(streampool::DType::F16)
        .unwrap()
        .to_dtype(streampool::DType::F32)
        .unwrap()
        .bias_act(&b, streampool::Activation::Gelu)
        .unwrap()
        .softmax()
        .unwrap()
        .sum(1, false)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
}

#[test]
fn compiled_once_then_loaded_from_disk_and_rebuilt_when_corrupt() {
    let dir = std::env::temp_dir().join(format!("streampool-cuda-kc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let Some(first) = device(KernelCacheDir::Dir(dir.clone())) else {
        return;
    };
    let phases = build_phases(&first);
    assert!(phases.contains(&"kernels compiled"), "{phases:?}");
    let stored = entries(&dir);
    // One image per kernel group this GPU runs (the tensor-core attention from sm_80 on).
    assert!(stored.len() >= 8, "one image per group: {stored:?}");
    let want = compute(&first);

    // A second device (as a second process would): read from disk, no compile.
    let second = device(KernelCacheDir::Dir(dir.clone())).unwrap();
    let phases = build_phases(&second);
    assert!(phases.contains(&"kernels cache read"), "{phases:?}");
    assert!(!phases.contains(&"kernels compiled"), "{phases:?}");
    assert_eq!(compute(&second), want);

    // A damaged entry: compiled again, and replaced by a good one.
    let bytes = std::fs::read(&stored[0]).unwrap();
    std::fs::write(&stored[0], &bytes[..bytes.len() / 2]).unwrap();
    let third = device(KernelCacheDir::Dir(dir.clone())).unwrap();
    assert!(build_phases(&third).contains(&"kernels compiled"));
    assert_eq!(compute(&third), want);
    let fourth = device(KernelCacheDir::Dir(dir.clone())).unwrap();
    assert!(!build_phases(&fourth).contains(&"kernels compiled"));
    assert_eq!(entries(&dir).len(), stored.len());

    // Off: compiles, writes nothing.
    let off = device(KernelCacheDir::Off).unwrap();
    assert!(build_phases(&off).contains(&"kernels compiled"));
    assert_eq!(compute(&off), want);

    // Unwritable (a folder under a regular file): compiles, works, no error.
    let file = dir.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let unwritable = device(KernelCacheDir::Dir(file.join("kernels"))).unwrap();
    assert!(build_phases(&unwritable).contains(&"kernels compiled"));
    assert_eq!(compute(&unwritable), want);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn embedded_kernels_need_no_compile_and_no_cache() {
    let dir = std::env::temp_dir().join(format!("streampool-cuda-emb-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let Some(embedded) = device_with(KernelCacheDir::Dir(dir.clone()), true) else {
        return;
    };
    let phases = build_phases(&embedded);
    if phases.contains(&"kernels compiled") {
        eprintln!("this build embeds no kernels for this GPU, skipping ({phases:?})");
        return;
    }
    assert!(phases.contains(&"kernels loaded"), "{phases:?}");
    assert!(entries(&dir).is_empty(), "nothing written to the cache");
    let compiled = device_with(KernelCacheDir::Off, false).unwrap();
    assert_eq!(compute(&embedded), compute(&compiled));
    let _ = std::fs::remove_dir_all(&dir);
}
