//! The memory a captured graph owns, and the hook through which ops allocate from it.
//!
//! A graph's kernels write the same addresses on every replay, so their memory cannot be the
//! caching allocator's to hand out while the graph lives. Before a capture, [`Pool::take`]
//! takes from the allocator one block per size the traced eager run allocated, in that order;
//! during the capture the thread's [`Hook`] makes every op's output ([`alloc`]) come from
//! those blocks instead of the allocator, and keeps alive every tensor an op reads
//! ([`note_inputs`]). When the graph goes, [`Pool::give_back`] returns the blocks with a lazy
//! guard on the graph's stream ([`hand_back`]). This file is the only part of the graph code
//! that speaks to the allocator: `alloc` and `free_lazy` of `CachingAllocator`, `Block` and
//! `size_class`.

use std::cell::RefCell;
use std::collections::VecDeque;

use crate::allocator::{size_class, Block};
use crate::backend::DevicePtr;
use crate::sync::Arc;
use crate::{Device, Error, Result, Stream, Tensor};

/// What a thread is doing for a graph while it runs a closure.
pub(super) enum Hook {
    /// Eager run: note the sizes allocated.
    Trace { device: u64, sizes: Vec<usize> },
    /// Capture: allocate from the pool (in traced order) and keep every input alive.
    Capture {
        device: u64,
        blocks: VecDeque<(DevicePtr, usize)>,
        keep: Vec<Tensor>,
    },
}

thread_local! {
    static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

/// Allocates an op output of `bytes` on `stream`: from the graph pool while this thread
/// captures a graph on `stream`'s device, else from the caching allocator. The flag says
/// whether the block belongs to a graph pool (its storage must not free it).
pub(crate) fn alloc(device: &Device, bytes: usize, stream: &Stream) -> Result<(Block, bool)> {
    let pooled = HOOK.with(|h| match &mut *h.borrow_mut() {
        Some(Hook::Trace { device: d, sizes }) if *d == device.id() => {
            sizes.push(bytes);
            None
        }
        Some(Hook::Capture {
            device: d, blocks, ..
        }) if *d == device.id() => Some(blocks.pop_front().ok_or(())),
        _ => None,
    });
    match pooled {
        None => Ok((
            device
                .allocator()
                .alloc(bytes, stream.index(), stream.inner.as_ref())?,
            false,
        )),
        Some(Ok((ptr, size))) if size == size_class(bytes) => Ok((
            Block {
                ptr,
                size,
                stream: stream.index(),
            },
            true,
        )),
        Some(_) => Err(Error::InvalidArgument(
            "graph capture: allocations differ from the traced eager run".into(),
        )),
    }
}

/// Notes the inputs of an op: while capturing, the graph keeps them alive (its kernels read
/// their memory on every replay).
pub(crate) fn note_inputs(device: &Device, inputs: &[&Tensor]) {
    HOOK.with(|h| {
        if let Some(Hook::Capture {
            device: d, keep, ..
        }) = &mut *h.borrow_mut()
        {
            if *d == device.id() {
                keep.extend(inputs.iter().map(|&t| t.clone()));
            }
        }
    });
}

/// Sets the thread's hook for the length of a closure and takes it back afterwards (also on
/// error), so a failed run never leaves a hook behind.
pub(super) fn with_hook<R>(hook: Hook, f: impl FnOnce() -> R) -> (R, Hook) {
    let previous = HOOK.with(|h| h.borrow_mut().replace(hook));
    let r = f();
    let hook = HOOK.with(|h| std::mem::replace(&mut *h.borrow_mut(), previous));
    // Invariant: set above and only replaced by nested hooks, which restore it.
    (r, hook.expect("graph hook set for this closure"))
}

/// The blocks a graph owns: taken from the caching allocator before its capture (its static
/// inputs and every allocation of the capture), given back when the graph goes.
#[derive(Default)]
pub(super) struct Pool {
    blocks: Vec<(DevicePtr, usize)>,
}

impl Pool {
    /// Takes a block of at least `bytes` for a graph of `stream` and returns it; the pool
    /// holds it from here on (also if the capture fails later: the graph's drop gives it back).
    pub(super) fn take(&mut self, stream: &Stream, bytes: usize) -> Result<Block> {
        let b = stream
            .device()
            .allocator()
            .alloc(bytes, stream.index(), stream.inner.as_ref())?;
        self.blocks.push((b.ptr, b.size));
        Ok(Block {
            ptr: b.ptr,
            size: size_class(bytes),
            stream: stream.index(),
        })
    }

    /// Bytes the pool holds.
    pub(super) fn bytes(&self) -> usize {
        self.blocks.iter().map(|&(_, size)| size).sum()
    }

    /// Gives every block back to the allocator (see [`hand_back`]). The caller has seen the
    /// graph's last replay complete.
    pub(super) fn give_back(&mut self, stream: &Stream) {
        hand_back(
            stream.device().allocator(),
            stream.index(),
            &stream.inner,
            self.blocks.drain(..),
        );
    }
}

/// Gives a graph's pool blocks back to the allocator, each with a lazy guard on the graph's
/// stream `slot`: only that stream used the pool (replays and their copies), so stream order
/// covers reuse there, and another stream gets a block only after resolving the guard into
/// an event on `stream` and seeing it complete. (Modelled in `graph_loom_tests`.)
pub(crate) fn hand_back(
    allocator: &crate::allocator::CachingAllocator,
    slot: usize,
    stream: &Arc<dyn crate::backend::BackendStream>,
    pool: impl IntoIterator<Item = (DevicePtr, usize)>,
) {
    for (ptr, size) in pool {
        let block = Block {
            ptr,
            size,
            stream: slot,
        };
        // Cannot fail (the stream is at hand), but a leak would be said, not hidden.
        if let Err(e) = allocator.free_lazy(block, || Ok(stream.clone())) {
            tracing::error!(error = %e, "graph pool hand-back: leaking {size} bytes");
        }
    }
}
