//! The caching allocator: size classes, per-stream free lists, event-gated cross-stream reuse.
//!
//! A block freed by a tensor is not returned to the backend; it goes onto the free list of
//! the stream it was allocated on, together with one *guard* event for every stream that
//! used it, recorded at the moment of the free. A later request on stream `s` may take it:
//!
//! 1. from `s`'s own list once its guards on *other* streams have completed (work on `s`
//!    itself is ordered by the stream, so needs no check) — the common, sync-free path;
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
//! **Where a cached block is.** At every moment, under the mutex, each byte of `reserved`
//! is in a live block (`allocated`), on a free list, or in a release in flight: a release
//! takes its blocks off the lists and counts itself in `State::in_flight` in one critical
//! section, and takes `reserved` down and itself out of `in_flight` in another, after the
//! backend has the memory back. A host wait counts itself in `in_flight` while its events
//! are collected and hands over to the release of what it found idle in one critical
//! section. So a requester that sees no room and nothing in flight knows no room is about
//! to appear; one that sees something in flight waits for it instead of failing. (Before
//! this, a block taken off its list to be released was invisible to a second requester
//! until the release was accounted, and that requester failed at the limit: issue #13.)
//!
//! **Lazy guards.** Where events cost a driver call (CUDA), a block used by one stream only
//! is freed with a *lazy* guard: no event, just "stream `t` used it up to now". Its own
//! stream reuses it at once (stream order covers it), so a thread running on its own stream
//! records no event at all in steady state. When another stream needs memory and finds
//! nothing ready, the allocator *resolves* lazy guards: one event per stream covers all of
//! that stream's lazily freed blocks. (The profile of the first H100 runs showed one event
//! per freed block was what stopped per-thread throughput from scaling.)
//!
//! One mutex guards the lists and statistics; it is held for list operations and event
//! queries only, never across a host wait on an event or a backend call. Requesters that
//! wait for operations in flight wait on a condition variable of that mutex.

pub mod size_class;

use std::collections::HashMap;

pub use size_class::size_class;

use crate::backend::{BackendEvent, BackendMemory, BackendStream, DevicePtr};
use crate::sync::{Arc, Condvar, Mutex};
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

/// "Stream `stream` used the block up to `event`"; `event: None` is a lazy guard ("up to the
/// time of the free"), turned into an event by [`State::resolve`] before another stream may
/// use the block.
pub(crate) struct Guard {
    pub(crate) stream: usize,
    pub(crate) event: Option<Arc<dyn BackendEvent>>,
}

impl Guard {
    /// Whether the guarded work is known to be done (a lazy guard never is).
    fn done(&self) -> bool {
        self.event.as_ref().is_some_and(|e| e.query())
    }
}

struct FreeBlock {
    ptr: DevicePtr,
    guards: Vec<Guard>,
}

impl FreeBlock {
    /// Whether stream `s` may use the block now without waiting. Completed guards of other
    /// streams are dropped. Guards on `s` itself are not queried: stream order covers them,
    /// and on CUDA each query is a driver call made under the allocator's mutex (the GPU
    /// profile showed alloc+free ops scaling negatively with threads while it was).
    fn ready_for(&mut self, s: usize) -> bool {
        self.guards.retain(|g| g.stream == s || !g.done());
        self.guards.iter().all(|g| g.stream == s)
    }
}

/// Allocator statistics (bytes are size-class bytes).
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

struct State {
    /// `free[stream][size_class]`: cached blocks owned by each stream slot.
    free: Vec<HashMap<usize, Vec<FreeBlock>>>,
    /// Per stream slot: its handle (to record resolving events) while it has lazy guards.
    lazy: Vec<Option<Arc<dyn BackendStream>>>,
    /// Releases and host waits in progress outside the lock (see the module doc): while
    /// non-zero, a requester at the limit waits instead of failing.
    in_flight: usize,
    /// Bumped whenever `stats.reserved` goes down (a release or a failed reservation is
    /// accounted): a requester that failed to find room retries if it changed meanwhile.
    room_made: u64,
    stats: AllocatorStats,
}

impl State {
    fn note_alloc(&mut self, size: usize) {
        self.stats.allocated += size;
        self.stats.peak_allocated = self.stats.peak_allocated.max(self.stats.allocated);
    }
    fn note_reserve(&mut self, size: usize) {
        self.stats.reserved += size;
        self.stats.backend_allocs += 1;
        self.stats.peak_reserved = self.stats.peak_reserved.max(self.stats.reserved);
    }

    /// Step 1 and 2 of the module doc: a block ready for stream `s` without waiting.
    fn take_ready(&mut self, s: usize, size: usize) -> Option<(DevicePtr, bool)> {
        let n = self.free.len();
        for owner in std::iter::once(s).chain((0..n).filter(|&o| o != s)) {
            if let Some(list) = self.free[owner].get_mut(&size) {
                // Newest first: the most recently freed block is the likeliest to be ready.
                if let Some(i) = list.iter_mut().rposition(|b| b.ready_for(s)) {
                    return Some((list.swap_remove(i).ptr, owner != s));
                }
            }
        }
        None
    }

    /// Records one event on each stream (other than `except`) that has lazily freed blocks
    /// and gives it to all of them. A failed record leaves that stream's guards lazy (its
    /// blocks stay reusable on their own stream only).
    fn resolve(&mut self, except: Option<usize>) {
        for t in 0..self.lazy.len() {
            if Some(t) == except {
                continue;
            }
            let Some(stream) = self.lazy[t].take() else {
                continue;
            };
            let event = match stream.record(false) {
                Ok(e) => e,
                Err(e) => {
                    tracing::warn!(error = %e, stream = t, "could not resolve lazy free guards");
                    self.lazy[t] = Some(stream);
                    continue;
                }
            };
            self.stats.guard_resolutions += 1;
            for lists in &mut self.free {
                for b in lists.values_mut().flatten() {
                    for g in b
                        .guards
                        .iter_mut()
                        .filter(|g| g.stream == t && g.event.is_none())
                    {
                        g.event = Some(event.clone());
                    }
                }
            }
        }
    }

    fn has_lazy(&self, except: usize) -> bool {
        self.lazy
            .iter()
            .enumerate()
            .any(|(t, l)| t != except && l.is_some())
    }

    /// Removes every cached block whose guards have all completed.
    fn drain_completed(&mut self) -> Vec<(DevicePtr, usize)> {
        self.resolve(None);
        let mut out = Vec::new();
        for lists in &mut self.free {
            for (&size, list) in lists.iter_mut() {
                let mut i = 0;
                while i < list.len() {
                    list[i].guards.retain(|g| !g.done());
                    if list[i].guards.is_empty() {
                        out.push((list.swap_remove(i).ptr, size));
                    } else {
                        i += 1;
                    }
                }
            }
        }
        out
    }
}

/// The per-device caching allocator. See the module documentation for the reuse rules.
pub(crate) struct CachingAllocator {
    memory: Arc<dyn BackendMemory>,
    device_name: String,
    limit: Option<usize>,
    state: Mutex<State>,
    /// Notified (under `state`) whenever an operation in flight ends.
    settled: Condvar,
}

impl CachingAllocator {
    pub(crate) fn new(
        memory: Arc<dyn BackendMemory>,
        device_name: String,
        streams: usize,
        limit: Option<usize>,
    ) -> Self {
        let free = (0..streams).map(|_| HashMap::new()).collect();
        Self {
            memory,
            device_name,
            limit,
            state: Mutex::new(State {
                free,
                lazy: (0..streams).map(|_| None).collect(),
                in_flight: 0,
                room_made: 0,
                stats: AllocatorStats::default(),
            }),
            settled: Condvar::new(),
        }
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
        let mut first = true;
        loop {
            // This pass's own failed reservations also count as "room made" (for others);
            // step 5 must not mistake them for room made by someone else, or a request the
            // backend refuses would retry for ever.
            let mut own = 0u64;
            // Step 5 compares against this: room made after it is seen by this pass.
            let room_seen;
            {
                let mut st = self.state.lock();
                if first {
                    st.stats.allocs += 1;
                    if self.limit.is_some_and(|l| size > l) {
                        // Can never fit: fail before releasing the cache or waiting on
                        // anyone's events, so one oversized request does not slow or starve
                        // other threads.
                        return Err(self.out_of_memory(bytes, &st));
                    }
                    first = false;
                }
                room_seen = st.room_made;
                let mut found = st.take_ready(s, size);
                if found.is_none() && st.has_lazy(s) {
                    // Nothing ready: give other streams' lazily freed blocks their events;
                    // those streams may well be idle already, so try again.
                    st.resolve(Some(s));
                    found = st.take_ready(s, size);
                }
                if let Some((ptr, cross)) = found {
                    st.stats.cache_hits += 1;
                    st.stats.cross_stream_reuses += cross as u64;
                    st.note_alloc(size);
                    return Ok(block(ptr));
                }
            }
            if let Some(ptr) = self.reserve(size, &mut own)? {
                return Ok(block(ptr));
            }
            if let Some(ptr) = self.at_limit(size, s, stream, &mut own)? {
                return Ok(block(ptr));
            }
            // Step 5: fail only if nothing can make room any more.
            let mut st = self.state.lock();
            loop {
                if st.room_made != room_seen + own {
                    break; // a release was accounted since this pass began: try again
                }
                if st.in_flight == 0 {
                    return Err(self.out_of_memory(bytes, &st));
                }
                // Releases the lock while waiting; this thread has nothing in flight itself,
                // so whoever does will end it and notify.
                st = self.settled.wait(st);
            }
        }
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
        self.release(|st| st.drain_completed());
        if let Some(ptr) = self.reserve(size, own)? {
            return Ok(Some(ptr));
        }
        // Reuse a same-size block still in use elsewhere, ordered by a device-side wait.
        let pending = {
            let mut st = self.state.lock();
            let found = st.free.iter_mut().enumerate().find_map(|(owner, lists)| {
                lists
                    .get_mut(&size)
                    .and_then(|l| l.pop())
                    .map(|b| (owner, b))
            });
            if found.is_some() {
                st.stats.cache_hits += 1;
                st.stats.event_gated_reuses += 1;
                st.note_alloc(size);
            }
            found
        };
        if let Some((owner, block)) = pending {
            // `drain_completed` above resolved every lazy guard; one whose record failed
            // leaves `None` here, which no wait can cover, so that counts as a failed wait.
            for g in block.guards.iter().filter(|g| g.stream != s) {
                let waited = match &g.event {
                    Some(event) => stream.wait(event),
                    None => Err(Error::Backend {
                        device: self.device_name.clone(),
                        msg: "could not record an event to reuse a block from another stream"
                            .into(),
                    }),
                };
                if let Err(e) = waited {
                    // Its users may still be running: back to its list with every guard,
                    // never as an idle block.
                    let mut st = self.state.lock();
                    st.stats.allocated -= size;
                    st.stats.cache_hits -= 1;
                    st.stats.event_gated_reuses -= 1;
                    st.free[owner].entry(size).or_default().push(block);
                    return Err(e);
                }
            }
            return Ok(Some(block.ptr));
        }
        // Last resort: wait on the host until every cached block is idle, then release the
        // idle ones. The blocks stay on their lists meanwhile, so other threads can still
        // reuse them (taking them out would make concurrent requests fail for no reason),
        // and the wait counts as in flight, so other requesters at the limit wait for it.
        let pending_events: Vec<Arc<dyn BackendEvent>> = {
            let mut st = self.state.lock();
            let events: Vec<_> = st
                .free
                .iter()
                .flat_map(|lists| lists.values().flatten())
                .flat_map(|b| b.guards.iter())
                .filter(|g| !g.done())
                .filter_map(|g| g.event.clone())
                .collect();
            if !events.is_empty() {
                st.in_flight += 1;
            }
            events
        };
        let waiting = !pending_events.is_empty();
        // No lock held here: host waits happen outside the allocator mutex.
        let waited = pending_events.iter().try_for_each(|e| e.synchronize());
        // Drain even when there was nothing to wait for: a guard may have completed since
        // the drain above, and its block is then idle on a list. The wait ends in the same
        // critical section that takes what is idle off the lists (and counts that release in
        // flight): no moment between the two where a block is neither cached nor counted.
        self.release(|st| {
            if waiting {
                self.end_op(st);
            }
            if waited.is_ok() {
                st.drain_completed()
            } else {
                Vec::new()
            }
        });
        waited?;
        self.reserve(size, own)
    }

    /// Ends an operation counted in `in_flight` and wakes requesters waiting for it.
    fn end_op(&self, st: &mut State) {
        st.in_flight -= 1;
        self.settled.notify_all();
    }

    fn out_of_memory(&self, requested: usize, st: &State) -> Error {
        Error::OutOfMemory {
            device: self.device_name.clone(),
            requested,
            allocated: st.stats.allocated,
            reserved: st.stats.reserved,
            limit: self.limit,
        }
    }

    /// Reserves a new block from the backend if the limit allows; `Ok(None)` at the limit.
    /// A backend refusal un-counts the reservation and counts as room made for others; it is
    /// also added to `own`, so the caller does not take its own refusal for someone's release.
    fn reserve(&self, size: usize, own: &mut u64) -> Result<Option<DevicePtr>> {
        {
            let mut st = self.state.lock();
            if self.limit.is_some_and(|l| st.stats.reserved + size > l) {
                return Ok(None);
            }
            // Count it before the (possibly slow) backend call so concurrent requests
            // cannot overshoot the limit together; undone below on failure.
            st.note_reserve(size);
            st.note_alloc(size);
        }
        match self.memory.alloc(size) {
            Ok(ptr) => Ok(Some(ptr)),
            Err(e) => {
                let mut st = self.state.lock();
                st.stats.reserved -= size;
                st.stats.allocated -= size;
                st.stats.backend_allocs -= 1;
                // Room appeared: a requester that found none meanwhile tries again.
                st.room_made += 1;
                *own += 1;
                self.settled.notify_all();
                drop(st);
                // The backend itself is out of memory: treat it like reaching the limit.
                if matches!(e, Error::OutOfMemory { .. }) {
                    Ok(None)
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Takes blocks out with `pick` (under the lock) and returns them to the backend. From
    /// the moment they leave the lists until `reserved` no longer counts them, the release is
    /// counted in `in_flight` (see the module doc).
    fn release(&self, pick: impl FnOnce(&mut State) -> Vec<(DevicePtr, usize)>) {
        let blocks = {
            let mut st = self.state.lock();
            let blocks = pick(&mut st);
            if blocks.is_empty() {
                return;
            }
            st.in_flight += 1;
            blocks
        };
        for &(ptr, size) in &blocks {
            // SAFETY: each block came from `self.memory.alloc(size)` and every guard on it has
            // completed (or been synchronized), so no stream touches it any more.
            unsafe { self.memory.free(ptr, size) };
        }
        let mut st = self.state.lock();
        for (_, size) in blocks {
            st.stats.reserved -= size;
            st.stats.backend_frees += 1;
        }
        st.room_made += 1;
        self.end_op(&mut st);
    }

    /// Returns a block used only by its own allocation stream `stream`, with a lazy guard:
    /// no event now; one is recorded only if another stream comes to need the block.
    pub(crate) fn free_lazy(&self, block: Block, stream: Arc<dyn BackendStream>) {
        let slot = block.stream;
        let mut st = self.state.lock();
        if let Some(l) = st.lazy.get_mut(slot) {
            l.get_or_insert(stream);
        }
        drop(st);
        self.free(
            block,
            vec![Guard {
                stream: slot,
                event: None,
            }],
        );
    }

    /// Returns `block` to the cache. `guards` holds an event recorded, at the time of the
    /// free, on every stream that used the block (or lazy guards, see [`Self::free_lazy`]).
    pub(crate) fn free(&self, block: Block, guards: Vec<Guard>) {
        let mut st = self.state.lock();
        st.stats.allocated -= block.size;
        let slot = block.stream.min(st.free.len() - 1);
        st.free[slot]
            .entry(block.size)
            .or_default()
            .push(FreeBlock {
                ptr: block.ptr,
                guards,
            });
    }

    /// Returns every cached block whose guards have completed to the backend.
    pub(crate) fn empty_cache(&self) {
        self.release(|st| st.drain_completed());
    }

    /// A snapshot of the statistics.
    pub(crate) fn stats(&self) -> AllocatorStats {
        self.state.lock().stats.clone()
    }
}

impl Drop for CachingAllocator {
    fn drop(&mut self) {
        // The device's stream pool is dropped before its allocator (field order in
        // `DeviceInner`) and dropping a stream finishes its queued work, so every guard is
        // done by now, lazy ones included; a pending event would be a bug: leak, not free.
        let mut st = self.state.lock();
        for lists in st.free.drain(..) {
            for (size, list) in lists {
                for b in list {
                    if b.guards
                        .iter()
                        .all(|g| g.event.as_ref().is_none_or(|e| e.query()))
                    {
                        // SAFETY: came from `alloc(size)`; no stream uses it (all guards done).
                        unsafe { self.memory.free(b.ptr, size) };
                    }
                }
            }
        }
    }
}
