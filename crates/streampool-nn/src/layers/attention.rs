//! Multi-head self-attention with a padding mask.

use streampool::{Device, Tensor};

use super::{Linear, LinearParams};
use crate::weights::HostTensor;
use crate::{ComputeDType, Error, Result};

/// Added to the attention scores of padded keys: the most negative finite `f32` (Hugging
/// Face's convention). `exp` of it underflows to exactly 0, and unlike `-inf` a row whose keys
/// are all padding gives a uniform distribution instead of NaN.
const MASKED: f32 = f32::MIN;

/// A padding mask for one batch, built once and shared by every layer. Either additive
/// ([`Self::new`]): a `[batch, 1, 1, seq]` tensor, 0 on real tokens and a huge negative number
/// on padding, which broadcasts over heads and query positions (the unfused f32 path); or
/// binary ([`Self::binary`]): an `F32` `[batch, seq]` tensor of 1 and 0, as the fused
/// attention kernel takes it (the f16/bf16 path); or packed ([`Self::packed`]): no padding
/// at all, the sequences stored back to back (`[tokens, hidden]` activations) and the mask
/// their `I64` offsets (`[batch + 1]`), for [`streampool::Tensor::attention_packed`].
///
/// ```
/// use streampool::Device;
/// use streampool_nn::AttentionMask;
/// let m = AttentionMask::new(&[1, 1, 0, 1, 0, 0], 2, 3, &Device::cpu()).unwrap();
/// assert_eq!(m.tensor().dims(), &[2, 1, 1, 3]);
/// assert!(AttentionMask::new(&[1, 2], 1, 2, &Device::cpu()).is_err()); // not 0/1
/// ```
#[derive(Debug, Clone)]
pub struct AttentionMask {
    /// Additive `[batch, 1, 1, seq]`, binary `[batch, seq]` when `binary`, or the `I64`
    /// offsets `[batch + 1]` when `packed` (`seq` is then the longest sequence's bound).
    additive: Tensor,
    binary: bool,
    packed: bool,
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
            binary: false,
            packed: false,
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
            binary: false,
            packed: false,
            batch,
            seq,
        })
    }

    /// A binary mask (for the fused attention of f16/bf16 layers) from a row-major
    /// `[batch, seq]` mask of 1 (attend) and 0 (padding).
    ///
    /// ```
    /// use streampool::Device;
    /// use streampool_nn::AttentionMask;
    /// let m = AttentionMask::binary(&[1, 1, 0, 1, 0, 0], 2, 3, &Device::cpu()).unwrap();
    /// assert_eq!(m.tensor().dims(), &[2, 3]);
    /// assert!(m.is_binary());
    /// ```
    pub fn binary(mask: &[i64], batch: usize, seq: usize, device: &Device) -> Result<Self> {
        if mask.len() != batch * seq {
            return Err(Error::Input(format!(
                "attention mask has {} values, expected batch {batch} x seq {seq}",
                mask.len()
            )));
        }
        let values = mask
            .iter()
            .map(|&m| match m {
                0 | 1 => Ok(m as f32),
                other => Err(Error::Input(format!(
                    "attention mask values must be 0 or 1, got {other}"
                ))),
            })
            .collect::<Result<Vec<f32>>>()?;
        Ok(Self {
            additive: Tensor::from_vec(values, &[batch, seq], device)?,
            binary: true,
            packed: false,
            batch,
            seq,
        })
    }

    /// The binary mask from its `F32` `[batch, seq]` tensor (as made by [`Self::binary`]).
    pub fn from_binary(mask: Tensor) -> Result<Self> {
        let &[batch, seq] = mask.dims() else {
            return Err(Error::Input(format!(
                "binary attention mask of shape {:?}, expected [batch, seq]",
                mask.dims()
            )));
        };
        Ok(Self {
            additive: mask,
            binary: true,
            packed: false,
            batch,
            seq,
        })
    }

    /// A packed batch's mask from the `batch + 1` offsets of its sequences (non-decreasing
    /// from 0; sequence `b` is rows `offsets[b]..offsets[b + 1]` of the `[tokens, hidden]`
    /// activations). `max_len` bounds every length (it sizes the attention kernel's grid, so
    /// a graph captured with it serves every batch of the same bound); at least the longest.
    ///
    /// ```
    /// use streampool::Device;
    /// use streampool_nn::AttentionMask;
    /// let m = AttentionMask::packed(&[0, 3, 5], 64, &Device::cpu()).unwrap();
    /// assert!(m.is_packed() && m.tensor().dims() == [3]);
    /// assert!(AttentionMask::packed(&[0, 3, 2], 64, &Device::cpu()).is_err()); // decreasing
    /// assert!(AttentionMask::packed(&[0, 70], 64, &Device::cpu()).is_err()); // over max_len
    /// ```
    pub fn packed(offsets: &[usize], max_len: usize, device: &Device) -> Result<Self> {
        let Some((&first, _)) = offsets.split_first() else {
            return Err(Error::Input("packed attention mask: no offsets".into()));
        };
        if first != 0 {
            return Err(Error::Input(format!(
                "packed attention mask: offsets start at {first}, not 0"
            )));
        }
        for w in offsets.windows(2) {
            if w[1] < w[0] || w[1] - w[0] > max_len {
                return Err(Error::Input(format!(
                    "packed attention mask: a sequence from {} to {} (lengths must be 0..={max_len})",
                    w[0], w[1]
                )));
            }
        }
        let values: Vec<i64> = offsets.iter().map(|&o| o as i64).collect();
        Self::from_packed(Tensor::from_vec(values, &[offsets.len()], device)?, max_len)
    }

    /// The packed mask from its `I64` offsets tensor (as made by [`Self::packed`], whose
    /// checks it does not repeat: the offsets are on the device).
    pub fn from_packed(offsets: Tensor, max_len: usize) -> Result<Self> {
        let &[n] = offsets.dims() else {
            return Err(Error::Input(format!(
                "packed attention mask of shape {:?}, expected [batch + 1]",
                offsets.dims()
            )));
        };
        Ok(Self {
            additive: offsets,
            binary: false,
            packed: true,
            batch: n.saturating_sub(1),
            seq: max_len,
        })
    }

    /// Whether this is a packed batch's mask (sequence offsets).
    pub fn is_packed(&self) -> bool {
        self.packed
    }

    /// The mask tensor: additive `[batch, 1, 1, seq]`, `[batch, seq]` of 0/1 if binary, or
    /// the `I64` offsets `[batch + 1]` if packed.
    pub fn tensor(&self) -> &Tensor {
        &self.additive
    }

    /// Whether this is a binary mask (for fused attention).
    pub fn is_binary(&self) -> bool {
        self.binary
    }
}

/// Multi-head self-attention (BERT's `attention.self` plus `attention.output.dense`):
/// `softmax(q k^T / sqrt(d) + mask) v`, heads merged, then the output projection.
///
/// At construction the query, key and value projections are fused into one `[in, 3 * hidden]`
/// matrix (one matmul per call instead of three), and `1/sqrt(head_dim)` is folded into the
/// query weights and bias, so the scores need no separate scaling kernel.
///
/// After [`Self::with_dtype`] to f16 or bf16 the scores, softmax and weighted sum run as one
/// fused kernel ([`Tensor::attention`], f32 softmax statistics), which takes a binary
/// [`AttentionMask`]; in f32 they stay separate kernels with an additive mask.
#[derive(Debug, Clone)]
pub struct MultiheadAttention {
    qkv: Linear,
    out: Linear,
    num_heads: usize,
    head_dim: usize,
    /// Fused attention kernel (half dtypes) instead of matmul/softmax/matmul.
    fused: bool,
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
            fused: false,
        })
    }

    /// This layer with its weights and activations in `dtype`; f16 and bf16 switch to the
    /// fused attention kernel (and then take a binary mask).
    pub fn with_dtype(&self, dtype: ComputeDType) -> Result<Self> {
        Ok(Self {
            qkv: self.qkv.with_dtype(dtype)?,
            out: self.out.with_dtype(dtype)?,
            num_heads: self.num_heads,
            head_dim: self.head_dim,
            fused: dtype.is_half(),
        })
    }

    /// Whether this layer uses the fused attention kernel (and so a binary mask).
    pub fn is_fused(&self) -> bool {
        self.fused
    }

    /// Number of heads.
    pub fn num_heads(&self) -> usize {
        self.num_heads
    }

    /// Self-attention over `x: [batch, seq, hidden]`; `mask` hides padded keys. With a
    /// packed mask `x` is `[tokens, hidden]` (the sequences back to back) and each sequence
    /// attends to itself, through the fused kernel in every dtype.
    pub fn forward(&self, x: &Tensor, mask: Option<&AttentionMask>) -> Result<Tensor> {
        let hidden = self.num_heads * self.head_dim;
        if let Some(m) = mask.filter(|m| m.packed) {
            if x.rank() != 2 || x.dims()[1] != hidden {
                return Err(Error::Input(format!(
                    "attention over a packed batch takes [tokens, {hidden}], got {:?}",
                    x.dims()
                )));
            }
            let ctx = self
                .qkv
                .forward(x)?
                .attention_packed(&m.additive, m.seq, self.num_heads)?;
            return self.out.forward(&ctx);
        }
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
            if m.binary != self.fused {
                return Err(Error::Input(format!(
                    "attention: {} layer given a {} mask",
                    if self.fused { "fused" } else { "unfused" },
                    if m.binary { "binary" } else { "additive" }
                )));
            }
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
        if self.fused {
            let ctx = self
                .qkv
                .forward(x)?
                .attention(mask.map(|m| &m.additive), nh)?;
            return self.out.forward(&ctx);
        }
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
