//! A CUDA stream of the pool: a non-blocking `CUstream`, its cuBLAS handle and the kernels.

use std::any::Any;

use cudarc::driver::sys::{self, CUevent_wait_flags, CUstream, CUstreamCaptureMode};
use cudarc::driver::{result, CudaStream as RawStream};

use super::blas::Blas;
use super::event::{CudaEvent, EventPool};
use super::kernels::Launcher;
use super::module::Module;
use super::staging::{Staging, UploadRing};
use super::{driver_err, Shared};
use crate::backend::{BackendEvent, BackendGraph, BackendPinned, BackendStream, DevicePtr};
use crate::kernel::{Activation, Kernel};
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
    /// The pinned upload ring, created on the first staged upload. The lock is held while a
    /// region is filled and its copy queued (a host `memcpy` and one driver call, no wait),
    /// so the ring's fences cover every copy they must (see `UploadRing::stage`).
    uploads: Mutex<Option<UploadRing>>,
    /// The private stream graphs of this stream are captured on (created on first capture).
    capture: Mutex<Option<Arc<CudaStream>>>,
    /// Whether this is such a capture stream: host copies on it are refused (a captured
    /// upload would replay whatever the staging memory holds then).
    is_capture: bool,
    /// Held for the length of one capture on a capture stream.
    capture_lock: Mutex<()>,
}

impl CudaStream {
    pub(crate) fn new(raw: Arc<RawStream>, shared: Arc<Shared>) -> Self {
        Self {
            module: std::sync::OnceLock::new(),
            blas: Mutex::new(None),
            events: Arc::new(EventPool::new(
                shared.ctx.clone(),
                shared.name.clone(),
                shared.wait,
            )),
            staging: Staging::new(shared.name.clone(), shared.staging),
            uploads: Mutex::new(None),
            capture: Mutex::new(None),
            is_capture: false,
            capture_lock: Mutex::new(()),
            raw,
            shared,
        }
    }

    fn refuse_in_capture(&self, what: &str) -> Result<()> {
        if self.is_capture {
            return Err(Error::InvalidArgument(format!(
                "{what} inside a graph capture (copies between host and device cannot be captured)"
            )));
        }
        Ok(())
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
        let m = self.shared.module()?;
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
        self.refuse_in_capture("host-to-device copy")?;
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        if self.shared.stage_uploads && src.len() <= super::staging::UPLOAD_SEGMENT {
            let mut ring = self.uploads.lock();
            if ring.is_none() {
                *ring = Some(UploadRing::new(self.device())?);
            }
            let ring = ring.as_mut().expect("set above"); // invariant: just filled
            let staged = ring.stage(&src, || self.events.record(self.cu(), false))?;
            if let Some(pinned) = staged {
                // SAFETY: `dst` is valid for `src.len()` bytes (caller); the pinned region is
                // not reused before the ring's fence recorded after this copy has completed.
                return unsafe { result::memcpy_htod_async(dst.0, pinned, self.cu()) }
                    .map_err(|e| driver_err(self.device(), e));
            }
        }
        // Larger copies (over a segment) and uploads that found the ring busy take the
        // pageable path.
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
        self.refuse_in_capture("device-to-host copy")?;
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

    fn has_graphs(&self) -> bool {
        !self.is_capture
    }

    fn fuses_matmul_bias(&self) -> bool {
        true // cuBLASLt's bias epilogue
    }

    fn fuses_matmul_act(&self, act: Activation) -> bool {
        // cuBLASLt's BIAS, RELU_BIAS and GELU_BIAS epilogues; GELU_BIAS computes the tanh
        // form, so BERT's erf GELU stays a separate pass.
        matches!(
            act,
            Activation::Identity | Activation::Relu | Activation::GeluTanh
        )
    }

    fn fuses_matmul_residual(&self, dtype: crate::DType, k: usize, n: usize) -> bool {
        // Half precision only: f32 products keep their plans (and their speed) as they were.
        matches!(dtype, crate::DType::F16 | crate::DType::BF16)
            && super::blas_lt::fuse_residual(k, n)
    }

    fn capture_stream(&self) -> Result<Option<Arc<dyn BackendStream>>> {
        if self.is_capture {
            return Err(Error::InvalidArgument("graphs: nested capture".into()));
        }
        // Held while the side stream is created (once per stream; no GPU wait).
        let mut slot = self.capture.lock();
        if let Some(s) = slot.as_ref() {
            return Ok(Some(s.clone() as Arc<dyn BackendStream>));
        }
        self.bind()?;
        let raw = self
            .shared
            .ctx
            .new_stream()
            .map_err(|e| driver_err(self.device(), e))?;
        let mut side = CudaStream::new(raw, self.shared.clone());
        side.is_capture = true;
        // Everything that allocates or loads must exist before capture starts: inside a
        // thread-local capture such calls are errors.
        side.module()?;
        *side.blas.lock() = Some(Blas::new(side.cu(), side.device())?);
        let side = Arc::new(side);
        *slot = Some(side.clone());
        Ok(Some(side as Arc<dyn BackendStream>))
    }

    fn capture(&self, body: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn BackendGraph>> {
        if !self.is_capture {
            return Err(Error::InvalidArgument(
                "graphs: capture on a pool stream".into(),
            ));
        }
        // Held for the whole capture: two threads sharing a pool stream share its capture
        // stream, and one capture must never take in another thread's work. `body` only
        // queues work (a thread-local capture refuses waits), so no GPU wait happens under it.
        let _one_at_a_time = self.capture_lock.lock();
        self.bind()?;
        // THREAD_LOCAL: only this thread's unsafe calls (allocations, syncs) are refused while
        // it captures; other threads keep working on their own streams.
        // SAFETY: the stream is live and not capturing (the lock above).
        unsafe {
            result::stream::begin_capture(
                self.cu(),
                CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(|e| driver_err(self.device(), e))?;
        let body_result = body();
        // Always end the capture, also after an error, so the stream leaves capture mode.
        // SAFETY: the stream is live and capturing.
        let ended = unsafe { result::stream::end_capture(self.cu()) };
        if let Err(e) = body_result {
            if let Ok(graph) = ended {
                // SAFETY: the graph just captured, not instantiated, owned by nobody else.
                let _ = unsafe { result::graph::destroy(graph) };
            }
            return Err(e);
        }
        let graph = ended.map_err(|e| driver_err(self.device(), e))?;
        // SAFETY: `graph` is the valid graph just captured; it is destroyed once instantiated
        // (the executable graph does not refer to it).
        let exec = crate::phases::timed("graph instantiate", || unsafe {
            result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0))
        });
        // SAFETY: see above.
        let _ = unsafe { result::graph::destroy(graph) };
        let exec = exec.map_err(|e| driver_err(self.device(), e))?;
        Ok(Box::new(CudaGraph {
            exec,
            shared: self.shared.clone(),
        }))
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<Box<dyn BackendPinned>> {
        self.bind()?;
        let len = bytes.max(1);
        // SAFETY: a plain pinned host allocation (flags 0) in the bound context.
        let ptr =
            unsafe { result::malloc_host(len, 0) }.map_err(|e| driver_err(self.device(), e))?;
        Ok(Box::new(Pinned {
            ptr: ptr as *mut u8,
            len,
            shared: self.shared.clone(),
        }))
    }

    unsafe fn copy_pinned_to_device(
        &self,
        src: &dyn BackendPinned,
        dst: DevicePtr,
        bytes: usize,
    ) -> Result<()> {
        if bytes > src.len() {
            return Err(Error::InvalidArgument(
                "pinned copy larger than its buffer".into(),
            ));
        }
        self.bind()?;
        // SAFETY: `src` is pinned memory of at least `bytes` (checked); `dst` per the caller.
        let host = unsafe { std::slice::from_raw_parts(src.ptr() as *const u8, bytes) };
        // SAFETY: per the caller, `dst` is valid and `src` stays unwritten until the copy ran.
        unsafe { result::memcpy_htod_async(dst.0, host, self.cu()) }
            .map_err(|e| driver_err(self.device(), e))
    }

    unsafe fn copy_device_to_pinned(
        &self,
        src: DevicePtr,
        dst: &dyn BackendPinned,
        bytes: usize,
    ) -> Result<()> {
        if bytes > dst.len() {
            return Err(Error::InvalidArgument(
                "pinned copy larger than its buffer".into(),
            ));
        }
        self.bind()?;
        // SAFETY: `dst` is pinned memory of at least `bytes` (checked), not read until the copy
        // ran (caller); `src` is valid for `bytes` (caller).
        let host = unsafe { std::slice::from_raw_parts_mut(dst.ptr(), bytes) };
        // SAFETY: as above.
        unsafe { result::memcpy_dtoh_async(host, src.0, self.cu()) }
            .map_err(|e| driver_err(self.device(), e))
    }

    unsafe fn launch_graph(&self, graph: &dyn BackendGraph) -> Result<()> {
        let graph = graph.as_any().downcast_ref::<CudaGraph>().ok_or_else(|| {
            Error::InvalidArgument("launch_graph: graph of another backend".into())
        })?;
        self.bind()?;
        // SAFETY: the executable graph is live (we hold it); memory it touches is kept valid
        // by the caller.
        unsafe { result::graph::launch(graph.exec, self.cu()) }
            .map_err(|e| driver_err(self.device(), e))
    }
}

/// Page-locked host memory from `cuMemHostAlloc`.
struct Pinned {
    ptr: *mut u8,
    len: usize,
    shared: Arc<Shared>,
}

// SAFETY: plain host memory owned by this value; who reads or writes it when is ordered by
// its user (a graph's busy flag and events).
unsafe impl Send for Pinned {}
// SAFETY: as above.
unsafe impl Sync for Pinned {}

impl BackendPinned for Pinned {
    fn ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = super::bind(&self.shared.ctx);
        // SAFETY: allocated by `malloc_host`; its owner (a graph) drops it only after the last
        // copy into or out of it has completed.
        let _ = unsafe { result::free_host(self.ptr as *mut _) };
    }
}

/// An instantiated CUDA graph (`CUgraphExec`).
pub(crate) struct CudaGraph {
    exec: sys::CUgraphExec,
    shared: Arc<Shared>,
}

// SAFETY: an executable graph is an opaque driver handle; launching it from several threads
// is allowed (the runtime serializes replays of one graph anyway).
unsafe impl Send for CudaGraph {}
// SAFETY: as above.
unsafe impl Sync for CudaGraph {}

impl BackendGraph for CudaGraph {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        if super::bind(&self.shared.ctx).is_ok() {
            // SAFETY: the runtime drops a graph only after its last replay has completed.
            let _ = unsafe { result::graph::exec_destroy(self.exec) };
        }
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
