//! The CUDA backend's launcher: the one `match` from [`Kernel`] to NVRTC kernels and cuBLAS.
//!
//! The CUDA C source (`kernels.cu`) is compiled by NVRTC once per device, at the first launch
//! on any of its streams, through the device's [`KernelCache`](crate::KernelCache): threads
//! racing to the first launch wait for the single compile.

use std::ffi::c_void;

use cudarc::driver::sys::{CUfunction, CUstream};
use cudarc::driver::{result, CudaContext, CudaFunction, CudaModule, DeviceRepr};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};

use super::blas::Blas;
use super::driver_err;
use crate::kernel::{Activation, BinaryOp, Kernel, ReduceOp, Strided, UnaryOp};
use crate::sync::{Arc, Mutex};
use crate::{Error, Result};

/// The CUDA C source of every kernel.
pub(crate) const SOURCE: &str = include_str!("kernels.cu");

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

/// The loaded module and its functions.
pub(crate) struct Module {
    _module: Arc<CudaModule>,
    fill: CudaFunction,
    copy: [CudaFunction; 3],
    unary: CudaFunction,
    binary: CudaFunction,
    softmax: CudaFunction,
    layer_norm: CudaFunction,
    bias_act: CudaFunction,
    index_select: CudaFunction,
    reduce: CudaFunction,
    reduce_rows: CudaFunction,
    sleep: CudaFunction,
}

impl Module {
    /// Compiles `kernels.cu` with NVRTC and loads it into `ctx`.
    pub(crate) fn build(ctx: &Arc<CudaContext>, device: &str) -> Result<Module> {
        // The device's own virtual architecture (NVRTC's default may predate `__nanosleep`).
        let arch = match ctx.compute_capability() {
            Ok((7, 5)) => Some("compute_75"),
            Ok((8, 0)) => Some("compute_80"),
            Ok((8, 6)) => Some("compute_86"),
            Ok((8, 9)) => Some("compute_89"),
            Ok((9, 0)) => Some("compute_90"),
            Ok((10, 0)) => Some("compute_100"),
            Ok((12, 0)) => Some("compute_120"),
            _ => None,
        };
        let opts = CompileOptions {
            // No fast math: accuracy against the CPU backend is part of the contract.
            name: Some("streampool_kernels.cu".into()),
            arch,
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(SOURCE, opts).map_err(|e| Error::Backend {
            device: device.to_string(),
            msg: format!("NVRTC compile of kernels.cu failed: {e:?}"),
        })?;
        let module = ctx.load_module(ptx).map_err(|e| driver_err(device, e))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| driver_err(device, e))
        };
        Ok(Module {
            fill: f("sp_fill")?,
            copy: [f("sp_copy16")?, f("sp_copy32")?, f("sp_copy64")?],
            unary: f("sp_unary")?,
            binary: f("sp_binary")?,
            softmax: f("sp_softmax")?,
            layer_norm: f("sp_layer_norm")?,
            bias_act: f("sp_bias_act")?,
            index_select: f("sp_index_select")?,
            reduce: f("sp_reduce")?,
            reduce_rows: f("sp_reduce_rows")?,
            sleep: f("sp_sleep")?,
            _module: module,
        })
    }
}

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

fn grid(n: usize) -> u32 {
    n.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS) as u32
}

/// Threads per block for one-block-per-row kernels: enough warps for the row, at most 1024.
fn row_threads(cols: usize) -> u32 {
    (cols.div_ceil(32) * 32).clamp(32, 1024) as u32
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
        let func: CUfunction = f.cu_function();
        // SAFETY: per the caller; the stream is live and bound to this thread's context.
        unsafe {
            result::launch_kernel(func, (blocks, 1, 1), (threads, 1, 1), 0, self.stream, args)
        }
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
            Kernel::Fill { out, len, value } => {
                if len == 0 {
                    return Ok(());
                }
                let (o, n) = (out.0, len as u64);
                self.go(&m.fill, grid(len), THREADS, &mut args![o, n, value])
            }
            Kernel::Sleep { nanos } => self.go(&m.sleep, 1, 1, &mut args![nanos]),
            Kernel::Copy {
                src,
                shape,
                out,
                elem_size,
            } => {
                let n: usize = shape.iter().product();
                if n == 0 {
                    return Ok(());
                }
                let f = match elem_size {
                    2 => &m.copy[0],
                    4 => &m.copy[1],
                    8 => &m.copy[2],
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
            Kernel::Matmul {
                a,
                b,
                out,
                batch,
                m: rows,
                n,
                k,
            } => {
                if batch == 0 || rows == 0 || n == 0 {
                    return Ok(());
                }
                if k == 0 {
                    // An empty sum: zeros (cuBLAS may skip writing `out` when k == 0).
                    return self.launch(Kernel::Fill {
                        out,
                        len: batch * rows * n,
                        value: 0.0,
                    });
                }
                // Held only while the gemm is queued (never across a wait), so two threads
                // sharing this stream never drive its handle at once.
                let mut guard = self.blas.lock();
                if guard.is_none() {
                    *guard = Some(Blas::new(self.stream, self.device)?);
                }
                let blas = guard.as_ref().expect("created above");
                blas.matmul(&a, &b, out.0, batch, rows, n, k)
            }
            Kernel::Unary { op, x, out, len } => {
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
                    &m.unary,
                    grid(len),
                    THREADS,
                    &mut args![code, px, po, n, mul, add],
                )
            }
            Kernel::Binary {
                op,
                a,
                b,
                shape,
                out,
            } => {
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
                    &m.binary,
                    grid(n),
                    THREADS,
                    &mut args![code, pa, pb, po, n64, contiguous, d],
                )
            }
            Kernel::Softmax { x, out, rows, cols } => {
                if rows == 0 || cols == 0 {
                    return Ok(());
                }
                let (px, po, r, c) = (x.0, out.0, rows as u64, cols as u64);
                self.go(
                    &m.softmax,
                    rows.min(MAX_BLOCKS) as u32,
                    row_threads(cols),
                    &mut args![px, po, r, c],
                )
            }
            Kernel::LayerNorm {
                x,
                residual,
                gamma,
                beta,
                out,
                rows,
                cols,
                eps,
            } => {
                if rows == 0 || cols == 0 {
                    return Ok(());
                }
                let (px, pr, pg, pb, po) =
                    (x.0, residual.map_or(0, |r| r.0), gamma.0, beta.0, out.0);
                let (r, c) = (rows as u64, cols as u64);
                self.go(
                    &m.layer_norm,
                    rows.min(MAX_BLOCKS) as u32,
                    row_threads(cols),
                    &mut args![px, pr, pg, pb, po, r, c, eps],
                )
            }
            Kernel::BiasAct {
                x,
                bias,
                out,
                rows,
                cols,
                act,
            } => {
                let n = rows * cols;
                if n == 0 {
                    return Ok(());
                }
                let code: i32 = match act {
                    Activation::Identity => 0,
                    Activation::Relu => 1,
                    Activation::Gelu => 2,
                };
                let (px, pb, po, r, c) = (x.0, bias.0, out.0, rows as u64, cols as u64);
                self.go(
                    &m.bias_act,
                    grid(n),
                    THREADS,
                    &mut args![px, pb, po, r, c, code],
                )
            }
            Kernel::IndexSelect {
                table,
                ids,
                out,
                n_ids,
                row_len,
                table_rows,
            } => {
                let n = n_ids * row_len;
                if n == 0 {
                    return Ok(());
                }
                let (pt, pi, po) = (table.0, ids.0, out.0);
                let (ni, rl, tr) = (n_ids as u64, row_len as u64, table_rows as u64);
                self.go(
                    &m.index_select,
                    grid(n),
                    THREADS,
                    &mut args![pt, pi, po, ni, rl, tr],
                )
            }
            Kernel::Reduce {
                op,
                x,
                out,
                outer,
                axis,
                inner,
            } => {
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
                    self.go(
                        &m.reduce_rows,
                        outer.min(MAX_BLOCKS) as u32,
                        row_threads(axis),
                        &mut args![code, px, po, r, a],
                    )
                } else {
                    let (o, a, i) = (outer as u64, axis as u64, inner as u64);
                    self.go(
                        &m.reduce,
                        grid(n),
                        THREADS,
                        &mut args![code, px, po, o, a, i],
                    )
                }
            }
        }
    }
}

/// Packs `shape` and two operands' strides, merging dimensions that are contiguous in both
/// operands and dropping extent-1 dimensions, into at most [`MAX_DIMS`] dimensions.
fn dims(shape: &[usize], a: &Strided, b: &Strided, device: &str) -> Result<Dims> {
    // (extent, stride a, stride b), outermost first, extent-1 dims dropped.
    let mut merged: Vec<(usize, usize, usize)> = Vec::with_capacity(shape.len());
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
            strides: strides.to_vec(),
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
