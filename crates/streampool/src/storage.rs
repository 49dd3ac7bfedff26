//! Storage: a block of device memory plus the tracking that makes cross-stream use safe.
//!
//! Tensors are immutable: a storage is written once, by the op that created it, on one
//! stream (the *writer*). Every stream that reads it is remembered. Reading on another stream
//! first makes that stream wait on the writer's event; dropping the storage records an event
//! on every stream that used it and hands those to the allocator as guards, so the block is
//! reused on another stream only after all of them have passed. Users never call
//! `record_stream`.

use crate::allocator::{Block, Guard};
use crate::backend::{BackendEvent, DevicePtr};
use crate::sync::{Arc, Mutex};
use crate::{Device, Result, Stream};

struct Track {
    writer: usize,
    /// The writer's event; recorded eagerly where events are cheap, else on first foreign read.
    write_event: Option<Arc<dyn BackendEvent>>,
    /// Pool slots of the streams that used the storage (writer included).
    uses: Vec<usize>,
}

pub(crate) struct Storage {
    device: Device,
    block: Option<Block>,
    /// Held while noting a use or recording the lazy write event; never across a host wait.
    track: Mutex<Track>,
}

impl Storage {
    /// A storage whose contents are produced by work just queued on `writer`.
    pub(crate) fn new(
        device: Device,
        block: Block,
        writer: &Stream,
        write_event: Option<Arc<dyn BackendEvent>>,
    ) -> Self {
        let track = Track {
            writer: writer.index(),
            write_event,
            uses: vec![writer.index()],
        };
        Self {
            device,
            block: Some(block),
            track: Mutex::new(track),
        }
    }

    /// Sets the write event once the producing work has been queued (eager-event backends).
    pub(crate) fn with_write_event(self, event: Arc<dyn BackendEvent>) -> Self {
        self.track.lock().write_event = Some(event);
        self
    }

    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    pub(crate) fn ptr(&self) -> DevicePtr {
        // `block` is only taken in `drop`.
        self.block.as_ref().map(|b| b.ptr).unwrap_or(DevicePtr(0))
    }

    /// Prepares a read (or any use) on `stream`: notes the use and, if the storage was written
    /// on another stream, makes `stream` wait for that write.
    pub(crate) fn prepare_use(&self, stream: &Stream) -> Result<()> {
        let s = stream.index();
        let event = {
            let mut t = self.track.lock();
            if !t.uses.contains(&s) {
                t.uses.push(s);
            }
            if t.writer == s {
                return Ok(());
            }
            match &t.write_event {
                Some(e) => e.clone(),
                None => {
                    let e = self.device.pool().get(t.writer)?.record(false)?;
                    t.write_event = Some(e.clone());
                    e
                }
            }
        };
        if !event.query() {
            stream.inner.wait(&event)?;
        }
        Ok(())
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        let Some(block) = self.block.take() else {
            return;
        };
        let uses = std::mem::take(&mut self.track.lock().uses);
        let mut guards = Vec::with_capacity(uses.len());
        for s in uses {
            match self.device.pool().get(s).and_then(|st| st.record(false)) {
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
