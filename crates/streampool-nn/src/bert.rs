//! Transformer models from Hugging Face checkpoints: BERT (MiniLM, bge), RoBERTa
//! (XLM-RoBERTa, CamemBERT), MPNet, GTE and Qwen3, each composed of the shared layers (see
//! [`Family`]), with a sequence-classification head where the checkpoint has one.

use std::path::Path;

use std::sync::Arc;

use streampool::phases::timed;
use streampool::{Activation, Device, GraphCache, Tensor};

use crate::families::{gte, modernbert, mpnet, nomic, qwen3};
use crate::heads::ClassificationHead;
use crate::layers::{
    AttentionInputs, AttentionMask, Embedding, LayerNorm, Norm, RmsNorm, Rotary,
    TransformerEncoderLayer,
};
use crate::packed::PackedInput;
use crate::weights::{HostTensor, WeightFile};
use crate::{BertConfig, ComputeDType, Error, Family, Result};

/// One batch of token ids for a BERT model: row-major `[batch, seq]` arrays, padded on the
/// right, with an attention mask of 1 (token) and 0 (padding).
///
/// ```
/// use streampool_nn::BertInput;
/// let input = BertInput::from_sequences(&[vec![101, 7, 102], vec![101, 102]]).unwrap();
/// assert_eq!((input.batch_size(), input.seq_len()), (2, 3));
/// assert_eq!(input.attention_mask(), &[1, 1, 1, 1, 1, 0]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BertInput {
    input_ids: Vec<i64>,
    attention_mask: Vec<i64>,
    token_type_ids: Vec<i64>,
    batch_size: usize,
    seq_len: usize,
}

impl BertInput {
    /// From row-major `[batch_size, seq]` arrays; `token_type_ids` default to all 0.
    pub fn new(
        input_ids: Vec<i64>,
        attention_mask: Vec<i64>,
        token_type_ids: Option<Vec<i64>>,
        batch_size: usize,
    ) -> Result<Self> {
        if batch_size == 0 || input_ids.is_empty() || !input_ids.len().is_multiple_of(batch_size) {
            return Err(Error::Input(format!(
                "{} input ids do not form a non-empty batch of {batch_size} rows",
                input_ids.len()
            )));
        }
        let token_type_ids = token_type_ids.unwrap_or_else(|| vec![0; input_ids.len()]);
        for (name, v) in [
            ("attention_mask", &attention_mask),
            ("token_type_ids", &token_type_ids),
        ] {
            if v.len() != input_ids.len() {
                return Err(Error::Input(format!(
                    "{name} has {} values but input_ids has {}",
                    v.len(),
                    input_ids.len()
                )));
            }
        }
        let seq_len = input_ids.len() / batch_size;
        Ok(Self {
            input_ids,
            attention_mask,
            token_type_ids,
            batch_size,
            seq_len,
        })
    }

    /// Right-pads `sequences` with id 0 to the longest one.
    pub fn from_sequences(sequences: &[Vec<i64>]) -> Result<Self> {
        let seq = sequences.iter().map(Vec::len).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(sequences.len() * seq);
        let mut mask = Vec::with_capacity(sequences.len() * seq);
        for s in sequences {
            ids.extend(s.iter().copied().chain(std::iter::repeat(0)).take(seq));
            mask.extend((0..seq).map(|i| i64::from(i < s.len())));
        }
        Self::new(ids, mask, None, sequences.len())
    }

    /// Rows in the batch.
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }
    /// Tokens per row (padding included).
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }
    /// Token ids, `[batch, seq]` row-major.
    pub fn input_ids(&self) -> &[i64] {
        &self.input_ids
    }
    /// 1 for tokens, 0 for padding, `[batch, seq]` row-major.
    pub fn attention_mask(&self) -> &[i64] {
        &self.attention_mask
    }
    /// Segment ids, `[batch, seq]` row-major.
    pub fn token_type_ids(&self) -> &[i64] {
        &self.token_type_ids
    }
}

/// Word embeddings, plus position and token-type embeddings where the family has them, then
/// LayerNorm where it has one.
#[derive(Debug, Clone)]
struct BertEmbeddings {
    word: Embedding,
    /// Absolute positions (none for rotary families).
    position: Option<Embedding>,
    /// The row of position 0: `pad_token_id + 1` for RoBERTa and MPNet, else 0.
    position_offset: usize,
    token_type: Option<Embedding>,
    /// `position + token_type[0]` (or either alone), precomputed: with all-zero token types
    /// (the usual case) the sum is one broadcast add. `[positions, h]`, or `[1, h]` with no
    /// position table.
    position_type0: Option<Tensor>,
    norm: Option<LayerNorm>,
}

impl BertEmbeddings {
    fn load(file: &WeightFile, p: &str, c: &BertConfig, device: &Device) -> Result<Self> {
        let h = c.hidden_size;
        let family = c.family()?;
        if family == Family::ModernBert {
            let word = file.get(
                &format!("{p}embeddings.tok_embeddings.weight"),
                &[c.vocab_size, h],
            )?;
            return Ok(Self {
                word: Embedding::new(&word, device)?,
                position: None,
                position_offset: 0,
                token_type: None,
                position_type0: None,
                norm: Some(LayerNorm::load_optional_bias(
                    file,
                    &format!("{p}embeddings.norm"),
                    h,
                    c.layer_norm_eps as f32,
                    device,
                )?),
            });
        }
        if family == Family::Qwen3 {
            let word = file.get(&format!("{p}embed_tokens.weight"), &[c.vocab_size, h])?;
            return Ok(Self {
                word: Embedding::new(&word, device)?,
                position: None,
                position_offset: 0,
                token_type: None,
                position_type0: None,
                norm: None,
            });
        }
        let word = file.get(
            &format!("{p}embeddings.word_embeddings.weight"),
            &[c.vocab_size, h],
        )?;
        let position = if family.is_rotary() {
            None
        } else {
            Some(file.get(
                &format!("{p}embeddings.position_embeddings.weight"),
                &[c.max_position_embeddings, h],
            )?)
        };
        let type_name = format!("{p}embeddings.token_type_embeddings.weight");
        let token_type = if family == Family::MPNet
            || (family.is_rotary() && (c.type_vocab_size == 0 || !file.contains(&type_name)))
        {
            None
        } else {
            Some(file.get(&type_name, &[c.type_vocab_size, h])?)
        };
        let position_type0 = match (&position, &token_type) {
            (Some(pos), Some(types)) => {
                let type0 = &types.data()[..h];
                let sum: Vec<f32> = pos
                    .data()
                    .chunks_exact(h)
                    .flat_map(|row| row.iter().zip(type0).map(|(p, t)| p + t))
                    .collect();
                Some(HostTensor::new(sum, pos.shape())?.to_device(device)?)
            }
            (Some(pos), None) => Some(pos.to_device(device)?),
            (None, Some(types)) => {
                Some(HostTensor::new(types.data()[..h].to_vec(), &[1, h])?.to_device(device)?)
            }
            (None, None) => None,
        };
        Ok(Self {
            word: Embedding::new(&word, device)?,
            position: position.map(|p| Embedding::new(&p, device)).transpose()?,
            position_offset: if family.offsets_positions() {
                c.pad_token_id + 1
            } else {
                0
            },
            token_type: token_type.map(|t| Embedding::new(&t, device)).transpose()?,
            position_type0,
            norm: Some(LayerNorm::load(
                file,
                &match family {
                    Family::NomicBert => format!("{p}emb_ln"),
                    _ => format!("{p}embeddings.LayerNorm"),
                },
                h,
                c.layer_norm_eps as f32,
                device,
            )?),
        })
    }

    fn with_dtype(&self, dtype: ComputeDType) -> Result<Self> {
        let conv = |e: &Option<Embedding>| e.as_ref().map(|e| e.with_dtype(dtype)).transpose();
        Ok(Self {
            word: self.word.with_dtype(dtype)?,
            position: conv(&self.position)?,
            position_offset: self.position_offset,
            token_type: conv(&self.token_type)?,
            position_type0: self
                .position_type0
                .as_ref()
                .map(|t| t.to_dtype(dtype.dtype()))
                .transpose()?,
            norm: self
                .norm
                .as_ref()
                .map(|n| n.with_dtype(dtype))
                .transpose()?,
        })
    }

    fn forward(&self, input: &BertInput) -> Result<Tensor> {
        let (b, s) = (input.batch_size, input.seq_len);
        if let Some(pos) = &self.position {
            if s + self.position_offset > pos.rows() {
                return Err(Error::Input(format!(
                    "sequence of {s} tokens is longer than the model's {} positions",
                    pos.rows() - self.position_offset
                )));
            }
        }
        let words = self.word.forward(&input.input_ids, &[b, s])?;
        let h = words.dims()[2];
        let typed = crate::scan::any_nonzero(&input.token_type_ids);
        let x = match (&self.position_type0, &self.token_type, typed) {
            (_, Some(types), true) => {
                let types = types.forward(&input.token_type_ids, &[b, s])?;
                let x = words.add(&types)?;
                match &self.position {
                    Some(pos) => x.add(&pos.table().narrow(0, self.position_offset, s)?)?,
                    None => x,
                }
            }
            (Some(bias), _, _) if self.position.is_some() => {
                // The [s, h] position rows are one bias over each sentence's s * h values, so
                // the add is bias_act's contiguous row kernel instead of a strided broadcast
                // (on the H100 at 512 x 128 tokens in f16 the broadcast add took 0.17 ms of a
                // 6.5 ms forward).
                words
                    .reshape(&[b, s * h])?
                    .bias_act(
                        &bias.narrow(0, self.position_offset, s)?.reshape(&[s * h])?,
                        Activation::Identity,
                    )?
                    .reshape(&[b, s, h])?
            }
            // Token type 0's row only (rotary families).
            (Some(bias), _, _) => words.bias_act(&bias.reshape(&[h])?, Activation::Identity)?,
            (None, _, _) => words,
        };
        match &self.norm {
            Some(n) => n.forward(&x),
            None => Ok(x),
        }
    }

    /// The embeddings of a packed batch, `[tokens, hidden]`: word + position (each token's
    /// position in its own sequence) + token type, then LayerNorm.
    fn forward_packed(&self, input: &PackedInput) -> Result<Tensor> {
        let pos = self.position.as_ref().ok_or_else(|| {
            Error::Input("packed batches need a model with absolute position embeddings".into())
        })?;
        if input.max_len() + self.position_offset > pos.rows() {
            return Err(Error::Input(format!(
                "sequence of {} tokens is longer than the model's {} positions",
                input.max_len(),
                pos.rows() - self.position_offset
            )));
        }
        let n = input.tokens();
        let words = self.word.forward(input.input_ids(), &[n])?;
        let typed = crate::scan::any_nonzero(input.token_type_ids());
        let x = match (&self.position_type0, &self.token_type, typed) {
            // The position rows with token type 0 already added: one gather and one add.
            (Some(pt0), _, false) if self.position_offset == 0 => {
                words.add(&pt0.embedding(input.positions(), &[n])?)?
            }
            (_, Some(types), _) => words
                .add(&types.forward(input.token_type_ids(), &[n])?)?
                .add(&pos.forward(input.positions(), &[n])?)?,
            _ => words.add(&pos.forward(input.positions(), &[n])?)?,
        };
        match &self.norm {
            Some(norm) => norm.forward(&x),
            None => Ok(x),
        }
    }
}

/// Packed batches run their encoder layers as one graph per (tokens, sequences and longest
/// length rounded up to this): the attention kernel's grid is sized by the bound, so every
/// batch under one bound replays the same graph.
const PACKED_LEN_BUCKET: usize = 64;

/// The length bound a packed batch whose longest sequence has `max_len` tokens runs under
/// (its attention grid's size and part of its graph's key).
pub(crate) fn packed_len_bound(max_len: usize) -> usize {
    max_len.div_ceil(PACKED_LEN_BUCKET).max(1) * PACKED_LEN_BUCKET
}

/// A transformer of any supported [`Family`] (the name is BERT's, the first one): embeddings
/// and a stack of layers (post-norm, or pre-norm with a final norm), with rotary tables, a
/// relative position bias and a classification head where the family and checkpoint have
/// them. Weights are read-only after load, so one `Arc<BertModel>` serves any number of
/// threads, each running on its own stream; `forward` takes `&self` and no lock.
///
/// Weights and activations are in the [`ComputeDType`] given to [`Self::load_with`] (f32 for
/// [`Self::load`]); the hidden states [`Self::forward`] returns are in that dtype's
/// [`ComputeDType::dtype`] (`Tensor::to_dtype(DType::F32)` converts them).
///
/// BERT's pooler (`pooler.dense`) is loaded only as part of a classification head: sentence
/// embeddings pool the hidden states ([`crate::SentenceEmbedder`]).
///
/// ```
/// use streampool::Device;
/// use streampool_nn::{tiny_bert_dir, BertInput, BertModel};
/// let model = BertModel::load(&Device::cpu(), tiny_bert_dir()).unwrap();
/// let input = BertInput::from_sequences(&[vec![101, 7592, 102]]).unwrap();
/// let hidden = model.forward(&input).unwrap();
/// assert_eq!(hidden.dims(), &[1, 3, model.config().hidden_size]);
/// ```
#[derive(Debug, Clone)]
pub struct BertModel {
    config: BertConfig,
    family: Family,
    embeddings: BertEmbeddings,
    layers: Vec<TransformerEncoderLayer>,
    /// The pre-norm families' norm after the last layer.
    final_norm: Option<Norm>,
    rotary: Option<Rotary>,
    /// ModernBERT's sliding-window layers: their rotary tables (another base), and which
    /// layers they are.
    sliding: Option<Sliding>,
    relative_bias: Option<mpnet::RelativeBias>,
    head: Option<ClassificationHead>,
    device: Device,
    dtype: ComputeDType,
    /// The encoder layers as one CUDA graph per (stream, batch and length bucket); eager
    /// where the device has no graphs. Shared by clones (same weights).
    graphs: Arc<GraphCache>,
}

/// The sliding-window layers of a model (ModernBERT's local attention).
#[derive(Debug, Clone)]
struct Sliding {
    rotary: Rotary,
    /// Per layer: whether it attends within the window.
    layers: Vec<bool>,
    /// A query attends keys at most this many positions away.
    half_window: usize,
}

/// Graph keys (stream x shape) kept per model.
const GRAPHS_KEPT: usize = 256;

impl BertModel {
    /// Loads `dir/config.json` and `dir/model.safetensors` onto `device`, in f32.
    pub fn load(device: &Device, dir: impl AsRef<Path>) -> Result<Self> {
        Self::load_with(device, dir, ComputeDType::F32)
    }

    /// Loads `dir/config.json` and `dir/model.safetensors` onto `device` and converts the
    /// weights to `dtype` once. A dtype the device cannot compute in fails here, at the
    /// conversion (on wgpu: `Bf16` always, as WGSL has no bf16 type; `F16` where the adapter
    /// lacks `SHADER_F16`; `Tf32` runs in full f32).
    ///
    /// ```
    /// use streampool::{DType, Device};
    /// use streampool_nn::{tiny_bert_dir, BertInput, BertModel, ComputeDType};
    /// let model = BertModel::load_with(&Device::cpu(), tiny_bert_dir(), ComputeDType::Bf16).unwrap();
    /// let input = BertInput::from_sequences(&[vec![101, 7592, 102]]).unwrap();
    /// assert_eq!(model.forward(&input).unwrap().dtype(), DType::BF16);
    /// ```
    pub fn load_with(device: &Device, dir: impl AsRef<Path>, dtype: ComputeDType) -> Result<Self> {
        let dir = dir.as_ref();
        let config = BertConfig::from_file(dir.join("config.json"))?;
        let model = Self::load_weights(device, &config, dir.join("model.safetensors"))?;
        // Queued casts on the device (the first one may wait for the kernels' build).
        timed("weights converted", || model.with_dtype(dtype))
    }

    /// This model with its weights converted to `dtype` (converting from f32 only: the
    /// weights of an already converted model are not upcast back). The converted model has
    /// its own graph cache.
    pub fn with_dtype(&self, dtype: ComputeDType) -> Result<Self> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        if self.dtype != ComputeDType::F32 {
            return Err(Error::Input(format!(
                "model is already {}; load it again to run it in {dtype}",
                self.dtype
            )));
        }
        crate::layers::check_quantized_on(&self.device, dtype)?;
        // A quantized model quantizes the encoder's linear layers only: a classification
        // head (a few products per sequence, not per token) stays exact.
        let head_dtype = if dtype.is_quantized() {
            ComputeDType::F32
        } else {
            dtype
        };
        Ok(Self {
            config: self.config.clone(),
            family: self.family,
            embeddings: self.embeddings.with_dtype(dtype)?,
            layers: self
                .layers
                .iter()
                .map(|l| l.with_dtype(dtype))
                .collect::<Result<_>>()?,
            final_norm: self
                .final_norm
                .as_ref()
                .map(|n| n.with_dtype(dtype))
                .transpose()?,
            rotary: self.rotary.clone(),
            sliding: self.sliding.clone(),
            relative_bias: self
                .relative_bias
                .as_ref()
                .map(|r| r.with_dtype(dtype))
                .transpose()?,
            head: self
                .head
                .as_ref()
                .map(|h| h.with_dtype(head_dtype))
                .transpose()?,
            device: self.device.clone(),
            dtype,
            graphs: Arc::new(GraphCache::new(GRAPHS_KEPT)),
        })
    }

    /// This model with the activation of every layer's MLP set to `act` (same weights, its
    /// own graph cache). In f16/bf16 the layers compute GELU's tanh approximation where the
    /// config names the erf form ([`crate::layers::HALF_PRECISION_GELU`]);
    /// `with_mlp_activation(Activation::Gelu)` computes the erf form again.
    ///
    /// ```
    /// use streampool::Device;
    /// use streampool_nn::{tiny_bert_dir, Activation, BertModel, ComputeDType};
    /// let m = BertModel::load_with(&Device::cpu(), tiny_bert_dir(), ComputeDType::F16).unwrap();
    /// let exact = m.with_mlp_activation(Activation::Gelu);
    /// # let _ = exact;
    /// ```
    pub fn with_mlp_activation(&self, act: Activation) -> Self {
        Self {
            layers: self
                .layers
                .iter()
                .map(|l| l.with_mlp_activation(act))
                .collect(),
            graphs: Arc::new(GraphCache::new(GRAPHS_KEPT)),
            ..self.clone()
        }
    }

    /// Drops the model's CUDA graphs (shared by its clones), giving their memory pools back
    /// to the device's allocator once their last replays complete. A graph's pool holds every
    /// intermediate of a forward at its shape (several GB for an f32 batch of 512 x 128
    /// tokens), so a process that is done with a shape, or with a model, calls this rather
    /// than wait for the model to drop. Later calls capture again.
    pub fn clear_graphs(&self) {
        self.graphs.clear();
    }

    /// The compute dtype of weights and activations.
    pub fn dtype(&self) -> ComputeDType {
        self.dtype
    }

    /// The model family.
    pub fn family(&self) -> Family {
        self.family
    }

    /// Loads the weights at `weights` (safetensors, Hugging Face names, with or without the
    /// task model's prefix such as `bert.`, `roberta.` or `model.`; F32, F16 or BF16, upcast
    /// to f32) for `config`. A `*ForSequenceClassification` config loads its head too.
    pub fn load_weights(
        device: &Device,
        config: &BertConfig,
        weights: impl AsRef<Path>,
    ) -> Result<Self> {
        config.validate()?;
        let family = config.family()?;
        let file = WeightFile::open(weights)?;
        let probe = match family {
            Family::Qwen3 => "embed_tokens.weight",
            Family::ModernBert => "embeddings.tok_embeddings.weight",
            _ => "embeddings.word_embeddings.weight",
        };
        let prefix = ["", "bert.", "roberta.", "mpnet.", "new.", "model."]
            .into_iter()
            .find(|p| file.contains(&format!("{p}{probe}")))
            .unwrap_or("");
        let embeddings = BertEmbeddings::load(&file, prefix, config, device)?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| match family {
                Family::Bert | Family::Roberta => TransformerEncoderLayer::load_bert(
                    &file,
                    &format!("{prefix}encoder.layer.{i}"),
                    config,
                    device,
                ),
                Family::MPNet => {
                    mpnet::load_layer(&file, &format!("{prefix}encoder.layer.{i}"), config, device)
                }
                Family::Gte => {
                    gte::load_layer(&file, &format!("{prefix}encoder.layer.{i}"), config, device)
                }
                Family::NomicBert => nomic::load_layer(
                    &file,
                    &format!("{prefix}encoder.layers.{i}"),
                    config,
                    device,
                ),
                Family::Qwen3 => {
                    qwen3::load_layer(&file, &format!("{prefix}layers.{i}"), config, device)
                }
                Family::ModernBert => {
                    modernbert::load_layer(&file, &format!("{prefix}layers.{i}"), config, device)
                }
            })
            .collect::<Result<_>>()?;
        let final_norm = match family {
            Family::Qwen3 => Some(Norm::Rms(RmsNorm::new(
                &file.get(&format!("{prefix}norm.weight"), &[config.hidden_size])?,
                config.norm_eps(),
                device,
            )?)),
            Family::ModernBert => Some(Norm::Layer(LayerNorm::load_optional_bias(
                &file,
                &format!("{prefix}final_norm"),
                config.hidden_size,
                config.layer_norm_eps as f32,
                device,
            )?)),
            _ => None,
        };
        let rotary = if family.is_rotary() {
            Some(Rotary::new(
                config.head_dim(),
                config.max_position_embeddings,
                config.rope_base_of(false)?,
                device,
            )?)
        } else {
            None
        };
        let sliding_layers: Vec<bool> = (0..config.num_hidden_layers)
            .map(|i| config.is_sliding_layer(i))
            .collect();
        let sliding = if sliding_layers.iter().any(|&s| s) {
            Some(Sliding {
                rotary: Rotary::new(
                    config.head_dim(),
                    config.max_position_embeddings,
                    config.rope_base_of(true)?,
                    device,
                )?,
                layers: sliding_layers,
                half_window: config.sliding_half_window(),
            })
        } else {
            None
        };
        let relative_bias = match family {
            Family::MPNet => Some(mpnet::RelativeBias::load(&file, prefix, config, device)?),
            _ => None,
        };
        let head = if config.is_sequence_classifier() {
            Some(ClassificationHead::load(&file, prefix, config, device)?)
        } else {
            None
        };
        Ok(Self {
            config: config.clone(),
            family,
            embeddings,
            layers,
            final_norm,
            rotary,
            sliding,
            relative_bias,
            head,
            device: device.clone(),
            dtype: ComputeDType::F32,
            graphs: Arc::new(GraphCache::new(GRAPHS_KEPT)),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// The device holding the weights.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The longest sequence the model takes, in tokens.
    pub fn max_positions(&self) -> usize {
        self.config.max_positions()
    }

    /// Classes of the classification head; `None` without one.
    pub fn num_labels(&self) -> Option<usize> {
        self.head.as_ref().map(ClassificationHead::labels)
    }

    /// The last hidden state, `[batch, seq, hidden]`, computed on the calling thread's
    /// current stream. Rows at padded positions are computed but meaningless.
    pub fn forward(&self, input: &BertInput) -> Result<Tensor> {
        let mut states = self.run(input, false)?;
        // `run` always returns at least the final state.
        Ok(states.pop().expect("final hidden state"))
    }

    /// The classification head's logits, `F32` `[batch, labels]` (a `*ForSequenceClassification`
    /// checkpoint: reranker scores, classifier logits); an error for a model without a head.
    pub fn logits(&self, input: &BertInput) -> Result<Tensor> {
        let head = self.head.as_ref().ok_or_else(|| {
            Error::Input(
                "this model has no sequence-classification head (its config's architectures \
                 name no *ForSequenceClassification)"
                    .into(),
            )
        })?;
        let hidden = self.forward(input)?;
        head.forward(&hidden)
    }

    /// The last hidden state of a packed batch, `[tokens, hidden]` (the sequences back to
    /// back, no padding computed), and its sequence offsets on the device (`I64`
    /// `[batch + 1]`, for [`Tensor::mean_pool_normalize_packed`]). Every layer runs over the
    /// batch's tokens alone; attention runs per sequence from the offsets. The result equals
    /// [`Self::forward`] on the same batch padded (at the real tokens, up to float rounding).
    /// Needs a device with packed kernels ([`Device::has_packed_kernels`]: CPU and CUDA).
    ///
    /// ```
    /// use streampool::Device;
    /// use streampool_nn::{tiny_bert_dir, BertModel, PackedInput};
    /// let model = BertModel::load(&Device::cpu(), tiny_bert_dir()).unwrap();
    /// let input = PackedInput::from_sequences(&[vec![101, 7592, 102], vec![101, 102]]).unwrap();
    /// let (hidden, offsets) = model.forward_packed(&input).unwrap();
    /// assert_eq!(hidden.dims(), &[5, model.config().hidden_size]);
    /// assert_eq!(offsets.to_vec::<i64>().unwrap(), vec![0, 3, 5]);
    /// ```
    pub fn forward_packed(&self, input: &PackedInput) -> Result<(Tensor, Tensor)> {
        if self.family != Family::Bert {
            return Err(Error::Input(format!(
                "packed batches cover BERT-family models (absolute positions, plain attention), \
                 not {:?}",
                self.family
            )));
        }
        let bound = packed_len_bound(input.max_len());
        let mask = AttentionMask::packed(input.offsets(), bound, &self.device)?;
        let x = self.embeddings.forward_packed(input)?;
        let mut out =
            self.graphs
                .run(&format!("bert-packed-{bound}"), &[&x, mask.tensor()], |i| {
                    let mask = AttentionMask::from_packed(i[1].clone(), bound)?;
                    let mut x = i[0].clone();
                    for layer in &self.layers {
                        x = layer.forward(&x, Some(&mask))?;
                    }
                    Ok::<_, Error>(vec![x])
                })?;
        // `run` returns the closure's one output.
        let hidden = out.pop().expect("packed hidden state");
        Ok((hidden, mask.tensor().clone()))
    }

    /// Every hidden state: index 0 is the embedding output (after LayerNorm), index `n` the
    /// output of layer `n - 1` (Hugging Face's `output_hidden_states`; the last one after the
    /// final norm of pre-norm families).
    pub fn forward_hidden_states(&self, input: &BertInput) -> Result<Vec<Tensor>> {
        self.run(input, true)
    }

    /// Whether the layers run the fused attention kernel (binary mask): half precision and
    /// attention the kernel covers (rotary positions included; no score bias, no causal
    /// mask, no grouped or normed heads).
    pub fn fused_attention(&self) -> bool {
        self.layers
            .first()
            .is_some_and(|l| l.attention().is_fused())
            && self.relative_bias.is_none()
            && self.sliding.is_none()
            && !self.family.is_causal()
    }

    /// Layer `i`'s mask, rotary tables and bias: the model's, or for a sliding-window layer
    /// its window mask (`local`) and tables.
    fn layer_inputs<'a>(
        &'a self,
        i: usize,
        mask: &'a AttentionMask,
        local: Option<&'a AttentionMask>,
        bias: Option<&'a Tensor>,
    ) -> AttentionInputs<'a> {
        match (&self.sliding, local) {
            (Some(w), Some(local)) if w.layers[i] => AttentionInputs {
                mask: Some(local),
                rotary: Some(&w.rotary),
                bias,
            },
            _ => AttentionInputs {
                mask: Some(mask),
                rotary: self.rotary.as_ref(),
                bias,
            },
        }
    }

    fn run(&self, input: &BertInput, keep_all: bool) -> Result<Vec<Tensor>> {
        let (mask, b, s) = (&input.attention_mask, input.batch_size, input.seq_len);
        if let Some(r) = &self.rotary {
            if s > r.positions() {
                return Err(Error::Input(format!(
                    "sequence of {s} tokens is longer than the model's {} positions",
                    r.positions()
                )));
            }
        }
        let binary = self.fused_attention();
        let dtype = self.dtype.dtype();
        let local_mask = self
            .sliding
            .as_ref()
            .map(|w| {
                AttentionMask::sliding(mask, b, s, w.half_window, &self.device)?.to_dtype(dtype)
            })
            .transpose()?;
        let mask = if binary {
            AttentionMask::binary(mask, b, s, &self.device)?
        } else if self.family.is_causal() {
            AttentionMask::causal(mask, b, s, &self.device)?.to_dtype(dtype)?
        } else {
            AttentionMask::new(mask, b, s, &self.device)?.to_dtype(dtype)?
        };
        let bias = self.relative_bias.as_ref().map(|r| r.bias(s)).transpose()?;
        let mut x = self.embeddings.forward(input)?;
        if !keep_all {
            // The layers are pure device work on `x`, the masks and the bias: one graph per
            // shape. Inputs: x, mask, then the bias and the sliding mask where present.
            let mut graph_inputs = vec![&x, mask.tensor()];
            graph_inputs.extend(bias.as_ref());
            graph_inputs.extend(local_mask.as_ref().map(AttentionMask::tensor));
            let has_bias = bias.is_some();
            let out = self.graphs.run("bert-layers", &graph_inputs, |t| {
                let mask = if binary {
                    AttentionMask::from_binary(t[1].clone())?
                } else {
                    AttentionMask::from_additive(t[1].clone())?
                };
                let bias = if has_bias { t.get(2) } else { None };
                let local = t
                    .get(if has_bias { 3 } else { 2 })
                    .map(|l| AttentionMask::from_additive(l.clone()))
                    .transpose()?;
                let mut x = t[0].clone();
                for (i, layer) in self.layers.iter().enumerate() {
                    x = layer
                        .forward_with(&x, &self.layer_inputs(i, &mask, local.as_ref(), bias))?;
                }
                if let Some(n) = &self.final_norm {
                    x = n.forward(&x)?;
                }
                Ok::<_, Error>(vec![x])
            })?;
            return Ok(out);
        }
        let mut states = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            let next = layer.forward_with(
                &x,
                &self.layer_inputs(i, &mask, local_mask.as_ref(), bias.as_ref()),
            )?;
            states.push(x);
            x = next;
        }
        if let Some(n) = &self.final_norm {
            x = n.forward(&x)?;
        }
        states.push(x);
        Ok(states)
    }
}
