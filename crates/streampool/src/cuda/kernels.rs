//! The CUDA backend's launcher: the `match` from [`Kernel`] to the function of each
//! operation, which picks among NVRTC kernels (and cuBLAS) and launches. Those functions are
//! in this module's children, one per kernel group (`basic`, `norm`, `act`, `pool`,
//! `attention`) and `matmul` for the products.
//!
//! The functions it launches are [`Module`]'s: `kernels.cu` in groups, each built once per
//! device at the first launch of one of its kernels on any of its streams (or earlier, by
//! `Device::load_kernels`, which builds them all on several threads); threads racing to a
//! group's first launch wait for its single build.

use std::ffi::c_void;

use cudarc::driver::sys::{CUfunction, CUstream};
use cudarc::driver::{result, CudaFunction, DeviceRepr};

use super::blas::Blas;
use super::driver_err;
use super::module::Module;
use crate::kernel::{Kernel, Strided};
use crate::sync::Mutex;
use crate::{DType, Error, Result};

/// Most dimensions a strided kernel takes after coalescing (`SP_MAX_DIMS` in `kernels.cu`).
const MAX_DIMS: usize = 8;
/// Threads per block of element-wise kernels.
const THREADS: u32 = 256;
/// Most blocks of an element-wise launch (grid-stride loops cover the rest).
const MAX_BLOCKS: usize = 65_535;

/// `struct Dims` of `kernels.cu`: shape and two operands' strides, row-major order.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Dims {
    rank: u64,
    shape: [u64; MAX_DIMS],
    sa: [u64; MAX_DIMS],
    sb: [u64; MAX_DIMS],
}

// SAFETY: plain `repr(C)` data of integers, laid out as `struct Dims` in `kernels.cu`.
unsafe impl DeviceRepr for Dims {}

/// `sp_cast`'s dtype codes.
fn dtype_code(dtype: DType) -> Result<i32> {
    match dtype {
        DType::F32 => Ok(0),
        DType::F16 => Ok(1),
        DType::BF16 => Ok(2),
        DType::I64 => Err(Error::InvalidArgument("cast to or from I64".into())),
    }
}

/// Head widths the fused attention kernel is compiled for (`SP_ATTN` in `kernels.cu`); a
/// head is zero-padded to the next one. Queries per block of that kernel.
const ATTENTION_HEAD_DIMS: [usize; 4] = [16, 32, 64, 128];
const ATTENTION_QUERIES: u32 = 64;

/// Everything a launch needs from its stream.
pub(crate) struct Launcher<'a> {
    pub(crate) module: &'a Module,
    pub(crate) stream: CUstream,
    /// The stream's cuBLAS handle, created on the first matmul.
    pub(crate) blas: &'a Mutex<Option<Blas>>,
    pub(crate) device: &'a str,
}

/// Argument pointers for `cuLaunchKernel`: each points at a live local of the right type.
macro_rules! args {
    ($($a:expr),* $(,)?) => { [$(&$a as *const _ as *mut std::ffi::c_void),*] };
}

// One child per kernel group of `kernels.cu` (`Module`'s groups), plus cuBLAS's products;
// each adds to `Launcher` the functions of its operations. Declared after `args!`, which
// they use. SAFETY (every launch in them): each argument list matches its kernel's
// parameter list in `kernels.cu` (same order, same widths), and the pointers are valid per
// the caller of `Launcher::launch`.
mod act;
mod attention;
mod basic;
mod matmul;
mod norm;
mod pool;

/// Groups of 4 columns per lane of the warp-per-row layer norm (`SP_LN_GROUPS`): rows up to
/// 4 * 32 * 8 = 1024 columns. Rows (warps) per block of that kernel.
const LN_GROUPS: usize = 8;
/// `sp_pool_rows`: warps per block and the widest row (`SP_POOL_WARPS`, `SP_POOL_MAX_DIM`).
const POOL_WARPS: u32 = 8;
const POOL_MAX_DIM: usize = 1024;
/// Warps per block of the tensor-core attention (`__launch_bounds__(128, ..)` in kernels.cu).
const MMA_WARPS: usize = 4;
const LN_ROWS_PER_BLOCK: usize = 8;

/// Whether f16/bf16 layer norms take `sp_layer_norm_vec8` (a half-warp per row, 16-byte
/// accesses) rather than the warp-per-row kernel: yes unless the tunables' `cuda.layer_norm`
/// says `warp` (`STREAMPOOL_CUDA_LN=warp`), kept to compare the two on a GPU (on the H100
/// the 13 layer norms of a 512 x 128 MiniLM forward took 0.739 ms against 0.915).
fn ln_vec8() -> bool {
    crate::config::tuning().cuda.layer_norm == crate::config::CudaLayerNorm::Vec8
}

/// Whether every non-null address is 16-byte aligned, as the vectorized kernels' 16-byte
/// (f32) and 8-byte (half) accesses need. Views at odd element offsets take the scalar kernels.
fn aligned16(ptrs: &[u64]) -> bool {
    ptrs.iter().all(|&p| p % 16 == 0)
}

fn grid(n: usize) -> u32 {
    n.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32
}

impl Launcher<'_> {
    /// Launches `f` with `blocks x threads` and the given argument pointers.
    ///
    /// # Safety
    /// `args` match `f`'s parameter list in number and type and point at live values.
    unsafe fn go(
        &self,
        f: &CudaFunction,
        blocks: u32,
        threads: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        self.go3(f, (blocks, 1, 1), threads, args)
    }

    /// A one-block-per-row kernel over `rows` rows of `cols` columns (the softmax, reduction,
    /// layer and RMS norm, pooling fallbacks): a block per row (grid-stride past
    /// `MAX_BLOCKS`), enough warps for the row, at most 1024 threads.
    ///
    /// # Safety
    /// As [`Launcher::go`].
    unsafe fn go_rows(
        &self,
        f: &CudaFunction,
        rows: usize,
        cols: usize,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let threads = (cols.div_ceil(32) * 32).clamp(32, 1024) as u32;
        // SAFETY: per the caller.
        unsafe { self.go(f, rows.min(MAX_BLOCKS) as u32, threads, args) }
    }

    /// [`Launcher::go`] with a 3-d grid.
    ///
    /// # Safety
    /// As [`Launcher::go`].
    unsafe fn go3(
        &self,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        threads: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let func: CUfunction = f.cu_function();
        // SAFETY: per the caller; the stream is live and bound to this thread's context.
        unsafe { result::launch_kernel(func, grid, (threads, 1, 1), 0, self.stream, args) }
            .map_err(|e| driver_err(self.device, e))
    }

    /// Queues `kernel`: nothing for an empty one, else through the function of its
    /// operation (in this module's children).
    ///
    /// # Safety
    /// As [`crate::backend::BackendStream::launch`].
    pub(crate) unsafe fn launch(&self, kernel: Kernel) -> Result<()> {
        if kernel.is_empty() {
            return Ok(());
        }
        match kernel {
            Kernel::Fill(p) => self.fill(p),
            Kernel::Cast(p) => self.cast(p),
            Kernel::Sleep { nanos } => self.sleep(nanos),
            Kernel::Copy(p) => self.copy(p),
            Kernel::Matmul(p) => self.matmul(p),
            Kernel::Unary(p) => self.unary(p),
            Kernel::Binary(p) => self.binary(p),
            Kernel::Softmax(p) => self.softmax(p),
            Kernel::LayerNorm(p) => self.layer_norm(p),
            Kernel::BiasAct(p) => self.bias_act(p),
            Kernel::IndexSelect(p) => self.index_select(p),
            Kernel::Reduce(p) => self.reduce(p),
            Kernel::Attention(p) => self.attention(p),
            Kernel::MeanPoolNorm(p) => self.mean_pool_norm(p),
            Kernel::RmsNorm(p) => self.rms_norm(p),
            Kernel::Rope(p) => self.rope(p),
            Kernel::GatedAct(p) => self.gated_act(p),
            Kernel::MeanPoolNormPacked(p) => self.mean_pool_norm_packed(p),
        }
    }
}

/// Packs `shape` and two operands' strides, merging dimensions that are contiguous in both
/// operands and dropping extent-1 dimensions, into at most [`MAX_DIMS`] dimensions.
fn dims(shape: &[usize], a: &Strided, b: &Strided, device: &str) -> Result<Dims> {
    // (extent, stride a, stride b), outermost first, extent-1 dims dropped.
    // Inline up to 8 dimensions: no heap allocation per strided launch.
    let mut merged: smallvec::SmallVec<[(usize, usize, usize); 8]> = smallvec::SmallVec::new();
    for (i, &n) in shape.iter().enumerate() {
        if n == 1 {
            continue;
        }
        let (sa, sb) = (a.strides[i], b.strides[i]);
        match merged.last_mut() {
            // The previous (outer) dim steps exactly over this one in both operands.
            Some(last) if last.1 == sa * n && last.2 == sb * n => {
                last.0 *= n;
                last.1 = sa;
                last.2 = sb;
            }
            _ => merged.push((n, sa, sb)),
        }
    }
    if merged.len() > MAX_DIMS {
        return Err(Error::Backend {
            device: device.to_string(),
            msg: format!(
                "strided kernel: {} dimensions after merging, at most {MAX_DIMS}",
                merged.len()
            ),
        });
    }
    let mut d = Dims {
        rank: merged.len() as u64,
        ..Dims::default()
    };
    for (k, &(n, sa, sb)) in merged.iter().enumerate() {
        d.shape[k] = n as u64;
        d.sa[k] = sa as u64;
        d.sb[k] = sb as u64;
    }
    if merged.is_empty() {
        // A single element: one dimension of extent 1.
        d.rank = 1;
        d.shape[0] = 1;
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::DevicePtr;

    fn strided(strides: &[usize]) -> Strided {
        Strided {
            ptr: DevicePtr(0),
            strides: strides.into(),
        }
    }

    #[test]
    fn dims_merge_contiguous_and_keep_broadcast() {
        // A dense [2, 3, 4] against a row broadcast over the first two dims.
        let d = dims(&[2, 3, 4], &strided(&[12, 4, 1]), &strided(&[0, 0, 1]), "t").unwrap();
        assert_eq!(d.rank, 2);
        assert_eq!(&d.shape[..2], &[6, 4]);
        assert_eq!(&d.sa[..2], &[4, 1]);
        assert_eq!(&d.sb[..2], &[0, 1]);
        // A transposed view does not merge.
        let d = dims(&[3, 2], &strided(&[1, 3]), &strided(&[2, 1]), "t").unwrap();
        assert_eq!(d.rank, 2);
        // A scalar.
        let d = dims(&[], &strided(&[]), &strided(&[]), "t").unwrap();
        assert_eq!((d.rank, d.shape[0], d.sa[0]), (1, 1, 0));
    }
}
