//! Device memory of the wgpu backend: one `wgpu::Buffer` per allocator block, named by id.
//!
//! wgpu buffers have no addresses, so a [`DevicePtr`] here is `id << 40 | byte offset`: the
//! runtime's view arithmetic (`ptr.offset(bytes)`) moves within the buffer, and kernels bind
//! the whole buffer and receive the offset (in elements) as a parameter. Binding whole
//! buffers at offset 0 sidesteps `min_storage_buffer_offset_alignment` (256 bytes on most
//! GPUs, far coarser than a view's offset); the other binding limit,
//! `max_storage_buffer_binding_size`, is checked once, here: a block larger than what a
//! kernel may bind is refused with an error at allocation rather than failing at launch.

use crate::backend::DevicePtr;
use crate::sync::Mutex;
use crate::{Error, Result};

/// Bits of a [`DevicePtr`] that hold the byte offset (1 TiB per buffer).
const OFFSET_BITS: u32 = 40;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;
/// Most buffer ids a device hands out at once (ids of freed buffers are reused).
const MAX_IDS: usize = 1 << (64 - OFFSET_BITS);

/// Splits a pointer into (buffer id, byte offset).
pub(crate) fn split(ptr: DevicePtr) -> (usize, u64) {
    ((ptr.0 >> OFFSET_BITS) as usize, ptr.0 & OFFSET_MASK)
}

/// Live buffers by id. Id 0 is never used, so `DevicePtr(0)` stays the null pointer.
#[derive(Default)]
struct Slab {
    buffers: Vec<Option<wgpu::Buffer>>,
    free_ids: Vec<usize>,
    /// Freed buffers, dropped at the next allocation (or with the device). `free` may run in
    /// a thread-local destructor (the allocator dropping with a thread's cached stream), where
    /// wgpu must not run; the allocator calls `alloc` right after freeing to make room, so
    /// the memory still goes back before it is needed.
    freed: Vec<wgpu::Buffer>,
}

/// The buffers of one device.
pub(crate) struct Memory {
    name: String,
    /// Held to insert, remove or clone one buffer handle (an `Arc` bump); never across a
    /// GPU wait or a wgpu call other than `Buffer::clone`.
    slab: Mutex<Slab>,
    /// `max_storage_buffer_binding_size` and `max_buffer_size` of the device, the lower.
    max_block: u64,
}

impl Memory {
    pub(crate) fn new(name: String, limits: &wgpu::Limits) -> Self {
        Self {
            name,
            slab: Mutex::new(Slab {
                buffers: vec![None],
                free_ids: Vec::new(),
                freed: Vec::new(),
            }),
            max_block: limits
                .max_storage_buffer_binding_size
                .min(limits.max_buffer_size),
        }
    }

    /// Creates a storage buffer of `bytes` and returns its pointer (offset 0).
    pub(crate) fn alloc(&self, device: &wgpu::Device, bytes: usize) -> Result<DevicePtr> {
        let size = (bytes as u64).next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        if size > self.max_block {
            return Err(Error::OutOfMemory {
                device: self.name.clone(),
                requested: bytes,
                allocated: 0,
                reserved: 0,
                limit: Some(self.max_block as usize),
            });
        }
        // Buffers freed since the last allocation go back to wgpu first (outside the lock).
        let freed = std::mem::take(&mut self.slab.lock().freed);
        drop(freed);
        // An out-of-memory error of `create_buffer` goes to the innermost error scope of this
        // thread (wgpu's scopes are thread-local), so concurrent allocations do not mix up.
        let scope = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("streampool block"),
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if pollster::block_on(scope.pop()).is_some() {
            return Err(Error::OutOfMemory {
                device: self.name.clone(),
                requested: bytes,
                allocated: 0,
                reserved: 0,
                limit: None,
            });
        }
        let mut slab = self.slab.lock();
        let id = match slab.free_ids.pop() {
            Some(id) => id,
            None if slab.buffers.len() < MAX_IDS => {
                slab.buffers.push(None);
                slab.buffers.len() - 1
            }
            None => {
                return Err(Error::Backend {
                    device: self.name.clone(),
                    msg: format!("more than {MAX_IDS} live buffers"),
                })
            }
        };
        slab.buffers[id] = Some(buffer);
        Ok(DevicePtr((id as u64) << OFFSET_BITS))
    }

    /// Drops the buffer of `ptr` (wgpu keeps it alive until submitted work using it is done).
    pub(crate) fn free(&self, ptr: DevicePtr) {
        let (id, _) = split(ptr);
        let mut slab = self.slab.lock();
        if let Some(buffer) = slab.buffers.get_mut(id).and_then(Option::take) {
            slab.free_ids.push(id);
            slab.freed.push(buffer);
        }
    }

    /// Drops every buffer (the device is going away).
    pub(crate) fn release_all(&self) {
        let slab = std::mem::take(&mut *self.slab.lock());
        drop(slab);
    }

    /// The buffer holding `ptr` and the byte offset into it.
    pub(crate) fn resolve(&self, ptr: DevicePtr) -> Result<(wgpu::Buffer, u64)> {
        let (id, offset) = split(ptr);
        let slab = self.slab.lock();
        match slab.buffers.get(id) {
            Some(Some(b)) if offset <= b.size() => Ok((b.clone(), offset)),
            _ => Err(Error::InvalidArgument(format!(
                "{}: no buffer behind pointer {:#x}",
                self.name, ptr.0
            ))),
        }
    }
}
