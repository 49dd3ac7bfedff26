//! One transformer layer: attention and MLP blocks with residuals, post-norm (BERT) or
//! pre-norm (Qwen).

use streampool::{Device, Tensor};

use super::{
    AttentionInputs, AttentionMask, LayerNorm, Linear, LinearParams, Mlp, MultiheadAttention, Norm,
};
use crate::weights::WeightFile;
use crate::{Activation, BertConfig, ComputeDType, Result};

/// Post-norm (BERT, RoBERTa, MPNet, GTE): `h = N1(x + attn(x))`, `out = N2(h + mlp(h))`, each
/// residual add fused into its LayerNorm. Pre-norm (Qwen): `h = x + attn(N1(x))`,
/// `out = h + mlp(N2(h))`.
#[derive(Debug, Clone)]
pub struct TransformerEncoderLayer {
    attn: MultiheadAttention,
    attn_norm: Norm,
    mlp: Mlp,
    out_norm: Norm,
    pre_norm: bool,
}

impl TransformerEncoderLayer {
    /// Assembles a post-norm LayerNorm layer (BERT's) from its parts.
    pub fn new(
        attn: MultiheadAttention,
        attn_norm: LayerNorm,
        mlp: Mlp,
        out_norm: LayerNorm,
    ) -> Self {
        Self::with_norms(
            attn,
            Norm::Layer(attn_norm),
            mlp,
            Norm::Layer(out_norm),
            false,
        )
    }

    /// Assembles a layer with any norms, post-norm or pre-norm.
    pub fn with_norms(
        attn: MultiheadAttention,
        attn_norm: Norm,
        mlp: Mlp,
        out_norm: Norm,
        pre_norm: bool,
    ) -> Self {
        Self {
            attn,
            attn_norm,
            mlp,
            out_norm,
            pre_norm,
        }
    }

    /// Loads layer `prefix` (e.g. `encoder.layer.0`) of a Hugging Face BERT (or RoBERTa)
    /// checkpoint.
    pub fn load_bert(
        file: &WeightFile,
        prefix: &str,
        config: &BertConfig,
        device: &Device,
    ) -> Result<Self> {
        let (h, i) = (config.hidden_size, config.intermediate_size);
        let eps = config.layer_norm_eps as f32;
        let p = |name: &str, out: usize, inp: usize| {
            LinearParams::load(file, &format!("{prefix}.{name}"), out, inp)
        };
        let attn = MultiheadAttention::new(
            &p("attention.self.query", h, h)?,
            &p("attention.self.key", h, h)?,
            &p("attention.self.value", h, h)?,
            &p("attention.output.dense", h, h)?,
            config.num_attention_heads,
            device,
        )?;
        let attn_norm = LayerNorm::load(
            file,
            &format!("{prefix}.attention.output.LayerNorm"),
            h,
            eps,
            device,
        )?;
        let mlp = Mlp::new(
            Linear::new(&p("intermediate.dense", i, h)?, device)?,
            config.activation()?,
            Linear::new(&p("output.dense", h, i)?, device)?,
        )?;
        let out_norm =
            LayerNorm::load(file, &format!("{prefix}.output.LayerNorm"), h, eps, device)?;
        Ok(Self::new(attn, attn_norm, mlp, out_norm))
    }

    /// This layer with its weights and activations in `dtype`.
    pub fn with_dtype(&self, dtype: ComputeDType) -> Result<Self> {
        Ok(Self {
            attn: self.attn.with_dtype(dtype)?,
            attn_norm: self.attn_norm.with_dtype(dtype)?,
            mlp: self.mlp.with_dtype(dtype)?,
            out_norm: self.out_norm.with_dtype(dtype)?,
            pre_norm: self.pre_norm,
        })
    }

    /// The layer's attention.
    pub fn attention(&self) -> &MultiheadAttention {
        &self.attn
    }

    /// This layer with its MLP's activation set to `act`.
    pub fn with_mlp_activation(&self, act: Activation) -> Self {
        Self {
            mlp: self.mlp.with_activation(act),
            ..self.clone()
        }
    }

    /// Runs the layer on `x: [batch, seq, hidden]` (or `[tokens, hidden]` with a packed
    /// mask).
    pub fn forward(&self, x: &Tensor, mask: Option<&AttentionMask>) -> Result<Tensor> {
        self.forward_with(
            x,
            &AttentionInputs {
                mask,
                ..Default::default()
            },
        )
    }

    /// Runs the layer on `x: [batch, seq, hidden]` with the attention's mask, rotary tables
    /// and score bias.
    pub fn forward_with(&self, x: &Tensor, inputs: &AttentionInputs) -> Result<Tensor> {
        if self.pre_norm {
            let a = self
                .attn
                .forward_with(&self.attn_norm.forward(x)?, inputs)?;
            let h = a.add(x)?;
            let m = self.mlp.forward(&self.out_norm.forward(&h)?)?;
            return Ok(m.add(&h)?);
        }
        let a = self.attn.forward_with(x, inputs)?;
        let h = self.attn_norm.forward_residual(&a, x)?;
        self.mlp.forward_add_norm(&h, &self.out_norm)
    }
}
