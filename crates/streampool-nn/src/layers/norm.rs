//! RMS normalisation, and the norm a family uses ([`Norm`]: LayerNorm or RMSNorm).

use streampool::{Device, Tensor};

use super::LayerNorm;
use crate::weights::{HostTensor, WeightFile};
use crate::{ComputeDType, Result};

/// `x / sqrt(mean(x^2) + eps) * gamma` over the last axis (T5, Llama, Qwen).
///
/// ```
/// use streampool::{Device, Tensor};
/// use streampool_nn::{HostTensor, RmsNorm};
/// let dev = Device::cpu();
/// let norm = RmsNorm::new(&HostTensor::new(vec![1.0; 2], &[2]).unwrap(), 0.0, &dev).unwrap();
/// let x = Tensor::from_vec(vec![1.0f32, -1.0], &[1, 2], &dev).unwrap();
/// assert_eq!(norm.forward(&x).unwrap().to_vec::<f32>().unwrap(), vec![1.0, -1.0]);
/// ```
#[derive(Debug, Clone)]
pub struct RmsNorm {
    gamma: Tensor,
    eps: f32,
}

impl RmsNorm {
    /// Uploads `gamma` (`[dim]`).
    pub fn new(gamma: &HostTensor, eps: f32, device: &Device) -> Result<Self> {
        gamma.expect_shape("rms norm gamma", &[gamma.data().len()])?;
        Ok(Self {
            gamma: gamma.to_device(device)?,
            eps,
        })
    }

    /// Reads `{prefix}.weight` (`[dim]`) from `file`; `scale` multiplies gamma (attention
    /// folds `1/sqrt(head_dim)` into its query norm this way).
    pub fn load(
        file: &WeightFile,
        prefix: &str,
        dim: usize,
        eps: f32,
        scale: f32,
        device: &Device,
    ) -> Result<Self> {
        let g = file.get(&format!("{prefix}.weight"), &[dim])?;
        let g = HostTensor::new(g.data().iter().map(|v| v * scale).collect(), &[dim])?;
        Self::new(&g, eps, device)
    }

    /// This layer with gamma in `dtype` (statistics stay f32 in the kernel).
    pub fn with_dtype(&self, dtype: ComputeDType) -> Result<Self> {
        Ok(Self {
            gamma: self.gamma.to_dtype(dtype.dtype())?,
            eps: self.eps,
        })
    }

    /// Normalises `x` over its last axis.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.rms_norm(&self.gamma, self.eps)?)
    }
}

/// The normalisation of a family: LayerNorm (BERT, RoBERTa, MPNet, GTE, ModernBERT) or
/// RMSNorm (Qwen), or none (ModernBERT's first layer has no attention norm).
#[derive(Debug, Clone)]
pub enum Norm {
    /// Mean and variance, with a bias (zeros where the checkpoint has none).
    Layer(LayerNorm),
    /// Root mean square only, no bias.
    Rms(RmsNorm),
    /// The input itself.
    Identity,
}

impl Norm {
    /// This norm in `dtype`.
    pub fn with_dtype(&self, dtype: ComputeDType) -> Result<Self> {
        Ok(match self {
            Norm::Layer(n) => Norm::Layer(n.with_dtype(dtype)?),
            Norm::Rms(n) => Norm::Rms(n.with_dtype(dtype)?),
            Norm::Identity => Norm::Identity,
        })
    }

    /// Normalises `x` over its last axis.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Norm::Layer(n) => n.forward(x),
            Norm::Rms(n) => n.forward(x),
            Norm::Identity => Ok(x.clone()),
        }
    }

    /// `norm(x + residual)`: one kernel for LayerNorm, an add then the norm for RMSNorm.
    pub fn forward_residual(&self, x: &Tensor, residual: &Tensor) -> Result<Tensor> {
        match self {
            Norm::Layer(n) => n.forward_residual(x, residual),
            Norm::Rms(n) => n.forward(&x.add(residual)?),
            Norm::Identity => Ok(x.add(residual)?),
        }
    }
}
