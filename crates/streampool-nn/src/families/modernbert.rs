//! ModernBERT: a pre-norm encoder with LayerNorms without bias (the first layer has no
//! attention norm), rotary positions with one base for global layers and another for the
//! sliding-window layers (the model picks each layer's mask and tables), a fused QKV
//! projection and a GeGLU MLP, no biases unless the config asks.

use streampool::Device;

use super::LayerWeights;
use crate::layers::{LayerNorm, Linear, Mlp, Norm, TransformerEncoderLayer};
use crate::weights::WeightFile;
use crate::{BertConfig, Result};

/// Loads layer `index` at `prefix` (`layers.N`): `attn_norm` (absent in layer 0),
/// `attn.Wqkv` (query, key, value rows), `attn.Wo`, `mlp_norm`, `mlp.Wi` (the activated
/// input rows, then the gate rows: `act(input) * gate`), `mlp.Wo`.
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
    let attn = w.fused_attention("attn.Wqkv", "attn.Wo", c)?;
    // Wi's first half is activated and gates nothing: the gated MLP's own layout.
    let mlp = Mlp::gated(
        Linear::new(&p("mlp.Wi", 2 * i, h)?, device)?,
        c.gate_activation()?,
        Linear::new(&p("mlp.Wo", h, i)?, device)?,
    )?;
    let norm = |name: &str| -> Result<Norm> {
        Ok(Norm::Layer(LayerNorm::load_optional_bias(
            file,
            &format!("{prefix}.{name}"),
            h,
            eps,
            device,
        )?))
    };
    let attn_norm = if file.contains(&format!("{prefix}.attn_norm.weight")) {
        norm("attn_norm")?
    } else {
        Norm::Identity
    };
    Ok(TransformerEncoderLayer::with_norms(
        attn,
        attn_norm,
        mlp,
        norm("mlp_norm")?,
        true,
    ))
}
