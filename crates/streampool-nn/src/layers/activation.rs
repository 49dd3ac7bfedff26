//! Activation functions (GELU, ReLU) as standalone ops and by config name.

use streampool::Tensor;

use streampool::GateActivation;

use crate::{Activation, Error, Result};

/// Applies `act` element-wise.
///
/// ```
/// use streampool::{Device, Tensor};
/// use streampool_nn::{layers::activation, Activation};
/// let x = Tensor::from_vec(vec![-1.0f32, 2.0], &[2], &Device::cpu()).unwrap();
/// let y = activation::apply(&x, Activation::Relu).unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![0.0, 2.0]);
/// ```
pub fn apply(x: &Tensor, act: Activation) -> Result<Tensor> {
    Ok(match act {
        Activation::Identity => x.clone(),
        Activation::Relu => x.relu()?,
        Activation::Gelu => x.gelu()?,
    })
}

/// The activation a Hugging Face config names in `hidden_act`. Only exact forms are accepted:
/// `gelu` (erf form), `relu`, `linear`/`identity`. The tanh approximation (`gelu_new`,
/// `gelu_pytorch_tanh`) is an error rather than a silent substitution.
pub fn parse(name: &str) -> Result<Activation> {
    match name {
        "gelu" => Ok(Activation::Gelu),
        "relu" => Ok(Activation::Relu),
        "linear" | "identity" => Ok(Activation::Identity),
        other => Err(Error::Config(format!(
            "hidden_act {other:?} is not supported (expected \"gelu\", \"relu\" or \"linear\")"
        ))),
    }
}

/// The gate activation of a gated MLP (GeGLU, SwiGLU) that a config names in `hidden_act`:
/// `gelu` (erf form), `gelu_pytorch_tanh` / `gelu_new` (tanh form), `silu` / `swish` /
/// `swiglu`.
///
/// ```
/// use streampool::GateActivation;
/// use streampool_nn::layers::activation::parse_gate;
/// assert_eq!(parse_gate("silu").unwrap(), GateActivation::Silu);
/// assert!(parse_gate("relu").is_err());
/// ```
pub fn parse_gate(name: &str) -> Result<GateActivation> {
    match name {
        "gelu" => Ok(GateActivation::Gelu),
        "gelu_pytorch_tanh" | "gelu_new" => Ok(GateActivation::GeluTanh),
        "silu" | "swish" | "swiglu" => Ok(GateActivation::Silu),
        other => Err(Error::Config(format!(
            "gated hidden_act {other:?} is not supported (expected \"gelu\", \"gelu_pytorch_tanh\" \
             or \"silu\")"
        ))),
    }
}
