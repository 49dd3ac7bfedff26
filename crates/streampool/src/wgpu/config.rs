//! The settings of a wgpu device: [`WgpuConfig`] and the choices it holds.

use crate::DeviceConfig;

/// Whether the device serializes encoding and submission behind its quarantine lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Quarantine {
    /// On for Metal, off for other backends, unless `STREAMPOOL_WGPU_QUARANTINE` says `1`/`0`.
    #[default]
    Auto,
    /// Always take the lock.
    On,
    /// Never take it.
    Off,
}

/// Settings of a wgpu device.
///
/// ```no_run
/// use streampool::{Device, WgpuConfig};
/// // The first adapter whose name contains "llvmpipe" (Mesa's software Vulkan), say.
/// let dev = Device::wgpu_with(WgpuConfig {
///     adapter: Some("llvmpipe".into()),
///     ..WgpuConfig::default()
/// }).unwrap();
/// assert!(dev.name().contains("llvmpipe"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WgpuConfig {
    /// Pool, memory limit and event policy, as for every device.
    pub device: DeviceConfig,
    /// Which adapter: its index in the adapter list (`"0"`), or a case-insensitive part of
    /// its name, backend or type (`"nvidia"`, `"vulkan"`, `"cpu"`). `None`: the variable
    /// `STREAMPOOL_WGPU_ADAPTER` if set, else the best adapter: discrete, then integrated,
    /// then virtual GPUs, then (if `allow_software`) software ones.
    pub adapter: Option<String>,
    /// Whether a software adapter (Mesa's lavapipe, WARP) may be picked when no GPU is found.
    pub allow_software: bool,
    /// The quarantine lock (see the module docs).
    pub quarantine: Quarantine,
    /// The matmul kernel: `Some(16)` the 16x16 tile with one output per invocation,
    /// `Some(64)` or `Some(128)` the register-blocked 64x64 (4x4 outputs per invocation) or
    /// 128x128 (8x8) tiles; `None` (unless the variable `STREAMPOOL_WGPU_MATMUL_TILE` names
    /// one): by shape, the GEMV kernel for one-row outputs, the 16x16 tile for other outputs
    /// under 64 rows or columns, else the largest
    /// blocked tile (128x128, 128x64, 64x64) that still fills the GPU. For tests and tuning;
    /// the variables `STREAMPOOL_WGPU_MATMUL_BLOCK=BMxBNxBK` (e.g. `128x64x16`) and
    /// `STREAMPOOL_WGPU_MATMUL_GROUPS` (workgroups a tile must give, default 256) tune the
    /// automatic choice. [`Device::wgpu_matmul_paths`] says what a device takes.
    pub matmul_tile: Option<u32>,
    /// The blocked tile `[BM, BN, BK]` the automatic choice takes wherever it takes a
    /// blocked one (BM and BN 64 or 128, BK 4, 8, 16 or 32); `None`: the variable
    /// `STREAMPOOL_WGPU_MATMUL_BLOCK` if set, else by shape. For tuning.
    pub matmul_block: Option<[u32; 3]>,
    /// f16 matmuls on cooperative matrices (matrix units; see [`CoopMatrix`]). Default
    /// [`CoopMatrix::Auto`]: only on adapters they were verified on.
    pub cooperative_matrix: CoopMatrix,
    /// The longest a host wait for the GPU (a synchronize, a read-back) may take before it
    /// fails with [`Error::Backend`] saying so, instead of blocking its caller for ever (a
    /// lost device fails at once). `None`: the variable `STREAMPOOL_WGPU_WAIT_LIMIT_S`
    /// (seconds) if set, else [`DEFAULT_WAIT_LIMIT`].
    pub wait_limit: Option<std::time::Duration>,
}

/// Whether f16 matmuls run on cooperative matrices (wgpu's experimental
/// `EXPERIMENTAL_COOPERATIVE_MATRIX`: Vulkan's `VK_KHR_cooperative_matrix`, Apple's
/// simdgroup matrices), the kernels of `wgpu/coop.rs`. They are taken only where the
/// adapter reports the feature, lists 16x16x16 f16 -> f32 products, has `SHADER_F16` and
/// `SUBGROUP` with 32-wide subgroups, and then for f16 products of 64 rows and columns and
/// K of 32 or more; elsewhere the FMA kernels run. `Device::wgpu_cooperative_matrix` says
/// what the adapter offers and `Device::wgpu_matmul_paths` what each shape takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CoopMatrix {
    /// On where the adapter is one the kernels were run, checked and measured faster on
    /// (`wgpu/choice.rs`, `COOP_VERIFIED`), off elsewhere; the variable
    /// `STREAMPOOL_WGPU_COOP_MATRIX` overrides it: `0` off, `1` as [`CoopMatrix::On`],
    /// `emulate` as [`CoopMatrix::Emulated`].
    #[default]
    Auto,
    /// On wherever the adapter has what they need (the opt-in for unverified adapters).
    On,
    /// Off: the FMA kernels everywhere.
    Off,
    /// The same kernels with their matrix operations written out in plain WGSL, on any
    /// adapter with `SHADER_F16`: for checking their tiling, staging and epilogue on
    /// adapters without matrix units (lavapipe). Slow; for tests.
    Emulated,
}

/// The default of [`WgpuConfig::wait_limit`]: far above any one submission of ours (the
/// largest MiniLM batch's forward takes milliseconds on the H100, a second on lavapipe).
pub const DEFAULT_WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

impl Default for WgpuConfig {
    fn default() -> Self {
        Self {
            device: DeviceConfig::default(),
            adapter: None,
            allow_software: true,
            quarantine: Quarantine::Auto,
            matmul_tile: None,
            matmul_block: None,
            cooperative_matrix: CoopMatrix::Auto,
            wait_limit: None,
        }
    }
}
