//! The start-up path `serve` and `embed` share: the device's kernels built on a second
//! thread while the model loads, both timed as phases (`streampool::phases`).

use std::sync::Arc;

use anyhow::{anyhow, Result};
use streampool::phases::Phases;
use streampool::Device;

/// Runs `load` (reading and uploading weights, which needs no kernel until the dtype
/// conversion) while another thread builds `dev`'s kernels (an NVRTC compile on a first
/// start, a cubin read from the disk cache later; nothing on the CPU). The first kernel
/// launch of `load` waits for that build instead of starting its own. Both record into
/// `phases`.
pub fn load_with_kernels<T>(
    phases: &Arc<Phases>,
    dev: &Device,
    load: impl FnOnce() -> Result<T>,
) -> Result<T> {
    std::thread::scope(|s| {
        let kernels = s.spawn(|| phases.scope(|| dev.load_kernels()));
        let loaded = phases.scope(load);
        let built = kernels
            .join()
            .map_err(|_| anyhow!("building the kernels of {} panicked", dev.name()))?;
        // A failed build also failed the load's first launch, which says more (what it was
        // loading); report the build's error only when the load did not need kernels.
        let loaded = loaded?;
        built?;
        Ok(loaded)
    })
}
