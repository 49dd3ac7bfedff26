//! Multi-head self-attention with a padding mask.

use streampool::{Device, Tensor};

use super::{Linear, LinearParams};
use crate::weights::HostTensor;
use crate::{Error, Result};

/// Added to the attention scores of padded keys: the most negative finite `f32` (Hugging
/// Face's convention). `exp` of it underflows to exactly 0, and unlike `-inf` a row whose keys
/// are all padding gives a uniform distribution instead of NaN.
const MASKED: f32 = f32::MIN;

/// A padding mask for one batch, built once and shared by every layer: an additive
/// `[batch, 1, 1, seq]` tensor, 0 on real tokens and a huge negative number on padding, which
/// broadcasts over heads and query positions.
///
/// ```
/// use streampool::Device;
/// use streampool_nn::AttentionMask;
/// let m = AttentionMask::new(&[1, 1, 0, 1, 0, 0], 2, 3, &Device::cpu()).unwrap();
/// assert_eq!(m.additive().dims(), &[2, 1, 1, 3]);
/// assert!(AttentionMask::new(&[1, 2], 1, 2, &Device::cpu()).is_err()); // not 0/1
/// ```
#[derive(Debug, Clone)]
pub struct AttentionMask {
    additive: Tensor,
    batch: usize,
    seq: usize,
}

impl AttentionMask {
    /// From a row-major `[batch, seq]` mask of 1 (attend) and 0 (padding).
    pub fn new(mask: &[i64], batch: usize, seq: usize, device: &Device) -> Result<Self> {
        if mask.len() != batch * seq {
            return Err(Error::Input(format!(
                "attention mask has {} values, expected batch {batch} x seq {seq}",
                mask.len()
            )));
        }
        let additive = mask
            .iter()
            .map(|&m| match m {
                1 => Ok(0.0),
                0 => Ok(MASKED),
                other => Err(Error::Input(format!(
                    "attention mask values must be 0 or 1, got {other}"
                ))),
            })
            .collect::<Result<Vec<f32>>>()?;
        Ok(Self {
            additive: Tensor::from_vec(additive, &[batch, 1, 1, seq], device)?,
            batch,
            seq,
        })
    }

    /// The mask from its additive `[batch, 1, 1, seq]` tensor (as made by [`Self::new`]).
    pub fn from_additive(additive: Tensor) -> Result<Self> {
        let (batch, seq) = match *additive.dims() {
            [batch, 1, 1, seq] => (batch, seq),
            _ => {
                return Err(Error::Input(format!(
                    "additive attention mask of shape {:?}, expected [batch, 1, 1, seq]",
                    additive.dims()
                )))
            }
        };
        Ok(Self {
            additive,
            batch,
            seq,
        })
    }

    /// The additive `[batch, 1, 1, seq]` tensor.
    pub fn additive(&self) -> &Tensor {
        &self.additive
    }
}

/// Multi-head self-attention (BERT's `attention.self` plus `attention.output.dense`):
/// `softmax(q k^T / sqrt(d) + mask) v`, heads merged, then the output projection.
///
/// At construction the query, key and value projections are fused into one `[in, 3 * hidden]`
/// matrix (one matmul per call instead of three), and `1/sqrt(head_dim)` is folded into the
/// query weights and bias, so the scores need no separate scaling kernel.
#[derive(Debug, Clone)]
pub struct MultiheadAttention {
    qkv: Linear,
    out: Linear,
    num_heads: usize,
    head_dim: usize,
}

impl MultiheadAttention {
    /// Builds the layer from PyTorch-layout projections (`[hidden, hidden]` weights, biases
    /// optional) and uploads it to `device`.
    pub fn new(
        query: &LinearParams,
        key: &LinearParams,
        value: &LinearParams,
        out: &LinearParams,
        num_heads: usize,
        device: &Device,
    ) -> Result<Self> {
        let hidden = query.in_features();
        if num_heads == 0 || !hidden.is_multiple_of(num_heads) {
            return Err(Error::Input(format!(
                "attention: hidden size {hidden} is not a multiple of {num_heads} heads"
            )));
        }
        for (name, p) in [
            ("query", query),
            ("key", key),
            ("value", value),
            ("out", out),
        ] {
            let p = LinearParams::new(p.weight.clone(), p.bias.clone())?;
            if p.weight.shape() != [hidden, hidden] {
                return Err(Error::Input(format!(
                    "attention {name} weight is {:?}, expected [{hidden}, {hidden}]",
                    p.weight.shape()
                )));
            }
        }
        let head_dim = hidden / num_heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        // Rows of the fused [3 * hidden, hidden] weight: query (scaled), key, value.
        let mut w = Vec::with_capacity(3 * hidden * hidden);
        let mut b = Vec::with_capacity(3 * hidden);
        for (p, s) in [(query, scale), (key, 1.0), (value, 1.0)] {
            w.extend(p.weight.data().iter().map(|x| x * s));
            match &p.bias {
                Some(bias) => b.extend(bias.data().iter().map(|x| x * s)),
                None => b.extend(vec![0.0; hidden]),
            }
        }
        let fused = LinearParams::new(
            HostTensor::new(w, &[3 * hidden, hidden])?,
            Some(HostTensor::new(b, &[3 * hidden])?),
        )?;
        Ok(Self {
            qkv: Linear::new(&fused, device)?,
            out: Linear::new(out, device)?,
            num_heads,
            head_dim,
        })
    }

    /// Number of heads.
    pub fn num_heads(&self) -> usize {
        self.num_heads
    }

    /// Self-attention over `x: [batch, seq, hidden]`; `mask` hides padded keys.
    pub fn forward(&self, x: &Tensor, mask: Option<&AttentionMask>) -> Result<Tensor> {
        let hidden = self.num_heads * self.head_dim;
        let &[batch, seq, h] = x.dims() else {
            return Err(Error::Input(format!(
                "attention takes [batch, seq, hidden], got {:?}",
                x.dims()
            )));
        };
        if h != hidden {
            return Err(Error::Input(format!(
                "attention takes hidden size {hidden}, got {:?}",
                x.dims()
            )));
        }
        if let Some(m) = mask {
            if (m.batch, m.seq) != (batch, seq) {
                return Err(Error::Input(format!(
                    "attention mask is for batch {} x seq {}, input is {:?}",
                    m.batch,
                    m.seq,
                    x.dims()
                )));
            }
        }
        let (nh, d) = (self.num_heads, self.head_dim);
        let qkv = self.qkv.forward(x)?.reshape(&[batch, seq, 3, nh, d])?;
        // [batch, seq, 1, heads, d] -> [batch, heads, 1, seq, d]: one copy per projection.
        let head = |i: usize| -> Result<Tensor> {
            Ok(qkv
                .narrow(2, i, 1)?
                .transpose(1, 3)?
                .contiguous()?
                .reshape(&[batch, nh, seq, d])?)
        };
        let (q, k, v) = (head(0)?, head(1)?, head(2)?);
        // The query is pre-scaled by 1/sqrt(d); `k.t()` is a view the matmul reads strided.
        let mut scores = q.matmul(&k.t()?)?;
        if let Some(m) = mask {
            scores = scores.add(&m.additive)?;
        }
        let ctx = scores.softmax()?.matmul(&v)?;
        let merged = ctx.transpose(1, 2)?.reshape(&[batch, seq, hidden])?;
        self.out.forward(&merged)
    }
}
