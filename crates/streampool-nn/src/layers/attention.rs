//! Multi-head self-attention with its options: padding or causal mask, rotary positions, a
//! score bias (relative positions), grouped-query heads, q/k RMSNorm.

use streampool::{Device, Tensor};

use super::{Linear, LinearParams, RmsNorm};
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

    /// A causal additive mask, `[batch, 1, seq, seq]`: query `i` attends key `j` when
    /// `j <= i` and `mask[b, j]` is 1 (a decoder used as an embedder, e.g. Qwen3).
    ///
    /// ```
    /// use streampool::Device;
    /// use streampool_nn::AttentionMask;
    /// let m = AttentionMask::causal(&[1, 1, 0], 1, 3, &Device::cpu()).unwrap();
    /// assert_eq!(m.tensor().dims(), &[1, 1, 3, 3]);
    /// let v = m.tensor().to_vec::<f32>().unwrap();
    /// assert_eq!((v[0], v[1], v[3], v[4]), (0.0, f32::MIN, 0.0, 0.0));
    /// ```
    pub fn causal(mask: &[i64], batch: usize, seq: usize, device: &Device) -> Result<Self> {
        Self::pairwise(mask, batch, seq, device, |i, j| j <= i)
    }

    /// A sliding-window additive mask, `[batch, 1, seq, seq]`: query `i` attends key `j` when
    /// `|i - j| <= half_window` and `mask[b, j]` is 1 (ModernBERT's local layers).
    ///
    /// ```
    /// use streampool::Device;
    /// use streampool_nn::AttentionMask;
    /// let m = AttentionMask::sliding(&[1, 1, 1], 1, 3, 1, &Device::cpu()).unwrap();
    /// let v = m.tensor().to_vec::<f32>().unwrap();
    /// assert_eq!((v[1], v[2], v[3]), (0.0, f32::MIN, 0.0)); // row 0 sees keys 0 and 1
    /// ```
    pub fn sliding(
        mask: &[i64],
        batch: usize,
        seq: usize,
        half_window: usize,
        device: &Device,
    ) -> Result<Self> {
        Self::pairwise(mask, batch, seq, device, |i, j| {
            i.abs_diff(j) <= half_window
        })
    }

    /// An additive `[batch, 1, seq, seq]` mask: query `i` attends key `j` when `keep(i, j)`
    /// and `mask[b, j]` is 1.
    fn pairwise(
        mask: &[i64],
        batch: usize,
        seq: usize,
        device: &Device,
        keep: impl Fn(usize, usize) -> bool,
    ) -> Result<Self> {
        if mask.len() != batch * seq {
            return Err(Error::Input(format!(
                "attention mask has {} values, expected batch {batch} x seq {seq}",
                mask.len()
            )));
        }
        if let Some(bad) = mask.iter().find(|&&m| m != 0 && m != 1) {
            return Err(Error::Input(format!(
                "attention mask values must be 0 or 1, got {bad}"
            )));
        }
        let mut additive = Vec::with_capacity(batch * seq * seq);
        for row in mask.chunks_exact(seq.max(1)) {
            for i in 0..seq {
                additive.extend(row.iter().enumerate().map(|(j, &m)| {
                    if keep(i, j) && m == 1 {
                        0.0
                    } else {
                        MASKED
                    }
                }));
            }
        }
        Ok(Self {
            additive: Tensor::from_vec(additive, &[batch, 1, seq, seq], device)?,
            binary: false,
            packed: false,
            batch,
            seq,
        })
    }

    /// This additive mask in `dtype`, for the unfused attention of half-precision layers
    /// that the fused kernel does not cover (score bias, grouped-query heads, causal or
    /// sliding-window masks). `f32::MIN` becomes a large finite negative number, not an
    /// infinity (it is past f16's and bf16's largest values): a query whose keys are all
    /// masked (padding far from any token in a sliding window) then attends uniformly
    /// instead of giving NaN, which would reach real tokens through `0 * NaN` in the next
    /// layer.
    pub fn to_dtype(&self, dtype: streampool::DType) -> Result<Self> {
        if self.binary || dtype == self.additive.dtype() {
            return Ok(self.clone());
        }
        let floor = match dtype {
            streampool::DType::F16 => -65504.0,
            // bf16's largest finite value is 3.39e38, below f32::MAX.
            _ => -1e38,
        };
        let floor = Tensor::full(floor, &[1], self.additive.device())?;
        Ok(Self {
            additive: self.additive.maximum(&floor)?.to_dtype(dtype)?,
            ..self.clone()
        })
    }

    /// The mask from its additive `[batch, 1, 1, seq]` (padding) or `[batch, 1, seq, seq]`
    /// (causal) tensor (as made by [`Self::new`] and [`Self::causal`]).
    pub fn from_additive(additive: Tensor) -> Result<Self> {
        let (batch, seq) = match *additive.dims() {
            [batch, 1, 1, seq] => (batch, seq),
            [batch, 1, q, seq] if q == seq => (batch, seq),
            _ => {
                return Err(Error::Input(format!(
                    "additive attention mask of shape {:?}, expected [batch, 1, 1, seq] or \
                     [batch, 1, seq, seq]",
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
        Ok(Self {
            additive: crate::scan::binary_mask(mask, &[batch, seq], device, "attention mask")?,
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

/// Rotary position tables for a head width: `cos` and `sin`, `F32` `[positions, head_dim
/// / 2]`, `cos[p, i] = cos(p / base^(2i / head_dim))` (computed in f64, stored f32). Shared by
/// every layer of a model.
///
/// ```
/// use streampool::Device;
/// use streampool_nn::Rotary;
/// let r = Rotary::new(4, 8, 10_000.0, &Device::cpu()).unwrap();
/// assert_eq!(r.cos().dims(), &[8, 2]);
/// assert_eq!(r.cos().to_vec::<f32>().unwrap()[..2], [1.0, 1.0]); // position 0
/// ```
#[derive(Debug, Clone)]
pub struct Rotary {
    cos: Tensor,
    sin: Tensor,
}

impl Rotary {
    /// Tables for `positions` positions of heads `head_dim` wide (even), base `base`.
    pub fn new(head_dim: usize, positions: usize, base: f64, device: &Device) -> Result<Self> {
        if head_dim == 0 || !head_dim.is_multiple_of(2) || base.is_nan() || base <= 0.0 {
            return Err(Error::Input(format!(
                "rotary tables: head width {head_dim} must be even and positive, base {base} \
                 positive"
            )));
        }
        let half = head_dim / 2;
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for p in 0..positions {
            for i in 0..half {
                let angle = p as f64 / base.powf(2.0 * i as f64 / head_dim as f64);
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        Ok(Self {
            cos: Tensor::from_vec(cos, &[positions, half], device)?,
            sin: Tensor::from_vec(sin, &[positions, half], device)?,
        })
    }

    /// The cosine table, `[positions, head_dim / 2]`.
    pub fn cos(&self) -> &Tensor {
        &self.cos
    }

    /// The sine table, `[positions, head_dim / 2]`.
    pub fn sin(&self) -> &Tensor {
        &self.sin
    }

    /// Positions the tables cover.
    pub fn positions(&self) -> usize {
        self.cos.dims()[0]
    }
}

/// What a family's attention adds to plain multi-head attention, set at construction.
#[derive(Debug, Clone, Default)]
pub struct AttentionOptions {
    /// Key/value heads (grouped-query attention: each serves `heads / kv_heads` query
    /// heads); `None`: as many as query heads.
    pub kv_heads: Option<usize>,
    /// Head width when not `hidden / heads` (Qwen3).
    pub head_dim: Option<usize>,
    /// RMSNorm gammas (`[head_dim]`) applied to each query and key head before the rotary
    /// positions (Qwen3's `q_norm`, `k_norm`), with their epsilon.
    pub qk_norm: Option<(crate::HostTensor, crate::HostTensor, f32)>,
}

/// What varies per call: the mask, rotary tables, a score bias.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttentionInputs<'a> {
    /// Hides padded (and, causal, later) keys.
    pub mask: Option<&'a AttentionMask>,
    /// Rotary positions applied to queries and keys (positions `0..seq`).
    pub rotary: Option<&'a Rotary>,
    /// Added to the scores before the softmax, `[1 or batch, heads, seq, seq]` in the
    /// layer's dtype (MPNet's relative position bias).
    pub bias: Option<&'a Tensor>,
}

/// Multi-head self-attention (BERT's `attention.self` plus `attention.output.dense`):
/// `softmax(q k^T / sqrt(d) + mask) v`, heads merged, then the output projection. With
/// [`AttentionOptions`] and [`AttentionInputs`] the same layer is every family's attention:
/// grouped-query heads, q/k RMSNorm, rotary positions, a score bias, a causal mask.
///
/// At construction the query, key and value projections are fused into one
/// `[(heads + 2 kv_heads) * head_dim, in]` matrix (one matmul per call instead of three), and
/// `1/sqrt(head_dim)` is folded into the query weights and bias (or, with a query norm, into
/// its gamma), so the scores need no separate scaling kernel.
///
/// After [`Self::with_dtype`] to f16 or bf16, attention with no options, no score bias and a
/// padding mask runs as one fused kernel ([`Tensor::attention`], f32 softmax statistics),
/// which takes a binary [`AttentionMask`] (rotary positions too: the queries and keys of the
/// fused projection are rotated first, [`Tensor::rope_heads`]); everything else (a score
/// bias, grouped-query heads, q/k norms, a causal mask) runs as separate kernels (matmul,
/// softmax, matmul) with an additive mask, in f32 or half precision.
#[derive(Debug, Clone)]
pub struct MultiheadAttention {
    qkv: Linear,
    out: Linear,
    num_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    /// Half precision (fused kernel where the layer is plain).
    half: bool,
    /// The device runs plain f32 attention fastest fused too, given a binary mask
    /// ([`streampool::Device::fuses_f32_attention`]).
    fused_f32: bool,
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
        Self::with_options(
            query,
            key,
            value,
            out,
            num_heads,
            &AttentionOptions::default(),
            device,
        )
    }

    /// [`Self::new`] from a checkpoint's fused projection: `qkv` `[3 * hidden, hidden]`,
    /// query rows first, then key, then value (GTE's `qkv_proj`, NomicBERT's and ModernBERT's
    /// `Wqkv`).
    pub fn from_fused_qkv(
        qkv: &LinearParams,
        out: &LinearParams,
        num_heads: usize,
        device: &Device,
    ) -> Result<Self> {
        let h = qkv.in_features();
        Self::new(
            &qkv.rows(0, h)?,
            &qkv.rows(h, h)?,
            &qkv.rows(2 * h, h)?,
            out,
            num_heads,
            device,
        )
    }

    /// [`Self::new`] with a family's options: query `[heads * head_dim, in]`, key and value
    /// `[kv_heads * head_dim, in]`, out `[in, heads * head_dim]`.
    pub fn with_options(
        query: &LinearParams,
        key: &LinearParams,
        value: &LinearParams,
        out: &LinearParams,
        num_heads: usize,
        options: &AttentionOptions,
        device: &Device,
    ) -> Result<Self> {
        let hidden = query.in_features();
        let kv_heads = options.kv_heads.unwrap_or(num_heads);
        if num_heads == 0 || kv_heads == 0 || !num_heads.is_multiple_of(kv_heads) {
            return Err(Error::Input(format!(
                "attention: {num_heads} query heads are not a multiple of {kv_heads} key/value heads"
            )));
        }
        let head_dim = match options.head_dim {
            Some(d) => d,
            None if hidden.is_multiple_of(num_heads) => hidden / num_heads,
            None => {
                return Err(Error::Input(format!(
                    "attention: hidden size {hidden} is not a multiple of {num_heads} heads"
                )))
            }
        };
        if head_dim == 0 {
            return Err(Error::Input("attention: head width 0".into()));
        }
        let (q_out, kv_out) = (num_heads * head_dim, kv_heads * head_dim);
        for (name, p, rows, cols) in [
            ("query", query, q_out, hidden),
            ("key", key, kv_out, hidden),
            ("value", value, kv_out, hidden),
            ("out", out, hidden, q_out),
        ] {
            let p = LinearParams::new(p.weight.clone(), p.bias.clone())?;
            if p.weight.shape() != [rows, cols] {
                return Err(Error::Input(format!(
                    "attention {name} weight is {:?}, expected [{rows}, {cols}]",
                    p.weight.shape()
                )));
            }
        }
        let scale = 1.0 / (head_dim as f32).sqrt();
        let (q_norm, k_norm, q_scale) = match &options.qk_norm {
            Some((qg, kg, eps)) => {
                for g in [qg, kg] {
                    g.expect_shape("attention q/k norm", &[head_dim])?;
                }
                // RMSNorm(q) * gamma is linear in gamma, and rotary positions are a rotation:
                // the scale goes into gamma.
                let qg = crate::HostTensor::new(
                    qg.data().iter().map(|v| v * scale).collect(),
                    &[head_dim],
                )?;
                (
                    Some(RmsNorm::new(&qg, *eps, device)?),
                    Some(RmsNorm::new(kg, *eps, device)?),
                    1.0,
                )
            }
            None => (None, None, scale),
        };
        let scaled = LinearParams::new(
            crate::HostTensor::new(
                query.weight.data().iter().map(|x| x * q_scale).collect(),
                query.weight.shape(),
            )?,
            query
                .bias
                .as_ref()
                .map(|b| {
                    crate::HostTensor::new(
                        b.data().iter().map(|x| x * q_scale).collect(),
                        b.shape(),
                    )
                })
                .transpose()?,
        )?;
        let fused = LinearParams::stack(&[&scaled, key, value])?;
        Ok(Self {
            qkv: Linear::new(&fused, device)?,
            out: Linear::new(out, device)?,
            num_heads,
            kv_heads,
            head_dim,
            q_norm,
            k_norm,
            half: false,
            fused_f32: device.fuses_f32_attention(),
        })
    }

    /// This layer with its weights and activations in `dtype`; f16 and bf16 switch plain
    /// attention to the fused kernel (and then take a binary mask).
    pub fn with_dtype(&self, dtype: ComputeDType) -> Result<Self> {
        let norm = |n: &Option<RmsNorm>| n.as_ref().map(|n| n.with_dtype(dtype)).transpose();
        Ok(Self {
            qkv: self.qkv.with_dtype(dtype)?,
            out: self.out.with_dtype(dtype)?,
            q_norm: norm(&self.q_norm)?,
            k_norm: norm(&self.k_norm)?,
            half: dtype.is_half(),
            ..*self
        })
    }

    /// Whether this layer uses the fused attention kernel (and so a binary mask) when called
    /// without a score bias: half precision or a device that fuses f32 attention, and none of the options the kernel
    /// lacks. Given an additive mask (causal, sliding window) any layer runs unfused.
    pub fn is_fused(&self) -> bool {
        (self.half || self.fused_f32) && self.is_plain()
    }

    /// No grouped-query heads and no q/k norm (the fused kernel's case, given no bias at the
    /// call).
    fn is_plain(&self) -> bool {
        self.kv_heads == self.num_heads && self.q_norm.is_none()
    }

    /// Number of (query) heads.
    pub fn num_heads(&self) -> usize {
        self.num_heads
    }

    /// Self-attention over `x: [batch, seq, hidden]`; `mask` hides padded keys. With a
    /// packed mask `x` is `[tokens, hidden]` (the sequences back to back) and each sequence
    /// attends to itself, through the fused kernel in every dtype.
    pub fn forward(&self, x: &Tensor, mask: Option<&AttentionMask>) -> Result<Tensor> {
        self.forward_with(
            x,
            &AttentionInputs {
                mask,
                ..Default::default()
            },
        )
    }

    /// Self-attention over `x: [batch, seq, hidden]` with a mask, rotary positions and a
    /// score bias as given.
    pub fn forward_with(&self, x: &Tensor, inputs: &AttentionInputs) -> Result<Tensor> {
        let hidden = self.qkv.in_features();
        if let Some(m) = inputs.mask.filter(|m| m.packed) {
            // Packed batches (concatenated sequences, no padding) run the fused kernel
            // per sequence: plain attention only.
            if !self.is_plain() || inputs.bias.is_some() || inputs.rotary.is_some() {
                return Err(Error::Input(
                    "attention over a packed batch takes plain attention (no rotary positions, \
                     score bias, grouped or normed heads)"
                        .into(),
                ));
            }
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
        // Half layers fuse with a binary mask, and f32 CPU layers too; an additive mask
        // (causal, sliding window, or the f32 path elsewhere) takes the unfused kernels: the
        // fused kernel masks padding only.
        let fused =
            self.is_fused() && inputs.bias.is_none() && inputs.mask.is_none_or(|m| m.binary);
        if let Some(m) = inputs.mask {
            if m.binary && !fused {
                return Err(Error::Input(
                    "attention: a binary mask needs the fused kernel (half precision, no score \
                     bias, no grouped or normed heads)"
                        .into(),
                ));
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
        if let Some(r) = inputs.rotary {
            if r.positions() < seq || r.cos().dims()[1] * 2 != self.head_dim {
                return Err(Error::Input(format!(
                    "rotary tables {:?} do not cover {seq} positions of heads {} wide",
                    r.cos().dims(),
                    self.head_dim
                )));
            }
        }
        let (nh, nkv, d) = (self.num_heads, self.kv_heads, self.head_dim);
        if fused {
            let mut qkv = self.qkv.forward(x)?;
            if let Some(r) = inputs.rotary {
                // Queries and keys rotated in one pass over the fused projection, values
                // copied: the fused kernel then sees plain attention.
                qkv = qkv
                    .reshape(&[batch, seq, 3 * nh, d])?
                    .rope_heads(r.cos(), r.sin(), 2 * nh)?
                    .reshape(&[batch, seq, 3 * nh * d])?;
            }
            let ctx = qkv.attention(inputs.mask.map(|m| &m.additive), nh)?;
            return self.out.forward(&ctx);
        }
        let qkv = self
            .qkv
            .forward(x)?
            .reshape(&[batch, seq, nh + 2 * nkv, d])?;
        let mut q = qkv.narrow(2, 0, nh)?;
        let mut k = qkv.narrow(2, nh, nkv)?;
        let v = qkv.narrow(2, nh + nkv, nkv)?;
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = qn.forward(&q)?;
            k = kn.forward(&k)?;
        }
        if let Some(r) = inputs.rotary {
            q = q.rope(r.cos(), r.sin())?;
            k = k.rope(r.cos(), r.sin())?;
        }
        // [batch, seq, heads, d] -> [batch, heads, seq, d]: one copy per projection.
        let heads = |t: &Tensor, n: usize| -> Result<Tensor> {
            Ok(t.transpose(1, 2)?
                .contiguous()?
                .reshape(&[batch, n, seq, d])?)
        };
        let q = heads(&q, nh)?;
        let (mut k, mut v) = (heads(&k, nkv)?, heads(&v, nkv)?);
        if nkv != nh {
            // Grouped-query: key/value head j serves query heads j * g .. (j + 1) * g.
            let g = nh / nkv;
            let repeat = |t: &Tensor| -> Result<Tensor> {
                Ok(t.reshape(&[batch, nkv, 1, seq, d])?
                    .broadcast_as(&[batch, nkv, g, seq, d])?
                    .contiguous()?
                    .reshape(&[batch, nh, seq, d])?)
            };
            k = repeat(&k)?;
            v = repeat(&v)?;
        }
        // The query is pre-scaled by 1/sqrt(d); `k.t()` is a view the matmul reads strided.
        let mut scores = q.matmul(&k.t()?)?;
        if let Some(b) = inputs.bias {
            scores = scores.add(b)?;
        }
        if let Some(m) = inputs.mask {
            scores = scores.add(&m.additive)?;
        }
        let ctx = scores.softmax()?.matmul(&v)?;
        let merged = ctx.transpose(1, 2)?.reshape(&[batch, seq, nh * d])?;
        self.out.forward(&merged)
    }
}
