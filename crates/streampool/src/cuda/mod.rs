//! The CUDA backend (feature `cuda`), through `cudarc` with the CUDA libraries loaded at run
//! time.
//!
//! | concept   | here                                                                      |
//! |-----------|---------------------------------------------------------------------------|
//! | device    | the GPU's primary context ([`CudaDevice`])                                |
//! | stream    | a non-blocking `CUstream` per pool slot, created lazily ([`stream`])      |
//! | event     | a `CUevent` recycled by its stream, untimed unless asked ([`event`])      |
//! | copies    | small ones staged through pinned buffers and an upload ring ([`staging`]) |
//! | memory    | plain `cuMemAlloc` / `cuMemFree` under the caching allocator               |
//! | kernels   | `kernels.cu` in groups: cubins embedded at build time for sm_80/sm_90,    |
//! |           | else compiled by NVRTC per group on first use ([`module`], [`nvrtc`])     |
//! |           | to a cubin kept on disk for the next process ([`crate::DiskCache`])      |
//! | matmul    | cuBLAS, one handle and workspace per stream ([`blas`])                    |
//!
//! Memory is raw device pointers managed by our caching allocator, so cudarc's per-slice event
//! tracking (`CudaContext::is_event_tracking`) has nothing to track: it is switched off on the
//! context at creation, so nothing pays for two trackers (and `new_stream` skips the context
//! synchronization that tracking asks for). Plain `cuMemAlloc` rather than the stream-ordered
//! `cuMemAllocAsync`: the latter draws from the driver's own memory pool, a second caching
//! allocator with its own reuse rules under ours. `cuMemFree` may synchronize the device, but
//! it only runs when the cache is trimmed (`empty_cache`, the memory limit), never per op.
//!
//! No vendor call needed a quarantine lock: one cuBLAS handle per stream (never shared by
//! threads at the same moment, never re-pointed at another stream) is the documented safe
//! use, and NVRTC compiles, module loads, handle creation and launches from many threads
//! at once are exercised by `tests/it/cuda.rs` (`vendor_calls_from_many_threads_at_once`).

pub(crate) mod blas;
pub(crate) mod blas_lt;
pub(crate) mod event;
pub(crate) mod kernel_groups;
pub(crate) mod kernels;
pub(crate) mod module;
pub(crate) mod nvrtc;
pub(crate) mod staging;
pub(crate) mod stream;

use std::any::Any;
use std::collections::HashMap;
use std::sync::OnceLock;

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::CUresult;
use cudarc::driver::{result, CudaContext};

use crate::backend::{BackendDevice, BackendMemory, BackendStream, DevicePtr};
use crate::phases::timed;
use crate::sync::{Arc, Mutex};
use crate::{Device, DeviceConfig, DeviceKind, Error, Result};

/// What a CUDA device shares with its streams.
pub(crate) struct Shared {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) name: String,
    /// Whether small device-to-host copies are staged through pinned buffers (the tunables'
    /// `cuda.staging`, default on; `STREAMPOOL_CUDA_STAGING=0` turns it off, to compare).
    pub(crate) staging: bool,
    /// Whether small host-to-device copies go through each stream's pinned upload ring
    /// (`cuda.h2d`, default on; `STREAMPOOL_CUDA_H2D=pageable` turns it off, to compare).
    pub(crate) stage_uploads: bool,
    /// How the host waits for events (`cuda.wait`, `STREAMPOOL_CUDA_WAIT`).
    pub(crate) wait: event::WaitPolicy,
    /// `kernels.cu`'s groups, each built on its first launch and shared by every stream
    /// and thread.
    pub(crate) kernels: Arc<module::Module>,
}

impl Shared {
    /// `kernels.cu`'s modules (see [`module::Module`]).
    pub(crate) fn module(&self) -> Result<Arc<module::Module>> {
        Ok(self.kernels.clone())
    }
}

/// One GPU.
pub(crate) struct CudaDevice {
    shared: Arc<Shared>,
}

/// A driver error as a runtime error; out-of-memory keeps its meaning.
pub(crate) fn driver_err(device: &str, e: DriverError) -> Error {
    if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Error::OutOfMemory {
            device: device.to_string(),
            requested: 0,
            allocated: 0,
            reserved: 0,
            limit: None,
        };
    }
    let name = e
        .error_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", e.0));
    Error::Backend {
        device: device.to_string(),
        msg: name,
    }
}

/// Makes `ctx` current on the calling thread, if it is not already. Unlike
/// `CudaContext::bind_to_thread`, this does not also swap cudarc's shared error word on every
/// call (an atomic write to one cache line from every thread, many times per op); every
/// driver error we meet is returned directly, so that word stays unused.
pub(crate) fn bind(ctx: &CudaContext) -> std::result::Result<(), DriverError> {
    match result::ctx::get_current()? {
        Some(current) if current == ctx.cu_ctx() => Ok(()),
        // SAFETY: the context is alive (we hold it) and may be current on any thread.
        _ => unsafe { result::ctx::set_current(ctx.cu_ctx()) },
    }
}

impl CudaDevice {
    /// Opens GPU `ordinal`, or says why it cannot (never panics when CUDA is absent).
    fn open(ordinal: usize, config: &DeviceConfig) -> Result<Self> {
        let unavailable = |what: &str| Error::Unavailable(format!("cuda:{ordinal}: {what}"));
        // Timed (`crate::phases`): loading libcublas (and the libcublasLt it pulls in, some
        // hundreds of MB) can be a visible part of a cold start.
        // NVRTC is not among them: a GPU with embedded kernels never needs it, and the
        // first group it must compile says so if it is missing (`nvrtc::load_group`).
        // SAFETY: only tries to load the shared libraries; nothing is called through them.
        let libs = timed("CUDA libraries loaded", || unsafe {
            [
                (
                    "libcuda (the NVIDIA driver)",
                    cudarc::driver::sys::is_culib_present(),
                ),
                ("libcublas", cudarc::cublas::sys::is_culib_present()),
            ]
        });
        if let Some((lib, _)) = libs.iter().find(|(_, present)| !present) {
            return Err(unavailable(&format!("{lib} not found")));
        }
        timed("cuInit", result::init).map_err(|e| unavailable(&format!("cuInit failed: {e:?}")))?;
        let count = result::device::get_count()
            .map_err(|e| unavailable(&format!("no device count: {e:?}")))?;
        if ordinal >= count.max(0) as usize {
            return Err(unavailable(&format!("only {count} CUDA device(s) present")));
        }
        let ctx = timed("CUDA context created", || CudaContext::new(ordinal))
            .map_err(|e| unavailable(&format!("{e:?}")))?;
        // SAFETY: we create no `CudaSlice`; our allocator tracks every use itself (module doc).
        unsafe { ctx.disable_event_tracking() };
        let gpu = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        let name = format!("cuda:{ordinal} ({gpu})");
        let kernel_disk = config.kernel_cache.resolve();
        let sources = nvrtc::ImageSources {
            embedded: config.embedded_kernels,
        };
        let cc = ctx.compute_capability().ok();
        tracing::info!(
            device = %name,
            embedded = ?nvrtc::embedded_nvrtc().filter(|_| config.embedded_kernels)
                .and(nvrtc::embedded_arch(cc)),
            "kernels: embedded cubins for this GPU (sm_XY), else NVRTC per group on first use"
        );
        let kernels = Arc::new(module::Module::new(
            &ctx,
            &name,
            kernel_disk.as_ref(),
            sources,
        ));
        let tuning = match (&kernel_disk, config.tuning_cache, cc) {
            (Some(disk), true, Some(cc)) => Some(crate::TuningCache::new(
                crate::TuningCache::dir_beside(disk.dir()),
                crate::TuningScope {
                    gpu: gpu.clone(),
                    compute_capability: cc,
                    library: blas_lt::library_version(),
                },
            )),
            _ => None,
        };
        blas_lt::set_tuning_cache(&name, tuning);
        let tuning = &crate::config::tuning().cuda;
        Ok(Self {
            shared: Arc::new(Shared {
                staging: tuning.staging,
                stage_uploads: tuning.h2d == crate::config::CudaH2d::Staged,
                wait: event::WaitPolicy::from_tuning(tuning),
                ctx,
                name,
                kernels,
            }),
        })
    }

    fn bind(&self) -> Result<()> {
        bind(&self.shared.ctx).map_err(|e| driver_err(&self.shared.name, e))
    }
}

impl BackendMemory for CudaDevice {
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.bind()?;
        // SAFETY: a plain device allocation (never managed memory) in the bound context.
        // Timed (`crate::phases`): new sizes on a new shape's first call reach the driver.
        let ptr = crate::phases::timed("cuMemAlloc", || unsafe { result::malloc_sync(bytes) })
            .map_err(|e| match driver_err(&self.shared.name, e) {
                Error::OutOfMemory { device, .. } => Error::OutOfMemory {
                    device,
                    requested: bytes,
                    allocated: 0,
                    reserved: 0,
                    limit: None,
                },
                other => other,
            })?;
        Ok(DevicePtr(ptr))
    }

    unsafe fn free(&self, ptr: DevicePtr, _bytes: usize) {
        if self.bind().is_ok() {
            // SAFETY: the caller guarantees `ptr` came from `alloc` and no stream uses it.
            if let Err(e) = unsafe { result::free_sync(ptr.0) } {
                tracing::error!(error = ?e, "cuMemFree failed");
            }
        }
    }
}

impl BackendDevice for CudaDevice {
    fn name(&self) -> String {
        self.shared.name.clone()
    }

    fn create_stream(&self, _index: usize) -> Result<Arc<dyn BackendStream>> {
        // Every slot, the default one included, is a real non-blocking stream: the legacy
        // NULL stream would serialize against all the others.
        let raw = self
            .shared
            .ctx
            .new_stream()
            .map_err(|e| driver_err(&self.shared.name, e))?;
        Ok(Arc::new(stream::CudaStream::new(raw, self.shared.clone())))
    }

    fn create_high_priority_stream(&self, _index: usize) -> Result<Arc<dyn BackendStream>> {
        // The greatest priority the context allows (numerically the least; 0 is the
        // default): the block scheduler dispatches these streams' pending blocks first.
        let (_, greatest) =
            result::stream::get_priority_range().map_err(|e| driver_err(&self.shared.name, e))?;
        let raw = self
            .shared
            .ctx
            .new_stream_with_priority(greatest)
            .map_err(|e| driver_err(&self.shared.name, e))?;
        Ok(Arc::new(stream::CudaStream::new(raw, self.shared.clone())))
    }

    fn has_packed_kernels(&self) -> bool {
        true
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        // The context must be current on this thread for `cuMemGetInfo`.
        self.bind().ok()?;
        result::mem_get_info().ok()
    }

    fn cheap_events(&self) -> bool {
        // A `cuEventRecord` per op output would cost more than many small kernels; record
        // the write event lazily, on the first read from another stream.
        false
    }

    fn load_kernels(&self) -> Result<()> {
        // One thread per group at most: NVRTC compiles a program on one core.
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        self.shared.kernels.load_all(threads)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Device {
    /// The process-wide device of CUDA GPU `ordinal` (default configuration), shared by every
    /// caller. Returns [`Error::Unavailable`] with the reason when there is no driver, no
    /// NVRTC/cuBLAS library or no such GPU; a failed open is retried on the next call.
    ///
    /// ```no_run
    /// use streampool::{Device, Tensor};
    /// let dev = Device::cuda(0).unwrap();
    /// let x = Tensor::randn(&[4, 4], 0, &dev).unwrap();
    /// let y = x.matmul(&x).unwrap().to_vec::<f32>().unwrap();
    /// assert_eq!(y.len(), 16);
    /// ```
    pub fn cuda(ordinal: usize) -> Result<Device> {
        static DEVICES: OnceLock<Mutex<HashMap<usize, Device>>> = OnceLock::new();
        let devices = DEVICES.get_or_init(|| Mutex::new(HashMap::new()));
        // Held while the first caller opens the GPU (context creation, no GPU wait), so
        // every thread gets the same device.
        let mut map = devices.lock();
        if let Some(d) = map.get(&ordinal) {
            return Ok(d.clone());
        }
        // The map holds it for ever: process-wide, so its handles need no reference count.
        let dev = Device::cuda_with(ordinal, DeviceConfig::default())?.into_process_wide();
        map.insert(ordinal, dev.clone());
        Ok(dev)
    }

    /// How many CUDA GPUs the driver reports (e.g. for `--device cuda:all`). Returns
    /// [`Error::Unavailable`] with the reason when the driver is absent or fails.
    pub fn cuda_count() -> Result<usize> {
        let unavailable = |what: String| Error::Unavailable(format!("cuda: {what}"));
        // SAFETY: only tries to load the driver library; nothing is called through it.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(unavailable("libcuda (the NVIDIA driver) not found".into()));
        }
        result::init().map_err(|e| unavailable(format!("cuInit failed: {e:?}")))?;
        let count = result::device::get_count()
            .map_err(|e| unavailable(format!("no device count: {e:?}")))?;
        Ok(count.max(0) as usize)
    }

    /// A new, separate device on CUDA GPU `ordinal` with its own streams, allocator and
    /// kernel cache (e.g. with a memory limit). It shares the GPU's primary context.
    pub fn cuda_with(ordinal: usize, config: DeviceConfig) -> Result<Device> {
        let backend = CudaDevice::open(ordinal, &config)?;
        Device::with_backend(
            Device::next_id(),
            DeviceKind::Cuda(ordinal),
            Arc::new(backend),
            config,
        )
    }
}
