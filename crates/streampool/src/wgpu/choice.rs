//! Which matmul kernel a wgpu launch takes, by shape and by what the device was opened with:
//! the GEMV kernel for one-row outputs, the 16x16 tile for other thin outputs, the
//! cooperative-matrix kernels ([`coop`]) for f16 products where they are on, else the
//! register-blocked FMA kernels ([`blocked`]). `streampool check --device wgpu` prints the
//! choice for the models' shapes (`Device::wgpu_matmul_paths`).

use super::coop;

/// Which matmul kernel a launch takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MatmulPath {
    /// The 16x16 tile, one output per invocation: thin or small outputs.
    Simple,
    /// A single output row (`Which::Gemv`): batch-1 layers.
    Gemv,
    /// A register-blocked `bm x bn` tile with `bk`-deep slices (`blocked`).
    Blocked { bm: u32, bn: u32, bk: u32 },
    /// A `bm x bn` block on cooperative matrices with `bk`-deep slices ([`coop`]; f16 only).
    Coop { bm: u32, bn: u32, bk: u32 },
}

/// How the cooperative-matrix kernels are taken on a device that has them on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CoopChoice {
    /// Matrix operations written out in plain WGSL ([`coop::Spec::emulate`]): for tests on
    /// adapters without matrix units.
    pub(crate) emulate: bool,
    /// Workgroup memory the device allows, in bytes: a tile is taken with 32-deep slices
    /// where they fit, else 16-deep, else not at all.
    pub(crate) workgroup_bytes: u32,
}

/// How the device picks matmul kernels ([`WgpuConfig`](super::WgpuConfig)'s `matmul_tile`,
/// `matmul_block`, `cooperative_matrix` and the tuning variables).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MatmulChoice {
    /// `Some(16)`: always the 16x16 tile; `Some(64)` / `Some(128)`: always the blocked
    /// 64x64 / 128x128 tile (tests); `None`: by shape.
    pub(crate) forced: Option<u32>,
    /// The blocked (or cooperative) tile to take where the shape calls for one (tuning),
    /// instead of the largest of 128x128, 128x64, 64x64 that gives `groups` workgroups.
    pub(crate) block: Option<(u32, u32, u32)>,
    /// Workgroups a blocked launch should give at least before a larger tile is taken.
    pub(crate) groups: usize,
    /// Cooperative matrices, where the device has them on (see `WgpuConfig`).
    pub(crate) coop: Option<CoopChoice>,
}

impl Default for MatmulChoice {
    fn default() -> Self {
        Self {
            forced: None,
            block: None,
            groups: DEFAULT_GROUPS,
            coop: None,
        }
    }
}

/// Workgroups a blocked matmul should fill before a larger tile is taken: about two per
/// multiprocessor of a large GPU (an H100 has 132). Tuned on the H100 through Vulkan
/// (`bench/results/wgpu-fma-matmul/`): with 256 the automatic choice is within 11% of the
/// best of the ten tiles swept at each of its shapes (f32).
pub(crate) const DEFAULT_GROUPS: usize = 256;
/// Slice depth of the automatic blocked tiles.
const DEFAULT_BK: u32 = 16;
/// The smallest K the cooperative-matrix kernels take: one 32-deep slice. Below it a
/// product is a handful of FMAs per output and the FMA kernels' single slice is as quick.
const COOP_MIN_K: usize = 32;

/// The matmul kernel for an output of `batch` x `m` x `n` over `k`: one row (batch-1
/// layers) by the GEMV kernel, the 16x16 tile for other thin outputs (fewer than 64 rows or
/// columns: attention's per-head products), f16 products on cooperative matrices where the
/// device has them on (and K is at least [`COOP_MIN_K`]), else the largest blocked tile
/// (128x128, 128x64, 64x64) that still gives `groups` workgroups.
pub(crate) fn matmul_kernel(
    c: &MatmulChoice,
    half: bool,
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
) -> MatmulPath {
    match c.forced {
        Some(16) => return MatmulPath::Simple,
        Some(t @ (64 | 128)) => {
            return MatmulPath::Blocked {
                bm: t,
                bn: t,
                bk: DEFAULT_BK,
            }
        }
        _ => {}
    }
    if m == 1 {
        return MatmulPath::Gemv;
    }
    if m < 64 || n < 64 {
        return MatmulPath::Simple;
    }
    let groups = |bm: usize, bn: usize| batch * m.div_ceil(bm) * n.div_ceil(bn);
    let by_shape = || {
        [(128, 128), (128, 64), (64, 64)]
            .into_iter()
            .find(|&(bm, bn)| groups(bm, bn) >= c.groups)
            .unwrap_or((64, 64))
    };
    if let Some(cc) = c.coop.filter(|_| half && k >= COOP_MIN_K) {
        let (bm, bn, bk) = match c.block {
            Some((bm, bn, bk)) if coop::valid(bm, bn, bk) => (bm, bn, Some(bk)),
            _ => {
                let (bm, bn) = by_shape();
                (bm as u32, bn as u32, None)
            }
        };
        // The largest footprint of the layouts (B staged along K), as the layout is only
        // known at launch.
        let fits = |bk: u32| {
            let spec = coop::Spec {
                bm,
                bn,
                bk,
                layout: coop::Layout::AlongK,
                emulate: cc.emulate,
            };
            spec.workgroup_bytes() <= cc.workgroup_bytes
        };
        let bk = match bk {
            Some(bk) => Some(bk).filter(|&bk| fits(bk)),
            None => [32, 16].into_iter().find(|&bk| fits(bk)),
        };
        if let Some(bk) = bk {
            return MatmulPath::Coop { bm, bn, bk };
        }
    }
    if let Some((bm, bn, bk)) = c
        .block
        .filter(|&(bm, bn, bk)| super::blocked::valid(bm, bn, bk))
    {
        return MatmulPath::Blocked { bm, bn, bk };
    }
    let (bm, bn) = by_shape();
    MatmulPath::Blocked {
        bm: bm as u32,
        bn: bn as u32,
        bk: DEFAULT_BK,
    }
}

/// Invocations per output column of the GEMV kernel (32 to 256, a power of two): the
/// fewest that still give [`GEMV_GROUPS`] workgroups (256 / lanes columns each), and no more
/// than `k` needs.
pub(crate) fn gemv_lanes(batch: usize, n: usize, k: usize) -> usize {
    let mut lanes = 32;
    while lanes < 256 && lanes < k && batch * n.div_ceil(256 / lanes) < GEMV_GROUPS {
        lanes *= 2;
    }
    lanes
}

/// Workgroups a GEMV launch should give where the output allows: about one per
/// multiprocessor of a large GPU (the H100 has 132), so that narrow batch-1 layers read
/// their weight with the whole GPU.
const GEMV_GROUPS: usize = 128;

/// Adapters the cooperative-matrix kernels ran on, were checked against float64 and the
/// real model's accuracy bounds, and beat the FMA kernels at the models' shapes: `(PCI
/// vendor id, backend, a part of the adapter's name)`. `WgpuCoopMatrix::Auto` takes them
/// only on these. The H100 through NVIDIA's Vulkan driver (580.159.04)
/// (`bench/results/wgpu/`): the `streampool` wgpu suite 74/74 with the kernels
/// on (alone and two at once), the real MiniLM f16 at min cosine 0.9999982 to
/// sentence-transformers, and every MiniLM product shape 1.6-2.3x the FMA kernels (2048^3:
/// 107.6 against 32.0 TFLOP/s). Another adapter (the H200 included) is added only after the
/// same checks ran on it.
pub(crate) const COOP_VERIFIED: &[(u32, wgpu::Backend, &str)] =
    &[(0x10de, wgpu::Backend::Vulkan, "H100")];

/// Whether the adapter `(vendor, backend, name)` is one of `verified`.
pub(crate) fn coop_verified(
    vendor: u32,
    backend: wgpu::Backend,
    name: &str,
    verified: &[(u32, wgpu::Backend, &str)],
) -> bool {
    verified
        .iter()
        .any(|&(v, b, part)| v == vendor && b == backend && name.contains(part))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(workgroup_bytes: u32) -> MatmulChoice {
        MatmulChoice {
            coop: Some(CoopChoice {
                emulate: false,
                workgroup_bytes,
            }),
            ..MatmulChoice::default()
        }
    }

    #[test]
    fn coop_takes_f16_products_that_fit_and_nothing_else() {
        let c = on(49_152);
        // MiniLM's GEMMs at 2048 rows: 128x64 blocks give 288 workgroups for QKV.
        assert_eq!(
            matmul_kernel(&c, true, 1, 2048, 384, 1152),
            MatmulPath::Coop {
                bm: 128,
                bn: 64,
                bk: 32
            }
        );
        assert_eq!(
            matmul_kernel(&c, true, 1, 8192, 384, 1536),
            MatmulPath::Coop {
                bm: 128,
                bn: 128,
                bk: 32
            }
        );
        // f32, thin outputs, one row, shallow K: the FMA kernels.
        assert!(matches!(
            matmul_kernel(&c, false, 1, 2048, 384, 1152),
            MatmulPath::Blocked { .. }
        ));
        assert_eq!(matmul_kernel(&c, true, 1, 32, 384, 384), MatmulPath::Simple);
        assert_eq!(matmul_kernel(&c, true, 1, 1, 384, 384), MatmulPath::Gemv);
        assert!(matches!(
            matmul_kernel(&c, true, 1, 2048, 16, 384),
            MatmulPath::Blocked { .. }
        ));
        // 32 KiB of workgroup memory: 16-deep slices for the largest tile.
        assert_eq!(
            matmul_kernel(&on(32_768), true, 1, 8192, 384, 1536),
            MatmulPath::Coop {
                bm: 128,
                bn: 128,
                bk: 16
            }
        );
        // Too little for any: the FMA kernels.
        assert!(matches!(
            matmul_kernel(&on(16_384), true, 1, 8192, 384, 1536),
            MatmulPath::Blocked { .. }
        ));
        // A forced coop tile; a forced FMA-only slice depth leaves coop to its own.
        let forced = |block| MatmulChoice {
            block: Some(block),
            ..on(49_152)
        };
        assert_eq!(
            matmul_kernel(&forced((64, 128, 16)), true, 1, 2048, 384, 384),
            MatmulPath::Coop {
                bm: 64,
                bn: 128,
                bk: 16
            }
        );
        assert_eq!(
            matmul_kernel(&forced((64, 64, 8)), true, 1, 2048, 384, 384),
            MatmulPath::Coop {
                bm: 64,
                bn: 64,
                bk: 32
            }
        );
        assert_eq!(
            matmul_kernel(&forced((64, 64, 8)), false, 1, 2048, 384, 384),
            MatmulPath::Blocked {
                bm: 64,
                bn: 64,
                bk: 8
            }
        );
        // Off: the FMA kernels.
        assert!(matches!(
            matmul_kernel(&MatmulChoice::default(), true, 1, 2048, 384, 1152),
            MatmulPath::Blocked { .. }
        ));
    }

    #[test]
    fn verified_adapters_match_vendor_backend_and_name() {
        let list = [(0x10de, wgpu::Backend::Vulkan, "H100")];
        let h100 = "NVIDIA H100 80GB HBM3";
        assert!(coop_verified(0x10de, wgpu::Backend::Vulkan, h100, &list));
        assert!(!coop_verified(
            0x10de,
            wgpu::Backend::Vulkan,
            "NVIDIA L4",
            &list
        ));
        assert!(!coop_verified(0x10de, wgpu::Backend::Dx12, h100, &list));
        assert!(!coop_verified(0x1002, wgpu::Backend::Vulkan, h100, &list));
    }
}
