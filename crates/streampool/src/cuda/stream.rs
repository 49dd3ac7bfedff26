//! A CUDA stream of the pool: a non-blocking `CUstream`, its cuBLAS handle and the kernels.

use cudarc::driver::sys::{CUevent_wait_flags, CUstream};
use cudarc::driver::{result, CudaStream as RawStream};

use super::blas::Blas;
use super::event::{CudaEvent, EventPool};
use super::kernels::{Launcher, Module};
use super::staging::Staging;
use super::{driver_err, Shared};
use crate::backend::{BackendEvent, BackendStream, DevicePtr};
use crate::kernel::Kernel;
use crate::sync::{Arc, Mutex};
use crate::{Error, Result};

/// One stream of a CUDA device's pool.
pub(crate) struct CudaStream {
    raw: Arc<RawStream>,
    shared: Arc<Shared>,
    /// The device's kernels, fetched from its kernel cache on this stream's first launch so
    /// later launches skip the cache's locks.
    module: std::sync::OnceLock<Arc<Module>>,
    /// The stream's cuBLAS handle; see `blas.rs` for why one per stream and why the lock.
    blas: Mutex<Option<Blas>>,
    events: Arc<EventPool>,
    staging: Staging,
}

impl CudaStream {
    pub(crate) fn new(raw: Arc<RawStream>, shared: Arc<Shared>) -> Self {
        Self {
            module: std::sync::OnceLock::new(),
            blas: Mutex::new(None),
            events: Arc::new(EventPool::new(shared.ctx.clone(), shared.name.clone())),
            staging: Staging::new(shared.name.clone(), shared.staging),
            raw,
            shared,
        }
    }

    fn cu(&self) -> CUstream {
        self.raw.cu_stream()
    }

    fn device(&self) -> &str {
        &self.shared.name
    }

    /// Makes this device's context current on the calling thread (a thread-local read when
    /// it already is): driver calls that allocate or load need it, and any thread may call.
    fn bind(&self) -> Result<()> {
        super::bind(&self.shared.ctx).map_err(|e| driver_err(self.device(), e))
    }

    fn module(&self) -> Result<&Arc<Module>> {
        if let Some(m) = self.module.get() {
            return Ok(m);
        }
        let shared = &self.shared;
        let m = shared
            .kernels
            .get_or_build("kernels.cu", || Module::build(&shared.ctx, &shared.name))?;
        Ok(self.module.get_or_init(|| m))
    }
}

impl BackendStream for CudaStream {
    fn record(&self, timing: bool) -> Result<Arc<dyn BackendEvent>> {
        self.bind()?;
        Ok(Arc::new(self.events.record(self.cu(), timing)?))
    }

    fn wait(&self, event: &Arc<dyn BackendEvent>) -> Result<()> {
        let event = event
            .as_any()
            .downcast_ref::<CudaEvent>()
            .ok_or_else(|| Error::InvalidArgument("wait_event: event of another backend".into()))?;
        if event.stream == self.cu() as usize {
            return Ok(()); // same stream: already ordered
        }
        self.bind()?;
        // SAFETY: both handles are live (we hold the event; the stream is ours).
        unsafe {
            result::stream::wait_event(
                self.cu(),
                event.raw(),
                CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(|e| driver_err(self.device(), e))
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        self.raw
            .synchronize()
            .map_err(|e| driver_err(self.device(), e))
    }

    unsafe fn launch(&self, kernel: Kernel) -> Result<()> {
        self.bind()?;
        let launcher = Launcher {
            module: self.module()?,
            stream: self.cu(),
            blas: &self.blas,
            device: self.device(),
        };
        // SAFETY: forwarded from the caller.
        unsafe { launcher.launch(kernel) }
    }

    unsafe fn copy_from_host(&self, src: Vec<u8>, dst: DevicePtr) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // Pageable on purpose: staging host-to-device copies through pinned buffers cost an
        // extra host copy and an event per copy, and measured slower from 1 and 8 threads
        // (bench/results/cuda-2026-11-23/run2/profile.log, `from_vec`).
        // SAFETY: `dst` is valid for `src.len()` bytes (caller). `src` is pageable memory, and
        // for a host-to-device `cuMemcpyHtoDAsync` from pageable memory the driver copies the
        // buffer to staging memory before returning ("API synchronization behavior",
        // CUDA driver API docs: "the function will return once the pageable buffer has been
        // copied to the staging memory for DMA transfer to device memory"), so `src` may be
        // dropped when this returns.
        unsafe { result::memcpy_htod_async(dst.0, &src, self.cu()) }
            .map_err(|e| driver_err(self.device(), e))
    }

    unsafe fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.bind()?;
        if let Some(mut buf) = self.staging.take(dst.len())? {
            // SAFETY: the buffer holds at least `dst.len()` bytes and no copy uses it.
            let pinned = unsafe { buf.bytes(dst.len()) };
            // SAFETY: `src` is valid for `dst.len()` bytes (caller); the pinned buffer is read
            // only after the event below has completed.
            let copied = unsafe { result::memcpy_dtoh_async(pinned, src.0, self.cu()) }
                .map_err(|e| driver_err(self.device(), e))
                .and_then(|()| self.events.record(self.cu(), false))
                .and_then(|done| done.synchronize());
            return match copied {
                Ok(()) => {
                    dst.copy_from_slice(pinned);
                    self.staging.give_back(buf);
                    Ok(())
                }
                Err(e) => {
                    self.staging.leak(buf);
                    Err(e)
                }
            };
        }
        // SAFETY: `src` is valid for `dst.len()` bytes (caller); `dst` stays borrowed until the
        // event below has completed, after which the copy is done.
        unsafe { result::memcpy_dtoh_async(dst, src.0, self.cu()) }
            .map_err(|e| driver_err(self.device(), e))?;
        // Wait for the copy only (not for work other threads queue on this stream later).
        let done = self.events.record(self.cu(), false)?;
        done.synchronize()
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        // Queued work may still use memory the allocator is about to release, and the cuBLAS
        // workspace is freed with the handle: finish it first.
        if self.bind().is_ok() {
            let _ = self.raw.synchronize();
        }
    }
}
