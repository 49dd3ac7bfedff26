//! The portable GPU backend (feature `wgpu`): Vulkan on Linux, Metal on macOS, DX12 on Windows.
//!
//! | concept   | here                                                                          |
//! |-----------|-------------------------------------------------------------------------------|
//! | device    | a `wgpu::Device` and its one `Queue`, on the adapter [`WgpuConfig`] picks, kept for the process ([`opened`]) |
//! | stream    | logical: its own command encoder, submitted in order to the one queue ([`stream`]) |
//! | event     | a point in a stream's submissions: a `SubmissionIndex` waited with `Device::poll` |
//! | copies    | through staging buffers mapped at creation (up) or mapped for reading (down)   |
//! | memory    | one storage buffer per allocator block; `DevicePtr` = buffer id + byte offset ([`memory`]) |
//! | kernels   | WGSL compute pipelines built once per device ([`kernels`], `shaders/`); the matmul per shape (`choice`): register-blocked FMA tiles (`blocked`) or matrix units (`coop`) |
//! | dtypes    | f32; f16 where the adapter has `SHADER_F16` (requested at open); never bf16    |
//!
//! **Quarantine lock.** Work reaches the GPU through one queue, but encoding is per stream, so
//! threads on different streams record command buffers at the same time; that is where
//! threads win on one queue. The system we descend from found Apple's Metal driver unsafe
//! with three or more command buffers encoded at once and serialized those calls. Here
//! [`WgpuConfig::quarantine`] puts one lock per device around encoding, finishing and
//! submitting command buffers: on for Metal by default (the suspect driver), off elsewhere;
//! `STREAMPOOL_WGPU_QUARANTINE=1|0` (the tunables' `wgpu.quarantine`) overrides the
//! default. Both settings are tested (`tests/it/wgpu.rs`).

mod blocked;
mod choice;
mod config;
mod coop;
pub(crate) mod kernels;
mod launch;
pub(crate) mod memory;
mod opened;
pub(crate) mod profile;
pub(crate) mod stream;

use std::any::Any;
use std::sync::OnceLock;

use crate::backend::{BackendDevice, BackendMemory, BackendStream, DevicePtr};
use crate::sync::{Arc, Mutex};
use crate::{Device, DeviceKind, Error, KernelCache, Result};

pub use config::{CoopMatrix, Quarantine, WgpuConfig, DEFAULT_WAIT_LIMIT};

/// What a wgpu device shares with its streams.
pub(crate) struct Shared {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) name: String,
    pub(crate) memory: memory::Memory,
    /// Pipelines, built once per device and shared by every stream and thread.
    pub(crate) kernels: KernelCache<kernels::Key, kernels::Pipeline>,
    /// Whether the device was opened with `SHADER_F16`: `F16` kernels run, else they are errors.
    pub(crate) shader_f16: bool,
    /// How matmul kernels are picked.
    pub(crate) matmul: choice::MatmulChoice,
    /// Attention per block of 32 queries where the head width allows (else one workgroup
    /// per token and head); `STREAMPOOL_WGPU_ATTENTION=token` turns it off, for comparison.
    pub(crate) attention_tiled: bool,
    /// Whether kernels keep naga's loop bounding (`STREAMPOOL_WGPU_LOOP_BOUNDS=1`): a counter
    /// in every loop that ends it after 2^64 iterations. Off by default: our loops all end
    /// (see `kernels::Key::build`), and the counter costs in the inner loops.
    pub(crate) loop_bounding: bool,
    /// What the adapter says of cooperative matrices: whether it has
    /// `EXPERIMENTAL_COOPERATIVE_MATRIX`, and its configurations (`MxNxK A/B->C`), for
    /// `streampool check`.
    pub(crate) coop_matrix: (bool, Vec<String>),
    /// Whether the cooperative-matrix kernels run here, and why, for `streampool check`.
    pub(crate) coop_use: String,
    /// Read-back staging buffers kept per stream (`STREAMPOOL_WGPU_KEEP_READBACK=0`: none).
    pub(crate) keep_readback: bool,
    /// Whether launch parameters go into buffers mapped at creation (`UNIFORM | MAP_WRITE`,
    /// with `MAPPABLE_PRIMARY_BUFFERS`) rather than through a staging copy.
    pub(crate) mapped_params: bool,
    /// Whether the first command buffers after a host wait are submitted after fewer launches
    /// (4, 8, 16, then 32; `stream::SUBMIT_FIRST`); `STREAMPOOL_WGPU_SUBMIT_RAMP=0`: every 32.
    pub(crate) submit_ramp: bool,
    /// `Some(nanoseconds per tick)` when every launch writes GPU timestamps for the profile
    /// (`STREAMPOOL_WGPU_PROFILE=1`, adapter with `TIMESTAMP_QUERY`).
    pub(crate) timestamp_period: Option<f32>,
    /// Whether the quarantine lock (the wgpu device's, `opened::Gpu::quarantine`) is taken:
    /// held around encoding, finishing and submission only.
    pub(crate) quarantine: bool,
    /// How long a host wait for the GPU may take before it fails (see `WgpuConfig::wait_limit`).
    pub(crate) wait_limit: std::time::Duration,
    /// The wgpu device and queue (`device` and `queue` above are clones of them), shared with
    /// other streampool devices on the same adapter and kept for the process's lifetime.
    pub(crate) gpu: Arc<opened::Gpu>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The wgpu device outlives this streampool device (see `opened`): give its buffers
        // back and poll once, so that wgpu frees the memory of those whose last submission is
        // done now rather than at some later poll that may never come.
        self.memory.release_all();
        let _ = self.device.poll(wgpu::PollType::Poll);
    }
}

impl Shared {
    /// The quarantine lock's guard when it is on (see the module docs).
    pub(crate) fn quarantined(&self) -> Option<crate::sync::MutexGuard<'_, ()>> {
        self.quarantine.then(|| self.gpu.quarantine.lock())
    }

    pub(crate) fn backend_err(&self, msg: String) -> Error {
        Error::Backend {
            device: self.name.clone(),
            msg,
        }
    }
}

/// An owning handle to a device's [`Shared`] state whose last drop runs on a helper thread.
/// Streams are dropped from thread-local destructors (a thread's cached pooled stream), and
/// wgpu must not be torn down there: it reaches for its own thread-locals, which are already
/// gone, and the process aborts.
pub(crate) struct SharedRef(Option<Arc<Shared>>);

impl SharedRef {
    fn new(shared: Shared) -> Self {
        Self(Some(Arc::new(shared)))
    }

    pub(crate) fn same(&self, other: &SharedRef) -> bool {
        Arc::ptr_eq(self, other)
    }
}

impl std::ops::Deref for SharedRef {
    type Target = Arc<Shared>;
    fn deref(&self) -> &Arc<Shared> {
        // Only `drop` takes the Arc out.
        self.0.as_ref().expect("SharedRef used after drop")
    }
}

impl Clone for SharedRef {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl Drop for SharedRef {
    fn drop(&mut self) {
        // `into_inner` is `Some` for exactly one owner, the last.
        if let Some(last) = self.0.take().and_then(Arc::into_inner) {
            drop_off_thread(last);
        }
    }
}

/// Drops `value` on a short-lived helper thread and waits for it: for wgpu objects whose
/// owner may be dropped inside a thread-local destructor (see [`SharedRef`]).
pub(crate) fn drop_off_thread<T: Send + 'static>(value: T) {
    let teardown = std::thread::Builder::new()
        .name("sp-wgpu-drop".into())
        .spawn(move || drop(value));
    // If no thread can be started, the closure (and the value) is dropped right here.
    if let Ok(handle) = teardown {
        let _ = handle.join();
    }
}

/// One wgpu device.
pub(crate) struct WgpuDevice {
    shared: SharedRef,
}

/// Rank of an adapter type when none is asked for: lower is preferred.
fn preference(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// The adapters wgpu finds, as `index: name (backend, type)` lines, for errors and `check`.
pub fn describe_adapters() -> Vec<String> {
    adapters()
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let info = a.get_info();
            format!(
                "{i}: {} ({:?}, {:?})",
                info.name, info.backend, info.device_type
            )
        })
        .collect()
}

use opened::adapters;

/// The adapter of `list` that `wanted` names (an index, or part of its `name (backend,
/// type)`), or without a wish the preferred one ([`preference`]), a software one only where
/// `allow_software`.
fn find_adapter(
    list: &[wgpu::Adapter],
    wanted: Option<&str>,
    allow_software: bool,
) -> Option<usize> {
    match wanted {
        Some(w) => match w.parse::<usize>() {
            Ok(i) if i < list.len() => Some(i),
            Ok(_) => None,
            Err(_) => {
                let w = w.to_lowercase();
                list.iter().position(|a| {
                    let info = a.get_info();
                    format!("{} {:?} {:?}", info.name, info.backend, info.device_type)
                        .to_lowercase()
                        .contains(&w)
                })
            }
        },
        None => (0..list.len())
            .filter(|&i| allow_software || list[i].get_info().device_type != wgpu::DeviceType::Cpu)
            .min_by_key(|&i| preference(list[i].get_info().device_type)),
    }
}

/// The features the cooperative-matrix kernels need.
const COOP_FEATURES: wgpu::Features =
    wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX.union(wgpu::Features::SUBGROUP);

/// Whether the cooperative-matrix kernels run on `adapter` under `setting`, on matrix units
/// (`Some(false)`) or emulated (`Some(true)`), and why, for `streampool check`: only with
/// everything `coop.rs` relies on (see `CoopMatrix`).
fn cooperative_matrix_use(
    adapter: &wgpu::Adapter,
    info: &wgpu::AdapterInfo,
    shader_f16: bool,
    setting: CoopMatrix,
) -> (Option<bool>, String) {
    let coop_capable = shader_f16
        && adapter.features().contains(COOP_FEATURES)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
                && p.ab_type == wgpu::CooperativeScalarType::F16
                && p.cr_type == wgpu::CooperativeScalarType::F32
        });
    let verified =
        choice::coop_verified(info.vendor, info.backend, &info.name, choice::COOP_VERIFIED);
    match setting {
        CoopMatrix::Off => (None, "off (setting)".to_string()),
        CoopMatrix::Emulated if shader_f16 => (Some(true), "emulated (setting)".into()),
        CoopMatrix::Emulated => (None, "off: emulation needs SHADER_F16".into()),
        _ if !coop_capable => (
            None,
            "off: the adapter lacks 16x16x16 f16->f32 cooperative matrices, SHADER_F16 \
             or 32-wide SUBGROUP"
                .into(),
        ),
        CoopMatrix::On => (Some(false), "on (opted in)".into()),
        _ if verified => (Some(false), "on (verified adapter)".into()),
        _ => (
            None,
            "off: not verified on this adapter (STREAMPOOL_WGPU_COOP_MATRIX=1 opts in)".into(),
        ),
    }
}

/// What `adapter` says of cooperative matrices: whether it has
/// `EXPERIMENTAL_COOPERATIVE_MATRIX`, and its configurations (`MxNxK A/B->C`), for
/// `streampool check`.
fn describe_coop_matrix(adapter: &wgpu::Adapter) -> (bool, Vec<String>) {
    let configs = adapter
        .cooperative_matrix_properties()
        .iter()
        .map(|p| {
            format!(
                "{}x{}x{} {:?}->{:?}",
                p.m_size, p.n_size, p.k_size, p.ab_type, p.cr_type
            )
        })
        .collect();
    let has = adapter
        .features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);
    (has, configs)
}

impl WgpuDevice {
    fn open(config: &WgpuConfig) -> Result<(usize, Self)> {
        let list = adapters();
        let describe = || {
            let lines = describe_adapters();
            if lines.is_empty() {
                "no adapters at all (is a Vulkan driver installed? e.g. mesa-vulkan-drivers)"
                    .to_string()
            } else {
                format!("adapters: {}", lines.join("; "))
            }
        };
        // Fields the config leaves open take the process's tunables (the environment's,
        // unless the program set its own).
        let tuning = &crate::config::tuning().wgpu;
        let wanted = config
            .adapter
            .clone()
            .or_else(|| tuning.adapter.clone())
            .filter(|s| !s.is_empty());
        let index = find_adapter(&list, wanted.as_deref(), config.allow_software);
        let Some(index) = index else {
            return Err(Error::Unavailable(match wanted {
                Some(w) => format!("wgpu: no adapter matches {w:?}; {}", describe()),
                None => format!("wgpu: no usable adapter; {}", describe()),
            }));
        };
        let adapter = &list[index];
        let info = adapter.get_info();
        // Half precision where the adapter has it (WGSL's `enable f16`: f16 arithmetic and
        // 16-bit storage buffers); without it, F16 kernels are errors (see `kernels`).
        let shader_f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
        let mut required_features = if shader_f16 {
            wgpu::Features::SHADER_F16
        } else {
            wgpu::Features::empty()
        };
        // Cooperative matrices: by the setting, and only with everything `coop.rs` relies
        // on (see `CoopMatrix`).
        let coop_setting = match config.cooperative_matrix {
            CoopMatrix::Auto => tuning.cooperative_matrix,
            other => other,
        };
        let (coop, coop_use) = cooperative_matrix_use(adapter, &info, shader_f16, coop_setting);
        if coop == Some(false) {
            required_features |= COOP_FEATURES;
        }
        // Launch parameters in buffers the host maps directly, where the adapter allows it
        // (native `MAPPABLE_PRIMARY_BUFFERS`); `wgpu.mapped_params` off turns it off.
        let mapped_params = adapter
            .features()
            .contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS)
            && tuning.mapped_params;
        if mapped_params {
            required_features |= wgpu::Features::MAPPABLE_PRIMARY_BUFFERS;
        }
        // GPU timestamps of every launch for the opt-in profile (`profile`), where the
        // adapter has them; an adapter without says so in the profile instead.
        let timestamps = profile::mode() == profile::Mode::Gpu
            && adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        if timestamps {
            required_features |= wgpu::Features::TIMESTAMP_QUERY;
        } else if profile::mode() == profile::Mode::Gpu {
            profile::unsupported(&info.name);
        }
        let gpu = opened::open(adapter, required_features, coop == Some(false))?;
        let name = format!("wgpu:{index} ({}, {:?})", info.name, info.backend);
        let wait_limit = config.wait_limit.unwrap_or(tuning.wait_limit);
        let quarantine = match config.quarantine {
            Quarantine::Auto => tuning.quarantine,
            other => other,
        };
        let quarantine = match quarantine {
            Quarantine::On => true,
            Quarantine::Off => false,
            Quarantine::Auto => info.backend == wgpu::Backend::Metal,
        };
        let forced = config.matmul_tile.or(tuning.matmul_tile);
        if let Some(t) = forced.filter(|t| ![16, 64, 128].contains(t)) {
            return Err(Error::InvalidArgument(format!(
                "wgpu matmul tile {t}: expected 16, 64 or 128"
            )));
        }
        let block = match config.matmul_block.or(tuning.matmul_block) {
            Some([bm, bn, bk]) if blocked::valid(bm, bn, bk) => Some((bm, bn, bk)),
            Some(b) => {
                return Err(Error::InvalidArgument(format!(
                    "wgpu matmul block {b:?}: BM and BN 64 or 128, BK 4, 8, 16 or 32"
                )))
            }
            None => None,
        };
        let groups = tuning.matmul_groups;
        let matmul = choice::MatmulChoice {
            forced,
            block,
            groups,
            coop: coop.map(|emulate| choice::CoopChoice {
                emulate,
                workgroup_bytes: gpu.device.limits().max_compute_workgroup_storage_size,
            }),
        };
        let coop_matrix = describe_coop_matrix(adapter);
        let memory = memory::Memory::new(name.clone(), &gpu.device.limits());
        Ok((
            index,
            Self {
                shared: SharedRef::new(Shared {
                    device: gpu.device.clone(),
                    queue: gpu.queue.clone(),
                    name,
                    memory,
                    kernels: KernelCache::new(),
                    quarantine,
                    wait_limit,
                    shader_f16,
                    matmul,
                    attention_tiled: tuning.attention == crate::config::WgpuAttention::Tiled,
                    loop_bounding: tuning.loop_bounds,
                    coop_matrix,
                    coop_use,
                    keep_readback: tuning.keep_readback,
                    mapped_params,
                    submit_ramp: tuning.submit_ramp,
                    timestamp_period: timestamps.then(|| gpu.queue.get_timestamp_period()),
                    gpu,
                }),
            },
        ))
    }
}

impl BackendMemory for WgpuDevice {
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.shared.memory.alloc(&self.shared.device, bytes)
    }

    unsafe fn free(&self, ptr: DevicePtr, _bytes: usize) {
        self.shared.memory.free(ptr)
    }
}

impl BackendDevice for WgpuDevice {
    fn name(&self) -> String {
        self.shared.name.clone()
    }

    fn create_stream(&self, _index: usize) -> Result<Arc<dyn BackendStream>> {
        Ok(Arc::new(stream::WgpuStream::new(self.shared.clone())))
    }

    fn cheap_events(&self) -> bool {
        // An event submits the stream's open command buffer: per op output, that would be a
        // submission per op. Record them lazily, on the first read from another stream.
        false
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Device {
    /// The process-wide wgpu device (default [`WgpuConfig`], so the adapter named by
    /// `STREAMPOOL_WGPU_ADAPTER` or else the best one), shared by every caller. Returns
    /// [`Error::Unavailable`] with the adapters found when none is usable; a failed open is
    /// retried on the next call.
    ///
    /// ```no_run
    /// use streampool::{Device, Tensor};
    /// let dev = Device::wgpu().unwrap();
    /// let x = Tensor::randn(&[4, 4], 0, &dev).unwrap();
    /// assert_eq!(x.matmul(&x).unwrap().to_vec::<f32>().unwrap().len(), 16);
    /// ```
    pub fn wgpu() -> Result<Device> {
        static DEVICE: OnceLock<Mutex<Option<Device>>> = OnceLock::new();
        // Held while the first caller opens the adapter (no GPU wait), so all get one device.
        let mut slot = DEVICE.get_or_init(|| Mutex::new(None)).lock();
        if let Some(d) = slot.as_ref() {
            return Ok(d.clone());
        }
        let dev = Device::wgpu_with(WgpuConfig::default())?;
        *slot = Some(dev.clone());
        Ok(dev)
    }

    /// Which matmul kernel this wgpu device takes in `dtype` for each of `shapes` (`(batch, m, k, n)`,
    /// contiguous operands, the right one through `W^T` as the models' linear layers use
    /// it), as `(shape, path)` lines such as `("2048x384x1152", "blocked 128x64x16, vec4
    /// along K")`; `None` for a device of another backend. For `streampool check`.
    pub fn wgpu_matmul_paths(
        &self,
        shapes: &[(usize, usize, usize, usize)],
        dtype: crate::DType,
    ) -> Option<Vec<(String, String)>> {
        let dev = self.backend().as_any().downcast_ref::<WgpuDevice>()?;
        let shared = &dev.shared;
        let half = dtype == crate::DType::F16;
        Some(
            shapes
                .iter()
                .map(|&(batch, m, k, n)| {
                    let shape = if batch == 1 {
                        format!("{m}x{k}x{n}")
                    } else {
                        format!("{batch} x {m}x{k}x{n}")
                    };
                    let vec = if k.is_multiple_of(4) && n.is_multiple_of(4) {
                        "vec4 along K"
                    } else {
                        "scalar loads"
                    };
                    let path = match choice::matmul_kernel(&shared.matmul, half, batch, m, k, n) {
                        choice::MatmulPath::Simple => "16x16 tile, 1 output per invocation".into(),
                        choice::MatmulPath::Gemv => {
                            let lanes = choice::gemv_lanes(batch, n, k);
                            format!(
                                "gemv, {} columns per workgroup, K over {lanes} lanes",
                                256 / lanes
                            )
                        }
                        choice::MatmulPath::Coop { bm, bn, bk } => {
                            let emu = match shared.matmul.coop {
                                Some(c) if c.emulate => " (emulated)",
                                _ => "",
                            };
                            format!(
                                "cooperative matrices{emu}, {bm}x{bn} blocks, {bk}-deep slices, \
                                 16x16x16 f16 products, {vec}"
                            )
                        }
                        choice::MatmulPath::Blocked { bm, bn, bk } => {
                            format!(
                                "blocked {bm}x{bn}x{bk}, {}x{} per invocation, {vec}",
                                bm / 16,
                                bn / 16
                            )
                        }
                    };
                    (shape, path)
                })
                .collect(),
        )
    }

    /// Whether this wgpu device's adapter reports `EXPERIMENTAL_COOPERATIVE_MATRIX`, and the
    /// cooperative-matrix configurations it lists (`"16x16x16 F16->F32"`); `None` for a
    /// device of another backend. For `streampool check`.
    pub fn wgpu_cooperative_matrix(&self) -> Option<(bool, Vec<String>)> {
        let dev = self.backend().as_any().downcast_ref::<WgpuDevice>()?;
        Some(dev.shared.coop_matrix.clone())
    }

    /// Whether this wgpu device runs f16 matmuls on cooperative matrices, and why (`"on
    /// (verified adapter)"`, `"off: not verified on this adapter ..."`); `None` for a device
    /// of another backend. For `streampool check`.
    pub fn wgpu_cooperative_matrix_use(&self) -> Option<String> {
        let dev = self.backend().as_any().downcast_ref::<WgpuDevice>()?;
        Some(dev.shared.coop_use.clone())
    }

    /// A new, separate streampool device (own pool, allocator, buffers and kernels) on the
    /// `wgpu::Device` and queue this process keeps for its adapter and features: opened on the
    /// first call and never destroyed while the process runs (NVIDIA's Vulkan driver
    /// deadlocks when a device is destroyed while other threads use it; see `wgpu/opened.rs`).
    /// Events of two such devices are still not interchangeable.
    pub fn wgpu_with(config: WgpuConfig) -> Result<Device> {
        let (index, backend) = WgpuDevice::open(&config)?;
        Device::with_backend(
            Device::next_id(),
            DeviceKind::Wgpu(index),
            Arc::new(backend),
            config.device,
        )
    }
}

#[cfg(test)]
mod tests {
    /// The tunables' default workgroup count is the one the matmul choice was tuned with.
    #[test]
    fn the_tunables_default_groups_are_the_choices() {
        assert_eq!(
            crate::config::Tuning::default().wgpu.matmul_groups,
            super::choice::DEFAULT_GROUPS
        );
    }
}
