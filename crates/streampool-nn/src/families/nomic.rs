//! NomicBERT (nomic-embed-text): GTE's shape (post-norm, rotary positions, a fused QKV
//! projection, a gated MLP) with SwiGLU, no biases where the config drops them, and its own
//! weight names.

use streampool::Device;

use super::LayerWeights;
use crate::layers::{LayerNorm, Linear, LinearParams, Mlp, Norm, TransformerEncoderLayer};
use crate::weights::WeightFile;
use crate::{BertConfig, Result};

/// Loads layer `prefix` (`encoder.layers.N`): `attn.Wqkv` (query, key, value rows),
/// `attn.out_proj`, `mlp.fc11` (up), `mlp.fc12` (gate), `mlp.fc2`, `norm1`, `norm2`; biases
/// read where the checkpoint has them.
pub(crate) fn load_layer(
    file: &WeightFile,
    prefix: &str,
    c: &BertConfig,
    device: &Device,
) -> Result<TransformerEncoderLayer> {
    let (h, i, eps) = (c.hidden_size, c.intermediate_size, c.layer_norm_eps as f32);
    let w = LayerWeights {
        file,
        prefix,
        device,
    };
    let p = |name: &str, out: usize, inp: usize| w.linear(name, out, inp);
    let attn = w.fused_attention("attn.Wqkv", "attn.out_proj", c)?;
    let gate_up = LinearParams::stack(&[&p("mlp.fc12", i, h)?, &p("mlp.fc11", i, h)?])?;
    let mlp = Mlp::gated(
        Linear::new(&gate_up, device)?,
        c.gate_activation()?,
        Linear::new(&p("mlp.fc2", h, i)?, device)?,
    )?;
    let norm = |name: &str| -> Result<Norm> {
        Ok(Norm::Layer(LayerNorm::load(
            file,
            &format!("{prefix}.{name}"),
            h,
            eps,
            device,
        )?))
    };
    Ok(TransformerEncoderLayer::with_norms(
        attn,
        norm("norm1")?,
        mlp,
        norm("norm2")?,
        false,
    ))
}
