//! The boundary between the device-independent runtime and a backend.
//!
//! A backend is one folder (`cpu/`, `cuda/`, `wgpu/`) that implements these three traits; nothing
//! outside that folder changes when a backend is added. Dispatch is through trait objects:
//! the runtime describes each operation as a [`Kernel`] value and hands it to
//! [`BackendStream::launch`], so every op is dispatched in exactly one place per backend
//! (one `match` in the backend's launcher) rather than once per op per backend.

use std::any::Any;
use std::time::Duration;

pub(crate) use crate::device_ptr::DevicePtr;
use crate::kernel::{Activation, Kernel};
use crate::sync::Arc;
use crate::Result;

/// Raw memory of a device. The caching allocator sits on top of it and is the only caller.
pub(crate) trait BackendMemory: Send + Sync {
    /// Allocates `bytes` (> 0) of uncached device memory.
    fn alloc(&self, bytes: usize) -> Result<DevicePtr>;
    /// Returns memory obtained from [`BackendMemory::alloc`] with the same size.
    ///
    /// # Safety
    /// `ptr` came from `alloc(bytes)` on this backend and no stream will touch it again.
    unsafe fn free(&self, ptr: DevicePtr, bytes: usize);
}

/// One device of a backend.
pub(crate) trait BackendDevice: BackendMemory {
    /// Human-readable name, used in errors ("cpu", "cuda:0 (NVIDIA H100)").
    fn name(&self) -> String;
    /// Creates the stream for pool slot `index` (slot 0 is the default stream).
    fn create_stream(&self, index: usize) -> Result<Arc<dyn BackendStream>>;
    /// Creates a high-priority stream for slot `index` (see
    /// [`Device::high_priority_stream`](crate::Device::high_priority_stream)). Backends
    /// without stream priorities give a plain stream.
    fn create_high_priority_stream(&self, index: usize) -> Result<Arc<dyn BackendStream>> {
        self.create_stream(index)
    }
    /// Whether recording an event costs next to nothing. If so, every op output records
    /// its write event eagerly; otherwise the event is recorded lazily, on the first read
    /// from another stream (correct, but it may wait for later work on the writer stream).
    fn cheap_events(&self) -> bool;
    /// The device's `(free, total)` memory in bytes as its driver reports it, where the
    /// backend can tell (CUDA); `None` elsewhere (host memory is the operating system's).
    fn memory_info(&self) -> Option<(usize, usize)> {
        None
    }
    /// Whether the backend runs packed (varlen) batches: [`Kernel::Attention`] with
    /// `packed` set and [`Kernel::MeanPoolNormPacked`].
    fn has_packed_kernels(&self) -> bool {
        false
    }
    /// Whether [`Kernel::Matmul`] runs [`crate::MatmulMath::Int8`] here; a backend that
    /// returns `false` never receives one (the tensor layer refuses it first).
    fn runs_int8_matmul(&self) -> bool {
        false
    }
    /// Whether plain `f32` attention given a binary key mask is fastest through the fused
    /// attention kernel here (half precision always takes it where it can). Models ask
    /// through [`crate::Device::fuses_f32_attention`] rather than naming a backend.
    fn fuses_f32_attention(&self) -> bool {
        false
    }
    /// Builds (or loads) the device's kernels now rather than at the first launch. Backends
    /// that build kernels per op on first use (CPU, wgpu) have nothing to do.
    fn load_kernels(&self) -> Result<()> {
        Ok(())
    }
    /// Downcasting, for backend-internal needs.
    #[allow(dead_code)]
    fn as_any(&self) -> &dyn Any;
}

/// An in-order queue of device work.
pub(crate) trait BackendStream: Send + Sync {
    /// Records an event after all work queued so far. `timing` asks for a timestamp.
    fn record(&self, timing: bool) -> Result<Arc<dyn BackendEvent>>;
    /// Makes work queued after this call wait until `event` completes (no host wait).
    fn wait(&self, event: &Arc<dyn BackendEvent>) -> Result<()>;
    /// Blocks the calling thread until all queued work is done; reports a deferred kernel error.
    fn synchronize(&self) -> Result<()>;
    /// Queues `kernel`.
    ///
    /// # Safety
    /// Every pointer in `kernel` is valid for the extent the kernel touches, until the
    /// kernel has run (the caller keeps the memory alive and un-reused through events).
    unsafe fn launch(&self, kernel: Kernel) -> Result<()>;
    /// Queues a copy of `src` to device memory at `dst`; `src` is owned, so the call may return
    /// before the copy runs.
    ///
    /// # Safety
    /// `dst` is valid for `src.len()` bytes until the copy has run.
    unsafe fn copy_from_host(&self, src: Vec<u8>, dst: DevicePtr) -> Result<()>;
    /// Copies device memory into `dst`, in stream order, and waits for it.
    ///
    /// # Safety
    /// `src` is valid for `dst.len()` bytes.
    unsafe fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()>;

    /// Whether [`Kernel::Matmul`] with a `bias` is worth launching here (the bias fused into
    /// the product); else `Tensor::matmul_bias` runs a product and a separate bias kernel. A
    /// backend that returns `false` never receives a matmul with a bias.
    fn fuses_matmul_bias(&self) -> bool {
        false
    }

    /// Whether [`Kernel::Matmul`] with a bias and activation `act` is worth launching here
    /// (both applied in the product's epilogue); else `Tensor::matmul_bias_act` runs a
    /// product and a separate bias + activation kernel. Only asked where
    /// [`Self::fuses_matmul_bias`] is true; a backend that returns `false` never receives a
    /// matmul with that activation.
    fn fuses_matmul_act(&self, act: Activation) -> bool {
        act == Activation::Identity
    }

    /// Whether [`Kernel::Matmul`] with a bias and a `residual` is worth launching here for a
    /// product of `dtype` with `k` inputs and `n` outputs per row (the residual added in the
    /// product's epilogue, so a following LayerNorm reads one tensor instead of two); else
    /// `Tensor::matmul_bias_residual` runs the product with its bias and a separate add.
    /// Only asked where [`Self::fuses_matmul_bias`] is true; a backend that returns `false`
    /// never receives a matmul with a residual.
    fn fuses_matmul_residual(&self, dtype: crate::DType, k: usize, n: usize) -> bool {
        let _ = (dtype, k, n);
        false
    }

    /// Whether [`Kernel::Matmul`] should carry a [`crate::kernel::PackSlot`] for a right
    /// operand that is a plain matrix (a weight): the backend packs it once and reuses it.
    fn prepacks_matmul_weights(&self) -> bool {
        false
    }

    /// Whether the backend can capture graphs (else callers run eagerly).
    fn has_graphs(&self) -> bool {
        false
    }
    /// A private stream for capturing graphs that will replay on this one (`None` where the
    /// backend has no graphs: callers then run eagerly). Created once, ready to capture (its
    /// library handles exist), and used only by the thread that captures.
    fn capture_stream(&self) -> Result<Option<Arc<dyn BackendStream>>> {
        Ok(None)
    }
    /// Captures what `body` queues on this (capture) stream into an instantiated graph. One
    /// capture at a time per stream; `body` must only queue work (no host waits or copies).
    fn capture(&self, body: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn BackendGraph>> {
        let _ = body;
        Err(crate::Error::Unavailable(
            "graphs: not on this backend".into(),
        ))
    }
    /// Page-locked host memory of `bytes`, for a graph's host inputs and outputs.
    fn alloc_pinned(&self, bytes: usize) -> Result<Box<dyn BackendPinned>> {
        let _ = bytes;
        Err(crate::Error::Unavailable(
            "pinned memory: not on this backend".into(),
        ))
    }
    /// Queues a copy of the first `bytes` of `src` to `dst` (capturable: pinned memory).
    ///
    /// # Safety
    /// `dst` is valid for `bytes`; `src` holds `bytes` and is not written until the copy ran.
    unsafe fn copy_pinned_to_device(
        &self,
        src: &dyn BackendPinned,
        dst: DevicePtr,
        bytes: usize,
    ) -> Result<()> {
        let _ = (src, dst, bytes);
        Err(crate::Error::Unavailable(
            "pinned memory: not on this backend".into(),
        ))
    }
    /// Queues a copy of `bytes` at `src` into `dst` (capturable: pinned memory).
    ///
    /// # Safety
    /// `src` is valid for `bytes`; `dst` holds `bytes` and is not read until the copy ran.
    unsafe fn copy_device_to_pinned(
        &self,
        src: DevicePtr,
        dst: &dyn BackendPinned,
        bytes: usize,
    ) -> Result<()> {
        let _ = (src, dst, bytes);
        Err(crate::Error::Unavailable(
            "pinned memory: not on this backend".into(),
        ))
    }
    /// Queues one replay of `graph` on this stream.
    ///
    /// # Safety
    /// Every address the graph touches is valid and not used by other work until the replay
    /// has run (the graph's pool and inputs are kept alive and ordered by the caller).
    unsafe fn launch_graph(&self, graph: &dyn BackendGraph) -> Result<()> {
        let _ = graph;
        Err(crate::Error::Unavailable(
            "graphs: not on this backend".into(),
        ))
    }
}

/// A page-locked host buffer (see [`BackendStream::alloc_pinned`]).
pub(crate) trait BackendPinned: Send + Sync {
    /// The start of the buffer.
    fn ptr(&self) -> *mut u8;
    /// Its length in bytes.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn len(&self) -> usize;
}

/// An instantiated graph of captured stream work.
pub(crate) trait BackendGraph: Send + Sync {
    /// Downcasting, so a stream can recognise its backend's graphs.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    fn as_any(&self) -> &dyn Any;
}

/// A point in a stream's queue.
pub(crate) trait BackendEvent: Send + Sync {
    /// Whether all work before the event has completed.
    fn query(&self) -> bool;
    /// Blocks until the event has completed.
    fn synchronize(&self) -> Result<()>;
    /// Time from `earlier` to `self`; both must have been recorded with timing.
    fn elapsed_since(&self, earlier: &dyn BackendEvent) -> Result<Duration>;
    /// Downcasting, so a stream can recognise its backend's events.
    fn as_any(&self) -> &dyn Any;
}
