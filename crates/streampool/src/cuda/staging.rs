//! Pinned (page-locked) host buffers that stage small host<->device copies, per stream.
//!
//! A copy to or from pageable memory goes through the driver's own staging buffers and is
//! synchronous for device-to-host ("API synchronization behavior", CUDA driver API docs);
//! copies from many threads then queue behind each other there. From pinned memory the copy
//! is a plain DMA on the stream. So copies up to [`MAX_STAGED`] bytes go through a pinned
//! buffer of the stream: device-to-host copies into it and the host reads it once the copy's
//! event has completed; host-to-device fills it and the copy runs asynchronously, the buffer
//! being reused only after that copy's event has completed. Larger copies are bandwidth-bound
//! and use the pageable path. Each stream keeps at most [`MAX_BUFFERS`] buffers; when all are
//! busy the pageable path is used, so pinned memory stays bounded (32 streams x 4 x 1 MiB at
//! the very most).

use cudarc::driver::result;

use super::driver_err;
use super::event::CudaEvent;
use crate::backend::BackendEvent;
use crate::sync::Mutex;
use crate::Result;

/// Largest copy that is staged.
pub(crate) const MAX_STAGED: usize = 1 << 20;
/// Smallest buffer allocated (so a few sizes cover most copies).
const MIN_BUFFER: usize = 64 << 10;
/// Most buffers per stream.
const MAX_BUFFERS: usize = 4;

/// One pinned buffer.
pub(crate) struct Buffer {
    ptr: *mut u8,
    cap: usize,
    /// The last copy from it (host-to-device); the buffer is free once it has completed.
    busy_until: Option<CudaEvent>,
}

// SAFETY: the buffer is plain host memory owned by this value; it moves between threads
// with it and is used by one thread at a time (taken out of the stream's list while used).
unsafe impl Send for Buffer {}

impl Buffer {
    /// The first `len` bytes.
    ///
    /// # Safety
    /// `len <= cap`, and no copy into or out of the buffer is pending.
    pub(crate) unsafe fn bytes(&mut self, len: usize) -> &mut [u8] {
        // SAFETY: per the caller; the allocation is `cap` bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, len) }
    }

    pub(crate) fn set_busy(&mut self, event: CudaEvent) {
        self.busy_until = Some(event);
    }
}

/// The pinned buffers of one stream.
pub(crate) struct Staging {
    device: String,
    /// Idle buffers, and how many exist in all (idle or taken). Held only to take or return
    /// a buffer, never across a copy or a wait.
    state: Mutex<(Vec<Buffer>, usize)>,
    enabled: bool,
}

impl Staging {
    pub(crate) fn new(device: String, enabled: bool) -> Self {
        Self {
            device,
            state: Mutex::new((Vec::new(), 0)),
            enabled,
        }
    }

    /// A free buffer of at least `len` bytes, or `None` to use the pageable path (copy too
    /// large, staging off, or every buffer of the stream busy). The context is bound.
    pub(crate) fn take(&self, len: usize) -> Result<Option<Buffer>> {
        if !self.enabled || len > MAX_STAGED {
            return Ok(None);
        }
        let evict = {
            let mut st = self.state.lock();
            let (idle, count) = &mut *st;
            let free = |b: &Buffer| b.busy_until.as_ref().is_none_or(|e| e.query());
            if let Some(i) = idle.iter().position(|b| b.cap >= len && free(b)) {
                let mut b = idle.swap_remove(i);
                b.busy_until = None;
                return Ok(Some(b));
            }
            if *count < MAX_BUFFERS {
                *count += 1;
                None
            } else {
                // Full: replace a free buffer that is too small, if any.
                match idle.iter().position(free) {
                    Some(i) => Some(idle.swap_remove(i)),
                    None => return Ok(None),
                }
            }
        };
        if let Some(old) = evict {
            drop(old); // frees its pinned memory; the slot is reused below
        }
        let cap = len.next_power_of_two().max(MIN_BUFFER);
        // SAFETY: a plain pinned host allocation (flags 0) in the bound context.
        match unsafe { result::malloc_host(cap, 0) } {
            Ok(ptr) => Ok(Some(Buffer {
                ptr: ptr as *mut u8,
                cap,
                busy_until: None,
            })),
            Err(e) => {
                self.state.lock().1 -= 1;
                Err(driver_err(&self.device, e))
            }
        }
    }

    /// Returns a buffer taken with [`Staging::take`].
    pub(crate) fn give_back(&self, buffer: Buffer) {
        self.state.lock().0.push(buffer);
    }

    /// Forgets a buffer that can no longer be proven idle (after a failed wait): it is leaked
    /// rather than freed or reused under a copy that may still be running.
    pub(crate) fn leak(&self, buffer: Buffer) {
        self.state.lock().1 -= 1;
        std::mem::forget(buffer);
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(e) = &self.busy_until {
            // A pending copy still reads the buffer: wait for it (stream teardown only).
            let _ = e.synchronize();
        }
        // SAFETY: allocated by `malloc_host` and no copy uses it any more.
        let _ = unsafe { result::free_host(self.ptr as *mut _) };
    }
}
