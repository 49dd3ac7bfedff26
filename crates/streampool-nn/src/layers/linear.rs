//! Fully connected layer.

use streampool::{Device, MatmulMath, Tensor};

use crate::weights::{HostTensor, WeightFile};
use crate::{Activation, ComputeDType, Error, Result};

/// The weights of a [`Linear`] layer as stored by PyTorch: `weight` is `[out, in]`, `bias`
/// is `[out]`.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearParams {
    pub weight: HostTensor,
    pub bias: Option<HostTensor>,
}

impl LinearParams {
    /// Checks the shapes and makes the pair.
    pub fn new(weight: HostTensor, bias: Option<HostTensor>) -> Result<Self> {
        let [out, _] = weight.shape()[..] else {
            return Err(Error::Input(format!(
                "linear weight must be [out, in], got {:?}",
                weight.shape()
            )));
        };
        if let Some(b) = &bias {
            b.expect_shape("linear bias", &[out])?;
        }
        Ok(Self { weight, bias })
    }

    /// Reads `{prefix}.weight` (`[out, in]`) and `{prefix}.bias` (`[out]`) from `file`.
    pub fn load(file: &WeightFile, prefix: &str, out: usize, inp: usize) -> Result<Self> {
        let weight = file.get(&format!("{prefix}.weight"), &[out, inp])?;
        let bias = file.get(&format!("{prefix}.bias"), &[out])?;
        Ok(Self {
            weight,
            bias: Some(bias),
        })
    }

    /// Reads `{prefix}.weight` and, when the file has it, `{prefix}.bias` (families whose
    /// configs drop biases, such as Qwen's projections and GTE's gated MLP).
    pub fn load_optional_bias(
        file: &WeightFile,
        prefix: &str,
        out: usize,
        inp: usize,
    ) -> Result<Self> {
        let weight = file.get(&format!("{prefix}.weight"), &[out, inp])?;
        let name = format!("{prefix}.bias");
        let bias = if file.contains(&name) {
            Some(file.get(&name, &[out])?)
        } else {
            None
        };
        Ok(Self { weight, bias })
    }

    /// The layers' outputs stacked into one layer (`[sum out, in]`): fused projections such
    /// as query/key/value or gate/up, one matmul instead of several. A missing bias is zeros
    /// when another part has one.
    ///
    /// ```
    /// use streampool_nn::{HostTensor, LinearParams};
    /// let a = LinearParams::new(HostTensor::new(vec![1.0, 2.0], &[1, 2]).unwrap(), None).unwrap();
    /// let b = LinearParams::new(HostTensor::new(vec![3.0, 4.0], &[1, 2]).unwrap(),
    ///                           Some(HostTensor::new(vec![5.0], &[1]).unwrap())).unwrap();
    /// let ab = LinearParams::stack(&[&a, &b]).unwrap();
    /// assert_eq!(ab.weight.shape(), &[2, 2]);
    /// assert_eq!(ab.bias.unwrap().data(), &[0.0, 5.0]);
    /// ```
    pub fn stack(parts: &[&LinearParams]) -> Result<Self> {
        let inp = parts.first().map_or(0, |p| p.in_features());
        if parts.iter().any(|p| p.in_features() != inp) {
            return Err(Error::Input(
                "stacked linear layers differ in input features".into(),
            ));
        }
        let out: usize = parts.iter().map(|p| p.out_features()).sum();
        let mut w = Vec::with_capacity(out * inp);
        let mut b = Vec::with_capacity(out);
        for p in parts {
            w.extend_from_slice(p.weight.data());
            match &p.bias {
                Some(bias) => b.extend_from_slice(bias.data()),
                None => b.extend(std::iter::repeat_n(0.0, p.out_features())),
            }
        }
        let bias = if parts.iter().any(|p| p.bias.is_some()) {
            Some(HostTensor::new(b, &[out])?)
        } else {
            None
        };
        Self::new(HostTensor::new(w, &[out, inp])?, bias)
    }

    /// Rows `start..start + len` of the layer (its outputs `start..start + len`): splits a
    /// fused checkpoint tensor such as GTE's `qkv_proj`.
    pub fn rows(&self, start: usize, len: usize) -> Result<Self> {
        let inp = self.in_features();
        if start + len > self.out_features() {
            return Err(Error::Input(format!(
                "rows {start}..{} of a layer with {} outputs",
                start + len,
                self.out_features()
            )));
        }
        let w = self.weight.data()[start * inp..(start + len) * inp].to_vec();
        let bias = self
            .bias
            .as_ref()
            .map(|b| HostTensor::new(b.data()[start..start + len].to_vec(), &[len]))
            .transpose()?;
        Self::new(HostTensor::new(w, &[len, inp])?, bias)
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        self.weight.shape()[0]
    }

    /// Input features.
    pub fn in_features(&self) -> usize {
        self.weight.shape()[1]
    }
}

/// `y = x W^T + b` over the last axis of `x`. The weight is kept transposed (`[in, out]`,
/// contiguous) from load on, so `forward` is one matmul and one fused bias kernel with no
/// per-call transpose.
///
/// ```
/// use streampool::{Device, Tensor};
/// use streampool_nn::{HostTensor, Linear, LinearParams};
/// let dev = Device::cpu();
/// let w = HostTensor::new(vec![1.0, 0.0, 0.0, 2.0, 1.0, 1.0], &[3, 2]).unwrap(); // [out, in]
/// let b = HostTensor::new(vec![0.5, 0.5, 0.5], &[3]).unwrap();
/// let lin = Linear::new(&LinearParams::new(w, Some(b)).unwrap(), &dev).unwrap();
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], &[1, 2], &dev).unwrap();
/// assert_eq!(lin.forward(&x).unwrap().to_vec::<f32>().unwrap(), vec![1.5, 4.5, 3.5]);
/// ```
#[derive(Debug, Clone)]
pub struct Linear {
    weight_t: Tensor,
    bias: Option<Tensor>,
    in_features: usize,
    out_features: usize,
    math: MatmulMath,
}

impl Linear {
    /// Uploads `params` to `device`, transposing the weight once.
    pub fn new(params: &LinearParams, device: &Device) -> Result<Self> {
        let params = LinearParams::new(params.weight.clone(), params.bias.clone())?;
        Ok(Self {
            weight_t: params.weight.transposed()?.to_device(device)?,
            bias: params
                .bias
                .as_ref()
                .map(|b| b.to_device(device))
                .transpose()?,
            in_features: params.in_features(),
            out_features: params.out_features(),
            math: MatmulMath::Exact,
        })
    }

    /// Reads `{prefix}.weight` and `{prefix}.bias` from `file` and uploads them.
    pub fn load(
        file: &WeightFile,
        prefix: &str,
        out: usize,
        inp: usize,
        device: &Device,
    ) -> Result<Self> {
        Self::new(&LinearParams::load(file, prefix, out, inp)?, device)
    }

    /// This layer with its weights converted to `dtype` (once, on the device) and its
    /// matmuls in `dtype`'s math mode. Inputs must then be in `dtype.dtype()`.
    ///
    /// `Int8` keeps the f32 weight in a storage of its own, which the backend quantizes
    /// into its int8 form on the first product and keeps beside it (so the f32 layer it
    /// came from keeps its own packed form too).
    ///
    /// # Errors
    /// A dtype the device cannot convert to, or `Int8` off the CPU backend
    /// ([`Error::UnsupportedDType`]).
    pub fn with_dtype(&self, dtype: ComputeDType) -> Result<Self> {
        if dtype.is_quantized() {
            let device = self.weight_t.device();
            check_quantized_on(device, dtype)?;
            let own =
                Tensor::from_vec(self.weight_t.to_vec::<f32>()?, self.weight_t.dims(), device)?;
            return Ok(Self {
                weight_t: own,
                math: dtype.math(),
                ..self.clone()
            });
        }
        Ok(Self {
            weight_t: self.weight_t.to_dtype(dtype.dtype())?,
            bias: self
                .bias
                .as_ref()
                .map(|b| b.to_dtype(dtype.dtype()))
                .transpose()?,
            math: dtype.math(),
            ..self.clone()
        })
    }

    /// Input features.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Output features.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// `x W^T + b` for `x` of shape `[..., in]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_act(x, Activation::Identity)
    }

    /// Whether [`Self::forward_residual`] on `x` runs as one kernel on this thread's current
    /// stream (a bias, and a backend that adds the residual in the product's epilogue).
    pub fn fuses_residual(&self, x: &Tensor) -> Result<bool> {
        Ok(self.bias.is_some() && x.matmul_fuses_residual(&self.weight_t)?)
    }

    /// `x W^T + b + residual` (`residual` of the output's shape): one kernel where
    /// [`Self::fuses_residual`], else the layer and an add.
    pub fn forward_residual(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        match &self.bias {
            Some(b) if x.dims().last() == Some(&self.in_features) => {
                Ok(x.matmul_bias_residual(&self.weight_t, b, residual, self.math)?)
            }
            _ => Ok(self.forward(x)?.add(residual)?),
        }
    }

    /// `act(x W^T + b)`: one kernel where the backend fuses the bias and `act` into the
    /// product (CUDA: every activation but the erf GELU), else the product and one bias +
    /// activation kernel.
    pub fn forward_act(&self, x: &Tensor, act: Activation) -> Result<Tensor> {
        if x.dims().last() != Some(&self.in_features) {
            return Err(Error::Input(format!(
                "linear layer takes [..., {}], got {:?}",
                self.in_features,
                x.dims()
            )));
        }
        match &self.bias {
            Some(b) => Ok(x.matmul_bias_act(&self.weight_t, b, act, self.math)?),
            None => super::activation::apply(&x.matmul_with(&self.weight_t, self.math)?, act),
        }
    }
}

/// Refuses `dtype` on `device` when it is quantized and the device runs no int8 products
/// ([`Device::runs_int8_matmul`]): checked before any weight is converted or loaded.
pub(crate) fn check_quantized_on(device: &Device, dtype: ComputeDType) -> Result<()> {
    if dtype.is_quantized() && !device.runs_int8_matmul() {
        return Err(int8_unsupported(device));
    }
    Ok(())
}

/// The error for an int8 layer on a device without int8 products.
fn int8_unsupported(device: &Device) -> Error {
    Error::UnsupportedDType {
        dtype: ComputeDType::Int8,
        device: device.name(),
        reason: "int8 linear layers run on the CPU backend only (load the model on the CPU, \
                 or use f16/bf16 on a GPU)"
            .into(),
    }
}
