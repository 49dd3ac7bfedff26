//! Alibaba GTE (gte-*-v1.5, gte-multilingual; `model_type` `new` on the hub, `gte` in
//! transformers): BERT's post-norm layer with rotary positions, a fused QKV projection and a
//! GeGLU MLP whose gate/up projection has no bias.

use streampool::Device;

use super::LayerWeights;
use crate::layers::{LayerNorm, Linear, LinearParams, Mlp, Norm, TransformerEncoderLayer};
use crate::weights::WeightFile;
use crate::{BertConfig, Result};

/// Loads layer `prefix` (`encoder.layer.N`), with the checkpoints' own names: `attention.
/// qkv_proj` (query, key, value rows), `attention.o_proj`, `attn_ln`, `mlp.up_gate_proj`
/// (up rows, then gate rows), `mlp.down_proj`, `mlp_ln`.
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
    let attn = w.fused_attention("attention.qkv_proj", "attention.o_proj", c)?;
    let up_gate = p("mlp.up_gate_proj", 2 * i, h)?;
    let gate_up = LinearParams::stack(&[&up_gate.rows(i, i)?, &up_gate.rows(0, i)?])?;
    let mlp = Mlp::gated(
        Linear::new(&gate_up, device)?,
        c.gate_activation()?,
        Linear::new(&p("mlp.down_proj", h, i)?, device)?,
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
        norm("attn_ln")?,
        mlp,
        norm("mlp_ln")?,
        false,
    ))
}
