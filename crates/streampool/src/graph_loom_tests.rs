//! loom model of a graph pool's hand-back to the caching allocator (`graph::hand_back`).
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p streampool --lib loom_graph`.
//! A graph's stream (slot 1) has one replay in flight that writes a pool block; the graph is
//! dropped and hands the block back while a thread on slot 2 allocates the same size. If
//! slot 2 gets that block, its write must happen after the replay's (loom checks the
//! causality of the `UnsafeCell` accesses); otherwise it gets fresh memory. (Checked to catch
//! the bug: handing the block back with no guard fails this model with a causality violation.)

use std::any::Any;
use std::time::Duration;

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;

use crate::allocator::CachingAllocator;
use crate::backend::{BackendEvent, BackendMemory, BackendStream, DevicePtr};
use crate::kernel::Kernel;
use crate::sync::{Arc, Mutex};
use crate::{Error, Result};

#[derive(Default)]
struct Event {
    done: AtomicBool,
}

impl BackendEvent for Event {
    fn query(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }
    fn synchronize(&self) -> Result<()> {
        while !self.query() {
            thread::yield_now();
        }
        Ok(())
    }
    fn elapsed_since(&self, _: &dyn BackendEvent) -> Result<Duration> {
        Err(Error::Unavailable("model event".into()))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The graph's stream: events recorded on it complete when its device thread has run the
/// replay queued before them.
#[derive(Default)]
struct GraphStream {
    /// Events recorded so far, and whether the device has passed them.
    recorded: Mutex<Vec<Arc<Event>>>,
    replay_done: AtomicBool,
}

impl BackendStream for GraphStream {
    fn record(&self, _: bool) -> Result<Arc<dyn BackendEvent>> {
        let e = Arc::new(Event::default());
        let mut recorded = self.recorded.lock();
        if self.replay_done.load(Ordering::Acquire) {
            e.done.store(true, Ordering::Release);
        }
        recorded.push(e.clone());
        Ok(e)
    }
    fn wait(&self, event: &Arc<dyn BackendEvent>) -> Result<()> {
        event.synchronize()
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    unsafe fn launch(&self, _: Kernel) -> Result<()> {
        Ok(())
    }
    unsafe fn copy_from_host(&self, _: Vec<u8>, _: DevicePtr) -> Result<()> {
        Ok(())
    }
    unsafe fn copy_to_host(&self, _: DevicePtr, _: &mut [u8]) -> Result<()> {
        Ok(())
    }
}

#[derive(Default)]
struct Memory {
    next: AtomicUsize,
}

impl BackendMemory for Memory {
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        Ok(DevicePtr(
            ((self.next.fetch_add(1, Ordering::Relaxed) + 1) * bytes) as u64,
        ))
    }
    unsafe fn free(&self, _: DevicePtr, _: usize) {}
}

#[test]
fn loom_graph_pool_hand_back() {
    loom::model(|| {
        let alloc = Arc::new(CachingAllocator::new(
            Arc::new(Memory::default()),
            "model".into(),
            3,
            None,
        ));
        let stream = Arc::new(GraphStream::default());
        let graph_stream: Arc<dyn BackendStream> = stream.clone();
        // The pool block, taken before capture on the graph's stream.
        let block = alloc.alloc(512, 1, graph_stream.as_ref()).unwrap();
        let pool_ptr = block.ptr;
        let memory = Arc::new(UnsafeCell::new(0u32));

        // The graph's stream runs the replay: writes the pool block, then passes its events.
        let device = {
            let (stream, memory) = (stream.clone(), memory.clone());
            thread::spawn(move || {
                memory.with_mut(|m| unsafe { *m = 1 });
                let recorded = stream.recorded.lock();
                stream.replay_done.store(true, Ordering::Release);
                for e in recorded.iter() {
                    e.done.store(true, Ordering::Release);
                }
            })
        };
        // The graph is dropped while the replay may still run: its pool goes back.
        let owner = {
            let (alloc, graph_stream) = (alloc.clone(), graph_stream.clone());
            thread::spawn(move || {
                crate::graph::hand_back(&alloc, 1, &graph_stream, [(pool_ptr, block.size)]);
            })
        };
        // Another stream allocates the same size; if it gets the pool block, it writes it.
        let other: Arc<dyn BackendStream> = Arc::new(GraphStream::default());
        let got = alloc.alloc(512, 2, other.as_ref()).unwrap();
        if got.ptr == pool_ptr {
            memory.with_mut(|m| unsafe { *m = 2 });
        }
        owner.join().unwrap();
        device.join().unwrap();
    });
}
