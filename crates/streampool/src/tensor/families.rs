//! Ops that model families past BERT need: RMS normalisation, rotary position embeddings,
//! gated activations, and broadcasting a tensor to a larger shape (grouped-query attention
//! shares each key/value head between several query heads).

use super::{launch, Layout, Tensor};
use crate::kernel::{GateActivation, GatedAct, Kernel, RmsNorm, Rope};
use crate::{DType, Error, Result};

impl Tensor {
    /// This tensor read as `shape` (NumPy broadcasting: size-1 or missing leading dims
    /// repeat), as a view with zero strides; [`Tensor::contiguous`] materializes it.
    ///
    /// ```
    /// use streampool::{Device, Tensor};
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2, 1], &Device::cpu()).unwrap();
    /// let y = x.broadcast_as(&[2, 3]).unwrap().contiguous().unwrap();
    /// assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
    /// assert!(x.broadcast_as(&[3, 3]).is_err());
    /// ```
    pub fn broadcast_as(&self, shape: &[usize]) -> Result<Tensor> {
        let strides = self.layout().broadcast_strides(shape)?;
        Ok(self.view(Layout {
            shape: shape.into(),
            strides,
            offset: self.layout().offset,
        }))
    }

    /// RMS normalisation over the last axis: `x / sqrt(mean(x^2) + eps) * gamma` (T5, Llama,
    /// Qwen), statistics in `f32` or wider whatever the dtype.
    ///
    /// ```
    /// use streampool::{Device, Tensor};
    /// let dev = Device::cpu();
    /// let x = Tensor::from_vec(vec![3.0f32, 4.0], &[1, 2], &dev).unwrap();
    /// let g = Tensor::from_vec(vec![1.0f32, 2.0], &[2], &dev).unwrap();
    /// let y = x.rms_norm(&g, 0.0).unwrap().to_vec::<f32>().unwrap(); // rms = sqrt(12.5)
    /// assert!((y[0] - 3.0 / 12.5f32.sqrt()).abs() < 1e-6 && (y[1] - 8.0 / 12.5f32.sqrt()).abs() < 1e-6);
    /// ```
    pub fn rms_norm(&self, gamma: &Tensor, eps: f32) -> Result<Tensor> {
        const OP: &str = "rms_norm";
        self.expect_float(OP)?;
        self.same_dtype(gamma, OP)?;
        self.same_device(gamma, OP)?;
        let cols = *self
            .dims()
            .last()
            .ok_or_else(|| Error::shape(OP, "scalar input"))?;
        if gamma.dims() != [cols] {
            return Err(Error::shape(
                OP,
                format!("gamma {:?} must be [{cols}]", gamma.dims()),
            ));
        }
        if eps.is_nan() || eps < 0.0 {
            return Err(Error::InvalidArgument(format!(
                "{OP}: eps must be >= 0, got {eps}"
            )));
        }
        let (x, g) = (self.as_contiguous()?, gamma.as_contiguous()?);
        let rows = x.elem_count().checked_div(cols).unwrap_or(0);
        let (px, pg, dtype) = (x.ptr(), g.ptr(), x.dtype());
        launch(self.device(), &[&x, &g], x.out_like(x.dims()), |o| {
            Kernel::RmsNorm(RmsNorm {
                x: px,
                gamma: pg,
                out: o,
                rows,
                cols,
                eps,
                dtype,
            })
        })
    }

    /// Rotary position embeddings (rotate-half form, as GPT-NeoX, Llama, Qwen and GTE) on
    /// `self: [batch, seq, heads, head_dim]`; row `s` of every sequence has position `s`.
    /// `cos` and `sin` are `F32` `[positions, head_dim / 2]` tables (`positions >= seq`),
    /// `cos[p, i] = cos(p * theta_i)`: see the kernel's definition, [`Kernel::Rope`].
    ///
    /// ```
    /// use streampool::{Device, Tensor};
    /// let dev = Device::cpu();
    /// // One head of width 2 at positions 0 and 1; a quarter turn per position.
    /// let x = Tensor::from_vec(vec![1.0f32, 0.0, 1.0, 0.0], &[1, 2, 1, 2], &dev).unwrap();
    /// let cos = Tensor::from_vec(vec![1.0f32, 0.0], &[2, 1], &dev).unwrap();
    /// let sin = Tensor::from_vec(vec![0.0f32, 1.0], &[2, 1], &dev).unwrap();
    /// let y = x.rope(&cos, &sin).unwrap().to_vec::<f32>().unwrap();
    /// assert_eq!(y, vec![1.0, 0.0, 0.0, 1.0]);
    /// ```
    pub fn rope(&self, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let heads = self.dims().get(2).copied().unwrap_or(0);
        self.rope_heads(cos, sin, heads)
    }

    /// [`Tensor::rope`] on heads `0..rotated` of `self: [batch, seq, heads, head_dim]`, the
    /// other heads copied unchanged: the queries and keys of a fused QKV projection
    /// (`[batch, seq, 3 * heads, head_dim]`, `rotated = 2 * heads`) rotated in one pass,
    /// ready for [`Tensor::attention`].
    ///
    /// ```
    /// use streampool::{Device, Tensor};
    /// let dev = Device::cpu();
    /// let x = Tensor::from_vec(vec![1.0f32, 0.0, 1.0, 0.0], &[1, 1, 2, 2], &dev).unwrap();
    /// let cos = Tensor::from_vec(vec![0.0f32], &[1, 1], &dev).unwrap();
    /// let sin = Tensor::from_vec(vec![1.0f32], &[1, 1], &dev).unwrap();
    /// let y = x.rope_heads(&cos, &sin, 1).unwrap().to_vec::<f32>().unwrap();
    /// assert_eq!(y, vec![0.0, 1.0, 1.0, 0.0]); // head 0 turned, head 1 copied
    /// ```
    pub fn rope_heads(&self, cos: &Tensor, sin: &Tensor, rotated: usize) -> Result<Tensor> {
        const OP: &str = "rope";
        self.expect_float(OP)?;
        let &[batch, seq, heads, head_dim] = self.dims() else {
            return Err(Error::shape(
                OP,
                format!(
                    "input must be [batch, seq, heads, head_dim], got {:?}",
                    self.dims()
                ),
            ));
        };
        if rotated > heads {
            return Err(Error::shape(
                OP,
                format!("{rotated} rotated heads of {heads}"),
            ));
        }
        if !head_dim.is_multiple_of(2) {
            return Err(Error::shape(OP, format!("head width {head_dim} is odd")));
        }
        for t in [cos, sin] {
            if t.dtype() != DType::F32 {
                return Err(Error::DType {
                    op: OP,
                    expected: DType::F32,
                    got: t.dtype(),
                });
            }
            self.same_device(t, OP)?;
        }
        let half = head_dim / 2;
        if cos.dims() != sin.dims()
            || cos.rank() != 2
            || cos.dims()[1] != half
            || cos.dims()[0] < seq
        {
            return Err(Error::shape(
                OP,
                format!(
                    "cos {:?} and sin {:?} must both be [positions >= {seq}, {half}]",
                    cos.dims(),
                    sin.dims()
                ),
            ));
        }
        let x = self.as_contiguous()?;
        let (c, s) = (cos.as_contiguous()?, sin.as_contiguous()?);
        let (px, pc, ps, dtype) = (x.ptr(), c.ptr(), s.ptr(), x.dtype());
        launch(self.device(), &[&x, &c, &s], x.out_like(x.dims()), |o| {
            Kernel::Rope(Rope {
                x: px,
                cos: pc,
                sin: ps,
                out: o,
                batch,
                seq,
                heads,
                head_dim,
                rotated,
                dtype,
            })
        })
    }

    /// A gated activation over a fused gate/up projection: `self: [..., 2 * n]` holds each
    /// row's gate values then its up values; returns `act(gate) * up`, `[..., n]` (GeGLU with
    /// [`GateActivation::Gelu`], SwiGLU with [`GateActivation::Silu`]).
    ///
    /// ```
    /// use streampool::{Device, GateActivation, Tensor};
    /// let x = Tensor::from_vec(vec![0.0f32, 2.0, 3.0, 5.0], &[1, 4], &Device::cpu()).unwrap();
    /// let y = x.gated_act(GateActivation::Silu).unwrap().to_vec::<f32>().unwrap();
    /// let silu2 = 2.0 / (1.0 + (-2.0f32).exp());
    /// assert_eq!(y[0], 0.0);
    /// assert!((y[1] - silu2 * 5.0).abs() < 1e-6);
    /// ```
    pub fn gated_act(&self, act: GateActivation) -> Result<Tensor> {
        const OP: &str = "gated_act";
        self.expect_float(OP)?;
        let width = *self
            .dims()
            .last()
            .ok_or_else(|| Error::shape(OP, "scalar input"))?;
        if !width.is_multiple_of(2) {
            return Err(Error::shape(
                OP,
                format!("last dim {width} is not gate + up of one width"),
            ));
        }
        let cols = width / 2;
        let x = self.as_contiguous()?;
        let rows = x.elem_count().checked_div(width).unwrap_or(0);
        let mut shape = x.dims().to_vec();
        *shape.last_mut().expect("rank >= 1, checked above") = cols;
        let (px, dtype) = (x.ptr(), x.dtype());
        launch(self.device(), &[&x], x.out_like(&shape), |o| {
            Kernel::GatedAct(GatedAct {
                x: px,
                out: o,
                rows,
                cols,
                act,
                dtype,
            })
        })
    }
}
