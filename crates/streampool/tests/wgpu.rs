//! The wgpu suite: the op suite (`ops.rs`, every op against float64), the concurrency suite
//! (`concurrency.rs`) and the allocator suite (`allocator.rs`) run here again, unchanged, on
//! a wgpu device (Mesa's lavapipe in CI, NVIDIA's Vulkan driver on the H100), plus the
//! tests of what only this backend has (the quarantine lock, buffer-relative pointers).
//!
//! The shared suites ask this file's root for their device (`device_under_test`,
//! `device_with`). Where no wgpu adapter exists at all, that says so loudly on stderr and the
//! shared suites fall back to the CPU backend (they have no early return of their own), while
//! this file's own tests print "no wgpu adapter, skipping" and return.
#![cfg(feature = "wgpu")]

use std::sync::{Arc, OnceLock};

use streampool::{Device, DeviceConfig, Tensor, WgpuConfig, WgpuQuarantine};

#[path = "allocator.rs"]
mod allocator;
#[path = "concurrency.rs"]
mod concurrency;
#[path = "ops.rs"]
mod ops;

/// Whether an adapter exists (asked once per test binary).
fn have_adapter() -> bool {
    static HAVE: OnceLock<bool> = OnceLock::new();
    *HAVE.get_or_init(|| match Device::wgpu() {
        Ok(d) => {
            eprintln!("wgpu suite on {}", d.name());
            true
        }
        Err(e) => {
            eprintln!("!!! NO WGPU ADAPTER ({e}): the wgpu tests are SKIPPED and the shared suites ran on the CPU instead !!!");
            false
        }
    })
}

/// The device of the shared suites: the process-wide wgpu device.
pub(crate) fn device_under_test() -> Device {
    if have_adapter() {
        Device::wgpu().expect("the wgpu device opened before")
    } else {
        Device::cpu()
    }
}

/// A new wgpu device with `config`, for the shared suites' tests that need their own.
pub(crate) fn device_with(config: DeviceConfig) -> streampool::Result<Device> {
    if have_adapter() {
        Device::wgpu_with(WgpuConfig {
            device: config,
            ..WgpuConfig::default()
        })
    } else {
        Device::cpu_with(config)
    }
}

fn gpu() -> Option<Device> {
    if have_adapter() {
        Device::wgpu().ok()
    } else {
        eprintln!("no wgpu adapter, skipping");
        None
    }
}

fn ints(len: usize, seed: u64) -> Vec<f32> {
    (0..len as u64)
        .map(|i| ((i * 5 + seed * 11) % 13) as f32 - 6.0)
        .collect()
}

/// 16 threads, each on its own stream, run matmul + bias + relu chains and check every
/// value; with the quarantine lock on and off.
#[test]
fn quarantine_lock_on_and_off_both_give_right_answers() {
    if gpu().is_none() {
        return;
    }
    for quarantine in [WgpuQuarantine::On, WgpuQuarantine::Off] {
        let dev = Device::wgpu_with(WgpuConfig {
            quarantine,
            ..WgpuConfig::default()
        })
        .unwrap();
        let (k, n) = (24, 16);
        let w_data = ints(k * n, 1);
        let w = Arc::new(Tensor::from_vec(w_data.clone(), &[k, n], &dev).unwrap());
        std::thread::scope(|s| {
            for t in 0..16u64 {
                let (dev, w, w_data) = (&dev, w.clone(), &w_data);
                s.spawn(move || {
                    for i in 0..20 {
                        let m = 3 + (i % 4);
                        let x_data = ints(m * k, t * 100 + i as u64);
                        let x = Tensor::from_vec(x_data.clone(), &[m, k], dev).unwrap();
                        let y = x.matmul(&w).unwrap().relu().unwrap();
                        let got = y.to_vec::<f32>().unwrap();
                        for r in 0..m {
                            for c in 0..n {
                                let want: f32 =
                                    (0..k).map(|p| x_data[r * k + p] * w_data[p * n + c]).sum();
                                assert_eq!(got[r * n + c], want.max(0.0), "{quarantine:?}");
                            }
                        }
                    }
                });
            }
        });
        dev.synchronize().unwrap();
    }
}

/// Views at element offsets into one buffer (narrow, transpose, select) read the right
/// elements: the pointer's byte offset travels to the kernels as an element offset.
#[test]
fn views_at_offsets_inside_one_buffer() {
    let Some(dev) = gpu() else { return };
    let data: Vec<f32> = (0..60).map(|v| v as f32).collect();
    let x = Tensor::from_vec(data.clone(), &[6, 10], &dev).unwrap();
    let v = x.narrow(0, 2, 3).unwrap().narrow(1, 3, 4).unwrap();
    let want: Vec<f32> = (2..5)
        .flat_map(|r| (3..7).map(move |c| (r * 10 + c) as f32))
        .collect();
    assert_eq!(v.to_vec::<f32>().unwrap(), want);
    assert_eq!(v.relu().unwrap().to_vec::<f32>().unwrap(), want);
    let t = x.narrow(1, 1, 2).unwrap().t().unwrap();
    let want_t: Vec<f32> = (1..3)
        .flat_map(|c| (0..6).map(move |r| (r * 10 + c) as f32))
        .collect();
    assert_eq!(t.contiguous().unwrap().to_vec::<f32>().unwrap(), want_t);
}

/// A block larger than a kernel may bind is refused with an out-of-memory error, and the
/// device keeps working.
#[test]
fn blocks_over_the_binding_limit_are_errors() {
    let Some(dev) = gpu() else { return };
    let huge = 1usize << 40; // 4 TiB of f32
    assert!(Tensor::zeros(&[huge], &dev).is_err());
    let x = Tensor::from_vec(vec![1.0f32, -2.0], &[2], &dev).unwrap();
    assert_eq!(x.relu().unwrap().to_vec::<f32>().unwrap(), vec![1.0, 0.0]);
}
