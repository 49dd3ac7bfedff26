//! Streams: in-order queues of device work.

use std::fmt;

use crate::backend::BackendStream;
use crate::sync::Arc;
use crate::{Device, Event, Result};

/// A handle to one stream of a device's pool (cheap to clone).
///
/// Work queued on one stream runs in order; work on different streams may overlap. On the
/// CPU backend a stream is a worker thread; on CUDA it is a `CUstream`.
///
/// ```
/// use streampool::Device;
/// let dev = Device::cpu();
/// let s = dev.current_stream().unwrap();
/// s.synchronize().unwrap();
/// ```
#[derive(Clone)]
pub struct Stream {
    device: Device,
    index: usize,
    pub(crate) inner: Arc<dyn BackendStream>,
}

impl Stream {
    pub(crate) fn new(device: Device, index: usize, inner: Arc<dyn BackendStream>) -> Self {
        Self {
            device,
            index,
            inner,
        }
    }

    /// The device this stream belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The pool slot: 0 is the default stream, `1..pool_size` are pooled streams, and
    /// `pool_size..2 * pool_size` the high-priority ones.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Blocks until everything queued on this stream has run. Returns the first deferred
    /// kernel error since the last synchronization, if any (and clears it).
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }

    /// Makes work queued on this stream after this call wait for `event` (no host wait).
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        event.check_device(&self.device, "wait_event")?;
        self.inner.wait(&event.inner)
    }

    /// Queues a delay of `duration` on this stream: later work on it starts no sooner. For
    /// tests that make a producer stream slow on purpose.
    #[doc(hidden)]
    pub fn debug_delay(&self, duration: std::time::Duration) -> Result<()> {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        // SAFETY: the kernel touches no memory.
        unsafe { self.inner.launch(crate::kernel::Kernel::Sleep { nanos }) }
    }

    /// Records a (timed) event after all work queued so far.
    pub fn record_event(&self) -> Result<Event> {
        Event::record(self)
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Self) -> bool {
        self.device.id() == other.device.id() && self.index == other.index
    }
}
impl Eq for Stream {}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream({}, {})", self.device.name(), self.index)
    }
}
