//! Storage: a block of device memory plus the tracking that makes cross-stream use safe.
//!
//! Tensors are immutable: a storage is written once, by the op that created it, on one
//! stream (the *writer*). Every stream that uses it is remembered. Using it on another stream
//! first makes that stream wait on the writer's event (skipped once the write is known done);
//! dropping the storage hands the allocator one guard per stream that used it, so the block
//! is reused on another stream only after all of them have passed. Users never call
//! `record_stream`.
//!
//! The per-op path is lock-free in the common cases: uses of slots below 64 are bits of an
//! atomic mask, and a write known to be complete is a flag.

use std::sync::OnceLock;

use smallvec::SmallVec;

use crate::allocator::{Block, Guard, Guards};
use crate::backend::{BackendEvent, DevicePtr};
use crate::kernel::PackSlot;
use crate::sync::{Arc, AtomicBool, AtomicU64, Mutex, Ordering};
use crate::{Device, Result, Stream};

/// Slots tracked in the atomic use mask; larger pools spill into `Track::more_uses`.
const MASK_SLOTS: usize = 64;

#[derive(Default)]
struct Track {
    /// The writer's event; recorded eagerly (see `EventPolicy`), else on first foreign use.
    write_event: Option<Arc<dyn BackendEvent>>,
    /// Uses of slots `>= MASK_SLOTS`.
    more_uses: Vec<usize>,
}

pub(crate) struct Storage {
    device: Device,
    block: Option<Block>,
    writer: usize,
    /// Bit `s` set: stream slot `s` used the storage. Relaxed suffices: it is read only in
    /// `drop`, which the last `Arc<Storage>` release orders after every use.
    uses: AtomicU64,
    /// The write has been observed complete: later foreign uses need no event at all.
    write_done: AtomicBool,
    /// Held to record or fetch the lazy write event and for slots past the mask; briefly.
    track: Mutex<Track>,
    /// The block belongs to a graph's pool (`crate::graph`): the graph gives it back, not us.
    graph_owned: bool,
    /// A backend's packed copy of the contents, made on first use as a matmul weight
    /// ([`PackSlot`]); empty for every other storage (no allocation until asked).
    pack: OnceLock<PackSlot>,
}

impl Storage {
    /// A storage whose contents are produced by work just queued on `writer`.
    pub(crate) fn new(
        device: Device,
        block: Block,
        writer: &Stream,
        write_event: Option<Arc<dyn BackendEvent>>,
    ) -> Self {
        let storage = Self {
            device,
            block: Some(block),
            writer: writer.index(),
            uses: AtomicU64::new(0),
            write_done: AtomicBool::new(false),
            track: Mutex::new(Track {
                write_event,
                more_uses: Vec::new(),
            }),
            graph_owned: false,
            pack: OnceLock::new(),
        };
        storage.note_use(writer.index());
        storage
    }

    /// Sets the write event once the producing work has been queued (eager-event policy).
    pub(crate) fn with_write_event(mut self, event: Arc<dyn BackendEvent>) -> Self {
        // Not shared yet (we own it): no lock.
        self.track.get_mut().write_event = Some(event);
        self
    }

    /// Marks the block as graph-pool memory: dropping the storage leaves it to the graph.
    pub(crate) fn graph_owned(mut self) -> Self {
        self.graph_owned = true;
        self
    }

    /// The slot where a backend may keep these contents packed as a matmul operand; `None`
    /// for a graph pool's block, which every replay writes again (all other storages are
    /// written once, by the op that made them, so a packed copy never goes stale).
    pub(crate) fn pack_slot(&self) -> Option<PackSlot> {
        (!self.graph_owned).then(|| self.pack.get_or_init(PackSlot::default).clone())
    }

    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    pub(crate) fn ptr(&self) -> DevicePtr {
        // `block` is only taken in `drop`.
        self.block.as_ref().map(|b| b.ptr).unwrap_or(DevicePtr(0))
    }

    fn note_use(&self, s: usize) {
        if s < MASK_SLOTS {
            let bit = 1u64 << s;
            if self.uses.load(Ordering::Relaxed) & bit == 0 {
                self.uses.fetch_or(bit, Ordering::Relaxed);
            }
        } else {
            let mut t = self.track.lock();
            if !t.more_uses.contains(&s) {
                t.more_uses.push(s);
            }
        }
    }

    /// Prepares a use on `stream`: notes it and, if the storage was written on another stream
    /// and the write is not known to be done, makes `stream` wait for it.
    pub(crate) fn prepare_use(&self, stream: &Stream) -> Result<()> {
        let s = stream.index();
        self.note_use(s);
        // Acquire pairs with the Release below: whoever saw the write complete published it.
        if self.writer == s || self.write_done.load(Ordering::Acquire) {
            return Ok(());
        }
        let event = {
            let mut t = self.track.lock();
            match &t.write_event {
                Some(e) => e.clone(),
                None => {
                    let e = self.device.pool().get(self.writer)?.record(false)?;
                    t.write_event = Some(e.clone());
                    e
                }
            }
        };
        if event.query() {
            self.write_done.store(true, Ordering::Release);
        } else {
            stream.inner.wait(&event)?;
        }
        Ok(())
    }

    /// Slots of every stream that used the storage.
    fn used_slots(&mut self) -> SmallVec<[usize; 4]> {
        let mask = self.uses.load(Ordering::Relaxed);
        let mut slots: SmallVec<[usize; 4]> = (0..MASK_SLOTS)
            .filter(|&s| mask & (1u64 << s) != 0)
            .collect();
        slots.extend(std::mem::take(&mut self.track.get_mut().more_uses));
        slots
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        let Some(block) = self.block.take() else {
            return;
        };
        if self.graph_owned {
            return; // the graph's pool holds the block until the graph is dropped
        }
        // The common case, checked without building the list of users (a heap allocation
        // per freed tensor): used by its own stream only. No lock: `&mut self` means we are
        // the last owner.
        let own_only = block.stream < MASK_SLOTS
            && self.uses.load(Ordering::Relaxed) == 1u64 << block.stream
            && self.track.get_mut().more_uses.is_empty();
        if !self.device.eager_events() && own_only {
            // Used only on its own stream: no event now (see `CachingAllocator::free_lazy`).
            let (slot, size) = (block.stream, block.size);
            let pool = self.device.pool();
            if let Err(e) = self.device.allocator().free_lazy(block, || pool.get(slot)) {
                tracing::error!(error = %e, "lost a stream; leaking {size} bytes");
            }
            return;
        }
        // Own stream only, eager events: one guard, without building the list of users.
        let uses = if own_only {
            SmallVec::from_elem(block.stream, 1)
        } else {
            self.used_slots()
        };
        let pool = self.device.pool();
        let mut guards = Guards::with_capacity(uses.len());
        for s in uses {
            match pool.get(s).and_then(|st| st.record(false)) {
                Ok(event) => guards.push(Guard { stream: s, event }),
                Err(e) => {
                    // Without an event we cannot prove the block idle: leak it rather than risk reuse.
                    tracing::error!(error = %e, "could not record a free event; leaking {} bytes", block.size);
                    return;
                }
            }
        }
        self.device.allocator().free(block, guards);
    }
}
