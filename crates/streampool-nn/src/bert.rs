//! BERT-family encoders (BERT, MiniLM, ...) from Hugging Face checkpoints.

use std::path::Path;

use std::sync::Arc;

use streampool::phases::timed;
use streampool::{Activation, Device, GraphCache, Tensor};

use crate::layers::{AttentionMask, Embedding, LayerNorm, TransformerEncoderLayer};
use crate::packed::PackedInput;
use crate::weights::{HostTensor, WeightFile};
use crate::{BertConfig, ComputeDType, Error, Result};

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

/// Word + position + token-type embeddings, then LayerNorm.
#[derive(Debug, Clone)]
struct BertEmbeddings {
    word: Embedding,
    position: Embedding,
    token_type: Embedding,
    /// `position + token_type[0]`, precomputed: with all-zero token types (the usual case)
    /// the three-way sum is one broadcast add.
    position_type0: Tensor,
    norm: LayerNorm,
}

impl BertEmbeddings {
    fn load(file: &WeightFile, p: &str, c: &BertConfig, device: &Device) -> Result<Self> {
        let h = c.hidden_size;
        let word = file.get(
            &format!("{p}embeddings.word_embeddings.weight"),
            &[c.vocab_size, h],
        )?;
        let position = file.get(
            &format!("{p}embeddings.position_embeddings.weight"),
            &[c.max_position_embeddings, h],
        )?;
        let token_type = file.get(
            &format!("{p}embeddings.token_type_embeddings.weight"),
            &[c.type_vocab_size, h],
        )?;
        let type0 = &token_type.data()[..h];
        let sum: Vec<f32> = position
            .data()
            .chunks_exact(h)
            .flat_map(|row| row.iter().zip(type0).map(|(p, t)| p + t))
            .collect();
        let position_type0 = HostTensor::new(sum, position.shape())?.to_device(device)?;
        Ok(Self {
            word: Embedding::new(&word, device)?,
            position: Embedding::new(&position, device)?,
            token_type: Embedding::new(&token_type, device)?,
            position_type0,
            norm: LayerNorm::load(
                file,
                &format!("{p}embeddings.LayerNorm"),
                h,
                c.layer_norm_eps as f32,
                device,
            )?,
        })
    }

    fn with_dtype(&self, dtype: ComputeDType) -> Result<Self> {
        Ok(Self {
            word: self.word.with_dtype(dtype)?,
            position: self.position.with_dtype(dtype)?,
            token_type: self.token_type.with_dtype(dtype)?,
            position_type0: self.position_type0.to_dtype(dtype.dtype())?,
            norm: self.norm.with_dtype(dtype)?,
        })
    }

    fn forward(&self, input: &BertInput) -> Result<Tensor> {
        let (b, s) = (input.batch_size, input.seq_len);
        if s > self.position.rows() {
            return Err(Error::Input(format!(
                "sequence of {s} tokens is longer than the model's {} positions",
                self.position.rows()
            )));
        }
        let words = self.word.forward(&input.input_ids, &[b, s])?;
        let x = if input.token_type_ids.iter().all(|&t| t == 0) {
            // The [s, h] position rows are one bias over each sentence's s * h values, so the
            // add is bias_act's contiguous row kernel instead of a strided broadcast (on the
            // H100 at 512 x 128 tokens in f16 the broadcast add took 0.17 ms of a 6.5 ms forward).
            let h = words.dims()[2];
            words
                .reshape(&[b, s * h])?
                .bias_act(
                    &self.position_type0.narrow(0, 0, s)?.reshape(&[s * h])?,
                    Activation::Identity,
                )?
                .reshape(&[b, s, h])?
        } else {
            let types = self.token_type.forward(&input.token_type_ids, &[b, s])?;
            words
                .add(&types)?
                .add(&self.position.table().narrow(0, 0, s)?)?
        };
        self.norm.forward(&x)
    }

    /// The embeddings of a packed batch, `[tokens, hidden]`: word + position (each token's
    /// position in its own sequence) + token type, then LayerNorm.
    fn forward_packed(&self, input: &PackedInput) -> Result<Tensor> {
        if input.max_len() > self.position.rows() {
            return Err(Error::Input(format!(
                "sequence of {} tokens is longer than the model's {} positions",
                input.max_len(),
                self.position.rows()
            )));
        }
        let n = input.tokens();
        let words = self.word.forward(input.input_ids(), &[n])?;
        let x = if input.token_type_ids().iter().all(|&t| t == 0) {
            // The position rows with token type 0 already added: one gather and one add.
            words.add(&self.position_type0.embedding(input.positions(), &[n])?)?
        } else {
            words
                .add(&self.token_type.forward(input.token_type_ids(), &[n])?)?
                .add(&self.position.forward(input.positions(), &[n])?)?
        };
        self.norm.forward(&x)
    }
}

/// Packed batches run their encoder layers as one graph per (tokens, sequences and longest
/// length rounded up to this): the attention kernel's grid is sized by the bound, so every
/// batch under one bound replays the same graph.
const PACKED_LEN_BUCKET: usize = 64;

/// A BERT-style encoder: embeddings and a stack of post-norm transformer layers. Weights are
/// read-only after load, so one `Arc<BertModel>` serves any number of threads, each running
/// on its own stream; `forward` takes `&self` and no lock.
///
/// Weights and activations are in the [`ComputeDType`] given to [`Self::load_with`] (f32 for
/// [`Self::load`]); the hidden states [`Self::forward`] returns are in that dtype's
/// [`ComputeDType::dtype`] (`Tensor::to_dtype(DType::F32)` converts them).
///
/// The pooler (`pooler.dense`) is not loaded: sentence embeddings use mean pooling
/// ([`crate::SentenceEmbedder`]).
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
    embeddings: BertEmbeddings,
    layers: Vec<TransformerEncoderLayer>,
    device: Device,
    dtype: ComputeDType,
    /// The encoder layers as one CUDA graph per (stream, batch and length bucket); eager
    /// where the device has no graphs. Shared by clones (same weights).
    graphs: Arc<GraphCache>,
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
        Ok(Self {
            config: self.config.clone(),
            embeddings: self.embeddings.with_dtype(dtype)?,
            layers: self
                .layers
                .iter()
                .map(|l| l.with_dtype(dtype))
                .collect::<Result<_>>()?,
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

    /// Loads the weights at `weights` (safetensors, Hugging Face names, with or without the
    /// `bert.` prefix; F32, F16 or BF16, upcast to f32) for `config`.
    pub fn load_weights(
        device: &Device,
        config: &BertConfig,
        weights: impl AsRef<Path>,
    ) -> Result<Self> {
        config.validate()?;
        let file = WeightFile::open(weights)?;
        let prefix = if !file.contains("embeddings.word_embeddings.weight")
            && file.contains("bert.embeddings.word_embeddings.weight")
        {
            "bert."
        } else {
            ""
        };
        let embeddings = BertEmbeddings::load(&file, prefix, config, device)?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                TransformerEncoderLayer::load_bert(
                    &file,
                    &format!("{prefix}encoder.layer.{i}"),
                    config,
                    device,
                )
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            config: config.clone(),
            embeddings,
            layers,
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

    /// The last hidden state, `[batch, seq, hidden]`, computed on the calling thread's
    /// current stream. Rows at padded positions are computed but meaningless.
    pub fn forward(&self, input: &BertInput) -> Result<Tensor> {
        let mut states = self.run(input, false)?;
        // `run` always returns at least the final state.
        Ok(states.pop().expect("final hidden state"))
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
        let bound = input.max_len().div_ceil(PACKED_LEN_BUCKET).max(1) * PACKED_LEN_BUCKET;
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
    /// output of layer `n - 1` (Hugging Face's `output_hidden_states`).
    pub fn forward_hidden_states(&self, input: &BertInput) -> Result<Vec<Tensor>> {
        self.run(input, true)
    }

    fn run(&self, input: &BertInput, keep_all: bool) -> Result<Vec<Tensor>> {
        let (mask, b, s) = (&input.attention_mask, input.batch_size, input.seq_len);
        let binary = self.dtype.is_half();
        let mask = if binary {
            AttentionMask::binary(mask, b, s, &self.device)?
        } else {
            AttentionMask::new(mask, b, s, &self.device)?
        };
        let mut x = self.embeddings.forward(input)?;
        if !keep_all {
            // The layers are pure device work on `x` and the mask: one graph per shape.
            let out = self.graphs.run("bert-layers", &[&x, mask.tensor()], |i| {
                let mask = if binary {
                    AttentionMask::from_binary(i[1].clone())?
                } else {
                    AttentionMask::from_additive(i[1].clone())?
                };
                let mut x = i[0].clone();
                for layer in &self.layers {
                    x = layer.forward(&x, Some(&mask))?;
                }
                Ok::<_, Error>(vec![x])
            })?;
            return Ok(out);
        }
        let mut states = Vec::new();
        for layer in &self.layers {
            let next = layer.forward(&x, Some(&mask))?;
            if keep_all {
                states.push(x);
            }
            x = next;
        }
        states.push(x);
        Ok(states)
    }
}
