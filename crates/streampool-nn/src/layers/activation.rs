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
        Activation::GeluTanh => {
            // The bias kernel with a zero bias: the one kernel that has this activation.
            let cols = x.dims().last().copied().unwrap_or(1);
            let zero = Tensor::zeros(&[cols], x.device())?.to_dtype(x.dtype())?;
            x.bias_act(&zero, act)?
        }
    })
}

/// The activation a Hugging Face config names in `hidden_act`: `gelu` (erf form),
/// `gelu_new` and `gelu_pytorch_tanh` (the tanh approximation), `relu`, `linear`/`identity`.
///
/// ```
/// use streampool_nn::{layers::activation, Activation};
/// assert_eq!(activation::parse("gelu").unwrap(), Activation::Gelu);
/// assert_eq!(activation::parse("gelu_new").unwrap(), Activation::GeluTanh);
/// assert!(activation::parse("swish").is_err());
/// ```
pub fn parse(name: &str) -> Result<Activation> {
    match name {
        "gelu" => Ok(Activation::Gelu),
        "gelu_new" | "gelu_pytorch_tanh" => Ok(Activation::GeluTanh),
        "relu" => Ok(Activation::Relu),
        "linear" | "identity" => Ok(Activation::Identity),
        other => Err(Error::Config(format!(
            "hidden_act {other:?} is not supported (expected \"gelu\", \"gelu_new\", \
             \"gelu_pytorch_tanh\", \"relu\" or \"linear\")"
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
