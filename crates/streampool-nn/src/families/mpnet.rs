//! MPNet (all-mpnet-base-v2): BERT's post-norm layer with its own weight names, and a
//! relative position bias added to every layer's attention scores.

use streampool::{Device, Tensor};

use crate::layers::{
    Embedding, LayerNorm, Linear, LinearParams, Mlp, MultiheadAttention, TransformerEncoderLayer,
};
use crate::weights::WeightFile;
use crate::{BertConfig, ComputeDType, Result};

/// Loads layer `prefix` (`encoder.layer.N`).
pub(crate) fn load_layer(
    file: &WeightFile,
    prefix: &str,
    c: &BertConfig,
    device: &Device,
) -> Result<TransformerEncoderLayer> {
    let (h, i, eps) = (c.hidden_size, c.intermediate_size, c.layer_norm_eps as f32);
    let p = |name: &str, out: usize, inp: usize| {
        LinearParams::load(file, &format!("{prefix}.{name}"), out, inp)
    };
    let attn = MultiheadAttention::new(
        &p("attention.attn.q", h, h)?,
        &p("attention.attn.k", h, h)?,
        &p("attention.attn.v", h, h)?,
        &p("attention.attn.o", h, h)?,
        c.num_attention_heads,
        device,
    )?;
    let norm = |name: &str| LayerNorm::load(file, &format!("{prefix}.{name}"), h, eps, device);
    let mlp = Mlp::new(
        Linear::new(&p("intermediate.dense", i, h)?, device)?,
        c.activation()?,
        Linear::new(&p("output.dense", h, i)?, device)?,
    )?;
    Ok(TransformerEncoderLayer::new(
        attn,
        norm("attention.LayerNorm")?,
        mlp,
        norm("output.LayerNorm")?,
    ))
}

/// MPNet's relative position bias: a `[buckets, heads]` table indexed by the bucket of each
/// key's offset from its query (T5's bucketing: exact up to `buckets / 4`, then logarithmic
/// up to `MAX_DISTANCE`, signed halves).
#[derive(Debug, Clone)]
pub(crate) struct RelativeBias {
    table: Embedding,
    buckets: usize,
    heads: usize,
}

/// Offsets past this share the last bucket (MPNet's `max_distance`).
const MAX_DISTANCE: i64 = 128;

impl RelativeBias {
    pub(crate) fn load(
        file: &WeightFile,
        prefix: &str,
        c: &BertConfig,
        device: &Device,
    ) -> Result<Self> {
        let buckets = c.relative_attention_num_buckets.unwrap_or(32);
        let heads = c.num_attention_heads;
        let table = Embedding::load(
            file,
            &format!("{prefix}encoder.relative_attention_bias.weight"),
            buckets,
            heads,
            device,
        )?;
        Ok(Self {
            table,
            buckets,
            heads,
        })
    }

    pub(crate) fn with_dtype(&self, dtype: ComputeDType) -> Result<Self> {
        Ok(Self {
            table: self.table.with_dtype(dtype)?,
            ..self.clone()
        })
    }

    /// The bias for `seq` tokens, `[1, heads, seq, seq]` (the same for every sequence of a
    /// batch: positions are `0..seq`).
    pub(crate) fn bias(&self, seq: usize) -> Result<Tensor> {
        let ids: Vec<i64> = (0..seq)
            .flat_map(|q| (0..seq).map(move |k| bucket(k as i64 - q as i64, self.buckets) as i64))
            .collect();
        // [q, k, heads] -> [heads, q, k]
        let values = self.table.forward(&ids, &[seq, seq])?;
        Ok(values
            .transpose(1, 2)?
            .transpose(0, 1)?
            .contiguous()?
            .reshape(&[1, self.heads, seq, seq])?)
    }
}

/// The bucket of `relative = key - query` (transformers' `relative_position_bucket`,
/// including its f32 logarithm, so bucket edges agree).
fn bucket(relative: i64, buckets: usize) -> usize {
    let half = (buckets / 2) as i64;
    let n = -relative;
    let mut ret = if n < 0 { half } else { 0 };
    let n = n.abs();
    let max_exact = half / 2;
    if n < max_exact {
        ret += n;
    } else {
        let ratio =
            (n as f32 / max_exact as f32).ln() / (MAX_DISTANCE as f32 / max_exact as f32).ln();
        let large = max_exact + (ratio * (half - max_exact) as f32) as i64;
        ret += large.min(half - 1);
    }
    ret as usize
}

#[cfg(test)]
mod tests {
    use super::bucket;

    #[test]
    fn buckets_match_transformers() {
        // transformers' MPNetEncoder.relative_position_bucket(torch.arange(-200, 201, 50))
        // and of torch.tensor([1, -1, 0, 7, -7, 8, -8]), 32 buckets.
        let got: Vec<usize> = (-200..=200).step_by(50).map(|r| bucket(r, 32)).collect();
        assert_eq!(got, [15, 15, 15, 13, 0, 29, 31, 31, 31]);
        let got: Vec<usize> = [1, -1, 0, 7, -7, 8, -8].map(|r| bucket(r, 32)).to_vec();
        assert_eq!(got, [17, 1, 0, 23, 7, 24, 8]);
    }
}
