//! Devices: a backend, its stream pool and its caching allocator.

use std::fmt;
use std::sync::OnceLock;

use crate::allocator::{AllocatorStats, CachingAllocator};
use crate::backend::BackendDevice;
use crate::stream_pool::{self, StreamPool};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sync::Arc;
use crate::{KernelCacheDir, Result, Stream};

/// Which backend a device runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// The CPU backend: each stream is a worker thread.
    Cpu,
    /// An NVIDIA GPU by ordinal (feature `cuda`).
    Cuda(usize),
    /// A GPU through wgpu (feature `wgpu`: Vulkan, Metal or DX12), by its index in the
    /// instance's adapter list.
    Wgpu(usize),
}

/// A device's memory as its driver reports it ([`Device::memory_info`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes free on the device.
    pub free: usize,
    /// The device's memory in bytes.
    pub total: usize,
}

/// Settings of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Streams in the pool, the default stream included (default 32: 1 default + 31 pooled).
    pub pool_size: usize,
    /// Most bytes the caching allocator may reserve; `None` for no limit but the device's.
    pub memory_limit: Option<usize>,
    /// When the runtime records the events behind cross-stream safety.
    pub events: EventPolicy,
    /// Where compiled kernels are kept between processes (CUDA's NVRTC cubins; the CPU
    /// and wgpu backends keep none). Default: as the environment says
    /// ([`DiskCache::kernels_from_env`](crate::DiskCache::kernels_from_env)).
    pub kernel_cache: KernelCacheDir,
    /// Whether the CUDA backend loads the kernels compiled at build time where the GPU runs
    /// them (sm_80 and sm_90 builds, when the build found NVRTC; default `true`). `false`
    /// compiles them with NVRTC at run time (or takes them from `kernel_cache`) as on any
    /// other GPU, e.g. to measure that path.
    pub embedded_kernels: bool,
    /// Whether the CUDA backend keeps its cuBLASLt tuning choices on disk, in the kernel
    /// cache's `tuning` folder ([`TuningCache`](crate::TuningCache); default `true`; nothing
    /// is kept when `kernel_cache` is off). A later process on the machine then takes each
    /// shape's choice instead of timing the candidates on its first call.
    pub tuning_cache: bool,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            pool_size: 32,
            memory_limit: None,
            events: EventPolicy::Auto,
            kernel_cache: KernelCacheDir::FromEnv,
            embedded_kernels: true,
            tuning_cache: true,
        }
    }
}

/// When the events that make cross-stream use safe are recorded. Both policies are safe;
/// they trade event cost against how early another stream may proceed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EventPolicy {
    /// The backend's choice: eager on the CPU (an event is a counter read), lazy on CUDA
    /// (an event is a driver call).
    #[default]
    Auto,
    /// Record a write event after every op and a guard event for every freed block: other
    /// streams wait exactly as long as needed.
    Eager,
    /// Record write events only when another stream first reads, and free guards only when
    /// another stream needs the block (one event then covers all of a stream's freed blocks):
    /// fewest events, but another stream may wait for later work of the same stream.
    Lazy,
}

/// Aligned to two cache lines so that, behind an `Arc`, the reference counts sit on a line of
/// their own: threads cloning handles then do not evict the read-mostly fields below (the
/// pool, the allocator's shards) from each other's caches.
#[repr(align(128))]
pub(crate) struct DeviceInner {
    id: u64,
    kind: DeviceKind,
    name: String,
    backend: Arc<dyn BackendDevice>,
    // Field order is drop order: the pool's streams finish their queued work (CPU workers are
    // joined) before the allocator returns memory to the backend.
    pool: StreamPool,
    allocator: CachingAllocator,
    eager_events: bool,
}

/// A device: CPU or GPU, with its pool of streams and its caching allocator. Cheap to clone
/// and shared by all threads.
///
/// ```
/// use streampool::{Device, Tensor};
/// let dev = Device::cpu();
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3], &dev).unwrap();
/// assert_eq!(x.relu().unwrap().to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0]);
/// ```
#[derive(Clone)]
pub struct Device(Handle);

/// How a [`Device`] holds its state. The process-wide devices ([`Device::cpu`],
/// `Device::cuda`) live as long as the process, so their handles are plain references:
/// cloning or dropping one touches no reference count shared by every thread (each op's
/// output storage holds its device, so that was a cache line all threads wrote twice per
/// op). Devices made with `*_with` are reference-counted and dropped with their last handle.
#[derive(Clone)]
enum Handle {
    ProcessWide(&'static DeviceInner),
    Counted(Arc<DeviceInner>),
}

impl std::ops::Deref for Handle {
    type Target = DeviceInner;
    #[inline]
    fn deref(&self) -> &DeviceInner {
        match self {
            Handle::ProcessWide(d) => d,
            Handle::Counted(d) => d,
        }
    }
}

/// Process-wide device ids (std atomics even under loom: a static needs a const constructor,
/// and id numbering is not part of any modelled hand-off).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Device {
    /// The process-wide CPU device (default configuration), shared by every caller.
    pub fn cpu() -> Device {
        static CPU: OnceLock<Device> = OnceLock::new();
        // The default configuration is valid, so building it cannot fail.
        CPU.get_or_init(|| {
            Device::cpu_with(DeviceConfig::default())
                .expect("default CPU device")
                .into_process_wide()
        })
        .clone()
    }

    /// Makes this device live for the rest of the process (it is never dropped: its streams
    /// and cached memory stay), so that its handles need no reference counting. For the
    /// process-wide devices only, which a static holds for ever anyway.
    pub(crate) fn into_process_wide(self) -> Device {
        match self.0 {
            Handle::ProcessWide(_) => self,
            // Leaks one strong count: the state is never dropped, which is the point.
            Handle::Counted(inner) => Device(Handle::ProcessWide(Box::leak(Box::new(inner)))),
        }
    }

    /// A new, separate CPU device with its own pool and allocator (e.g. with a memory limit).
    pub fn cpu_with(config: DeviceConfig) -> Result<Device> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Self::with_backend(
            id,
            DeviceKind::Cpu,
            Arc::new(crate::cpu::CpuDevice::new(id)),
            config,
        )
    }

    pub(crate) fn with_backend(
        id: u64,
        kind: DeviceKind,
        backend: Arc<dyn BackendDevice>,
        config: DeviceConfig,
    ) -> Result<Device> {
        let factory_backend = backend.clone();
        let normal = config.pool_size;
        let pool = StreamPool::new(
            config.pool_size,
            Box::new(move |i| {
                if i >= normal {
                    factory_backend.create_high_priority_stream(i)
                } else {
                    factory_backend.create_stream(i)
                }
            }),
        )?;
        let name = backend.name();
        let memory: Arc<dyn crate::backend::BackendMemory> = backend.clone();
        let allocator =
            CachingAllocator::new(memory, name.clone(), config.pool_size, config.memory_limit);
        let eager_events = match config.events {
            EventPolicy::Auto => backend.cheap_events(),
            EventPolicy::Eager => true,
            EventPolicy::Lazy => false,
        };
        Ok(Device(Handle::Counted(Arc::new(DeviceInner {
            id,
            kind,
            name,
            backend,
            pool,
            allocator,
            eager_events,
        }))))
    }

    #[cfg_attr(not(any(feature = "cuda", feature = "wgpu")), allow(dead_code))]
    pub(crate) fn next_id() -> u64 {
        NEXT_ID.fetch_add(1, Ordering::Relaxed)
    }

    /// A process-unique id of this device.
    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// The backend kind.
    pub fn kind(&self) -> DeviceKind {
        self.0.kind
    }

    /// A readable name such as `cpu` or `cuda:0`.
    pub fn name(&self) -> String {
        self.0.name.clone()
    }

    /// Whether two handles name the same device.
    pub fn same(&self, other: &Device) -> bool {
        self.0.id == other.0.id
    }

    /// The calling thread's current stream: the one set by the innermost live
    /// [`StreamGuard`](crate::StreamGuard), else this thread's pooled stream (assigned
    /// round-robin on the thread's first use and cached thread-locally).
    pub fn current_stream(&self) -> Result<Stream> {
        stream_pool::current_stream(self)
    }

    /// The next pooled stream, round-robin (does not change the current stream).
    pub fn stream_from_pool(&self) -> Result<Stream> {
        self.stream_at(self.0.pool.next_slot())
    }

    /// The default stream (slot 0).
    pub fn default_stream(&self) -> Result<Stream> {
        self.stream_at(0)
    }

    /// The stream of pool slot `index`.
    pub fn stream_at(&self, index: usize) -> Result<Stream> {
        Ok(Stream::new(self.clone(), index, self.0.pool.get(index)?))
    }

    /// High-priority stream `i` (taken modulo [`pool_size`](Self::pool_size)): for work
    /// whose latency matters more than others' throughput, such as a latency-critical
    /// model's batch workers. On CUDA its kernels' blocks are dispatched before the pending
    /// blocks of normal streams (`cuStreamCreateWithPriority` at the greatest priority), so
    /// a short forward is not queued behind a long one's waves; on backends without stream
    /// priorities it is a plain stream of its own. Never handed out round-robin.
    ///
    /// ```
    /// use streampool::Device;
    /// let dev = Device::cpu();
    /// let high = dev.high_priority_stream(0).unwrap();
    /// assert!(high.index() >= dev.pool_size());
    /// assert_ne!(high, dev.stream_from_pool().unwrap());
    /// ```
    pub fn high_priority_stream(&self, i: usize) -> Result<Stream> {
        self.stream_at(self.0.pool.high_priority_slot(i))
    }

    /// The device memory free and in total, in bytes, where the backend can tell (CUDA:
    /// the driver's `cuMemGetInfo`, which counts this process's cached blocks as used;
    /// add [`AllocatorStats`](crate::AllocatorStats)' `reserved - allocated` for what this
    /// process could reuse). `None` on the CPU and wgpu.
    ///
    /// ```
    /// assert!(streampool::Device::cpu().memory_info().is_none());
    /// ```
    pub fn memory_info(&self) -> Option<MemoryInfo> {
        self.0
            .backend
            .memory_info()
            .map(|(free, total)| MemoryInfo { free, total })
    }

    /// Forgets the calling thread's pooled stream; the thread's next use picks a new one.
    pub fn release_current_thread_slot(&self) {
        stream_pool::release_current_thread_slot(self)
    }

    /// Streams in the pool, the default stream included.
    pub fn pool_size(&self) -> usize {
        self.0.pool.size()
    }

    /// Streams created so far (they are created lazily).
    pub fn streams_created(&self) -> usize {
        self.0.pool.created()
    }

    /// Waits for every stream of the device. Reports the first deferred kernel error.
    pub fn synchronize(&self) -> Result<()> {
        let mut first = Ok(());
        for (_, s) in self.0.pool.existing() {
            let r = s.synchronize();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Builds the device's kernels now instead of at the first launch, so a server can
    /// build them in the background while it reads weights, and a start-up log can time
    /// them. On CUDA: compiles `kernels.cu` with NVRTC, or loads the cubin an earlier
    /// process left in the on-disk cache ([`DiskCache::kernels_from_env`](crate::DiskCache::kernels_from_env));
    /// threads launching meanwhile wait for this one build. Nothing to do on the CPU and
    /// wgpu. Errors are those the first launch would have returned.
    ///
    /// ```
    /// let dev = streampool::Device::cpu();
    /// dev.load_kernels().unwrap();
    /// ```
    pub fn load_kernels(&self) -> Result<()> {
        self.0.backend.load_kernels()
    }

    /// Whether this device runs packed (varlen) batches ([`Tensor::attention_packed`],
    /// [`Tensor::mean_pool_normalize_packed`]): the CPU and CUDA do, wgpu does not (callers
    /// run such batches padded there).
    ///
    /// [`Tensor::attention_packed`]: crate::Tensor::attention_packed
    /// [`Tensor::mean_pool_normalize_packed`]: crate::Tensor::mean_pool_normalize_packed
    ///
    /// ```
    /// assert!(streampool::Device::cpu().has_packed_kernels());
    /// ```
    pub fn has_packed_kernels(&self) -> bool {
        self.0.backend.has_packed_kernels()
    }

    /// Whether this device runs [`MatmulMath::Int8`](crate::MatmulMath::Int8) products (the
    /// CPU does; the GPU backends do not yet).
    ///
    /// ```
    /// assert!(streampool::Device::cpu().runs_int8_matmul());
    /// ```
    pub fn runs_int8_matmul(&self) -> bool {
        self.0.backend.runs_int8_matmul()
    }

    /// Whether plain `f32` attention (given a binary key mask) is fastest here through the
    /// fused kernel ([`Tensor::attention`](crate::Tensor::attention) with a mask rather than
    /// products, an additive bias and a softmax): the CPU's is; the GPUs' fused kernels win
    /// in half precision only.
    ///
    /// ```
    /// assert!(streampool::Device::cpu().fuses_f32_attention());
    /// ```
    pub fn fuses_f32_attention(&self) -> bool {
        self.0.backend.fuses_f32_attention()
    }

    /// A snapshot of the caching allocator's statistics.
    pub fn allocator_stats(&self) -> AllocatorStats {
        self.0.allocator.stats()
    }

    /// Returns every idle cached block to the backend.
    pub fn empty_cache(&self) {
        self.0.allocator.empty_cache()
    }

    pub(crate) fn allocator(&self) -> &CachingAllocator {
        &self.0.allocator
    }

    pub(crate) fn pool(&self) -> &StreamPool {
        &self.0.pool
    }

    /// Whether events are recorded eagerly (see [`EventPolicy`]).
    pub(crate) fn eager_events(&self) -> bool {
        self.0.eager_events
    }

    #[allow(dead_code)]
    pub(crate) fn backend(&self) -> &Arc<dyn BackendDevice> {
        &self.0.backend
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.0.name)
    }
}
