//! Tensor operations. Each checks shapes, dtypes and devices and returns `Err` on mismatch,
//! then describes its work as one [`Kernel`] for the device's backend.

use std::borrow::Cow;

use smallvec::smallvec;

use super::{launch, Dims, Inputs, Layout, OutSpec, Tensor};
use crate::kernel::{
    Activation, BiasAct, Binary, BinaryOp, IndexSelect, Kernel, LayerNorm, MatOperand, Matmul,
    MatmulMath, Reduce, ReduceOp, Softmax, Strided, StridedCopy, Unary, UnaryOp,
};
use crate::{DType, Error, Result};

impl Tensor {
    /// Floating-point ops take `F32`, `F16` or `BF16` (and compute in `f32` inside).
    pub(crate) fn expect_float(&self, op: &'static str) -> Result<()> {
        if !self.dtype().is_float() {
            return Err(Error::DType {
                op,
                expected: DType::F32,
                got: self.dtype(),
            });
        }
        Ok(())
    }

    /// `other` has this tensor's dtype (ops do not promote mixed inputs; convert first with
    /// [`Tensor::to_dtype`]).
    pub(crate) fn same_dtype(&self, other: &Tensor, op: &'static str) -> Result<()> {
        if other.dtype() != self.dtype() {
            return Err(Error::DType {
                op,
                expected: self.dtype(),
                got: other.dtype(),
            });
        }
        Ok(())
    }

    /// An output spec of this tensor's dtype.
    pub(super) fn out_like(&self, shape: &[usize]) -> OutSpec {
        OutSpec {
            shape: Dims::from_slice(shape),
            dtype: self.dtype(),
        }
    }

    pub(super) fn same_device(&self, other: &Tensor, op: &'static str) -> Result<()> {
        if !self.device().same(other.device()) {
            return Err(Error::Device {
                op,
                lhs: self.device().name(),
                rhs: other.device().name(),
            });
        }
        Ok(())
    }

    fn check_axis(&self, axis: usize, op: &'static str) -> Result<()> {
        if axis >= self.rank() {
            return Err(Error::shape(
                op,
                format!("axis {axis} out of range for shape {:?}", self.dims()),
            ));
        }
        Ok(())
    }

    /// A contiguous copy (or `self` if already contiguous).
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let l = self.layout().clone();
        let (ptr, elem_size) = (self.ptr(), self.dtype().size());
        let spec = OutSpec {
            shape: l.shape.clone(),
            dtype: self.dtype(),
        };
        launch(self.device(), &[self], spec, |o| {
            Kernel::Copy(StridedCopy {
                src: Strided {
                    ptr,
                    strides: l.strides.clone(),
                },
                shape: l.shape.clone(),
                out: o,
                elem_size,
            })
        })
    }

    /// `self` when contiguous (borrowed: no reference count touched, which for a tensor
    /// that many threads read, such as a weight, is a cache line they would all write), else
    /// a contiguous copy. What ops use for their inputs.
    pub(crate) fn as_contiguous(&self) -> Result<Cow<'_, Tensor>> {
        if self.is_contiguous() {
            return Ok(Cow::Borrowed(self));
        }
        self.contiguous().map(Cow::Owned)
    }

    /// The same elements with a new shape (a view when contiguous, else a copy).
    ///
    /// ```
    /// # use streampool::{Device, Tensor};
    /// let x = Tensor::zeros(&[2, 3], &Device::cpu()).unwrap();
    /// assert_eq!(x.reshape(&[3, 2]).unwrap().dims(), &[3, 2]);
    /// assert!(x.reshape(&[4, 2]).is_err());
    /// ```
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        if super::checked_elem_count("reshape", shape)? != self.elem_count() {
            return Err(Error::shape(
                "reshape",
                format!("cannot reshape {:?} into {shape:?}", self.dims()),
            ));
        }
        let t = self.contiguous()?;
        let offset = t.layout().offset;
        Ok(t.view(Layout {
            offset,
            ..Layout::contiguous(shape)
        }))
    }

    /// Swaps two dimensions (a view).
    pub fn transpose(&self, d0: usize, d1: usize) -> Result<Tensor> {
        self.check_axis(d0, "transpose")?;
        self.check_axis(d1, "transpose")?;
        let mut l = self.layout().clone();
        l.shape.swap(d0, d1);
        l.strides.swap(d0, d1);
        Ok(self.view(l))
    }

    /// Swaps the last two dimensions (a view).
    pub fn t(&self) -> Result<Tensor> {
        if self.rank() < 2 {
            return Err(Error::shape(
                "t",
                format!("needs rank >= 2, got {:?}", self.dims()),
            ));
        }
        self.transpose(self.rank() - 2, self.rank() - 1)
    }

    /// Elements `start..start + len` along `axis` (a view).
    pub fn narrow(&self, axis: usize, start: usize, len: usize) -> Result<Tensor> {
        self.check_axis(axis, "narrow")?;
        if !matches!(start.checked_add(len), Some(end) if end <= self.dims()[axis]) {
            return Err(Error::shape(
                "narrow",
                format!(
                    "{len} elements from {start} out of bounds for axis {axis} of {:?}",
                    self.dims()
                ),
            ));
        }
        let mut l = self.layout().clone();
        l.offset += start * l.strides[axis];
        l.shape[axis] = len;
        Ok(self.view(l))
    }

    /// Batched matrix product: `[..., m, k] @ [..., k, n]`. The right operand may also be a
    /// plain `[k, n]` matrix shared by every batch. Half inputs give a half output, accumulated
    /// in `f32`.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.matmul_with(rhs, MatmulMath::Exact)
    }

    /// [`Tensor::matmul`] with an explicit math mode for `F32` operands ([`MatmulMath::Tf32`]
    /// opts into TF32 tensor cores on CUDA; ignored for half operands and on the CPU).
    pub fn matmul_with(&self, rhs: &Tensor, math: MatmulMath) -> Result<Tensor> {
        self.matmul_impl(rhs, None, Activation::Identity, math, None)
    }

    /// `self @ rhs + bias`, the bias (`[n]`) added to every row of the product: a linear
    /// layer in one kernel where the backend fuses it (on CUDA, cuBLASLt's bias epilogue),
    /// else a product and a bias pass. Same shapes and math as [`Tensor::matmul_with`].
    ///
    /// ```
    /// use streampool::{Device, MatmulMath, Tensor};
    /// let dev = Device::cpu();
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2], &dev).unwrap();
    /// let w = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[2, 2], &dev).unwrap();
    /// let b = Tensor::from_vec(vec![10.0f32, 20.0], &[2], &dev).unwrap();
    /// let y = x.matmul_bias(&w, &b, MatmulMath::Exact).unwrap();
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![11.0, 22.0]);
    /// assert!(x.matmul_bias(&w, &x, MatmulMath::Exact).is_err()); // bias is not [2]
    /// ```
    pub fn matmul_bias(&self, rhs: &Tensor, bias: &Tensor, math: MatmulMath) -> Result<Tensor> {
        self.matmul_impl(rhs, Some(bias), Activation::Identity, math, None)
    }

    /// The product, plus `bias` and then `act` where given (`act` is `Identity` without a
    /// bias): one [`Kernel::Matmul`] where the backend fuses them, else the product and one
    /// bias + activation pass. A `residual` (only with a bias and `Identity`, the caller
    /// having asked the backend whether it fuses one) is added in the same kernel.
    pub(super) fn matmul_impl(
        &self,
        rhs: &Tensor,
        bias: Option<&Tensor>,
        act: Activation,
        math: MatmulMath,
        residual: Option<&Tensor>,
    ) -> Result<Tensor> {
        const OP: &str = "matmul";
        self.expect_float(OP)?;
        self.same_dtype(rhs, OP)?;
        self.same_device(rhs, OP)?;
        if math == MatmulMath::Int8 {
            self.check_int8_matmul(OP)?;
        }
        if self.rank() < 2 || rhs.rank() < 2 {
            return Err(Error::shape(
                OP,
                format!(
                    "needs rank >= 2, got {:?} and {:?}",
                    self.dims(),
                    rhs.dims()
                ),
            ));
        }
        let (ar, br) = (self.rank(), rhs.rank());
        let (m, k) = (self.dims()[ar - 2], self.dims()[ar - 1]);
        let (k2, n) = (rhs.dims()[br - 2], rhs.dims()[br - 1]);
        if k != k2 {
            return Err(Error::shape(
                OP,
                format!(
                    "inner dimensions differ: {:?} @ {:?}",
                    self.dims(),
                    rhs.dims()
                ),
            ));
        }
        let bias = match bias {
            Some(b) => {
                b.same_dtype(self, OP)?;
                b.same_device(self, OP)?;
                // Borrowing the current stream (not cloning it) touches no shared count.
                let fuses = crate::stream_pool::with_current_stream(self.device(), |s| {
                    Ok(s.inner.fuses_matmul_bias() && s.inner.fuses_matmul_act(act))
                })?;
                if !fuses {
                    // The checks above and below run in matmul_with and bias_act.
                    let y = self.matmul_with(rhs, math)?.bias_act(b, act)?;
                    return match residual {
                        Some(r) => y.add(r),
                        None => Ok(y),
                    };
                }
                if b.dims() != [n] {
                    return Err(Error::shape(
                        OP,
                        format!(
                            "bias {:?} must be [{n}] for {:?} @ {:?}",
                            b.dims(),
                            self.dims(),
                            rhs.dims()
                        ),
                    ));
                }
                Some(b.as_contiguous()?)
            }
            None => None,
        };
        let batch_dims = &self.dims()[..ar - 2];
        let residual = match residual {
            Some(r) => {
                r.same_dtype(self, OP)?;
                r.same_device(self, OP)?;
                let mut want = batch_dims.to_vec();
                want.extend([m, n]);
                if bias.is_none() || act != Activation::Identity || r.dims() != want.as_slice() {
                    return Err(Error::shape(
                        OP,
                        format!(
                            "residual {:?} must be {want:?}, with a bias and no activation",
                            r.dims()
                        ),
                    ));
                }
                Some(r.as_contiguous()?)
            }
            None => None,
        };
        if br > 2 && &rhs.dims()[..br - 2] != batch_dims {
            return Err(Error::shape(
                OP,
                format!(
                    "batch dimensions differ: {:?} @ {:?}",
                    self.dims(),
                    rhs.dims()
                ),
            ));
        }
        // A contiguous batch times one shared matrix is one [batch * m, k] @ [k, n] product:
        // one large GEMM, which cuBLAS tiles far better than `batch` small ones of m rows (on
        // the H100 a MiniLM forward's projections at 512 x 32 tokens took 1.5x as long as
        // strided-batched GEMMs).
        if br == 2 && ar > 2 && m > 0 && n > 0 && self.is_contiguous() {
            let rows = super::checked_elem_count(OP, &self.dims()[..ar - 1])?;
            let mut shape = batch_dims.to_vec();
            shape.extend([m, n]);
            let residual = residual.map(|r| r.reshape(&[rows, n])).transpose()?;
            return self
                .reshape(&[rows, k])?
                .matmul_impl(rhs, bias.as_deref(), act, math, residual.as_ref())?
                .reshape(&shape);
        }
        // An empty output needs no work (and then its batch dims alone may not fit a usize).
        let batch = if m == 0 || n == 0 {
            0
        } else {
            super::checked_elem_count(OP, batch_dims)?
        };
        let a = mat_operand(self)?;
        let b = mat_operand(rhs)?;
        // A plain matrix (a weight, not a batch of them) kept in its own storage: the backend
        // may pack it once for every later product. Copied operands (`Cow::Owned`) are
        // temporaries, packed per call.
        let b_pack = match (&b.0, br) {
            (Cow::Borrowed(t), 2) => {
                let wants = crate::stream_pool::with_current_stream(self.device(), |s| {
                    Ok(s.inner.prepacks_matmul_weights())
                })?;
                if wants {
                    t.storage().pack_slot()
                } else {
                    None
                }
            }
            _ => None,
        };
        let mut shape = Dims::from_slice(batch_dims);
        shape.extend([m, n]);
        let (ao, bo, dtype) = (a.1, b.1, self.dtype());
        let bias_ptr = bias.as_deref().map(Tensor::ptr);
        let residual_ptr = residual.as_deref().map(Tensor::ptr);
        let mut inputs: Inputs = smallvec![&*a.0, &*b.0];
        inputs.extend(bias.as_deref());
        inputs.extend(residual.as_deref());
        launch(self.device(), &inputs, self.out_like(&shape), |o| {
            Kernel::Matmul(Matmul {
                a: ao,
                b: bo,
                b_pack,
                bias: bias_ptr,
                residual: residual_ptr,
                act,
                out: o,
                batch,
                m,
                n,
                k,
                dtype,
                math,
            })
        })
    }

    /// Refuses [`MatmulMath::Int8`] where it cannot run: operands other than `F32`, or a
    /// backend without int8 products.
    fn check_int8_matmul(&self, op: &'static str) -> Result<()> {
        if self.dtype() != DType::F32 {
            return Err(Error::DType {
                op,
                expected: DType::F32,
                got: self.dtype(),
            });
        }
        if !self.device().runs_int8_matmul() {
            return Err(Error::Unavailable(format!(
                "int8 matmul: not on {} (the CPU backend runs it)",
                self.device().name()
            )));
        }
        Ok(())
    }

    fn binary(&self, rhs: &Tensor, op: BinaryOp, name: &'static str) -> Result<Tensor> {
        self.expect_float(name)?;
        self.same_dtype(rhs, name)?;
        self.same_device(rhs, name)?;
        let shape = super::broadcast_shapes(name, self.dims(), rhs.dims())?;
        let sa = self.layout().broadcast_strides(&shape)?;
        let sb = rhs.layout().broadcast_strides(&shape)?;
        let (pa, pb) = (self.ptr(), rhs.ptr());
        let (spec, dtype) = (self.out_like(&shape), self.dtype());
        launch(self.device(), &[self, rhs], spec, |o| {
            Kernel::Binary(Binary {
                op,
                a: Strided {
                    ptr: pa,
                    strides: sa,
                },
                b: Strided {
                    ptr: pb,
                    strides: sb,
                },
                shape,
                out: o,
                dtype,
            })
        })
    }

    /// Element-wise `self + rhs` with broadcasting.
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Add, "add")
    }
    /// Element-wise `self - rhs` with broadcasting.
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Sub, "sub")
    }
    /// Element-wise `self * rhs` with broadcasting.
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Mul, "mul")
    }
    /// Element-wise `self / rhs` with broadcasting.
    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Div, "div")
    }
    /// Element-wise maximum with broadcasting.
    pub fn maximum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary(rhs, BinaryOp::Max, "maximum")
    }

    fn unary(&self, op: UnaryOp, name: &'static str) -> Result<Tensor> {
        self.expect_float(name)?;
        let x = self.as_contiguous()?;
        let (ptr, len, dtype) = (x.ptr(), x.elem_count(), x.dtype());
        launch(self.device(), &[&x], x.out_like(x.dims()), |o| {
            Kernel::Unary(Unary {
                op,
                x: ptr,
                out: o,
                len,
                dtype,
            })
        })
    }

    /// `max(x, 0)`.
    pub fn relu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Relu, "relu")
    }
    /// GELU, erf form (as in BERT).
    pub fn gelu(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Gelu, "gelu")
    }
    /// Hyperbolic tangent.
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Tanh, "tanh")
    }
    /// `e^x`.
    pub fn exp(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Exp, "exp")
    }
    /// Square root.
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqrt, "sqrt")
    }
    /// `x * x`.
    pub fn sqr(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Sqr, "sqr")
    }
    /// `-x`.
    pub fn neg(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Neg, "neg")
    }
    /// `1 / x`.
    pub fn recip(&self) -> Result<Tensor> {
        self.unary(UnaryOp::Recip, "recip")
    }
    /// `x * mul + add`.
    pub fn affine(&self, mul: f32, add: f32) -> Result<Tensor> {
        self.unary(UnaryOp::Affine { mul, add }, "affine")
    }
    /// `x * factor`.
    pub fn scale(&self, factor: f32) -> Result<Tensor> {
        self.affine(factor, 0.0)
    }

    /// Softmax over the last axis.
    pub fn softmax(&self) -> Result<Tensor> {
        self.expect_float("softmax")?;
        let x = self.as_contiguous()?;
        let cols = *x
            .dims()
            .last()
            .ok_or_else(|| Error::shape("softmax", "scalar input"))?;
        let rows = x.elem_count().checked_div(cols).unwrap_or(0);
        let (ptr, dtype) = (x.ptr(), x.dtype());
        launch(self.device(), &[&x], x.out_like(x.dims()), |o| {
            Kernel::Softmax(Softmax {
                x: ptr,
                out: o,
                rows,
                cols,
                dtype,
            })
        })
    }

    /// Layer normalisation over the last axis: `(x - mean) / sqrt(var + eps) * gamma + beta`.
    pub fn layer_norm(&self, gamma: &Tensor, beta: &Tensor, eps: f32) -> Result<Tensor> {
        self.norm_impl(None, gamma, beta, eps, "layer_norm")
    }

    /// `layer_norm(self + residual)` in one kernel (the post-norm residual of BERT).
    pub fn add_layer_norm(
        &self,
        residual: &Tensor,
        gamma: &Tensor,
        beta: &Tensor,
        eps: f32,
    ) -> Result<Tensor> {
        if residual.dims() != self.dims() {
            return Err(Error::shape(
                "add_layer_norm",
                format!(
                    "residual {:?} differs from input {:?}",
                    residual.dims(),
                    self.dims()
                ),
            ));
        }
        self.norm_impl(Some(residual), gamma, beta, eps, "add_layer_norm")
    }

    fn norm_impl(
        &self,
        res: Option<&Tensor>,
        gamma: &Tensor,
        beta: &Tensor,
        eps: f32,
        op: &'static str,
    ) -> Result<Tensor> {
        let mut all: Inputs = smallvec![self, gamma, beta];
        all.extend(res);
        self.expect_float(op)?;
        for t in &all {
            self.same_dtype(t, op)?;
            self.same_device(t, op)?;
        }
        let cols = *self
            .dims()
            .last()
            .ok_or_else(|| Error::shape(op, "scalar input"))?;
        if gamma.dims() != [cols] || beta.dims() != [cols] {
            return Err(Error::shape(
                op,
                format!(
                    "gamma {:?} and beta {:?} must be [{cols}]",
                    gamma.dims(),
                    beta.dims()
                ),
            ));
        }
        if eps.is_nan() || eps < 0.0 {
            return Err(Error::InvalidArgument(format!(
                "{op}: eps must be >= 0, got {eps}"
            )));
        }
        let x = self.as_contiguous()?;
        let r = res.map(|r| r.as_contiguous()).transpose()?;
        let (g, b) = (gamma.as_contiguous()?, beta.as_contiguous()?);
        let rows = x.elem_count().checked_div(cols).unwrap_or(0);
        let (px, pr, pg, pb) = (x.ptr(), r.as_ref().map(|r| r.ptr()), g.ptr(), b.ptr());
        let mut inputs: Inputs = smallvec![&*x, &*g, &*b];
        inputs.extend(r.as_deref());
        let dtype = x.dtype();
        launch(self.device(), &inputs, x.out_like(x.dims()), |o| {
            Kernel::LayerNorm(LayerNorm {
                x: px,
                residual: pr,
                gamma: pg,
                beta: pb,
                out: o,
                rows,
                cols,
                eps,
                dtype,
            })
        })
    }

    /// `act(self + bias)` with `bias` of shape `[last dim]`, in one kernel.
    pub fn bias_act(&self, bias: &Tensor, act: Activation) -> Result<Tensor> {
        const OP: &str = "bias_act";
        self.expect_float(OP)?;
        self.same_dtype(bias, OP)?;
        self.same_device(bias, OP)?;
        let cols = *self
            .dims()
            .last()
            .ok_or_else(|| Error::shape(OP, "scalar input"))?;
        if bias.dims() != [cols] {
            return Err(Error::shape(
                OP,
                format!(
                    "bias {:?} must be [{cols}] for input {:?}",
                    bias.dims(),
                    self.dims()
                ),
            ));
        }
        let (x, b) = (self.as_contiguous()?, bias.as_contiguous()?);
        let rows = x.elem_count().checked_div(cols).unwrap_or(0);
        let (px, pb, dtype) = (x.ptr(), b.ptr(), x.dtype());
        launch(self.device(), &[&x, &b], x.out_like(x.dims()), |o| {
            Kernel::BiasAct(BiasAct {
                x: px,
                bias: pb,
                out: o,
                rows,
                cols,
                act,
                dtype,
            })
        })
    }

    /// Rows of this `[rows, dim]` table picked by `i64` `ids` of any shape; the result has
    /// shape `ids.dims() + [dim]`. Ids out of `0..rows` give rows of zeros (a device kernel
    /// cannot report per-element errors cheaply; use [`Tensor::embedding`] to reject them).
    pub fn index_select(&self, ids: &Tensor) -> Result<Tensor> {
        const OP: &str = "index_select";
        self.expect_float(OP)?;
        if ids.dtype() != DType::I64 {
            return Err(Error::DType {
                op: OP,
                expected: DType::I64,
                got: ids.dtype(),
            });
        }
        self.same_device(ids, OP)?;
        if self.rank() != 2 {
            return Err(Error::shape(
                OP,
                format!("table must be [rows, dim], got {:?}", self.dims()),
            ));
        }
        let (table_rows, row_len) = (self.dims()[0], self.dims()[1]);
        let (t, i) = (self.as_contiguous()?, ids.as_contiguous()?);
        let n_ids = i.elem_count();
        let mut shape = i.dims().to_vec();
        shape.push(row_len);
        let (pt, pi, dtype) = (t.ptr(), i.ptr(), t.dtype());
        launch(self.device(), &[&t, &i], t.out_like(&shape), |o| {
            Kernel::IndexSelect(IndexSelect {
                table: pt,
                ids: pi,
                out: o,
                n_ids,
                row_len,
                table_rows,
                dtype,
            })
        })
    }

    /// Embedding lookup of host `ids` (checked against the table size) with result shape
    /// `shape + [dim]`.
    pub fn embedding(&self, ids: &[i64], shape: &[usize]) -> Result<Tensor> {
        let rows = self.dims().first().copied().unwrap_or(0) as i64;
        // A fold per chunk vectorizes (a negative id is a huge u64); the search for the bad
        // id runs only on failure. This runs before the forward's first kernel can be queued.
        let in_range = |c: &[i64]| {
            c.iter()
                .fold(true, |ok, &i| ok & ((i as u64) < rows as u64))
        };
        if !ids.chunks(256).all(in_range) {
            let bad = ids.iter().find(|&&i| i < 0 || i >= rows).copied();
            return Err(Error::InvalidArgument(format!(
                "embedding: id {} out of range 0..{rows}",
                bad.unwrap_or_default()
            )));
        }
        let ids = Tensor::from_slice(ids, shape, self.device())?;
        self.index_select(&ids)
    }

    fn reduce(
        &self,
        axis: usize,
        keepdim: bool,
        op: ReduceOp,
        name: &'static str,
    ) -> Result<Tensor> {
        self.expect_float(name)?;
        self.check_axis(axis, name)?;
        let x = self.as_contiguous()?;
        let d = x.dims();
        let len = d[axis];
        if len == 0 && op == ReduceOp::Max {
            return Err(Error::shape(name, "max over an empty axis"));
        }
        let mut shape = d.to_vec();
        if keepdim {
            shape[axis] = 1;
        } else {
            shape.remove(axis);
        }
        // `outer * inner` is the output's element count, so both fit once it does; an empty
        // output needs no work (and its outer dims alone may not fit a usize).
        let (outer, inner) = if super::checked_elem_count(name, &shape)? == 0 {
            (0, 0)
        } else {
            (d[..axis].iter().product(), d[axis + 1..].iter().product())
        };
        let (ptr, dtype) = (x.ptr(), x.dtype());
        launch(self.device(), &[&x], x.out_like(&shape), |o| {
            Kernel::Reduce(Reduce {
                op,
                x: ptr,
                out: o,
                outer,
                axis: len,
                inner,
                dtype,
            })
        })
    }

    /// Sum over `axis`.
    pub fn sum(&self, axis: usize, keepdim: bool) -> Result<Tensor> {
        self.reduce(axis, keepdim, ReduceOp::Sum, "sum")
    }
    /// Mean over `axis`.
    pub fn mean(&self, axis: usize, keepdim: bool) -> Result<Tensor> {
        self.reduce(axis, keepdim, ReduceOp::Mean, "mean")
    }
    /// Maximum over `axis`.
    pub fn max(&self, axis: usize, keepdim: bool) -> Result<Tensor> {
        self.reduce(axis, keepdim, ReduceOp::Max, "max")
    }
}

/// A matmul operand view of `t` (`[..., rows, cols]`), copying `t` if its batch dimensions
/// do not collapse to one stride or neither matrix stride is 1. Returns the tensor the
/// operand points into (keep it alive) and the operand.
fn mat_operand(t: &Tensor) -> Result<(Cow<'_, Tensor>, MatOperand)> {
    if t.elem_count() == 0 {
        // Backends read nothing through an empty operand (an empty output is skipped and a
        // k == 0 product is zeros), and an empty tensor counts as contiguous whatever its
        // strides, so give it row-major matrix strides rather than inspecting its own.
        let cols = t.dims()[t.rank() - 1];
        let op = MatOperand {
            ptr: t.ptr(),
            batch_stride: 0,
            rs: cols.max(1),
            cs: 1,
        };
        return Ok((Cow::Borrowed(t), op));
    }
    let fits = |t: &Tensor| {
        let l = t.layout();
        let r = l.shape.len();
        // An extent-1 dim's stride never addresses anything, and a contiguous layout may
        // carry any value there (e.g. a [1, 1] narrow of a transposed view); 1 keeps the
        // operand's unit-stride contract.
        let unit_if_single = |d: usize| if l.shape[d] == 1 { 1 } else { l.strides[d] };
        let (rs, cs) = (unit_if_single(r - 2), unit_if_single(r - 1));
        let unit = cs == 1 || rs == 1;
        // Batch dims collapse if each (non-trivial) dim's stride is the next one's extent times stride.
        let mut collapse = true;
        let mut batch_stride = None;
        for i in (0..r - 2).rev() {
            if l.shape[i] == 1 {
                continue;
            }
            match batch_stride {
                None => batch_stride = Some((l.strides[i], l.shape[i])),
                Some((s, n)) => {
                    if l.strides[i] != s * n {
                        collapse = false;
                    }
                    batch_stride = Some((l.strides[i], l.shape[i]));
                }
            }
        }
        // The innermost non-trivial batch dim gives the batch stride.
        let bs = (0..r - 2)
            .rev()
            .find(|&i| l.shape[i] != 1)
            .map_or(0, |i| l.strides[i]);
        (unit && collapse).then_some((bs, rs, cs))
    };
    let t = if fits(t).is_some() {
        Cow::Borrowed(t)
    } else {
        Cow::Owned(t.contiguous()?)
    };
    // A non-empty contiguous tensor always fits: its last stride is 1 unless that extent is
    // 1 (then read as 1), and its batch strides are products of the inner extents.
    let (batch_stride, rs, cs) = fits(&t).expect("contiguous operand fits");
    let op = MatOperand {
        ptr: t.ptr(),
        batch_stride,
        rs,
        cs,
    };
    Ok((t, op))
}
