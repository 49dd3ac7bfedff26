//! CUDA events, recycled through a pool per stream (threads on different streams never
//! contend for it).
//!
//! Every op output, free guard and `to_vec` records an event, so creating a `CUevent` each
//! time would put `cuEventCreate`/`cuEventDestroy` on the hot path. Dropped events go back to
//! the pool instead. Reuse is sound because `cuStreamWaitEvent` captures the event's state at
//! the time of the call (CUDA driver API, `cuStreamWaitEvent`: "waits on the most recent
//! `cuEventRecord`"), and an event returns to the pool only when no handle to it is left,
//! so nobody can query or wait on the old recording any more.

use std::any::Any;
use std::time::Duration;

use cudarc::driver::sys::{self, CUevent, CUevent_flags, CUresult};
use cudarc::driver::{result, CudaContext};

use super::driver_err;
use crate::backend::BackendEvent;
use crate::sync::{Arc, Mutex};
use crate::{Error, Result};

/// A raw `CUevent`; the pool owns it while it is idle.
#[derive(Clone, Copy)]
struct RawEvent(CUevent);

// SAFETY: a CUevent is an opaque driver handle; the driver API is thread-safe, and we never
// use one handle from two owners at once (an idle event belongs to the pool alone).
unsafe impl Send for RawEvent {}

/// How the host waits for an event (the tunables' `cuda.wait`, `STREAMPOOL_CUDA_WAIT`,
/// default `spin`; [`crate::config::CudaWait`]). On the H100,
/// `blocking` cost 20-40 us per read-back at low thread counts (12k calls/s from one thread
/// against 19k with `spin`) and won only with more waiting threads than cores; `yield` was
/// within noise of `spin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitPolicy {
    /// `cuEventSynchronize` on a default event: the driver spins (or yields, per the
    /// context's scheduling flags).
    Spin,
    /// Events created with `CU_EVENT_BLOCKING_SYNC`: the waiting thread sleeps until the GPU
    /// signals, leaving the CPU to launching threads.
    Blocking,
    /// Poll `cuEventQuery`, yielding the CPU between polls.
    Yield,
    /// Poll for up to `spin` (`cuda.spin_us`, default 30 us: a small call's
    /// read-back completes within that), then sleep as `Blocking` does: short waits keep
    /// spin latency, long ones (many more threads than cores) free the CPU.
    Hybrid { spin: std::time::Duration },
}

impl WaitPolicy {
    /// From the tunables' `cuda.wait` and `cuda.spin_us`. Spin by default: with one graph
    /// launch per call it gave the best rate at every thread count from 1 to 64 and the
    /// lowest latency.
    pub(crate) fn from_tuning(cuda: &crate::config::CudaTuning) -> Self {
        use crate::config::CudaWait;
        match cuda.wait {
            CudaWait::Spin => WaitPolicy::Spin,
            CudaWait::Blocking => WaitPolicy::Blocking,
            CudaWait::Yield => WaitPolicy::Yield,
            CudaWait::Hybrid => WaitPolicy::Hybrid {
                spin: std::time::Duration::from_micros(cuda.spin_us),
            },
        }
    }
}

/// Idle events of one stream, with and without timing.
pub(crate) struct EventPool {
    ctx: Arc<CudaContext>,
    device: String,
    wait: WaitPolicy,
    /// Idle events `[untimed, timed]`. Held only to push or pop one handle.
    idle: [Mutex<Vec<RawEvent>>; 2],
}

impl EventPool {
    pub(crate) fn new(ctx: Arc<CudaContext>, device: String, wait: WaitPolicy) -> Self {
        Self {
            ctx,
            device,
            wait,
            idle: [Mutex::new(Vec::new()), Mutex::new(Vec::new())],
        }
    }

    /// Records an event on `stream` (the caller has bound the context to this thread).
    pub(crate) fn record(
        self: &Arc<Self>,
        stream: sys::CUstream,
        timing: bool,
    ) -> Result<CudaEvent> {
        let raw = match self.idle[timing as usize].lock().pop() {
            Some(raw) => raw,
            None => {
                let flags = if timing {
                    CUevent_flags::CU_EVENT_DEFAULT as u32
                } else {
                    // Timing costs a timestamp write per record; only `Event::record` asks for it.
                    CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
                };
                let flags = match self.wait {
                    WaitPolicy::Blocking | WaitPolicy::Hybrid { .. } => {
                        flags | CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32
                    }
                    _ => flags,
                };
                let mut raw = std::ptr::null_mut();
                // SAFETY: `raw` is a valid out-pointer; the context is bound by the caller.
                unsafe { sys::cuEventCreate(&mut raw, flags) }
                    .result()
                    .map_err(|e| driver_err(&self.device, e))?;
                RawEvent(raw)
            }
        };
        let event = CudaEvent {
            raw,
            timing,
            stream: stream as usize,
            pool: self.clone(),
        };
        // SAFETY: both handles are live: the event is ours, the stream belongs to a live
        // `CudaStream` of this context (bound by the caller).
        unsafe { result::event::record(raw.0, stream) }.map_err(|e| driver_err(&self.device, e))?;
        Ok(event)
    }

    pub(crate) fn device(&self) -> &str {
        &self.device
    }
}

impl Drop for EventPool {
    fn drop(&mut self) {
        let _ = super::bind(&self.ctx);
        for list in &self.idle {
            for raw in list.lock().drain(..) {
                // SAFETY: idle events are owned by the pool alone; destroying a pending event
                // is allowed (its resources are released once it completes).
                let _ = unsafe { result::event::destroy(raw.0) };
            }
        }
    }
}

/// A recorded CUDA event. Dropping it returns the `CUevent` to the pool.
pub(crate) struct CudaEvent {
    raw: RawEvent,
    timing: bool,
    /// The `CUstream` it was recorded on (identity only, to skip same-stream waits).
    pub(crate) stream: usize,
    pool: Arc<EventPool>,
}

// SAFETY: see `RawEvent`; `CudaEvent` methods only call thread-safe driver functions on it.
unsafe impl Sync for CudaEvent {}

impl CudaEvent {
    pub(crate) fn raw(&self) -> CUevent {
        self.raw.0
    }
}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        self.pool.idle[self.timing as usize].lock().push(self.raw);
    }
}

impl BackendEvent for CudaEvent {
    fn query(&self) -> bool {
        let _ = super::bind(&self.pool.ctx);
        // SAFETY: the event is live (we hold it).
        // Only success counts as done: after an error (a faulted context) the allocator must
        // keep the block, and waiters fall through to `wait`/`synchronize`, which report it.
        matches!(
            unsafe { sys::cuEventQuery(self.raw.0) },
            CUresult::CUDA_SUCCESS
        )
    }

    fn synchronize(&self) -> Result<()> {
        super::bind(&self.pool.ctx).map_err(|e| driver_err(self.pool.device(), e))?;
        if let WaitPolicy::Hybrid { spin } = self.pool.wait {
            let start = std::time::Instant::now();
            loop {
                // SAFETY: the event is live (we hold it).
                match unsafe { sys::cuEventQuery(self.raw.0) } {
                    CUresult::CUDA_ERROR_NOT_READY if start.elapsed() < spin => {
                        std::hint::spin_loop()
                    }
                    CUresult::CUDA_ERROR_NOT_READY => break, // sleep below
                    r => return r.result().map_err(|e| driver_err(self.pool.device(), e)),
                }
            }
        }
        if self.pool.wait == WaitPolicy::Yield {
            loop {
                // SAFETY: the event is live (we hold it).
                match unsafe { sys::cuEventQuery(self.raw.0) } {
                    CUresult::CUDA_ERROR_NOT_READY => std::thread::yield_now(),
                    r => return r.result().map_err(|e| driver_err(self.pool.device(), e)),
                }
            }
        }
        // SAFETY: the event is live (we hold it).
        unsafe { result::event::synchronize(self.raw.0) }
            .map_err(|e| driver_err(self.pool.device(), e))
    }

    fn elapsed_since(&self, earlier: &dyn BackendEvent) -> Result<Duration> {
        let earlier = earlier
            .as_any()
            .downcast_ref::<CudaEvent>()
            .ok_or_else(|| {
                Error::InvalidArgument("elapsed: events of different backends".into())
            })?;
        if !self.timing || !earlier.timing {
            return Err(Error::InvalidArgument(
                "elapsed: event was not recorded with timing".into(),
            ));
        }
        self.synchronize()?;
        earlier.synchronize()?;
        // SAFETY: both events are live, timed and completed.
        let ms = unsafe { result::event::elapsed(earlier.raw.0, self.raw.0) }
            .map_err(|e| driver_err(self.pool.device(), e))?;
        Ok(Duration::from_secs_f64(ms.max(0.0) as f64 / 1e3))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
