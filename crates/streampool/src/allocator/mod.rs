//! The caching allocator: size classes, per-stream free lists, event-gated cross-stream reuse.
//!
//! A block freed by a tensor is not returned to the backend; it goes onto the free list of
//! the stream it was allocated on, together with one *guard* event for every stream that
//! used it, recorded at the moment of the free. A later request on stream `s` may take it:
//!
//! 1. from `s`'s own list once its guards on *other* streams have completed (work on `s`
//!    itself is ordered by the stream, so needs no check) — the common, sync-free path, which
//!    locks `s`'s shard only (see **Locks** below);
//! 2. from another stream's list once all its guards (except on `s`) have completed. This
//!    is what keeps memory from growing with the number of streams (unlike one pool per
//!    stream, where every pool grows to the peak);
//! 3. otherwise new memory is reserved from the backend, within the device's memory limit;
//! 4. at the limit, completed cached blocks are released, and if that is not enough a block
//!    of the right size whose guards are still pending is reused by making `s` *wait* on
//!    those events (device-side, no host block); then the host waits (outside the lock) for
//!    the guards of every cached block and releases the blocks that are idle (it drains
//!    again even with nothing to wait for: a guard may have completed since the first drain);
//! 5. if there is still no room, the request fails with [`Error::OutOfMemory`] only when no
//!    other thread has a release or a host wait *in flight* and no room has been made (a
//!    release or a failed reservation accounted) since this pass began; otherwise it waits
//!    for those to finish (on a condition variable, lock released) and starts again from
//!    step 1. A request larger than the whole limit fails at once, without touching the
//!    cache.
//!
//! **Where a cached block is.** At every moment, under the device-wide lock, each byte of
//! `reserved` is in a live block (`allocated`), on a free list, or in a release in flight: a
//! release takes its blocks off the lists and counts itself in `Global::in_flight` in one
//! critical section of the device-wide lock (locking each shard inside it), and takes
//! `reserved` down and itself out of `in_flight` in another, after the backend has the
//! memory back. (Moving a block between live and a free list, which the hot path does under
//! its shard's lock only, changes neither `reserved` nor this.) A host wait counts itself in `in_flight` while its events
//! are collected and hands over to the release of what it found idle in one critical
//! section. So a requester that sees no room and nothing in flight knows no room is about
//! to appear; one that sees something in flight waits for it instead of failing. (Before
//! this, a block taken off its list to be released was invisible to a second requester
//! until the release was accounted, and that requester failed at the limit, a spurious
//! out-of-memory; `loom_allocator_requests_at_the_limit_wait_for_releases_in_flight` shows it.)
//!
//! **Lazy guards.** Where events cost a driver call (CUDA), a block used by one stream only
//! is freed with a *lazy* guard: no event, just "stream `t` used it up to now". Its own
//! stream reuses it at once (stream order covers it), so a thread running on its own stream
//! records no event at all in steady state. When another stream needs a block of a class
//! that a stream's list holds lazily, the allocator *resolves* that stream's lazy guards: one
//! event covers all of its lazily freed blocks (a release resolves every stream's). (The profile of the first H100 runs showed one event
//! per freed block was what stopped per-thread throughput from scaling.)
//!
//! **Locks.** The lists are sharded per stream slot ([`shard`]): each slot's free lists, lazy
//! guards and counters sit behind a lock of their own, so the hot path (a request served
//! from the calling stream's own list, and a free back onto it) locks that shard only. The
//! device-wide lock (`Global`: `reserved`, releases and host waits in flight, room made,
//! backend counters) is taken on a miss, for a reservation and at the limit. `allocated`
//! and its peak are atomics (exact, and lock-free). Lock order: device-wide, then one shard
//! at a time; a shard lock is never held while taking the device-wide lock or another
//! shard. Locks are held for list operations, event queries and event records only, never
//! across a host wait or a backend memory call. Requesters that wait for operations in
//! flight wait on a condition variable of the device-wide lock.

mod shard;
pub mod size_class;

pub use size_class::size_class;

use self::shard::{FreeBlock, Padded, ShardLock, ShardStats};
use crate::backend::{BackendEvent, BackendMemory, BackendStream, DevicePtr};
use crate::sync::{Arc, AtomicUsize, Condvar, Mutex, Ordering};
use crate::{Error, Result};

/// A live block handed out by the allocator.
#[derive(Debug)]
pub(crate) struct Block {
    pub(crate) ptr: DevicePtr,
    /// Size class of the block (what it really occupies).
    pub(crate) size: usize,
    /// Pool slot of the stream it was allocated on.
    pub(crate) stream: usize,
}

/// The guards of one freed block: one per stream that used it, almost always one (inline, so
/// an eager free allocates no list).
pub(crate) type Guards = smallvec::SmallVec<[Guard; 1]>;

/// "Stream `stream` used the block up to `event`" (a lazy guard, with no event yet, is a
/// flag of the cached block: see `shard::FreeBlock::lazy`).
pub(crate) struct Guard {
    pub(crate) stream: usize,
    pub(crate) event: Arc<dyn BackendEvent>,
}

impl Guard {
    /// Whether the guarded work is known to be done.
    fn done(&self) -> bool {
        self.event.query()
    }
}

/// Allocator statistics (bytes are size-class bytes). Each counter is exact; a snapshot taken
/// while other threads allocate reads the counters one after another, not at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Bytes in live blocks.
    pub allocated: usize,
    /// Bytes held from the backend (live + cached).
    pub reserved: usize,
    /// Highest `allocated` seen.
    pub peak_allocated: usize,
    /// Highest `reserved` seen.
    pub peak_reserved: usize,
    /// Allocation requests.
    pub allocs: u64,
    /// Requests served from the cache.
    pub cache_hits: u64,
    /// Cache hits that took a block from another stream's list.
    pub cross_stream_reuses: u64,
    /// Reuses that made the requesting stream wait on a pending event (memory pressure).
    pub event_gated_reuses: u64,
    /// Blocks obtained from the backend.
    pub backend_allocs: u64,
    /// Blocks returned to the backend.
    pub backend_frees: u64,
    /// Events the allocator recorded to resolve lazy guards (one covers a whole stream).
    pub guard_resolutions: u64,
}

/// The device-wide part: what a reservation, a release or a failing requester must see whole.
struct Global {
    /// Releases and host waits in progress outside the lock (see the module doc): while
    /// non-zero, a requester at the limit waits instead of failing.
    in_flight: usize,
    /// Bumped whenever `reserved` goes down (a release or a failed reservation is
    /// accounted): a requester that failed to find room retries if it changed meanwhile.
    room_made: u64,
    reserved: usize,
    peak_reserved: usize,
    backend_allocs: u64,
    backend_frees: u64,
}

/// The per-device caching allocator. See the module documentation for the reuse rules.
pub(crate) struct CachingAllocator {
    memory: Arc<dyn BackendMemory>,
    device_name: String,
    limit: Option<usize>,
    /// One per stream slot: the hot path's only lock.
    shards: Vec<ShardLock>,
    /// Taken before any shard lock, never while one is held.
    global: Mutex<Global>,
    /// Notified (under `global`) whenever an operation in flight ends.
    settled: Condvar,
    /// Bytes in live blocks. Relaxed: a statistic; no memory is published through it.
    allocated: Padded<AtomicUsize>,
    /// Highest `allocated` seen; read before it is raised, so in steady state (no new peak)
    /// threads only read its cache line.
    peak_allocated: Padded<AtomicUsize>,
}

thread_local! {
    /// Bytes the calling thread took from every device's allocator less the bytes it gave
    /// back (see [`thread_net_allocated`]). A plain cell: only its own thread touches it.
    static THREAD_NET: std::cell::Cell<i64> = const { std::cell::Cell::new(0) };
}

/// Bytes the calling thread has allocated less the bytes it has freed, over every device's
/// caching allocator since the thread started (negative when it freed memory others
/// allocated). The difference across a piece of work on one thread is what that work
/// left allocated, whatever other threads allocate meanwhile: how a model loader measures
/// the memory a model holds while other models serve.
///
/// ```
/// use streampool::{allocator::thread_net_allocated, Device, Tensor};
/// let before = thread_net_allocated();
/// let t = Tensor::zeros(&[1024], &Device::cpu()).unwrap();
/// assert!(thread_net_allocated() - before >= 4096);
/// drop(t);
/// ```
pub fn thread_net_allocated() -> i64 {
    THREAD_NET.with(std::cell::Cell::get)
}

impl CachingAllocator {
    pub(crate) fn new(
        memory: Arc<dyn BackendMemory>,
        device_name: String,
        streams: usize,
        limit: Option<usize>,
    ) -> Self {
        Self {
            memory,
            device_name,
            limit,
            shards: (0..streams.max(1))
                .map(|_| Padded(Mutex::new(shard::Shard::default())))
                .collect(),
            global: Mutex::new(Global {
                in_flight: 0,
                room_made: 0,
                reserved: 0,
                peak_reserved: 0,
                backend_allocs: 0,
                backend_frees: 0,
            }),
            settled: Condvar::new(),
            allocated: Padded(AtomicUsize::new(0)),
            peak_allocated: Padded(AtomicUsize::new(0)),
        }
    }

    /// The shard of stream slot `s` (slots past the pool share the last one, as before).
    fn shard(&self, s: usize) -> &Mutex<shard::Shard> {
        &self.shards[s.min(self.shards.len() - 1)].0
    }

    fn note_alloc(&self, size: usize) {
        THREAD_NET.with(|n| n.set(n.get() + size as i64));
        let now = self.allocated.0.fetch_add(size, Ordering::Relaxed) + size;
        if now > self.peak_allocated.0.load(Ordering::Relaxed) {
            self.peak_allocated.0.fetch_max(now, Ordering::Relaxed);
        }
    }

    fn note_free(&self, size: usize) {
        THREAD_NET.with(|n| n.set(n.get() - size as i64));
        self.allocated.0.fetch_sub(size, Ordering::Relaxed);
    }

    /// Allocates at least `bytes` for use on pool slot `s`, whose stream is `stream`.
    pub(crate) fn alloc(
        &self,
        bytes: usize,
        s: usize,
        stream: &dyn BackendStream,
    ) -> Result<Block> {
        let size = size_class(bytes);
        let block = |ptr| Block {
            ptr,
            size,
            stream: s,
        };
        // The hot path: step 1 on this stream's own list, under its shard's lock only.
        {
            // Lock: this stream's shard alone (lock order: nothing else is held).
            let mut sh = self.shard(s).lock();
            sh.stats.allocs += 1;
            if self.limit.is_some_and(|l| size > l) {
                // Can never fit: fail before releasing the cache or waiting on anyone's
                // events, so one oversized request does not slow or starve other threads.
                drop(sh);
                return Err(self.out_of_memory(bytes, &self.global.lock()));
            }
            if let Some(ptr) = sh.take(size, s, s) {
                sh.stats.cache_hits += 1;
                drop(sh);
                self.note_alloc(size);
                return Ok(block(ptr));
            }
        }
        loop {
            // This pass's own failed reservations also count as "room made" (for others);
            // step 5 must not mistake them for room made by someone else, or a request the
            // backend itself refuses would retry for ever.
            let mut own = 0u64;
            // Step 5 compares against this: room made after it is seen by this pass.
            let room_seen = self.global.lock().room_made;
            if let Some(ptr) = self.take_ready(s, size) {
                self.note_alloc(size);
                return Ok(block(ptr));
            }
            if let Some(ptr) = self.reserve(size, &mut own)? {
                return Ok(block(ptr));
            }
            if let Some(ptr) = self.at_limit(size, s, stream, &mut own)? {
                return Ok(block(ptr));
            }
            // Step 5: fail only if nothing can make room any more.
            let mut g = self.global.lock();
            loop {
                if g.room_made != room_seen + own {
                    break; // a release was accounted since this pass began: try again
                }
                if g.in_flight == 0 {
                    return Err(self.out_of_memory(bytes, &g));
                }
                // Releases the lock while waiting; this thread has nothing in flight itself,
                // so whoever does will end it and notify.
                g = self.settled.wait(g);
            }
        }
    }

    /// Steps 1 and 2 of the module doc: a block of class `size` ready for stream `s` now,
    /// from its own list first, then from the others'. A shard holding a lazily freed block
    /// of this class gets its guards resolved into one event and is looked at again (its
    /// stream may well be idle already). Counts the hit in the shard it came from.
    fn take_ready(&self, s: usize, size: usize) -> Option<DevicePtr> {
        let n = self.shards.len();
        let own = s.min(n - 1);
        for owner in std::iter::once(own).chain((0..n).filter(|&o| o != own)) {
            // Lock: one shard at a time, nothing else held.
            let mut sh = self.shard(owner).lock();
            let mut found = sh.take(size, s, owner);
            if found.is_none() && owner != own && sh.lazy_of(size) {
                sh.resolve(owner);
                found = sh.take(size, s, owner);
            }
            if let Some(ptr) = found {
                sh.stats.cache_hits += 1;
                sh.stats.cross_stream_reuses += (owner != own) as u64;
                return Some(ptr);
            }
        }
        None
    }

    /// Resolves every shard's lazy guards and takes out every cached block whose guards have
    /// all completed. The caller holds the device-wide lock (lock order: then each shard).
    fn drain_idle(&self) -> Vec<(DevicePtr, usize)> {
        let mut out = Vec::new();
        for (owner, shard) in self.shards.iter().enumerate() {
            let mut sh = shard.0.lock();
            sh.resolve(owner);
            sh.drain_idle(&mut out);
        }
        out
    }

    /// Step 4 of the module doc, after a reservation failed at the limit: `Ok(None)` if
    /// this pass found no memory.
    fn at_limit(
        &self,
        size: usize,
        s: usize,
        stream: &dyn BackendStream,
        own: &mut u64,
    ) -> Result<Option<DevicePtr>> {
        // Release what is idle, then try again.
        self.release(|_| self.drain_idle());
        if let Some(ptr) = self.reserve(size, own)? {
            return Ok(Some(ptr));
        }
        // Reuse a same-size block still in use elsewhere, ordered by a device-side wait.
        let own_shard = s.min(self.shards.len() - 1);
        let pending = self.shards.iter().enumerate().find_map(|(owner, shard)| {
            // Lock: one shard at a time, nothing else held.
            let mut sh = shard.0.lock();
            if owner != own_shard && sh.lazy_of(size) {
                // Freed lazily since the drain above (loom found this race): give it an
                // event to wait on.
                sh.resolve(owner);
            }
            let b = sh.take_any(size)?;
            sh.stats.cache_hits += 1;
            sh.stats.event_gated_reuses += 1;
            Some((owner, b))
        });
        if let Some((owner, block)) = pending {
            self.note_alloc(size);
            // Every lazy guard of another stream was resolved above; one whose record failed
            // is still lazy, and no wait can cover it, so that counts as a failed wait.
            let lazy_left = block.lazy && owner != own_shard;
            let waited = if lazy_left {
                Err(Error::Backend {
                    device: self.device_name.clone(),
                    msg: "could not record an event to reuse a block from another stream".into(),
                })
            } else {
                block
                    .guards
                    .iter()
                    .filter(|g| g.stream != s)
                    .try_for_each(|g| stream.wait(&g.event))
            };
            if let Err(e) = waited {
                // Its users may still be running: back to its list with every guard, never
                // as an idle block.
                self.note_free(size);
                let mut sh = self.shard(owner).lock();
                sh.stats.cache_hits -= 1;
                sh.stats.event_gated_reuses -= 1;
                sh.push(block);
                return Err(e);
            }
            return Ok(Some(block.ptr));
        }
        // Last resort: wait on the host until every cached block is idle, then release the
        // idle ones. The blocks stay on their lists meanwhile, so other threads can still
        // reuse them (taking them out would make concurrent requests fail for no reason),
        // and the wait counts as in flight, so other requesters at the limit wait for it.
        let pending_events: Vec<Arc<dyn BackendEvent>> = {
            let mut g = self.global.lock();
            let mut events = Vec::new();
            for shard in &self.shards {
                // Lock order: device-wide, then this shard.
                let sh = shard.0.lock();
                events.extend(
                    sh.blocks()
                        .flat_map(|b| b.guards.iter())
                        .filter(|g| !g.done())
                        .map(|g| g.event.clone()),
                );
            }
            if !events.is_empty() {
                g.in_flight += 1;
            }
            events
        };
        let waiting = !pending_events.is_empty();
        // No lock held here: host waits happen outside the allocator's locks.
        let waited = pending_events.iter().try_for_each(|e| e.synchronize());
        // Drain even when there was nothing to wait for: a guard may have completed since
        // the drain above, and its block is then idle on a list. The wait ends in the same
        // critical section that takes what is idle off the lists (and counts that release in
        // flight): no moment between the two where a block is neither cached nor counted.
        self.release(|g| {
            if waiting {
                self.end_op(g);
            }
            if waited.is_ok() {
                self.drain_idle()
            } else {
                Vec::new()
            }
        });
        waited?;
        self.reserve(size, own)
    }

    /// Ends an operation counted in `in_flight` and wakes requesters waiting for it.
    fn end_op(&self, g: &mut Global) {
        g.in_flight -= 1;
        self.settled.notify_all();
    }

    fn out_of_memory(&self, requested: usize, g: &Global) -> Error {
        Error::OutOfMemory {
            device: self.device_name.clone(),
            requested,
            allocated: self.allocated.0.load(Ordering::Relaxed),
            reserved: g.reserved,
            limit: self.limit,
        }
    }

    /// Reserves a new block from the backend if the limit allows; `Ok(None)` at the limit.
    /// A backend refusal un-counts the reservation and counts as room made for others; it is
    /// also added to `own`, so the caller does not take its own refusal for someone's release.
    fn reserve(&self, size: usize, own: &mut u64) -> Result<Option<DevicePtr>> {
        {
            let mut g = self.global.lock();
            if self.limit.is_some_and(|l| g.reserved + size > l) {
                return Ok(None);
            }
            // Count it before the (possibly slow) backend call so concurrent requests
            // cannot overshoot the limit together; undone below on failure.
            g.reserved += size;
            g.backend_allocs += 1;
            g.peak_reserved = g.peak_reserved.max(g.reserved);
        }
        self.note_alloc(size);
        match self.memory.alloc(size) {
            Ok(ptr) => Ok(Some(ptr)),
            Err(e) => {
                self.note_free(size);
                let mut g = self.global.lock();
                g.reserved -= size;
                g.backend_allocs -= 1;
                // Room appeared: a requester that found none meanwhile tries again.
                g.room_made += 1;
                *own += 1;
                self.settled.notify_all();
                drop(g);
                // The backend itself is out of memory: treat it like reaching the limit.
                if matches!(e, Error::OutOfMemory { .. }) {
                    Ok(None)
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Takes blocks out with `pick` (under the device-wide lock) and returns them to the
    /// backend. From the moment they leave the lists until `reserved` no longer counts them,
    /// the release is counted in `in_flight` (see the module doc).
    fn release(&self, pick: impl FnOnce(&mut Global) -> Vec<(DevicePtr, usize)>) {
        let blocks = {
            let mut g = self.global.lock();
            let blocks = pick(&mut g);
            if blocks.is_empty() {
                return;
            }
            g.in_flight += 1;
            blocks
        };
        for &(ptr, size) in &blocks {
            // SAFETY: each block came from `self.memory.alloc(size)` and every guard on it has
            // completed (or been synchronized), so no stream touches it any more.
            unsafe { self.memory.free(ptr, size) };
        }
        let mut g = self.global.lock();
        for (_, size) in blocks {
            g.reserved -= size;
            g.backend_frees += 1;
        }
        g.room_made += 1;
        self.end_op(&mut g);
    }

    /// Returns a block used only by its own allocation stream, with a lazy guard: no event
    /// now; one is recorded only if another stream comes to need the block. `stream` gives
    /// that stream's handle; it is called only on the slot's first lazy free (the shard keeps
    /// the handle), so the per-op path does not look the stream up. Fails only if `stream`
    /// does; the block is then not cached (the caller leaks it).
    pub(crate) fn free_lazy(
        &self,
        block: Block,
        stream: impl FnOnce() -> Result<Arc<dyn BackendStream>>,
    ) -> Result<()> {
        let shard = self.shard(block.stream);
        // Lock: this block's shard alone.
        let mut sh = shard.lock();
        if sh.stream.is_none() {
            // Looked up outside the shard's lock (the pool may create the stream).
            drop(sh);
            let handle = stream()?;
            sh = shard.lock();
            sh.stream.get_or_insert(handle);
        }
        sh.push(FreeBlock {
            ptr: block.ptr,
            size: block.size,
            lazy: true,
            guards: Guards::new(),
        });
        drop(sh);
        self.note_free(block.size);
        Ok(())
    }

    /// Returns `block` to the cache. `guards` holds an event recorded, at the time of the
    /// free, on every stream that used the block (see [`Self::free_lazy`] for the lazy way).
    pub(crate) fn free(&self, block: Block, guards: Guards) {
        // Lock: this block's shard alone.
        self.shard(block.stream).lock().push(FreeBlock {
            ptr: block.ptr,
            size: block.size,
            lazy: false,
            guards,
        });
        self.note_free(block.size);
    }

    /// Returns every cached block whose guards have completed to the backend.
    pub(crate) fn empty_cache(&self) {
        self.release(|_| self.drain_idle());
    }

    /// A snapshot of the statistics.
    pub(crate) fn stats(&self) -> AllocatorStats {
        let g = self.global.lock();
        let mut sum = ShardStats::default();
        for shard in &self.shards {
            // Lock order: device-wide, then this shard.
            let st = shard.0.lock().stats;
            sum.allocs += st.allocs;
            sum.cache_hits += st.cache_hits;
            sum.cross_stream_reuses += st.cross_stream_reuses;
            sum.event_gated_reuses += st.event_gated_reuses;
            sum.guard_resolutions += st.guard_resolutions;
        }
        AllocatorStats {
            allocated: self.allocated.0.load(Ordering::Relaxed),
            reserved: g.reserved,
            peak_allocated: self.peak_allocated.0.load(Ordering::Relaxed),
            peak_reserved: g.peak_reserved,
            allocs: sum.allocs,
            cache_hits: sum.cache_hits,
            cross_stream_reuses: sum.cross_stream_reuses,
            event_gated_reuses: sum.event_gated_reuses,
            backend_allocs: g.backend_allocs,
            backend_frees: g.backend_frees,
            guard_resolutions: sum.guard_resolutions,
        }
    }
}

impl Drop for CachingAllocator {
    fn drop(&mut self) {
        // The device's stream pool is dropped before its allocator (field order in
        // `DeviceInner`) and dropping a stream finishes its queued work, so every guard is
        // done by now, lazy ones included; a pending event would be a bug: leak, not free.
        for shard in &self.shards {
            for b in shard.0.lock().take_all() {
                if b.guards.iter().all(|g| g.done()) {
                    // SAFETY: came from `alloc(size)`; no stream uses it (all guards done).
                    unsafe { self.memory.free(b.ptr, b.size) };
                }
            }
        }
    }
}
