//! Pinned (page-locked) host buffers that stage small device-to-host copies, per stream.
//!
//! A copy to pageable memory goes through the driver's own staging buffers and is synchronous
//! ("API synchronization behavior", CUDA driver API docs); such copies from many threads queue
//! behind each other there (on the H100, `to_vec` of a small tensor went from 0.96x to 3.8x
//! at 8 threads vs 1 with staging). Into pinned memory the copy is a plain DMA on the stream.
//! So copies up to [`MAX_STAGED`] bytes land in a pinned buffer of the stream, which the host
//! reads once the copy's event has completed; larger copies are bandwidth-bound and use the
//! pageable path. Each stream keeps at most [`MAX_BUFFERS`] buffers; when all are in use
//! (threads sharing the stream) the pageable path is used, so pinned memory stays bounded (32
//! streams x 4 x 1 MiB at most).

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

/// Bytes of one segment of an upload ring; uploads larger than this take the pageable path.
/// A batch's token ids and masks fit: 512 x 128 tokens upload 512 KiB of ids and two 256 KiB
/// masks per call, which at 64 KiB segments took the pageable path, each copy waiting for the
/// stream (the pooling mask's for the whole forward) while the GPU idled between calls.
pub(crate) const UPLOAD_SEGMENT: usize = 1 << 20;
/// Segments per upload ring (so at most 4 MiB of pinned memory per stream).
const UPLOAD_SEGMENTS: usize = 4;

/// A stream's ring of pinned memory for host-to-device uploads.
///
/// A pageable `cuMemcpyHtoDAsync` synchronizes the whole stream before it copies ("API
/// synchronization behavior", CUDA driver API docs), which is what made the bench's call
/// collapse with threads on the H100. From pinned memory the copy is a plain DMA on the stream.
/// The ring hands out consecutive regions; when the write head leaves a segment, one event
/// recorded on the stream marks the end of every copy from it, so an upload costs a host
/// `memcpy` and one driver call, and an event is recorded once per [`UPLOAD_SEGMENT`] bytes
/// rather than per copy. A segment is reused only once its event has completed; if it has not
/// (the GPU is far behind), the upload takes the pageable path instead of waiting, so pinned
/// memory stays bounded.
pub(crate) struct UploadRing {
    ptr: *mut u8,
    /// Write offset into the ring.
    head: usize,
    /// Per segment: the event recorded after the last copy from it, until known complete.
    fences: Vec<Option<super::event::CudaEvent>>,
    /// The segment being filled (its copies have no fence yet).
    open: Option<usize>,
}

// SAFETY: the ring's pinned memory is owned by this value and only touched under the owning
// stream's mutex (`CudaStream::uploads`), one thread at a time.
unsafe impl Send for UploadRing {}

impl UploadRing {
    /// A ring of `UPLOAD_SEGMENTS x UPLOAD_SEGMENT` pinned bytes (context bound by the caller).
    pub(crate) fn new(device: &str) -> Result<Self> {
        // SAFETY: a plain pinned host allocation (flags 0) in the bound context.
        let ptr = unsafe { result::malloc_host(UPLOAD_SEGMENT * UPLOAD_SEGMENTS, 0) }
            .map_err(|e| driver_err(device, e))?;
        Ok(Self {
            ptr: ptr as *mut u8,
            head: 0,
            fences: (0..UPLOAD_SEGMENTS).map(|_| None).collect(),
            open: None,
        })
    }

    /// A pinned region holding a copy of `src`, or `None` when `src` does not fit a segment or
    /// the segment it would use is still being copied from. `fence` records an event on the
    /// stream (after every copy queued so far), called when the head leaves a segment.
    ///
    /// The caller must queue the copy from the returned region before anyone calls this
    /// again (the stream's upload lock is held across both), so the fence recorded when the
    /// head moves on covers it.
    pub(crate) fn stage(
        &mut self,
        src: &[u8],
        fence: impl FnOnce() -> Result<super::event::CudaEvent>,
    ) -> Result<Option<&[u8]>> {
        let len = src.len();
        if len == 0 || len > UPLOAD_SEGMENT {
            return Ok(None);
        }
        // 256-byte alignment keeps every copy's source DMA-friendly.
        let len_aligned = (len + 255) & !255;
        let mut at = self.head;
        if at % UPLOAD_SEGMENT + len_aligned > UPLOAD_SEGMENT {
            // Does not fit the rest of this segment: start the next one.
            at = ((at / UPLOAD_SEGMENT + 1) % UPLOAD_SEGMENTS) * UPLOAD_SEGMENT;
        }
        let seg = at / UPLOAD_SEGMENT;
        if at.is_multiple_of(UPLOAD_SEGMENT) {
            // Entering `seg`: it must be idle, and the segment we leave gets its fence now,
            // after every copy from it has been queued.
            if !self.segment_free(seg) {
                return Ok(None);
            }
            if let Some(prev) = self.open {
                self.fences[prev] = Some(fence()?);
            }
            self.open = Some(seg);
        }
        self.head = (at + len_aligned) % (UPLOAD_SEGMENTS * UPLOAD_SEGMENT);
        // SAFETY: `[at, at + len)` lies inside one segment of the allocation (`len_aligned` fits
        // the rest of the segment) and no copy reads it: the segment was idle when entered,
        // and regions handed out since are disjoint.
        let region = unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), len) };
        region.copy_from_slice(src);
        Ok(Some(region))
    }

    /// Whether segment `i` has no copy pending; drops its fence once complete.
    fn segment_free(&mut self, i: usize) -> bool {
        use crate::backend::BackendEvent;
        match &self.fences[i] {
            None => true,
            Some(e) if e.query() => {
                self.fences[i] = None;
                true
            }
            Some(_) => false,
        }
    }
}

impl Drop for UploadRing {
    fn drop(&mut self) {
        // SAFETY: allocated by `malloc_host`; the owning stream synchronizes before its
        // fields drop (`CudaStream::drop`), so no copy reads the ring any more.
        let _ = unsafe { result::free_host(self.ptr as *mut _) };
    }
}
