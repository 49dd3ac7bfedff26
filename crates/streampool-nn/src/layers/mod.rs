//! Layers: each holds its weights on a device and has a `forward(&self, ...)` that only reads
//! them, so one layer (or model) is shared by any number of threads with no lock.

pub mod activation;
mod attention;
mod embedding;
mod encoder_layer;
mod layer_norm;
mod linear;
mod mlp;
mod norm;

pub use attention::{AttentionInputs, AttentionMask, AttentionOptions, MultiheadAttention, Rotary};
pub use embedding::Embedding;
pub use encoder_layer::TransformerEncoderLayer;
pub use layer_norm::LayerNorm;
pub(crate) use linear::check_quantized_on;
pub use linear::{Linear, LinearParams};
pub use mlp::{Mlp, HALF_PRECISION_GELU};
pub use norm::{Norm, RmsNorm};
