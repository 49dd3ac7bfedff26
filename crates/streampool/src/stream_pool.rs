//! The stream pool: per device, slot 0 is the default stream and slots `1..n` are pooled
//! streams, created lazily on first use. A thread's first use of a device picks
//! `1 + counter.fetch_add(1) % (n - 1)` and caches that stream thread-locally, as PyTorch's
//! CUDA stream pool does. More threads than streams share streams round-robin: never an
//! error, never a wait.
//!
//! Slots `n..2n` are the high-priority streams (PyTorch's `isHighPriority` pool): never handed
//! out round-robin, only asked for by index (a latency-critical model's batch workers). On a
//! backend with stream priorities (CUDA) the device's block scheduler dispatches their
//! kernels' blocks before pending blocks of normal streams; elsewhere they are plain streams.

use std::cell::RefCell;
use std::rc::Rc;

use crate::backend::BackendStream;
use crate::sync::{Arc, AtomicUsize, Mutex, Ordering};
use crate::{Device, Error, Result, Stream};

/// Creates the backend stream of a slot.
pub(crate) type StreamFactory = Box<dyn Fn(usize) -> Result<Arc<dyn BackendStream>> + Send + Sync>;

/// The streams of one device.
pub(crate) struct StreamPool {
    /// Slot `i` holds stream `i` once created. The lock is taken only on a thread's first use
    /// of a slot (later uses hit the thread-local cache) and covers the one-time creation, so
    /// two threads never create the same stream twice.
    slots: Vec<Mutex<Option<Arc<dyn BackendStream>>>>,
    next: AtomicUsize,
    created: AtomicUsize,
    factory: StreamFactory,
}

impl StreamPool {
    /// A pool of `size` streams (slot 0 the default one) plus `size` high-priority slots;
    /// `factory` creates slot `i`'s stream (`i >= size`: a high-priority one).
    pub(crate) fn new(size: usize, factory: StreamFactory) -> Result<Self> {
        if size < 2 {
            return Err(Error::InvalidArgument(format!(
                "stream pool size must be at least 2, got {size}"
            )));
        }
        Ok(Self {
            slots: (0..2 * size).map(|_| Mutex::new(None)).collect(),
            next: AtomicUsize::new(0),
            created: AtomicUsize::new(0),
            factory,
        })
    }

    /// Streams of the normal pool, the default stream included (the high-priority slots
    /// follow them).
    pub(crate) fn size(&self) -> usize {
        self.slots.len() / 2
    }

    /// The next pooled slot, round-robin over `1..size`.
    pub(crate) fn next_slot(&self) -> usize {
        // Relaxed: the counter only spreads threads over slots; no data is published through it.
        1 + self.next.fetch_add(1, Ordering::Relaxed) % (self.size() - 1)
    }

    /// The slot of high-priority stream `i` (modulo the pool size).
    pub(crate) fn high_priority_slot(&self, i: usize) -> usize {
        self.size() + i % self.size()
    }

    /// The stream of `slot`, created on first use.
    pub(crate) fn get(&self, slot: usize) -> Result<Arc<dyn BackendStream>> {
        let cell = self.slots.get(slot).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "stream slot {slot} out of range 0..{}",
                self.slots.len()
            ))
        })?;
        let mut guard = cell.lock();
        if let Some(s) = guard.as_ref() {
            return Ok(s.clone());
        }
        let stream = (self.factory)(slot)?;
        self.created.fetch_add(1, Ordering::Relaxed);
        *guard = Some(stream.clone());
        Ok(stream)
    }

    /// Streams created so far.
    pub(crate) fn created(&self) -> usize {
        self.created.load(Ordering::Relaxed)
    }

    /// The streams created so far, with their slots.
    pub(crate) fn existing(&self) -> Vec<(usize, Arc<dyn BackendStream>)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.lock().clone().map(|s| (i, s)))
            .collect()
    }
}

/// Per-thread state for one device. Streams are held in `Rc`s so the per-op path can take
/// the current one out of the thread-local cell with a thread-local count, not by cloning
/// the `Stream` (two reference counts shared with other threads: the device's and the
/// stream's).
struct ThreadSlot {
    device_id: u64,
    /// The pooled stream this thread was given (round-robin, on first use).
    assigned: Option<Rc<Stream>>,
    /// Streams set by live [`StreamGuard`]s, innermost last.
    overrides: Vec<Rc<Stream>>,
}

thread_local! {
    static CURRENT: RefCell<Vec<ThreadSlot>> = const { RefCell::new(Vec::new()) };
}

fn with_slot<R>(device_id: u64, f: impl FnOnce(&mut ThreadSlot) -> R) -> R {
    CURRENT.with(|cur| {
        let mut cur = cur.borrow_mut();
        let i = match cur.iter().position(|s| s.device_id == device_id) {
            Some(i) => i,
            None => {
                cur.push(ThreadSlot {
                    device_id,
                    assigned: None,
                    overrides: Vec::new(),
                });
                cur.len() - 1
            }
        };
        f(&mut cur[i])
    })
}

/// The calling thread's current stream on `device`: the innermost [`StreamGuard`]'s, else
/// the thread's pooled stream (assigned on first use).
pub(crate) fn current_stream(device: &Device) -> Result<Stream> {
    let rc = current_rc(device)?;
    Ok(Stream::clone(&rc))
}

/// Runs `f` on the calling thread's current stream of `device` (as [`current_stream`]),
/// without cloning the `Stream`: the per-op path.
pub(crate) fn with_current_stream<R>(
    device: &Device,
    f: impl FnOnce(&Stream) -> Result<R>,
) -> Result<R> {
    let rc = current_rc(device)?;
    f(&rc)
}

fn current_rc(device: &Device) -> Result<Rc<Stream>> {
    let cached = with_slot(device.id(), |s| {
        s.overrides.last().or(s.assigned.as_ref()).cloned()
    });
    if let Some(s) = cached {
        return Ok(s);
    }
    // Created outside the thread-local borrow: stream creation may be slow.
    let stream = Rc::new(device.stream_at(device.pool().next_slot())?);
    with_slot(device.id(), |s| s.assigned = Some(stream.clone()));
    Ok(stream)
}

/// Forgets the calling thread's pooled stream on `device`; its next use is assigned afresh.
pub(crate) fn release_current_thread_slot(device: &Device) {
    with_slot(device.id(), |s| s.assigned = None);
}

/// Makes `stream` the calling thread's current stream on its device until the guard drops,
/// then restores the previous one. Guards nest; drop them in reverse order of creation
/// (the natural order of scopes).
///
/// ```
/// use streampool::{Device, StreamGuard};
/// let dev = Device::cpu();
/// let s = dev.stream_from_pool().unwrap();
/// {
///     let _g = StreamGuard::new(&s);
///     assert_eq!(dev.current_stream().unwrap().index(), s.index());
/// }
/// ```
pub struct StreamGuard {
    device_id: u64,
    depth: usize,
    /// A guard belongs to the thread that made it (it edits that thread's state).
    _not_send: std::marker::PhantomData<*const ()>,
}

impl StreamGuard {
    /// Sets `stream` as current for this thread until the guard is dropped.
    pub fn new(stream: &Stream) -> Self {
        let device_id = stream.device().id();
        let depth = with_slot(device_id, |s| {
            s.overrides.push(Rc::new(stream.clone()));
            s.overrides.len()
        });
        Self {
            device_id,
            depth,
            _not_send: std::marker::PhantomData,
        }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        // Truncating to our depth also unwinds guards leaked out of order inside our scope.
        let _ = CURRENT.try_with(|cur| {
            if let Some(s) = cur
                .borrow_mut()
                .iter_mut()
                .find(|s| s.device_id == self.device_id)
            {
                s.overrides.truncate(self.depth - 1);
            }
        });
    }
}
