//! Fused transformer ops: each is one kernel that replaces a chain of smaller ones (and
//! their intermediates in device memory).

use smallvec::smallvec;

use super::{launch, Inputs, OutSpec, Tensor};
use crate::kernel::{
    Activation, Attention, Kernel, MatmulMath, MeanPoolNorm, MeanPoolNormPacked, SeqOffsets,
};
use crate::{DType, Error, Result};

impl Tensor {
    /// `[batch, seq]` `F32` 0/1 mask on this tensor's device, checked against `batch x seq`.
    fn check_mask(&self, mask: &Tensor, batch: usize, seq: usize, op: &'static str) -> Result<()> {
        if mask.dtype() != DType::F32 {
            return Err(Error::DType {
                op,
                expected: DType::F32,
                got: mask.dtype(),
            });
        }
        self.same_device(mask, op)?;
        if mask.dims() != [batch, seq] {
            return Err(Error::shape(
                op,
                format!("mask {:?} must be [{batch}, {seq}]", mask.dims()),
            ));
        }
        Ok(())
    }

    /// `act(self @ rhs + bias)`: a linear layer and its activation in one kernel where the
    /// backend fuses them (on CUDA, cuBLASLt's epilogues for `Identity`, `Relu` and
    /// `GeluTanh`; the erf [`Activation::Gelu`] has none), else a product and one bias +
    /// activation pass. Same shapes and math as [`Tensor::matmul_bias`].
    ///
    /// ```
    /// use streampool::{Activation, Device, MatmulMath, Tensor};
    /// let dev = Device::cpu();
    /// let x = Tensor::from_vec(vec![1.0f32, -2.0], &[1, 2], &dev).unwrap();
    /// let w = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[2, 2], &dev).unwrap();
    /// let b = Tensor::from_vec(vec![0.5f32, 0.5], &[2], &dev).unwrap();
    /// let y = x.matmul_bias_act(&w, &b, Activation::Relu, MatmulMath::Exact).unwrap();
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.5, 0.0]);
    /// ```
    pub fn matmul_bias_act(
        &self,
        rhs: &Tensor,
        bias: &Tensor,
        act: Activation,
        math: MatmulMath,
    ) -> Result<Tensor> {
        self.matmul_impl(rhs, Some(bias), act, math, None)
    }

    /// `self @ rhs + bias + residual` (`residual` of the product's shape): the post-norm
    /// residual of a transformer layer added in the product's epilogue where the backend
    /// fuses it ([`Tensor::matmul_fuses_residual`]), so the LayerNorm after it reads one
    /// tensor instead of two; else [`Tensor::matmul_bias`] and an add. Same shapes and math
    /// as [`Tensor::matmul_bias`].
    ///
    /// ```
    /// use streampool::{Device, MatmulMath, Tensor};
    /// let dev = Device::cpu();
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2], &dev).unwrap();
    /// let w = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], &[2, 2], &dev).unwrap();
    /// let b = Tensor::from_vec(vec![10.0f32, 20.0], &[2], &dev).unwrap();
    /// let r = Tensor::from_vec(vec![100.0f32, 200.0], &[1, 2], &dev).unwrap();
    /// let y = x.matmul_bias_residual(&w, &b, &r, MatmulMath::Exact).unwrap();
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![111.0, 222.0]);
    /// assert!(x.matmul_bias_residual(&w, &b, &b, MatmulMath::Exact).is_err()); // not [1, 2]
    /// ```
    pub fn matmul_bias_residual(
        &self,
        rhs: &Tensor,
        bias: &Tensor,
        residual: &Tensor,
        math: MatmulMath,
    ) -> Result<Tensor> {
        if !self.matmul_fuses_residual(rhs)? {
            let y = self.matmul_bias(rhs, bias, math)?;
            // The fused form takes exactly the output's shape; so does this one (no
            // broadcasting through `add`).
            if residual.dims() != y.dims() {
                return Err(Error::shape(
                    "matmul",
                    format!("residual {:?} must be {:?}", residual.dims(), y.dims()),
                ));
            }
            return y.add(residual);
        }
        self.matmul_impl(rhs, Some(bias), Activation::Identity, math, Some(residual))
    }

    /// Whether [`Tensor::matmul_bias_residual`] of `self @ rhs` runs as one kernel on this
    /// thread's current stream (CUDA: cuBLASLt's epilogue, for f16/bf16 products that are
    /// bound by their arithmetic rather than by memory; see the CUDA backend).
    pub fn matmul_fuses_residual(&self, rhs: &Tensor) -> Result<bool> {
        let (Some(&k), Some(&n)) = (self.dims().last(), rhs.dims().last()) else {
            return Ok(false);
        };
        let dtype = self.dtype();
        crate::stream_pool::with_current_stream(self.device(), |s| {
            Ok(s.inner.fuses_matmul_bias() && s.inner.fuses_matmul_residual(dtype, k, n))
        })
    }

    /// Multi-head self-attention in one kernel, on the output of a fused QKV projection.
    ///
    /// `self` is `[batch, seq, 3 * heads * head_dim]`: per token the queries (already scaled
    /// by `1/sqrt(head_dim)`), keys and values of every head, in that order. `mask` is an
    /// optional `F32` `[batch, seq]` of 1 (attend) and 0 (padded key). Returns the heads'
    /// outputs merged, `[batch, seq, heads * head_dim]`, in this tensor's dtype. Softmax
    /// statistics are kept in `f32`, and no `[seq, seq]` score matrix is written to memory.
    ///
    /// ```
    /// use streampool::{Device, Tensor};
    /// let dev = Device::cpu();
    /// // One head of width 1, two tokens: q = [0, 0], k = [1, 2], v = [10, 20].
    /// let qkv = Tensor::from_vec(vec![0.0f32, 1.0, 10.0, 0.0, 2.0, 20.0], &[1, 2, 3], &dev).unwrap();
    /// let y = qkv.attention(None, 1).unwrap();
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![15.0, 15.0]); // equal scores: the mean
    /// let mask = Tensor::from_vec(vec![1.0f32, 0.0], &[1, 2], &dev).unwrap();
    /// let y = qkv.attention(Some(&mask), 1).unwrap();
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![10.0, 10.0]); // the padded key is ignored
    /// ```
    pub fn attention(&self, mask: Option<&Tensor>, heads: usize) -> Result<Tensor> {
        const OP: &str = "attention";
        self.expect_float(OP)?;
        let &[batch, seq, width] = self.dims() else {
            return Err(Error::shape(
                OP,
                format!(
                    "qkv must be [batch, seq, 3 * hidden], got {:?}",
                    self.dims()
                ),
            ));
        };
        if heads == 0 || width == 0 || !width.is_multiple_of(3 * heads) {
            return Err(Error::shape(
                OP,
                format!("last dim {width} is not 3 x {heads} heads x a head width"),
            ));
        }
        let head_dim = width / (3 * heads);
        if let Some(m) = mask {
            self.check_mask(m, batch, seq, OP)?;
        }
        let x = self.as_contiguous()?;
        let m = mask.map(Tensor::as_contiguous).transpose()?;
        let (px, pm, dtype) = (x.ptr(), m.as_deref().map(Tensor::ptr), x.dtype());
        let mut inputs: Inputs = smallvec![&*x];
        inputs.extend(m.as_deref());
        let spec = x.out_like(&[batch, seq, heads * head_dim]);
        launch(self.device(), &inputs, spec, |o| {
            Kernel::Attention(Attention {
                qkv: px,
                mask: pm,
                packed: None,
                out: o,
                batch,
                seq,
                heads,
                head_dim,
                dtype,
            })
        })
    }

    /// Sentence embeddings from `self: [batch, seq, dim]`: the mean over the positions where
    /// `mask` (`F32` `[batch, seq]`, 1 = token, 0 = padding) is 1, then divided by its L2
    /// norm, in one kernel (sentence-transformers' mean pooling and `normalize`: the token
    /// count is floored at 1e-9 and the norm at 1e-12, so an all-padding row gives zeros).
    /// The result is `F32` `[batch, dim]` whatever this tensor's dtype.
    ///
    /// ```
    /// use streampool::{Device, Tensor};
    /// let dev = Device::cpu();
    /// let h = Tensor::from_vec(vec![3.0f32, 0.0, 5.0, 8.0, 100.0, 100.0], &[1, 3, 2], &dev).unwrap();
    /// let mask = Tensor::from_vec(vec![1.0f32, 1.0, 0.0], &[1, 3], &dev).unwrap();
    /// let e = h.mean_pool_normalize(&mask).unwrap(); // mean [4, 4], normalized
    /// let v = e.to_vec::<f32>().unwrap();
    /// assert!((v[0] - 0.5f32.sqrt()).abs() < 1e-6 && (v[1] - 0.5f32.sqrt()).abs() < 1e-6);
    /// ```
    pub fn mean_pool_normalize(&self, mask: &Tensor) -> Result<Tensor> {
        const OP: &str = "mean_pool_normalize";
        self.expect_float(OP)?;
        let &[batch, seq, dim] = self.dims() else {
            return Err(Error::shape(
                OP,
                format!("input must be [batch, seq, dim], got {:?}", self.dims()),
            ));
        };
        self.check_mask(mask, batch, seq, OP)?;
        let (x, m) = (self.as_contiguous()?, mask.as_contiguous()?);
        let (px, pm, dtype) = (x.ptr(), m.ptr(), x.dtype());
        launch(self.device(), &[&x, &m], OutSpec::f32(&[batch, dim]), |o| {
            Kernel::MeanPoolNorm(MeanPoolNorm {
                x: px,
                mask: pm,
                out: o,
                batch,
                seq,
                dim,
                dtype,
            })
        })
    }

    /// `I64` `[batch + 1]` sequence offsets on this tensor's device; returns `batch`.
    fn check_offsets(&self, offsets: &Tensor, op: &'static str) -> Result<usize> {
        if offsets.dtype() != DType::I64 {
            return Err(Error::DType {
                op,
                expected: DType::I64,
                got: offsets.dtype(),
            });
        }
        self.same_device(offsets, op)?;
        match *offsets.dims() {
            [n] if n >= 1 => Ok(n - 1),
            _ => Err(Error::shape(
                op,
                format!("offsets {:?} must be [batch + 1]", offsets.dims()),
            )),
        }
    }

    /// [`Tensor::attention`] over a packed batch (flash-attention's varlen form): `self` is
    /// `[tokens, 3 * heads * head_dim]`, the QKV projections of sequences stored back to back,
    /// and `offsets` (`I64` `[batch + 1]`, non-decreasing from 0 to `tokens`) says where each
    /// starts: sequence `b` is rows `offsets[b]..offsets[b + 1]` and attends to itself only.
    /// `max_len` is at least the longest sequence (a longer one is cut to it, its last rows
    /// left unspecified). Returns `[tokens, heads * head_dim]`. No padding is computed: a
    /// batch of lengths 8 and 256 costs what its 264 tokens cost. The offsets stay on the
    /// device, so they are not checked; offsets that break the rule give unspecified rows but
    /// never reach outside the tensors (the kernels clamp them).
    ///
    /// ```
    /// use streampool::{Device, Tensor};
    /// let dev = Device::cpu();
    /// // Two sequences of one head of width 1: [q, k, v] rows; lengths 1 and 2.
    /// let qkv = Tensor::from_vec(vec![0.0f32, 1.0, 10.0,  0.0, 1.0, 30.0,  0.0, 2.0, 50.0],
    ///                            &[3, 3], &dev).unwrap();
    /// let offsets = Tensor::from_vec(vec![0i64, 1, 3], &[3], &dev).unwrap();
    /// let y = qkv.attention_packed(&offsets, 2, 1).unwrap();
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![10.0, 40.0, 40.0]); // each its own mean
    /// ```
    pub fn attention_packed(
        &self,
        offsets: &Tensor,
        max_len: usize,
        heads: usize,
    ) -> Result<Tensor> {
        const OP: &str = "attention_packed";
        self.expect_float(OP)?;
        let &[tokens, width] = self.dims() else {
            return Err(Error::shape(
                OP,
                format!("qkv must be [tokens, 3 * hidden], got {:?}", self.dims()),
            ));
        };
        if heads == 0 || width == 0 || !width.is_multiple_of(3 * heads) {
            return Err(Error::shape(
                OP,
                format!("last dim {width} is not 3 x {heads} heads x a head width"),
            ));
        }
        let head_dim = width / (3 * heads);
        let batch = self.check_offsets(offsets, OP)?;
        let (x, off) = (self.as_contiguous()?, offsets.as_contiguous()?);
        let (px, po, dtype) = (x.ptr(), off.ptr(), x.dtype());
        let spec = x.out_like(&[tokens, heads * head_dim]);
        launch(self.device(), &[&x, &off], spec, |o| {
            Kernel::Attention(Attention {
                qkv: px,
                mask: None,
                packed: Some(SeqOffsets { ptr: po, tokens }),
                out: o,
                batch,
                seq: max_len.min(tokens),
                heads,
                head_dim,
                dtype,
            })
        })
    }

    /// [`Tensor::mean_pool_normalize`] over a packed batch: `self` is `[tokens, dim]` with the
    /// sequences back to back as `offsets` (`I64` `[batch + 1]`, see
    /// [`Tensor::attention_packed`]) says; sentence `b` is the normalized mean of its rows
    /// (an empty one gives zeros). The result is `F32` `[batch, dim]`.
    ///
    /// ```
    /// use streampool::{Device, Tensor};
    /// let dev = Device::cpu();
    /// let h = Tensor::from_vec(vec![3.0f32, 0.0, 5.0, 8.0, 0.0, 2.0], &[3, 2], &dev).unwrap();
    /// let offsets = Tensor::from_vec(vec![0i64, 2, 3], &[3], &dev).unwrap();
    /// let e = h.mean_pool_normalize_packed(&offsets).unwrap().to_vec::<f32>().unwrap();
    /// assert!((e[0] - 0.5f32.sqrt()).abs() < 1e-6); // mean [4, 4], normalized
    /// assert_eq!(&e[2..], &[0.0, 1.0]); // [0, 2], normalized
    /// ```
    pub fn mean_pool_normalize_packed(&self, offsets: &Tensor) -> Result<Tensor> {
        const OP: &str = "mean_pool_normalize_packed";
        self.expect_float(OP)?;
        let &[tokens, dim] = self.dims() else {
            return Err(Error::shape(
                OP,
                format!("input must be [tokens, dim], got {:?}", self.dims()),
            ));
        };
        let batch = self.check_offsets(offsets, OP)?;
        let (x, off) = (self.as_contiguous()?, offsets.as_contiguous()?);
        let (px, po, dtype) = (x.ptr(), off.ptr(), x.dtype());
        launch(
            self.device(),
            &[&x, &off],
            OutSpec::f32(&[batch, dim]),
            |o| {
                Kernel::MeanPoolNormPacked(MeanPoolNormPacked {
                    x: px,
                    seqs: SeqOffsets { ptr: po, tokens },
                    out: o,
                    batch,
                    dim,
                    dtype,
                })
            },
        )
    }
}
