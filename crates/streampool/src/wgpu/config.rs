//! The settings of a wgpu device: [`WgpuConfig`] and the choices it holds.

use crate::DeviceConfig;

pub use crate::config::{
    WgpuCoopMatrix as CoopMatrix, WgpuQuarantine as Quarantine,
    WGPU_DEFAULT_WAIT_LIMIT as DEFAULT_WAIT_LIMIT,
};

/// Settings of a wgpu device. Fields left at `None` or `Auto` take the process's tunables
/// ([`WgpuTuning`](crate::config::WgpuTuning), from the environment unless the program set
/// them).
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
    /// its name, backend or type (`"nvidia"`, `"vulkan"`, `"cpu"`). `None`: the tunables'
    /// `wgpu.adapter` (`STREAMPOOL_WGPU_ADAPTER`) if set, else the best adapter: discrete,
    /// then integrated, then virtual GPUs, then (if `allow_software`) software ones.
    pub adapter: Option<String>,
    /// Whether a software adapter (Mesa's lavapipe, WARP) may be picked when no GPU is found.
    pub allow_software: bool,
    /// The quarantine lock (see the module docs).
    pub quarantine: Quarantine,
    /// The matmul kernel: `Some(16)` the 16x16 tile with one output per invocation,
    /// `Some(64)` or `Some(128)` the register-blocked 64x64 (4x4 outputs per invocation) or
    /// 128x128 (8x8) tiles; `None` (unless the tunables' `wgpu.matmul_tile`,
    /// `STREAMPOOL_WGPU_MATMUL_TILE`, names one): by shape, the GEMV kernel for one-row
    /// outputs, the 16x16 tile for other outputs under 64 rows or columns, else the largest
    /// blocked tile (128x128, 128x64, 64x64) that still fills the GPU. For tests and tuning;
    /// the tunables' `wgpu.matmul_block` (`STREAMPOOL_WGPU_MATMUL_BLOCK=BMxBNxBK`, e.g.
    /// `128x64x16`) and `wgpu.matmul_groups` (`STREAMPOOL_WGPU_MATMUL_GROUPS`, workgroups a
    /// tile must give, default 256) tune the automatic choice.
    /// [`Device::wgpu_matmul_paths`] says what a device takes.
    pub matmul_tile: Option<u32>,
    /// The blocked tile `[BM, BN, BK]` the automatic choice takes wherever it takes a
    /// blocked one (BM and BN 64 or 128, BK 4, 8, 16 or 32); `None`: the tunables'
    /// `wgpu.matmul_block` (`STREAMPOOL_WGPU_MATMUL_BLOCK`) if set, else by shape. For tuning.
    pub matmul_block: Option<[u32; 3]>,
    /// f16 matmuls on cooperative matrices (matrix units; see [`CoopMatrix`]). Default
    /// [`CoopMatrix::Auto`]: as the tunables' `wgpu.cooperative_matrix`
    /// (`STREAMPOOL_WGPU_COOP_MATRIX`) says, by default only on adapters they were verified
    /// on.
    pub cooperative_matrix: CoopMatrix,
    /// The longest a host wait for the GPU (a synchronize, a read-back) may take before it
    /// fails with [`Error::Backend`] saying so, instead of blocking its caller for ever (a
    /// lost device fails at once). `None`: the tunables' `wgpu.wait_limit`
    /// (`STREAMPOOL_WGPU_WAIT_LIMIT_S`, seconds; default [`DEFAULT_WAIT_LIMIT`]).
    pub wait_limit: Option<std::time::Duration>,
}

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
