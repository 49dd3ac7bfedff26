//! Events: points in a stream's queue.

use std::time::Duration;

use crate::backend::BackendEvent;
use crate::sync::Arc;
use crate::{Device, Error, Result, Stream};

/// A recorded point in a stream. Another stream can wait for it ([`Stream::wait_event`]),
/// the host can poll or block on it, and two timed events give the time between them.
///
/// ```
/// use streampool::{Device, Event};
/// let dev = Device::cpu();
/// let s = dev.current_stream().unwrap();
/// let start = Event::record(&s).unwrap();
/// let end = Event::record(&s).unwrap();
/// end.synchronize().unwrap();
/// assert!(end.query());
/// let _ = end.elapsed_since(&start).unwrap();
/// ```
#[derive(Clone)]
pub struct Event {
    device_id: u64,
    pub(crate) inner: Arc<dyn BackendEvent>,
}

impl Event {
    /// Records a timed event on `stream` after all work queued there so far.
    pub fn record(stream: &Stream) -> Result<Event> {
        Ok(Event {
            device_id: stream.device().id(),
            inner: stream.inner.record(true)?,
        })
    }

    /// Whether the work before the event has completed (never blocks).
    pub fn query(&self) -> bool {
        self.inner.query()
    }

    /// Blocks until the work before the event has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }

    /// Time between `earlier` and this event (waits for both).
    pub fn elapsed_since(&self, earlier: &Event) -> Result<Duration> {
        if self.device_id != earlier.device_id {
            return Err(Error::InvalidArgument(
                "elapsed_since: events of different devices".into(),
            ));
        }
        self.inner.elapsed_since(earlier.inner.as_ref())
    }

    pub(crate) fn check_device(&self, device: &Device, op: &'static str) -> Result<()> {
        if self.device_id != device.id() {
            return Err(Error::Device {
                op,
                lhs: format!("device #{}", self.device_id),
                rhs: device.name(),
            });
        }
        Ok(())
    }
}
