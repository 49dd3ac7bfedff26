//! Layer normalisation.

use streampool::{Device, Tensor};

use crate::weights::{HostTensor, WeightFile};
use crate::{ComputeDType, Result};

/// `(x - mean) / sqrt(var + eps) * gamma + beta` over the last axis.
///
/// ```
/// use streampool::{Device, Tensor};
/// use streampool_nn::{HostTensor, LayerNorm};
/// let dev = Device::cpu();
/// let ones = HostTensor::new(vec![1.0; 2], &[2]).unwrap();
/// let zeros = HostTensor::new(vec![0.0; 2], &[2]).unwrap();
/// let ln = LayerNorm::new(&ones, &zeros, 0.0, &dev).unwrap();
/// let x = Tensor::from_vec(vec![1.0f32, 3.0], &[1, 2], &dev).unwrap();
/// assert_eq!(ln.forward(&x).unwrap().to_vec::<f32>().unwrap(), vec![-1.0, 1.0]);
/// ```
#[derive(Debug, Clone)]
pub struct LayerNorm {
    gamma: Tensor,
    beta: Tensor,
    eps: f32,
}

impl LayerNorm {
    /// Uploads `gamma` and `beta` (both `[dim]`).
    pub fn new(gamma: &HostTensor, beta: &HostTensor, eps: f32, device: &Device) -> Result<Self> {
        gamma.expect_shape("layer norm gamma", &[gamma.data().len()])?;
        beta.expect_shape("layer norm beta", gamma.shape())?;
        Ok(Self {
            gamma: gamma.to_device(device)?,
            beta: beta.to_device(device)?,
            eps,
        })
    }

    /// Reads `{prefix}.weight` and `{prefix}.bias` (both `[dim]`) from `file`.
    pub fn load(
        file: &WeightFile,
        prefix: &str,
        dim: usize,
        eps: f32,
        device: &Device,
    ) -> Result<Self> {
        let gamma = file.get(&format!("{prefix}.weight"), &[dim])?;
        let beta = file.get(&format!("{prefix}.bias"), &[dim])?;
        Self::new(&gamma, &beta, eps, device)
    }

    /// Reads `{prefix}.weight` and, when the file has it, `{prefix}.bias` (zeros otherwise:
    /// ModernBERT's norms have no bias).
    pub fn load_optional_bias(
        file: &WeightFile,
        prefix: &str,
        dim: usize,
        eps: f32,
        device: &Device,
    ) -> Result<Self> {
        let gamma = file.get(&format!("{prefix}.weight"), &[dim])?;
        let name = format!("{prefix}.bias");
        let beta = if file.contains(&name) {
            file.get(&name, &[dim])?
        } else {
            HostTensor::new(vec![0.0; dim], &[dim])?
        };
        Self::new(&gamma, &beta, eps, device)
    }

    /// This layer with gamma and beta in `dtype` (statistics stay f32 in the kernel).
    pub fn with_dtype(&self, dtype: ComputeDType) -> Result<Self> {
        Ok(Self {
            gamma: self.gamma.to_dtype(dtype.dtype())?,
            beta: self.beta.to_dtype(dtype.dtype())?,
            eps: self.eps,
        })
    }

    /// Normalises `x` over its last axis.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.layer_norm(&self.gamma, &self.beta, self.eps)?)
    }

    /// `layer_norm(x + residual)` in one kernel (the post-norm residual of BERT).
    pub fn forward_residual(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        Ok(x.add_layer_norm(residual, &self.gamma, &self.beta, self.eps)?)
    }
}
