//! The compute precision a model runs in.

use std::fmt;
use std::str::FromStr;

use streampool::{DType, MatmulMath};

use crate::{Error, Result};

/// The precision of a model's weights and activations. Weights are converted once at load;
/// LayerNorm and softmax statistics are kept in `f32` inside the kernels whatever the
/// choice, and sentence embeddings are always returned as `f32`.
///
/// | value  | storage | matmul                                   |
/// |--------|---------|------------------------------------------|
/// | `F32`  | f32     | exact f32                                |
/// | `Tf32` | f32     | TF32 tensor cores on CUDA (exact on CPU) |
/// | `F16`  | f16     | f16 inputs, f32 accumulation             |
/// | `Bf16` | bf16    | bf16 inputs, f32 accumulation            |
/// | `Int8` | f32     | the encoder's linear layers in int8 ([`MatmulMath::Int8`]), CPU only |
///
/// `Int8` is a quantized dtype: the linear layers' weights are quantized per output channel
/// and their inputs per token (a scale per 32 inputs), so a model keeps its meaning only as
/// far as the accuracy gate measures ([`crate::accuracy`]); [`crate::SentenceEmbedder`] runs
/// that gate when it loads a model in it. Attention, LayerNorm, softmax and pooling stay `f32`.
///
/// The wgpu backend runs `F32`, `Tf32` (as full f32) and `F16` where the adapter has
/// `SHADER_F16`; `Bf16` fails at load there (WGSL has no bf16 type).
///
/// ```
/// use streampool_nn::ComputeDType;
/// let d: ComputeDType = "bf16".parse().unwrap();
/// assert_eq!(d, ComputeDType::Bf16);
/// assert_eq!(d.to_string(), "bf16");
/// assert!("f64".parse::<ComputeDType>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ComputeDType {
    /// Full f32 (the reference precision).
    #[default]
    F32,
    /// f32 storage, TF32 tensor-core matmuls.
    Tf32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// f32 storage, int8 linear layers with `i32` sums (CPU only).
    Int8,
}

impl ComputeDType {
    /// Every value: the float ones in increasing order of speed on tensor-core GPUs, then
    /// the quantized one.
    pub const ALL: [ComputeDType; 5] = [Self::F32, Self::Tf32, Self::F16, Self::Bf16, Self::Int8];

    /// The tensor dtype of weights and activations.
    pub fn dtype(self) -> DType {
        match self {
            Self::F32 | Self::Tf32 | Self::Int8 => DType::F32,
            Self::F16 => DType::F16,
            Self::Bf16 => DType::BF16,
        }
    }

    /// The matmul mode (only differs from `Exact` for `Tf32`).
    pub fn math(self) -> MatmulMath {
        match self {
            Self::Tf32 => MatmulMath::Tf32,
            Self::Int8 => MatmulMath::Int8,
            _ => MatmulMath::Exact,
        }
    }

    /// Whether weights are quantized (`Int8`): such a model must pass the accuracy gate
    /// against its own f32 ([`crate::accuracy`]).
    pub fn is_quantized(self) -> bool {
        self == Self::Int8
    }

    /// Whether storage is 16-bit (these run the fused attention and pooling kernels).
    pub fn is_half(self) -> bool {
        matches!(self, Self::F16 | Self::Bf16)
    }

    /// The name used on the command line: `f32`, `tf32`, `f16`, `bf16` or `int8`.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Tf32 => "tf32",
            Self::F16 => "f16",
            Self::Bf16 => "bf16",
            Self::Int8 => "int8",
        }
    }
}

impl fmt::Display for ComputeDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ComputeDType {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                Error::Input(format!(
                    "unknown compute dtype {s:?}: expected f32, tf32, f16, bf16 or int8"
                ))
            })
    }
}
