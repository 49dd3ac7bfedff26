//! The CUDA backend's launcher: the one `match` from [`Kernel`] to NVRTC kernels and cuBLAS.
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
use crate::kernel::{
    Activation, Attention, BiasAct, Binary, BinaryOp, Cast, Fill, GateActivation, GatedAct,
    IndexSelect, Kernel, LayerNorm, Matmul, MeanPoolNorm, MeanPoolNormPacked, Reduce, ReduceOp,
    RmsNorm, Rope, Softmax, Strided, StridedCopy, Unary, UnaryOp,
};
use crate::phases::timed;
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
    ($($a:expr),* $(,)?) => { [$(&$a as *const _ as *mut c_void),*] };
}

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
/// accesses) rather than the warp-per-row kernel: yes unless `STREAMPOOL_CUDA_LN=warp`, kept
/// to compare the two on a GPU (on the H100 the 13 layer norms of a 512 x 128 MiniLM forward
/// took 0.739 ms against 0.915).
fn ln_vec8() -> bool {
    static VEC8: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VEC8.get_or_init(|| std::env::var("STREAMPOOL_CUDA_LN").map_or(true, |v| v != "warp"))
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

    /// Queues `kernel`.
    ///
    /// # Safety
    /// As [`crate::backend::BackendStream::launch`].
    pub(crate) unsafe fn launch(&self, kernel: Kernel) -> Result<()> {
        let m = self.module;
        // SAFETY (every `go` below): each argument list matches its kernel's parameter list in
        // `kernels.cu` (same order, same widths), and the pointers are valid per the caller.
        match kernel {
            Kernel::Fill(Fill {
                out,
                len,
                value,
                dtype,
            }) => {
                if len == 0 {
                    return Ok(());
                }
                let (o, n) = (out.0, len as u64);
                self.go(
                    m.basic()?.fill.get(dtype)?,
                    grid(len),
                    THREADS,
                    &mut args![o, n, value],
                )
            }
            Kernel::Cast(Cast {
                x,
                out,
                len,
                from,
                to,
            }) => {
                if len == 0 {
                    return Ok(());
                }
                let (cf, ct) = (dtype_code(from)?, dtype_code(to)?);
                let (px, po, n) = (x.0, out.0, len as u64);
                self.go(
                    &m.basic()?.cast,
                    grid(len),
                    THREADS,
                    &mut args![cf, ct, px, po, n],
                )
            }
            Kernel::Sleep { nanos } => self.go(&m.basic()?.sleep, 1, 1, &mut args![nanos]),
            Kernel::Copy(StridedCopy {
                src,
                shape,
                out,
                elem_size,
            }) => {
                let n: usize = shape.iter().product();
                if n == 0 {
                    return Ok(());
                }
                let f = match elem_size {
                    2 => &m.basic()?.copy[0],
                    4 => &m.basic()?.copy[1],
                    8 => &m.basic()?.copy[2],
                    other => {
                        return Err(Error::InvalidArgument(format!(
                            "copy kernel: unsupported element size {other}"
                        )))
                    }
                };
                let d = dims(&shape, &src, &src, self.device)?;
                let (s, o, n64) = (src.ptr.0, out.0, n as u64);
                self.go(f, grid(n), THREADS, &mut args![s, o, n64, d])
            }
            Kernel::Matmul(Matmul {
                a,
                b,
                bias,
                residual,
                act,
                out,
                batch,
                m: rows,
                n,
                k,
                dtype,
                math,
                b_pack: _,
            }) => {
                if batch == 0 || rows == 0 || n == 0 {
                    return Ok(());
                }
                if k == 0 {
                    // An empty sum: zeros (cuBLAS may skip writing `out` when k == 0).
                    return self.launch(Kernel::Fill(Fill {
                        out,
                        len: batch * rows * n,
                        value: 0.0,
                        dtype,
                    }));
                }
                // Held only while the gemm is queued (never across a wait), so two threads
                // sharing this stream never drive its handle at once.
                let mut guard = self.blas.lock();
                if guard.is_none() {
                    *guard = Some(timed("cuBLAS handle", || {
                        Blas::new(self.stream, self.device)
                    })?);
                }
                let blas = guard.as_mut().expect("created above");
                if let (Some(bias), 1) = (bias, batch) {
                    let c = residual.map(|r| r.0);
                    if blas.matmul_bias(&a, &b, bias.0, c, act, out.0, (rows, n, k), dtype, math)? {
                        return Ok(());
                    }
                }
                blas.matmul(&a, &b, out.0, (batch, rows, n, k), dtype, math)?;
                drop(guard);
                // No epilogue for this shape: the bias and activation in place (each element
                // is read and then written by the same thread), then the residual if any.
                match bias {
                    Some(bias) => self.launch(Kernel::BiasAct(BiasAct {
                        x: out,
                        bias,
                        out,
                        rows: batch * rows,
                        cols: n,
                        act,
                        dtype,
                    }))?,
                    None if act == Activation::Identity => {}
                    None => {
                        return Err(Error::InvalidArgument(
                            "matmul: an activation epilogue needs a bias".into(),
                        ))
                    }
                }
                let Some(r) = residual else {
                    return Ok(());
                };
                let flat = |ptr| Strided {
                    ptr,
                    strides: smallvec::smallvec![1],
                };
                self.launch(Kernel::Binary(Binary {
                    op: BinaryOp::Add,
                    a: flat(out),
                    b: flat(r),
                    shape: smallvec::smallvec![batch * rows * n],
                    out,
                    dtype,
                }))
            }
            Kernel::Unary(Unary {
                op,
                x,
                out,
                len,
                dtype,
            }) => {
                if len == 0 {
                    return Ok(());
                }
                let (code, mul, add): (i32, f32, f32) = match op {
                    UnaryOp::Relu => (0, 1.0, 0.0),
                    UnaryOp::Gelu => (1, 1.0, 0.0),
                    UnaryOp::Tanh => (2, 1.0, 0.0),
                    UnaryOp::Exp => (3, 1.0, 0.0),
                    UnaryOp::Sqrt => (4, 1.0, 0.0),
                    UnaryOp::Sqr => (5, 1.0, 0.0),
                    UnaryOp::Neg => (6, 1.0, 0.0),
                    UnaryOp::Recip => (7, 1.0, 0.0),
                    UnaryOp::Affine { mul, add } => (8, mul, add),
                };
                let (px, po, n) = (x.0, out.0, len as u64);
                self.go(
                    m.basic()?.unary.get(dtype)?,
                    grid(len),
                    THREADS,
                    &mut args![code, px, po, n, mul, add],
                )
            }
            Kernel::Binary(Binary {
                op,
                a,
                b,
                shape,
                out,
                dtype,
            }) => {
                let n: usize = shape.iter().product();
                if n == 0 {
                    return Ok(());
                }
                let code: i32 = match op {
                    BinaryOp::Add => 0,
                    BinaryOp::Sub => 1,
                    BinaryOp::Mul => 2,
                    BinaryOp::Div => 3,
                    BinaryOp::Max => 4,
                };
                let d = dims(&shape, &a, &b, self.device)?;
                // Dense operands (the common case) skip the index arithmetic.
                let dense = d.rank <= 1 && d.sa[0] == 1 && d.sb[0] == 1;
                let contiguous: i32 = dense as i32;
                let (pa, pb, po, n64) = (a.ptr.0, b.ptr.0, out.0, n as u64);
                self.go(
                    m.basic()?.binary.get(dtype)?,
                    grid(n),
                    THREADS,
                    &mut args![code, pa, pb, po, n64, contiguous, d],
                )
            }
            Kernel::Softmax(Softmax {
                x,
                out,
                rows,
                cols,
                dtype,
            }) => {
                if rows == 0 || cols == 0 {
                    return Ok(());
                }
                let (px, po, r, c) = (x.0, out.0, rows as u64, cols as u64);
                self.go_rows(
                    m.basic()?.softmax.get(dtype)?,
                    rows,
                    cols,
                    &mut args![px, po, r, c],
                )
            }
            Kernel::LayerNorm(LayerNorm {
                x,
                residual,
                gamma,
                beta,
                out,
                rows,
                cols,
                eps,
                dtype,
            }) => {
                if rows == 0 || cols == 0 {
                    return Ok(());
                }
                let (px, pr, pg, pb, po) =
                    (x.0, residual.map_or(0, |r| r.0), gamma.0, beta.0, out.0);
                let (r, c) = (rows as u64, cols as u64);
                let half = match dtype {
                    DType::F16 => Some(0),
                    DType::BF16 => Some(1),
                    _ => None,
                };
                if let (Some(t), 0, true, true) = (
                    half,
                    cols % 8,
                    cols <= 16 * 8 * 8 && ln_vec8(),
                    aligned16(&[px, pr, pg, pb, po]),
                ) {
                    let g = usize::from(cols > 16 * 8 * 4);
                    return self.go(
                        &m.norm()?.layer_norm_vec8[g][t],
                        rows.div_ceil(2 * LN_ROWS_PER_BLOCK).min(MAX_BLOCKS) as u32,
                        32 * LN_ROWS_PER_BLOCK as u32,
                        &mut args![px, pr, pg, pb, po, r, c, eps],
                    );
                }
                if cols % 4 == 0 && cols <= 4 * 32 * LN_GROUPS && aligned16(&[px, pr, pg, pb, po]) {
                    return self.go(
                        m.norm()?.layer_norm_warp.get(dtype)?,
                        rows.div_ceil(LN_ROWS_PER_BLOCK).min(MAX_BLOCKS) as u32,
                        32 * LN_ROWS_PER_BLOCK as u32,
                        &mut args![px, pr, pg, pb, po, r, c, eps],
                    );
                }
                self.go_rows(
                    m.norm()?.layer_norm.get(dtype)?,
                    rows,
                    cols,
                    &mut args![px, pr, pg, pb, po, r, c, eps],
                )
            }
            Kernel::BiasAct(BiasAct {
                x,
                bias,
                out,
                rows,
                cols,
                act,
                dtype,
            }) => {
                let n = rows * cols;
                if n == 0 {
                    return Ok(());
                }
                let code: i32 = match act {
                    Activation::Identity => 0,
                    Activation::Relu => 1,
                    Activation::Gelu => 2,
                    Activation::GeluTanh => 3,
                };
                let (px, pb, po, r, c) = (x.0, bias.0, out.0, rows as u64, cols as u64);
                // Rows of whole 16-byte chunks: a block per (two) rows, a thread per chunk,
                // biases held in registers (bias_act_rows8_k's comment has the measurement).
                if let (0, Ok(rows32), true, true) = (
                    cols % 8,
                    u32::try_from(rows),
                    cols / 8 <= 1024,
                    aligned16(&[px, pb, po]),
                ) {
                    let c8 = (cols / 8) as u32;
                    return self.go(
                        m.act()?.bias_act_rows8.get(dtype)?,
                        rows.div_ceil(2).min(MAX_BLOCKS) as u32,
                        c8.div_ceil(32) * 32,
                        &mut args![px, pb, po, rows32, c8, code],
                    );
                }
                if let (0, Ok(n4), Ok(c4), true) = (
                    cols % 4,
                    u32::try_from(n / 4),
                    u32::try_from(cols / 4),
                    aligned16(&[px, pb, po]),
                ) {
                    return self.go(
                        m.act()?.bias_act4.get(dtype)?,
                        grid(n / 4),
                        THREADS,
                        &mut args![px, pb, po, n4, c4, code],
                    );
                }
                self.go(
                    m.act()?.bias_act.get(dtype)?,
                    grid(n),
                    THREADS,
                    &mut args![px, pb, po, r, c, code],
                )
            }
            Kernel::IndexSelect(IndexSelect {
                table,
                ids,
                out,
                n_ids,
                row_len,
                table_rows,
                dtype,
            }) => {
                let n = n_ids * row_len;
                if n == 0 {
                    return Ok(());
                }
                let (pt, pi, po) = (table.0, ids.0, out.0);
                let (ni, rl, tr) = (n_ids as u64, row_len as u64, table_rows as u64);
                // Rows of whole 16-byte chunks (f16 rows of a multiple of 8, f32 of 4) take the
                // chunked kernel.
                let row_bytes = row_len * dtype.size();
                if row_bytes % 16 == 0 && aligned16(&[pt, po]) {
                    let chunks = (row_bytes / 16) as u64;
                    return self.go(
                        &m.basic()?.index_select16,
                        grid(n_ids * chunks as usize),
                        THREADS,
                        &mut args![pt, pi, po, ni, chunks, tr],
                    );
                }
                self.go(
                    m.basic()?.index_select.get(dtype)?,
                    grid(n),
                    THREADS,
                    &mut args![pt, pi, po, ni, rl, tr],
                )
            }
            Kernel::Reduce(Reduce {
                op,
                x,
                out,
                outer,
                axis,
                inner,
                dtype,
            }) => {
                let n = outer * inner;
                if n == 0 {
                    return Ok(());
                }
                let code: i32 = match op {
                    ReduceOp::Sum => 0,
                    ReduceOp::Mean => 1,
                    ReduceOp::Max => 2,
                };
                let (px, po) = (x.0, out.0);
                if inner == 1 && axis >= 64 {
                    // Reducing the last axis: a block per row keeps the reads coalesced.
                    let (r, a) = (outer as u64, axis as u64);
                    self.go_rows(
                        m.basic()?.reduce_rows.get(dtype)?,
                        outer,
                        axis,
                        &mut args![code, px, po, r, a],
                    )
                } else {
                    let (o, a, i) = (outer as u64, axis as u64, inner as u64);
                    self.go(
                        m.basic()?.reduce.get(dtype)?,
                        grid(n),
                        THREADS,
                        &mut args![code, px, po, o, a, i],
                    )
                }
            }
            Kernel::Attention(Attention {
                qkv,
                mask,
                packed,
                out,
                batch,
                seq,
                heads,
                head_dim,
                dtype,
            }) => {
                if batch == 0 || seq == 0 || heads == 0 || head_dim == 0 {
                    return Ok(());
                }
                let Some(slot) = ATTENTION_HEAD_DIMS.iter().position(|&w| head_dim <= w) else {
                    return Err(Error::InvalidArgument(format!(
                        "attention: head width {head_dim} above the CUDA kernel's {}",
                        ATTENTION_HEAD_DIMS[3]
                    )));
                };
                let too_big = |v: usize| {
                    Error::InvalidArgument(format!("attention: {v} too large for the kernel"))
                };
                let dim32 = |v: usize| i32::try_from(v).map_err(|_| too_big(v));
                let (s, h, d) = (dim32(seq)?, dim32(heads)?, dim32(head_dim)?);
                let gy = u32::try_from(heads).ok().filter(|&g| g <= 65_535);
                let gz = u32::try_from(batch).ok().filter(|&g| g <= 65_535);
                let (Some(gy), Some(gz)) = (gy, gz) else {
                    return Err(too_big(batch.max(heads)));
                };
                let (pq, pm, po) = (qkv.0, mask.map_or(0, |m| m.0), out.0);
                // Packed: the offsets and the token count; the grid is sized by `seq`, the
                // longest sequence, and blocks past their own sequence's end leave at once.
                let (poff, tokens) = packed.map_or((0u64, 0i64), |p| (p.ptr.0, p.tokens as i64));
                let half = match dtype {
                    DType::F16 => Some(0),
                    DType::BF16 => Some(1),
                    _ => None,
                };
                if let (Some(t), true, true) = (
                    half,
                    m.tensor_cores && ATTENTION_HEAD_DIMS[slot] == head_dim,
                    aligned16(&[pq, po]),
                ) {
                    // One warp per 16 queries, up to MMA_WARPS per block: the kernels'
                    // launch bounds are sized for it (kernels.cu, SP_ATTN_MMA).
                    let warps = seq.div_ceil(16).min(MMA_WARPS);
                    let gx = seq.div_ceil(16 * warps) as u32;
                    return self.go3(
                        &m.attention_mma(slot)?[t],
                        (gx, gy, gz),
                        32 * warps as u32,
                        &mut args![pq, pm, poff, po, s, h, tokens],
                    );
                }
                let gx = seq.div_ceil(ATTENTION_QUERIES as usize) as u32;
                self.go3(
                    m.attention(slot)?.get(dtype)?,
                    (gx, gy, gz),
                    ATTENTION_QUERIES,
                    &mut args![pq, pm, poff, po, s, h, d, tokens],
                )
            }
            Kernel::MeanPoolNorm(MeanPoolNorm {
                x,
                mask,
                out,
                batch,
                seq,
                dim,
                dtype,
            }) => {
                if batch == 0 || dim == 0 {
                    return Ok(());
                }
                let (px, pm, po) = (x.0, mask.0, out.0);
                if let (true, Ok(s32)) = (dim <= POOL_MAX_DIM, i32::try_from(seq)) {
                    // Rows spread over a block's warps (sp_pool_rows).
                    let (b, d, none, tokens) = (batch as u64, dim as u64, 0u64, 0i64);
                    return self.go(
                        m.pool()?.pool_rows.get(dtype)?,
                        batch.min(MAX_BLOCKS) as u32,
                        32 * POOL_WARPS,
                        &mut args![px, pm, none, po, b, s32, d, tokens],
                    );
                }
                let (b, s, d) = (batch as u64, seq as u64, dim as u64);
                self.go_rows(
                    m.pool()?.mean_pool_norm.get(dtype)?,
                    batch,
                    dim,
                    &mut args![px, pm, po, b, s, d],
                )
            }
            Kernel::RmsNorm(RmsNorm {
                x,
                gamma,
                out,
                rows,
                cols,
                eps,
                dtype,
            }) => {
                if rows == 0 || cols == 0 {
                    return Ok(());
                }
                let (px, pg, po, r, c) = (x.0, gamma.0, out.0, rows as u64, cols as u64);
                self.go_rows(
                    m.norm()?.rms_norm.get(dtype)?,
                    rows,
                    cols,
                    &mut args![px, pg, po, r, c, eps],
                )
            }
            Kernel::Rope(Rope {
                x,
                cos,
                sin,
                out,
                batch,
                seq,
                heads,
                head_dim,
                rotated,
                dtype,
            }) => {
                let n = batch * seq * heads * (head_dim / 2);
                if n == 0 {
                    return Ok(());
                }
                let (px, pc, ps, po) = (x.0, cos.0, sin.0, out.0);
                let (b, s, h, d) = (batch as u64, seq as u64, heads as u64, head_dim as u64);
                let r = rotated as u64;
                self.go(
                    m.act()?.rope.get(dtype)?,
                    grid(n),
                    THREADS,
                    &mut args![px, pc, ps, po, b, s, h, d, r],
                )
            }
            Kernel::GatedAct(GatedAct {
                x,
                out,
                rows,
                cols,
                act,
                dtype,
            }) => {
                if rows == 0 || cols == 0 {
                    return Ok(());
                }
                let code: i32 = match act {
                    GateActivation::Gelu => 0,
                    GateActivation::GeluTanh => 1,
                    GateActivation::Silu => 2,
                };
                let (px, po, r, c) = (x.0, out.0, rows as u64, cols as u64);
                self.go(
                    m.act()?.gated_act.get(dtype)?,
                    grid(rows * cols),
                    THREADS,
                    &mut args![px, po, r, c, code],
                )
            }
            Kernel::MeanPoolNormPacked(MeanPoolNormPacked {
                x,
                seqs,
                out,
                batch,
                dim,
                dtype,
            }) => {
                if batch == 0 || dim == 0 {
                    return Ok(());
                }
                if dim > POOL_MAX_DIM {
                    return Err(Error::InvalidArgument(format!(
                        "packed mean pooling: rows of {dim} columns, at most {POOL_MAX_DIM}"
                    )));
                }
                let (px, poff, po) = (x.0, seqs.ptr.0, out.0);
                let (none, b, d, tokens) = (0u64, batch as u64, dim as u64, seqs.tokens as i64);
                // Every sequence fits `tokens` rows; no cut.
                let s32 = i32::try_from(seqs.tokens).unwrap_or(i32::MAX);
                self.go(
                    m.pool()?.pool_rows.get(dtype)?,
                    batch.min(MAX_BLOCKS) as u32,
                    32 * POOL_WARPS,
                    &mut args![px, none, poff, po, b, s32, d, tokens],
                )
            }
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
