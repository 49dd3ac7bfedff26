//! Pinned (page-locked) host buffers that stage small device-to-host copies, per stream.
//!
//! A copy to pageable memory goes through the driver's own staging buffers and is synchronous
//! ("API synchronization behavior", CUDA driver API docs); such copies from many threads queue
//! behind each other there (on the H100, `to_vec` of a small tensor went from 0.96x to 3.8x
//! at 8 threads vs 1 with staging: bench/results/cuda-2026-11-23/run2/profile.log). Into
//! pinned memory the copy is a plain DMA on the stream. So copies up to [`MAX_STAGED`] bytes
//! land in a pinned buffer of the stream, which the host reads once the copy's event has
//! completed; larger copies are bandwidth-bound and use the pageable path. Each stream keeps
//! at most [`MAX_BUFFERS`] buffers; when all are in use (threads sharing the stream) the
//! pageable path is used, so pinned memory stays bounded (32 streams x 4 x 1 MiB at most).

use cudarc::driver::result;

use super::driver_err;
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

    /// An idle buffer of at least `len` bytes, or `None` to use the pageable path (copy too
    /// large, staging off, or every buffer of the stream in use). The context is bound.
    pub(crate) fn take(&self, len: usize) -> Result<Option<Buffer>> {
        if !self.enabled || len > MAX_STAGED {
            return Ok(None);
        }
        let evict = {
            let mut st = self.state.lock();
            let (idle, count) = &mut *st;
            if let Some(i) = idle.iter().position(|b| b.cap >= len) {
                return Ok(Some(idle.swap_remove(i)));
            }
            if *count < MAX_BUFFERS {
                *count += 1;
                None
            } else {
                // Full: replace an idle buffer that is too small, if any.
                match idle.pop() {
                    Some(small) => Some(small),
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
        // SAFETY: allocated by `malloc_host`; an idle buffer has no copy pending (the copy
        // into it was waited for before it was given back).
        let _ = unsafe { result::free_host(self.ptr as *mut _) };
    }
}
