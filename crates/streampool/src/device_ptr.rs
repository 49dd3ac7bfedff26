//! [`DevicePtr`]: where a backend's memory is, as the runtime and the kernels pass it around.
//!
//! The runtime never dereferences a `DevicePtr`; it only moves it by byte offsets (views,
//! the caching allocator's blocks) and hands it to the backend that made it. So its meaning
//! is the backend's:
//!
//! | backend | meaning of the 64 bits                                                     |
//! |---------|----------------------------------------------------------------------------|
//! | CPU     | a host address                                                             |
//! | CUDA    | a `CUdeviceptr`                                                            |
//! | wgpu    | a buffer id (high 24 bits) and a byte offset into that buffer (low 40 bits) |
//!
//! wgpu buffers have no device addresses, hence the pair; adding a byte offset to it moves
//! within the same buffer, exactly as `offset` does for an address (see `wgpu/memory.rs`).
//! `DevicePtr(0)` is the null pointer of every backend (the storage of an empty tensor).

/// A backend's handle to a byte of its memory (see the module docs for its meaning per backend).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The location `bytes` further on (in the same allocation).
    #[inline]
    pub fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0 + bytes as u64)
    }
}
