//! One stream slot's share of the caching allocator: its free lists, its lazy guards and its
//! counters, behind a lock of its own.
//!
//! A thread allocates and frees on its own stream almost always, so in steady state only
//! that stream's shard is locked, by the threads that share the stream (one, or two when 64
//! threads share 31 pooled streams). Other threads touch it only when their own lists miss
//! (cross-stream reuse) or when memory is short (releases, host waits); see the module doc
//! of [`super`] for the rules and the lock order.

use super::size_class::class_index;
use super::{Guard, Guards};
use crate::backend::{BackendStream, DevicePtr};
use crate::sync::{Arc, Mutex};

/// A cached block.
pub(super) struct FreeBlock {
    pub(super) ptr: DevicePtr,
    pub(super) size: usize,
    /// A lazy guard on the shard's own stream: "that stream used the block up to the free",
    /// with no event yet ([`Shard::resolve`] turns it into one). Kept as a flag, not a
    /// [`Guard`], so a lazy free allocates nothing.
    pub(super) lazy: bool,
    /// An event, recorded at the free, on every stream that used the block.
    pub(super) guards: Guards,
}

impl FreeBlock {
    /// Whether stream `s` may use the block now without waiting; the block is on the list of
    /// stream `owner`. Completed guards of other streams are dropped. Guards on `s` itself
    /// are not queried: stream order covers them, and on CUDA each query is a driver call
    /// made under a lock (the GPU profile showed alloc+free ops scaling negatively with
    /// threads while they were).
    fn ready_for(&mut self, s: usize, owner: usize) -> bool {
        if self.lazy && s != owner {
            return false;
        }
        if self.guards.iter().all(|g| g.stream == s) {
            return true; // the own-stream case: no query, no list edit
        }
        self.guards.retain(|g| g.stream == s || !g.done());
        self.guards.iter().all(|g| g.stream == s)
    }

    /// Whether no stream uses the block any more (a lazy guard is never known done).
    fn idle(&mut self) -> bool {
        self.guards.retain(|g| !g.done());
        !self.lazy && self.guards.is_empty()
    }
}

/// Counters a shard keeps under its own lock; [`super::CachingAllocator::stats`] sums them.
#[derive(Default, Clone, Copy)]
pub(super) struct ShardStats {
    pub(super) allocs: u64,
    pub(super) cache_hits: u64,
    pub(super) cross_stream_reuses: u64,
    pub(super) event_gated_reuses: u64,
    pub(super) guard_resolutions: u64,
}

/// The free lists and lazy state of one stream slot.
#[derive(Default)]
pub(super) struct Shard {
    /// `free[class_index(size)]`: blocks cached on this stream's list.
    free: Vec<Vec<FreeBlock>>,
    /// This slot's stream, kept from its first lazy free on (a slot's stream never changes),
    /// to record the event that resolves lazy guards.
    pub(super) stream: Option<Arc<dyn BackendStream>>,
    /// Some block here has a lazy guard.
    lazy: bool,
    pub(super) stats: ShardStats,
}

impl Shard {
    /// Takes the newest block of class `size` that stream `s` may use now; the shard is
    /// stream `owner`'s.
    pub(super) fn take(&mut self, size: usize, s: usize, owner: usize) -> Option<DevicePtr> {
        let list = self.free.get_mut(class_index(size))?;
        // Newest first: the most recently freed block is the likeliest to be ready.
        let i = list.iter_mut().rposition(|b| b.ready_for(s, owner))?;
        Some(list.swap_remove(i).ptr)
    }

    /// Takes the newest block of class `size` whatever its guards (for an event-gated reuse).
    pub(super) fn take_any(&mut self, size: usize) -> Option<FreeBlock> {
        self.free.get_mut(class_index(size))?.pop()
    }

    /// Whether a block of class `size` is cached here with a lazy guard still unresolved.
    pub(super) fn lazy_of(&self, size: usize) -> bool {
        self.lazy
            && self
                .free
                .get(class_index(size))
                .is_some_and(|l| l.iter().any(|b| b.lazy))
    }

    pub(super) fn push(&mut self, block: FreeBlock) {
        self.lazy |= block.lazy;
        let i = class_index(block.size);
        if self.free.len() <= i {
            self.free.resize_with(i + 1, Vec::new);
        }
        self.free[i].push(block);
    }

    /// Records one event on this shard's stream (`owner`) and gives it to every lazily freed
    /// block here. A failed record leaves the guards lazy (the blocks stay reusable on their
    /// own stream only). Holding the shard's lock makes this exact: every lazy free on the
    /// list happened before the event was recorded.
    pub(super) fn resolve(&mut self, owner: usize) {
        if !self.lazy {
            return;
        }
        let Some(stream) = &self.stream else {
            return; // unreachable: a lazy free sets the stream first
        };
        let event = match stream.record(false) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, stream = owner, "could not resolve lazy free guards");
                return;
            }
        };
        self.stats.guard_resolutions += 1;
        self.lazy = false;
        for b in self.free.iter_mut().flatten().filter(|b| b.lazy) {
            b.lazy = false;
            b.guards.push(Guard {
                stream: owner,
                event: event.clone(),
            });
        }
    }

    /// Takes out every block whose guards have all completed, as `(ptr, size)`.
    pub(super) fn drain_idle(&mut self, out: &mut Vec<(DevicePtr, usize)>) {
        for list in &mut self.free {
            let mut i = 0;
            while i < list.len() {
                if list[i].idle() {
                    let b = list.swap_remove(i);
                    out.push((b.ptr, b.size));
                } else {
                    i += 1;
                }
            }
        }
    }

    /// Every cached block, for the pending-event scan and the final release.
    pub(super) fn blocks(&self) -> impl Iterator<Item = &FreeBlock> {
        self.free.iter().flatten()
    }

    /// Takes every cached block out (the allocator is being dropped).
    pub(super) fn take_all(&mut self) -> Vec<FreeBlock> {
        self.free.drain(..).flatten().collect()
    }
}

/// A lock on its own cache line (two, for adjacent-line prefetch), so that threads working on
/// neighbouring shards do not slow each other down through false sharing.
#[repr(align(128))]
pub(super) struct Padded<T>(pub(super) T);

/// A shard behind its lock.
pub(super) type ShardLock = Padded<Mutex<Shard>>;
