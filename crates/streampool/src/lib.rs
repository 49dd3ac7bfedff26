//! # streampool
//!
//! A tensor runtime that lets any number of threads run work on one device safely and fast.
//! Load a model once, call it from every thread: each thread runs on its own stream from the
//! device's pool, cross-stream hazards are handled automatically, and freed memory is reused
//! across streams without races.
//!
//! | concept   | CPU backend                                  | CUDA backend (feature `cuda`)           | wgpu backend (feature `wgpu`: Vulkan, Metal, DX12) |
//! |-----------|----------------------------------------------|-----------------------------------------|----------------------------------------------------|
//! | [`Device`]| the host; process-wide [`Device::cpu`]       | one GPU, [`Device::cuda`]              | one adapter, `Device::wgpu` / `Device::wgpu_with`  |
//! | [`Stream`]| a worker thread running jobs in order        | a `CUstream`                            | logical: own command encoder, in order onto the device's one queue |
//! | [`Event`] | "stream has completed `n` jobs"              | a `CUevent`                             | a point in a stream's submissions (`SubmissionIndex`) |
//! | allocator | caching, per-stream lists, heap blocks       | caching, per-stream lists, `cuMemAlloc` | caching, per-stream lists, one storage buffer per block |
//! | pointer   | a host address                               | a `CUdeviceptr`                         | buffer id + byte offset (`device_ptr.rs`)          |
//! | [`Tensor`]| Rust kernels (f32, f16/bf16, int8): a packed AVX2/AVX-512 SGEMM for weights, `gemm` for other products | NVRTC kernels, cuBLAS/cuBLASLt | WGSL kernels (f32; f16 with `SHADER_F16`, no bf16), register-blocked matmul |
//! | kernels   | [`KernelCache`] (unused)                     | NVRTC modules built once per device; cubins kept on disk ([`DiskCache`]) | pipelines built once per device, shared by threads |
//!
//! ```
//! use std::sync::Arc;
//! use streampool::{Device, Tensor};
//!
//! let dev = Device::cpu();
//! let w = Arc::new(Tensor::randn(&[64, 64], 1, &dev).unwrap());
//! let handles: Vec<_> = (0..4).map(|i| {
//!     let w = w.clone();
//!     std::thread::spawn(move || {
//!         let dev = Device::cpu();
//!         let x = Tensor::randn(&[8, 64], i, &dev).unwrap();
//!         x.matmul(&w).unwrap().gelu().unwrap().to_vec::<f32>().unwrap()
//!     })
//! }).collect();
//! for h in handles { assert_eq!(h.join().unwrap().len(), 8 * 64); }
//! ```
//!
//! Per-device settings are [`DeviceConfig`] (and `WgpuConfig`); the process-wide tunables
//! (CPU tiles and paths, CUDA waits and cuBLASLt tuning, graphs, wgpu switches, the kernel
//! cache folder) are [`config::Tuning`], set with [`config::set`] or from the environment.
//! Every environment variable is listed, with its default and when to change it, in
//! `docs/configuration.md` of the repository.

pub mod allocator;
mod backend;
pub mod config;
mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
mod device_ptr;
pub mod disk_cache;
mod dtype;
mod error;
mod event;
mod graph;
pub mod kernel;
mod kernel_cache;
pub mod phases;
mod profile;
mod shape;
mod storage;
mod stream;
mod stream_pool;
#[doc(hidden)]
pub mod sync;
pub mod tensor;
pub mod tuning_cache;
#[cfg(feature = "wgpu")]
mod wgpu;

// Test-only: other crates' loom builds compile this library without its tests.
#[cfg(all(loom, test))]
mod graph_loom_tests;
#[cfg(all(loom, test))]
mod loom_tests;

#[cfg(feature = "wgpu")]
pub use self::wgpu::{
    describe_adapters as wgpu_adapters,
    kernels::all_wgsl as wgpu_kernel_sources,
    profile::{wgpu_profile, WgpuProfile},
    CoopMatrix as WgpuCoopMatrix, Quarantine as WgpuQuarantine, WgpuConfig,
    DEFAULT_WAIT_LIMIT as WGPU_DEFAULT_WAIT_LIMIT,
};
pub use allocator::AllocatorStats;
#[cfg(feature = "wgpu")]
pub use config::WGPU_PROFILE_ENV;
pub use config::{CPU_BF16_ENV, CPU_PROFILE_ENV, CPU_THREADS_ENV};
pub use cpu::intra_op::{cpu_threads, set_cpu_threads};
pub use cpu::kernels::bf16::{cpu_bf16_path, Bf16Path};
pub use cpu::profile::cpu_kernel_profile;
pub use device::{Device, DeviceConfig, DeviceKind, EventPolicy, MemoryInfo};
pub use disk_cache::{DiskCache, KernelCacheDir};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use event::Event;
pub use graph::{GraphCache, GraphStats, DEFAULT_GRAPH_MEMORY};
pub use kernel::{Activation, GateActivation, MatmulMath};
pub use kernel_cache::KernelCache;
pub use profile::KernelTime;
pub use stream::Stream;
pub use stream_pool::StreamGuard;
pub use tensor::Tensor;
pub use tuning_cache::{TunedChoice, TuningCache, TuningScope};
