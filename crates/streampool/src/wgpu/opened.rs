//! The wgpu instance and the wgpu devices this process has opened, kept until it exits.
//!
//! **Why nothing is torn down.** NVIDIA's Vulkan driver (580, H100) deadlocks when a
//! `VkDevice` is destroyed while other threads are in the driver. In the stack dump of the
//! hung parallel test suite on an H100, the one thread inside the driver that was not waiting
//! for the driver's lock was in `vkDestroyDevice`, waiting for another thread to finish; an
//! exiting thread was blocked on that lock in the driver's thread-exit (pthread key)
//! destructor, and every other call into the driver from any device (`vkQueueSubmit`,
//! `vkBeginCommandBuffer`, `vkCreateInstance`, `vkDestroyInstance`) was queued behind it, GPU
//! idle. The suite opens and drops dozens of devices while other tests' threads come and go,
//! and hung in 6 of 9 runs on the H100 before this; see also gfx-rs/wgpu#8365 (NVIDIA's driver
//! deadlocking in teardown, an external driver bug).
//!
//! So this process destroys no `VkDevice` and no `VkInstance` while it runs: there is one
//! `wgpu::Instance`, and one `wgpu::Device` with its queue per adapter and feature set,
//! opened on first use and shared by every streampool device opened on that adapter with
//! those features (each keeps its own pool, allocator, buffers and kernels). That also
//! spares each `Device::wgpu_with` the instance creation and device open. A device that is
//! lost stays in the list (never destroyed) and the next open makes a new one.

use std::sync::OnceLock;

use crate::sync::{Arc, Mutex};
use crate::{Error, Result};

/// One opened wgpu device and its queue.
pub(crate) struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    /// Why the device was lost, once it is (set by wgpu's device-lost callback): waits then
    /// return this instead of polling a device that will never finish.
    lost: Arc<Mutex<Option<String>>>,
    /// The quarantine lock of this device (see the module docs of `wgpu`): one per wgpu
    /// device, since the driver concern is encoding on one device from several threads.
    pub(crate) quarantine: Mutex<()>,
}

impl Gpu {
    /// Why the device was lost, if it was.
    pub(crate) fn lost(&self) -> Option<String> {
        self.lost.lock().clone()
    }
}

/// What identifies a device to reuse: the adapter (its whole `AdapterInfo`, printed) and the
/// features it was opened with.
type Key = (String, wgpu::Features);

/// Every device opened, in order, by what identifies it; a lost one stays (see the module
/// docs).
type Opened = Vec<(Key, Arc<Gpu>)>;

static OPENED: OnceLock<Mutex<Opened>> = OnceLock::new();

/// The process's one wgpu instance.
pub(crate) fn instance() -> &'static wgpu::Instance {
    static INSTANCE: OnceLock<wgpu::Instance> = OnceLock::new();
    INSTANCE.get_or_init(|| {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
        // No validation layers unless asked for through wgpu's environment variables.
        desc.flags = wgpu::InstanceFlags::empty().with_env();
        wgpu::Instance::new(desc)
    })
}

/// The adapters the instance finds.
pub(crate) fn adapters() -> Vec<wgpu::Adapter> {
    pollster::block_on(instance().enumerate_adapters(wgpu::Backends::all()))
}

/// The device of `adapter` opened with `features` (and the adapter's own limits): the one
/// opened before if it is not lost, else a new one, kept for the process's lifetime.
/// `experimental`: whether `features` holds experimental ones (cooperative matrices).
pub(crate) fn open(
    adapter: &wgpu::Adapter,
    features: wgpu::Features,
    experimental: bool,
) -> Result<Arc<Gpu>> {
    let info = adapter.get_info();
    let key: Key = (format!("{info:?}"), features);
    // Held across the open so that two threads opening the same adapter get one device; an
    // open makes no GPU wait, and no other lock is taken inside.
    let mut opened = OPENED.get_or_init(Mutex::default).lock();
    if let Some((_, gpu)) = opened
        .iter()
        .find(|(k, gpu)| *k == key && gpu.lost().is_none())
    {
        return Ok(gpu.clone());
    }
    let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("streampool"),
        required_features: features,
        // The adapter's own limits: the largest buffers and bindings it allows.
        required_limits: adapter.limits(),
        // SAFETY: experimental features are only requested where the cooperative-matrix
        // kernels run (`WgpuConfig::cooperative_matrix`: an opt-in, or an adapter they were
        // verified on); wgpu's token acknowledges that they may have bugs. Every variant of
        // those kernels is validated by naga in CI (tests/it/wgpu_naga.rs).
        experimental_features: if experimental {
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        },
        ..Default::default()
    }))
    .map_err(|e| Error::Unavailable(format!("wgpu: opening {}: {e}", info.name)))?;
    // wgpu's default handler panics; errors outside our scopes are logged instead (all
    // encoding and submission runs inside scopes, which report to the calling thread).
    let log_name = info.name.clone();
    device.on_uncaptured_error(std::sync::Arc::new(move |e: wgpu::Error| {
        tracing::error!(adapter = %log_name, error = %e, "uncaptured wgpu error");
    }));
    let lost = Arc::new(Mutex::new(None));
    let flag = lost.clone();
    device.set_device_lost_callback(move |reason, msg| {
        *flag.lock() = Some(format!("device lost ({reason:?}): {msg}"));
    });
    let gpu = Arc::new(Gpu {
        device,
        queue,
        lost,
        quarantine: Mutex::new(()),
    });
    opened.push((key, gpu.clone()));
    Ok(gpu)
}
