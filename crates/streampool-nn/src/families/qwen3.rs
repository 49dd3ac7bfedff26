//! Qwen3 (Qwen3-Embedding): a pre-norm decoder layer with RMSNorm, grouped-query attention
//! with per-head q/k RMSNorm and rotary positions (causal mask set by the model), and a
//! SwiGLU MLP; no biases unless `attention_bias`.

use streampool::Device;

use super::LayerWeights;
use crate::layers::{
    AttentionOptions, Linear, LinearParams, Mlp, MultiheadAttention, Norm, RmsNorm,
    TransformerEncoderLayer,
};
use crate::weights::WeightFile;
use crate::{BertConfig, Result};

/// Loads layer `prefix` (`layers.N`).
pub(crate) fn load_layer(
    file: &WeightFile,
    prefix: &str,
    c: &BertConfig,
    device: &Device,
) -> Result<TransformerEncoderLayer> {
    let (h, i, d) = (c.hidden_size, c.intermediate_size, c.head_dim());
    let (nh, nkv, eps) = (c.num_attention_heads, c.kv_heads(), c.norm_eps());
    let w = LayerWeights {
        file,
        prefix,
        device,
    };
    let p = |name: &str, out: usize, inp: usize| w.linear(name, out, inp);
    let gamma = |name: &str, dim: usize| file.get(&format!("{prefix}.{name}.weight"), &[dim]);
    let options = AttentionOptions {
        kv_heads: Some(nkv),
        head_dim: Some(d),
        qk_norm: Some((
            gamma("self_attn.q_norm", d)?,
            gamma("self_attn.k_norm", d)?,
            eps,
        )),
    };
    let attn = MultiheadAttention::with_options(
        &p("self_attn.q_proj", nh * d, h)?,
        &p("self_attn.k_proj", nkv * d, h)?,
        &p("self_attn.v_proj", nkv * d, h)?,
        &p("self_attn.o_proj", h, nh * d)?,
        nh,
        &options,
        device,
    )?;
    let gate_up = LinearParams::stack(&[&p("mlp.gate_proj", i, h)?, &p("mlp.up_proj", i, h)?])?;
    let mlp = Mlp::gated(
        Linear::new(&gate_up, device)?,
        c.gate_activation()?,
        Linear::new(&p("mlp.down_proj", h, i)?, device)?,
    )?;
    let norm = |name: &str| -> Result<Norm> {
        Ok(Norm::Rms(RmsNorm::new(&gamma(name, h)?, eps, device)?))
    };
    Ok(TransformerEncoderLayer::with_norms(
        attn,
        norm("input_layernorm")?,
        mlp,
        norm("post_attention_layernorm")?,
        true,
    ))
}
