//! The CPU backend: the reference backend, and the one CI runs.
//!
//! | concept   | here                                                          |
//! |-----------|---------------------------------------------------------------|
//! | stream    | a worker thread running queued jobs in order ([`stream`])      |
//! | event     | "this stream has finished `n` jobs" ([`progress`])            |
//! | memory    | 64-byte-aligned heap blocks                                    |
//! | kernels   | vectorized loops and `gemm`, split over a shared pool ([`kernels`], [`intra_op`]) |

pub(crate) mod half;
pub(crate) mod intra_op;
pub(crate) mod kernels;
pub(crate) mod profile;
pub(crate) mod progress;
pub(crate) mod stream;

use std::alloc::Layout;
use std::any::Any;

use crate::backend::{BackendDevice, BackendMemory, BackendStream, DevicePtr};
use crate::sync::Arc;
use crate::{Error, Result};

/// Alignment of CPU blocks: a cache line, enough for any SIMD load.
const ALIGN: usize = 64;

/// The host's physical memory in bytes (Linux: `sysconf`), read once; `None` where unknown.
fn host_memory_bytes() -> Option<u64> {
    static TOTAL: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *TOTAL.get_or_init(|| {
        #[cfg(target_os = "linux")]
        {
            // SAFETY: `sysconf` only reads system configuration; it has no preconditions.
            let (pages, page) = unsafe {
                (
                    libc::sysconf(libc::_SC_PHYS_PAGES),
                    libc::sysconf(libc::_SC_PAGESIZE),
                )
            };
            (pages > 0 && page > 0).then(|| pages as u64 * page as u64)
        }
        #[cfg(not(target_os = "linux"))]
        {
            None
        }
    })
}

/// The CPU device backend.
pub(crate) struct CpuDevice {
    id: u64,
}

impl CpuDevice {
    pub(crate) fn new(id: u64) -> Self {
        Self { id }
    }
}

impl BackendMemory for CpuDevice {
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        // A block larger than the host's memory can never be backed: refuse it here. With
        // overcommit (`vm.overcommit_memory=1`, common on large hosts and in containers)
        // `malloc` would hand out the address space, and the first kernel writing it would
        // page-fault its way into the OOM killer instead of the caller getting an error.
        if let Some(total) = host_memory_bytes() {
            if bytes as u64 > total {
                return Err(Error::OutOfMemory {
                    device: "cpu".into(),
                    requested: bytes,
                    allocated: 0,
                    reserved: 0,
                    limit: Some(usize::try_from(total).unwrap_or(usize::MAX)),
                });
            }
        }
        let layout = Layout::from_size_align(bytes.max(1), ALIGN)
            .map_err(|e| Error::InvalidArgument(format!("allocation of {bytes} bytes: {e}")))?;
        // SAFETY: the layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(Error::OutOfMemory {
                device: "cpu".into(),
                requested: bytes,
                allocated: 0,
                reserved: 0,
                limit: None,
            });
        }
        Ok(DevicePtr(ptr as u64))
    }

    unsafe fn free(&self, ptr: DevicePtr, bytes: usize) {
        // SAFETY: `ptr` came from `alloc(bytes)`, whose layout this rebuilds exactly.
        unsafe {
            std::alloc::dealloc(
                ptr.0 as *mut u8,
                Layout::from_size_align_unchecked(bytes.max(1), ALIGN),
            )
        }
    }
}

impl BackendDevice for CpuDevice {
    fn name(&self) -> String {
        "cpu".into()
    }
    fn create_stream(&self, index: usize) -> Result<Arc<dyn BackendStream>> {
        Ok(Arc::new(stream::CpuStream::new(format!(
            "sp-cpu{}-s{index}",
            self.id
        ))?))
    }
    fn has_packed_kernels(&self) -> bool {
        true
    }
    fn runs_int8_matmul(&self) -> bool {
        true // kernels::qgemm
    }
    fn fuses_f32_attention(&self) -> bool {
        // Its kernel splits (sequence, head) pairs over the intra-op pool as two GEMMs
        // around a vectorized softmax; the unfused path spent about a tenth of a forward in
        // copies and softmax.
        true
    }

    fn cheap_events(&self) -> bool {
        true
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
