//! cuBLAS: one handle per stream, bound to that stream for its whole life, with its own
//! workspace.
//!
//! Why per stream: a handle's stream and workspace are handle state, and cuBLAS warns that
//! changing a shared handle's configuration from several threads races (cuBLAS docs, "Thread
//! Safety"). PyTorch learned the same about workspaces shared by streams. So a handle is
//! created lazily for one stream, `cublasSetStream` is called once, and the stream's mutex
//! around it makes sure two threads sharing the stream (more threads than streams) never use
//! the handle at the same moment. The lock is held only while the gemm is *queued*.
//!
//! Math modes: an `F32` gemm with [`MatmulMath::Exact`] is `cublasSgemmStridedBatched` under
//! `CUBLAS_DEFAULT_MATH` (full fp32, matching the CPU backend to 1e-5); with
//! [`MatmulMath::Tf32`] it is `cublasGemmStridedBatchedEx` with
//! `CUBLAS_COMPUTE_32F_FAST_TF32` (tensor cores, inputs rounded to TF32). `F16`/`BF16` gemms
//! are `cublasGemmStridedBatchedEx` with half inputs and output and `CUBLAS_COMPUTE_32F`
//! (tensor cores, fp32 accumulation), as PyTorch's default for half matmuls.

use std::ffi::c_void;
use std::os::raw::{c_int, c_longlong};

use cudarc::cublas::result as blas;
use cudarc::cublas::sys::{
    self as bsys, cublasComputeType_t, cublasGemmAlgo_t, cublasHandle_t, cublasMath_t,
    cublasOperation_t, cudaDataType,
};
use cudarc::driver::{result, sys};

use super::blas_lt::{BlasLt, LtOperand};
use crate::kernel::{Activation, MatOperand, MatmulMath};
use crate::{DType, Error, Result};

/// Workspace per handle. cuBLAS recommends up to 32 MiB on Hopper for large problems; the
/// small gemms of inference need far less, and a pool of 32 streams must not hold 1 GiB.
const WORKSPACE_BYTES: usize = 4 << 20;

/// A cuBLAS handle bound to one stream, and its workspace.
pub(crate) struct Blas {
    handle: cublasHandle_t,
    workspace: sys::CUdeviceptr,
    device: String,
    stream: sys::CUstream,
    /// cuBLASLt for matmuls with a bias, created on the first one.
    lt: Option<BlasLt>,
}

// SAFETY: the handle and workspace are only used under the owning stream's mutex, one thread
// at a time; cuBLAS allows a handle to move between threads.
unsafe impl Send for Blas {}

fn blas_err(device: &str, what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Backend {
        device: device.to_string(),
        msg: format!("cuBLAS {what}: {e:?}"),
    }
}

impl Blas {
    /// Creates a handle for `stream` (the caller has bound the context to this thread).
    pub(crate) fn new(stream: sys::CUstream, device: &str) -> Result<Self> {
        let handle = blas::create_handle().map_err(|e| blas_err(device, "create", e))?;
        // From here on `Drop` cleans up whatever was set up.
        let mut this = Self {
            handle,
            workspace: 0,
            device: device.to_string(),
            stream,
            lt: None,
        };
        // SAFETY: `handle` is live; the stream belongs to this context.
        unsafe { blas::set_stream(handle, stream as _) }
            .map_err(|e| blas_err(device, "set stream", e))?;
        // SAFETY: plain allocation in the current (bound) context.
        this.workspace = unsafe { result::malloc_sync(WORKSPACE_BYTES) }
            .map_err(|e| super::driver_err(device, e))?;
        // SAFETY: live handle; the workspace is ours, of the size given, and lives as long as
        // the handle. Set after `cublasSetStream`, which resets the workspace.
        unsafe {
            bsys::cublasSetWorkspace_v2(handle, this.workspace as *mut _, WORKSPACE_BYTES)
                .result()
                .map_err(|e| blas_err(device, "set workspace", e))?;
            bsys::cublasSetMathMode(handle, cublasMath_t::CUBLAS_DEFAULT_MATH)
                .result()
                .map_err(|e| blas_err(device, "set math mode", e))?;
        }
        Ok(this)
    }

    /// Queues `out[b] = a[b] @ b[b]` (row-major) on the handle's stream.
    ///
    /// Row-major through a column-major library: a row-major `[r, c]` matrix read column-major
    /// is its transpose, so we ask cuBLAS for `out^T = b^T a^T`, which it writes as exactly
    /// the row-major `out`.
    ///
    /// # Safety
    /// The operands' pointers are valid for the extents described, in `dtype`; `out` holds
    /// `batch * m * n` elements of `dtype`.
    pub(crate) unsafe fn matmul(
        &self,
        a: &MatOperand,
        b: &MatOperand,
        out: u64,
        (batch, m, n, k): (usize, usize, usize, usize),
        dtype: DType,
        math: MatmulMath,
    ) -> Result<()> {
        let int = |v: usize| {
            c_int::try_from(v).map_err(|_| {
                Error::InvalidArgument(format!("matmul: dimension {v} too large for cuBLAS"))
            })
        };
        let (op_b, ld_b) = transposed(b, k, n, &self.device)?;
        let (op_a, ld_a) = transposed(a, m, k, &self.device)?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (data, compute) = match (dtype, math) {
            (DType::F32, MatmulMath::Exact) => (None, cublasComputeType_t::CUBLAS_COMPUTE_32F),
            (DType::F32, MatmulMath::Tf32) => (
                Some(cudaDataType::CUDA_R_32F),
                cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            ),
            (DType::F16, _) => (
                Some(cudaDataType::CUDA_R_16F),
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            (DType::BF16, _) => (
                Some(cudaDataType::CUDA_R_16BF),
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            (DType::I64, _) => {
                return Err(Error::InvalidArgument("matmul of I64 tensors".into()));
            }
            // The tensor layer refuses int8 products on CUDA before they get here.
            (DType::F32, MatmulMath::Int8) => {
                return Err(Error::Unavailable("int8 matmul on CUDA".into()));
            }
        };
        if let Some(t) = data {
            // SAFETY: as below; with CUBLAS_COMPUTE_32F* the scalars are f32 host values.
            return unsafe {
                blas::gemm_strided_batched_ex(
                    self.handle,
                    op_b,
                    op_a,
                    int(n)?,
                    int(m)?,
                    int(k)?,
                    (&alpha as *const f32).cast::<c_void>(),
                    b.ptr.0 as *const c_void,
                    t,
                    int(ld_b)?,
                    b.batch_stride as c_longlong,
                    a.ptr.0 as *const c_void,
                    t,
                    int(ld_a)?,
                    a.batch_stride as c_longlong,
                    (&beta as *const f32).cast::<c_void>(),
                    out as *mut c_void,
                    t,
                    int(n)?,
                    (m * n) as c_longlong,
                    int(batch)?,
                    compute,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
                )
            }
            .map_err(|e| blas_err(&self.device, "gemm_ex", e));
        }
        // SAFETY: the caller guarantees the extents; alpha/beta are host scalars (the default
        // pointer mode) read during the call.
        unsafe {
            blas::sgemm_strided_batched(
                self.handle,
                op_b,
                op_a,
                int(n)?,
                int(m)?,
                int(k)?,
                &alpha,
                b.ptr.0 as *const f32,
                int(ld_b)?,
                b.batch_stride as c_longlong,
                a.ptr.0 as *const f32,
                int(ld_a)?,
                a.batch_stride as c_longlong,
                &beta,
                out as *mut f32,
                int(n)?,
                (m * n) as c_longlong,
                int(batch)?,
            )
        }
        .map_err(|e| blas_err(&self.device, "sgemm", e))
    }
}

/// How cuBLAS should read the transpose of a row-major `[rows, cols]` operand: `N` with
/// leading dimension `rs` if rows are contiguous (`cs == 1`), else `T` with `cs` (`rs == 1`).
/// Strides of extent-1 dimensions are arbitrary, so they are replaced by a valid minimum.
impl Blas {
    /// Row-major `out[m, n] = act(a[m, k] @ b[k, n] + bias[n] (+ residual[m, n]))` in one
    /// cuBLASLt GEMM with a bias (and activation) epilogue, the residual as its `C` operand. `Ok(false)` when this shape, math or activation has no
    /// such plan (f32 with TF32, the erf GELU, or cuBLASLt found no algorithm): the caller
    /// then runs the GEMM and a bias + activation kernel.
    ///
    /// # Safety
    /// As [`Blas::matmul`]; `bias` holds `n` elements of `dtype`, `residual` (if any) `m * n`
    /// contiguous ones that `out` does not overlap.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn matmul_bias(
        &mut self,
        a: &MatOperand,
        b: &MatOperand,
        bias: u64,
        residual: Option<u64>,
        act: Activation,
        out: u64,
        (m, n, k): (usize, usize, usize),
        dtype: DType,
        math: MatmulMath,
    ) -> Result<bool> {
        if dtype == DType::F32 && math == MatmulMath::Tf32 {
            return Ok(false);
        }
        let (op_b, ld_b) = transposed(b, k, n, &self.device)?;
        let (op_a, ld_a) = transposed(a, m, k, &self.device)?;
        let lt = match &mut self.lt {
            Some(lt) => lt,
            None => self.lt.insert(crate::phases::timed("cuBLASLt handle", || {
                BlasLt::new(&self.device)
            })?),
        };
        let t = |op| op == cublasOperation_t::CUBLAS_OP_T;
        // cuBLAS is column-major: the row-major product is out^T = b^T @ a^T, whose rows are
        // the output's columns, so the epilogue's per-row bias is the per-column bias here.
        let lt_a = LtOperand {
            ptr: b.ptr.0,
            transposed: t(op_b),
            ld: ld_b,
        };
        let lt_b = LtOperand {
            ptr: a.ptr.0,
            transposed: t(op_a),
            ld: ld_a,
        };
        // SAFETY: forwarded from the caller; the workspace is this stream's, and work on
        // one stream runs in order.
        unsafe {
            lt.matmul_bias(
                &lt_a,
                &lt_b,
                bias,
                residual,
                act,
                out,
                (n, m, k),
                dtype,
                self.stream,
                (self.workspace, WORKSPACE_BYTES),
            )
        }
    }
}

fn transposed(
    x: &MatOperand,
    rows: usize,
    cols: usize,
    device: &str,
) -> Result<(cublasOperation_t, usize)> {
    if x.cs == 1 || cols <= 1 {
        let ld = if rows <= 1 { cols.max(1) } else { x.rs };
        if ld >= cols.max(1) {
            return Ok((cublasOperation_t::CUBLAS_OP_N, ld));
        }
    }
    if x.rs == 1 || rows <= 1 {
        let ld = if cols <= 1 { rows.max(1) } else { x.cs };
        if ld >= rows.max(1) {
            return Ok((cublasOperation_t::CUBLAS_OP_T, ld));
        }
    }
    Err(Error::Backend {
        device: device.to_string(),
        msg: format!(
            "matmul: operand strides ({}, {}) overlap for [{rows}, {cols}]",
            x.rs, x.cs
        ),
    })
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle is ours and unused from now on; the owning stream was
        // synchronized before its handle is dropped, so the workspace is idle.
        unsafe {
            let _ = blas::destroy_handle(self.handle);
            if self.workspace != 0 {
                let _ = result::free_sync(self.workspace);
            }
        }
    }
}
