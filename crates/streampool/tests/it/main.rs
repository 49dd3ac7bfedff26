//! The integration tests of `streampool`: one test binary (each binary links the whole
//! dependency tree, which dominates a 2-core CI's build), a module per area, and `util` for
//! the float64 reference, the closeness measures and the other helpers they share.
//!
//! Four suites are shared between backends: `allocator`, `concurrency`, `dtypes` and `ops`
//! run here on the CPU backend, and again as modules of `wgpu` on a wgpu device. Each asks
//! its parent module for the device (`device_under_test`, `device_with`) and the dtypes it
//! computes in (`dtypes_under_test`); this root supplies the CPU's.
//!
//! The GPU suites build with their feature: `cuda*` needs a GPU at run time (and returns
//! early without one), `wgpu*` runs on any Vulkan/Metal/DX12 adapter (Mesa's lavapipe in CI).

// `wgpu` loads the shared suites' files a second time, on purpose (see above).
#![allow(clippy::duplicate_mod)]

use streampool::{DType, Device, DeviceConfig};

mod allocator;
mod concurrency;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod cuda_graphs;
#[cfg(feature = "cuda")]
mod cuda_kernel_cache;
mod disk_cache;
mod dtypes;
mod family_ops;
mod graphs;
mod intra_op;
mod lazy_events;
mod ops;
mod packed;
mod shapes;
mod smoke;
mod tuning_cache;
mod util;
#[cfg(feature = "wgpu")]
mod wgpu;
#[cfg(feature = "wgpu")]
mod wgpu_naga;
#[cfg(feature = "wgpu")]
mod wgpu_profile;

/// The device of the shared suites at this level: the process-wide CPU device.
pub(crate) fn device_under_test() -> Device {
    Device::cpu()
}

/// A new CPU device with `config`, for the shared suites' tests that need their own.
pub(crate) fn device_with(config: DeviceConfig) -> streampool::Result<Device> {
    Device::cpu_with(config)
}

/// The dtypes the CPU backend computes in: all of them.
pub(crate) fn dtypes_under_test() -> Vec<DType> {
    vec![DType::F32, DType::F16, DType::BF16]
}
