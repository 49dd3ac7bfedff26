//! Two-layer perceptron.

use streampool::{GateActivation, Tensor};

use super::{Linear, Norm};
use crate::{Activation, ComputeDType, Error, Result};

/// The GELU an f16/bf16 MLP computes where its config names the erf form (`gelu`): the tanh
/// approximation. Measured on all-MiniLM-L6-v2 against the fp32 sentence-transformers
/// embeddings (`tests/it/minilm.rs`, CPU backend, the same arithmetic as CUDA's):
/// see `half_precision_gelu_forms` there.
pub const HALF_PRECISION_GELU: Activation = Activation::GeluTanh;

/// `fc2(act(fc1(x)))`, with `fc1`'s bias and the activation fused into one kernel. In BERT this
/// is the feed-forward block (`intermediate.dense`, GELU, `output.dense`).
///
/// ```
/// use streampool::{Device, Tensor};
/// use streampool_nn::{Activation, HostTensor, Linear, LinearParams, Mlp};
/// let dev = Device::cpu();
/// let lin = |w: Vec<f32>, shape: &[usize]| {
///     Linear::new(&LinearParams::new(HostTensor::new(w, shape).unwrap(), None).unwrap(), &dev)
/// };
/// let mlp = Mlp::new(lin(vec![1.0, -1.0], &[2, 1]).unwrap(), Activation::Relu,
///                    lin(vec![1.0, 1.0], &[1, 2]).unwrap()).unwrap();
/// let x = Tensor::from_vec(vec![3.0f32], &[1, 1], &dev).unwrap();
/// assert_eq!(mlp.forward(&x).unwrap().to_vec::<f32>().unwrap(), vec![3.0]);
/// ```
///
/// [`Mlp::gated`] builds the gated form (GeGLU, SwiGLU): `fc2(act(gate(x)) * up(x))`, with
/// the gate and up projections fused into `fc1`.
#[derive(Debug, Clone)]
pub struct Mlp {
    fc1: Linear,
    act: Activation,
    /// Gated: `fc1` gives `[gate, up]` and this activates the gate.
    gate: Option<GateActivation>,
    fc2: Linear,
}

impl Mlp {
    /// Chains two layers; `fc1`'s outputs must be `fc2`'s inputs.
    pub fn new(fc1: Linear, act: Activation, fc2: Linear) -> Result<Self> {
        if fc1.out_features() != fc2.in_features() {
            return Err(Error::Input(format!(
                "mlp: fc1 gives {} features but fc2 takes {}",
                fc1.out_features(),
                fc2.in_features()
            )));
        }
        Ok(Self {
            fc1,
            act,
            gate: None,
            fc2,
        })
    }

    /// The gated form: `fc1` gives `2 * n` features per row, the gate's `n` then the up
    /// projection's `n` ([`LinearParams::stack`](crate::LinearParams::stack) of the two), and
    /// `fc2` takes `n`.
    ///
    /// ```
    /// use streampool::{Device, GateActivation, Tensor};
    /// use streampool_nn::{HostTensor, Linear, LinearParams, Mlp};
    /// let dev = Device::cpu();
    /// let lin = |w: Vec<f32>, shape: &[usize]| {
    ///     Linear::new(&LinearParams::new(HostTensor::new(w, shape).unwrap(), None).unwrap(), &dev)
    /// };
    /// // gate = 10 x (silu(10) ~ 10), up = x, down = identity: about 10 x^2 at x = 1.
    /// let mlp = Mlp::gated(lin(vec![10.0, 1.0], &[2, 1]).unwrap(), GateActivation::Silu,
    ///                      lin(vec![1.0], &[1, 1]).unwrap()).unwrap();
    /// let x = Tensor::from_vec(vec![1.0f32], &[1, 1], &dev).unwrap();
    /// assert!((mlp.forward(&x).unwrap().to_vec::<f32>().unwrap()[0] - 9.9995).abs() < 1e-3);
    /// ```
    pub fn gated(fc1: Linear, act: GateActivation, fc2: Linear) -> Result<Self> {
        if fc1.out_features() != 2 * fc2.in_features() {
            return Err(Error::Input(format!(
                "gated mlp: fc1 gives {} features, not gate + up of the {} fc2 takes",
                fc1.out_features(),
                fc2.in_features()
            )));
        }
        Ok(Self {
            fc1,
            act: Activation::Identity,
            gate: Some(act),
            fc2,
        })
    }

    /// This MLP with both layers in `dtype`. In f16 and bf16 the erf GELU becomes its tanh
    /// approximation ([`Activation::GeluTanh`]), which CUDA computes in the first product's
    /// epilogue instead of a separate pass over the `[tokens, intermediate]` activations (as
    /// text-embeddings-inference does); [`Self::with_activation`] sets the erf form back.
    /// See [`HALF_PRECISION_GELU`] for what it costs in accuracy.
    pub fn with_dtype(&self, dtype: ComputeDType) -> Result<Self> {
        let act = match self.act {
            Activation::Gelu if dtype.is_half() => HALF_PRECISION_GELU,
            act => act,
        };
        Ok(Self {
            fc1: self.fc1.with_dtype(dtype)?,
            act,
            gate: self.gate,
            fc2: self.fc2.with_dtype(dtype)?,
        })
    }

    /// This MLP with activation `act` (same weights).
    pub fn with_activation(&self, act: Activation) -> Self {
        Self {
            act,
            ..self.clone()
        }
    }

    /// The activation between the two layers.
    pub fn activation(&self) -> Activation {
        self.act
    }

    /// Applies the block to `[..., in]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.fc2.forward(&self.hidden(x)?)
    }

    /// `fc1` and the activation (the gated form's product).
    fn hidden(&self, x: &Tensor) -> Result<Tensor> {
        match self.gate {
            Some(gate) => Ok(self.fc1.forward(x)?.gated_act(gate)?),
            None => self.fc1.forward_act(x, self.act),
        }
    }

    /// `norm(self(x) + x)`, BERT's post-norm MLP block. Where the backend adds the residual
    /// in `fc2`'s epilogue (CUDA, f16/bf16: see [`Linear::fuses_residual`]) and `norm` is a
    /// LayerNorm, the norm then reads one tensor instead of two (on the H100 at 512 x 128
    /// tokens a LayerNorm with its residual read 150 MB, without it 100 MB); else the norm
    /// adds the residual itself (one kernel for LayerNorm).
    pub fn forward_add_norm(&self, x: &Tensor, norm: &Norm) -> Result<Tensor> {
        let hidden = self.hidden(x)?;
        if matches!(norm, Norm::Layer(_)) && self.fc2.fuses_residual(&hidden)? {
            return norm.forward(&self.fc2.forward_residual(&hidden, x)?);
        }
        norm.forward_residual(&self.fc2.forward(&hidden)?, x)
    }
}
