//! Sentence embeddings: tokenizer + BERT + mean pooling + L2 normalisation.

use std::path::Path;

use streampool::phases::timed;
use streampool::{Device, Tensor};

use crate::pooling::{l2_normalize, mean_pool};
use crate::{BertInput, BertModel, BertTokenizer, ComputeDType, Error, PackedInput, Result};

/// Turns sentences into unit-length vectors, as sentence-transformers does for models such
/// as all-MiniLM-L6-v2. `Send + Sync`: share one `Arc<SentenceEmbedder>` between threads.
///
/// ```
/// use streampool::Device;
/// use streampool_nn::{tiny_bert_dir, SentenceEmbedder};
/// let emb = SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap();
/// let v = emb.embed(&["a first sentence", "and another"]).unwrap();
/// assert_eq!((v.len(), v[0].len()), (2, emb.dim()));
/// let norm: f32 = v[0].iter().map(|x| x * x).sum::<f32>().sqrt();
/// assert!((norm - 1.0).abs() < 1e-5);
/// ```
pub struct SentenceEmbedder {
    tokenizer: BertTokenizer,
    model: BertModel,
    /// Most texts per device batch in [`SentenceEmbedder::embed`]; see
    /// [`SentenceEmbedder::with_chunk_size`].
    chunk: usize,
    /// Whether batches of mixed lengths run packed; see [`SentenceEmbedder::with_packing`].
    packing: bool,
}

/// The default [`SentenceEmbedder::with_chunk_size`]: a batch of up to 256 texts runs as one
/// device batch; a larger one in chunks of 256, tokenizing each chunk on the tokenization
/// pool while the device runs the ones before (a batch of 512 hides the tokenization of its
/// second half).
pub const DEFAULT_EMBED_CHUNK: usize = 256;

impl SentenceEmbedder {
    /// Loads a model folder: `config.json`, `model.safetensors` and `tokenizer.json`. Inputs
    /// are truncated to `max_seq_length` of `sentence_bert_config.json` when the folder has
    /// one (256 for all-MiniLM-L6-v2), never beyond the model's positions.
    pub fn load(device: &Device, dir: impl AsRef<Path>) -> Result<Self> {
        Self::load_with(device, dir, ComputeDType::F32)
    }

    /// As [`Self::load`], with the model's weights and activations in `dtype` (see
    /// [`ComputeDType`]); embeddings are `f32` whatever the dtype. f16 and bf16 use the fused
    /// mean-pool-and-normalize kernel.
    pub fn load_with(device: &Device, dir: impl AsRef<Path>, dtype: ComputeDType) -> Result<Self> {
        let dir = dir.as_ref();
        let model = BertModel::load_with(device, dir, dtype)?;
        let max_len = max_seq_length(dir)?
            .unwrap_or(usize::MAX)
            .min(model.config().max_position_embeddings);
        let tokenizer = timed("tokenizer loaded", || {
            BertTokenizer::from_file(dir.join("tokenizer.json"), max_len)
        })?;
        Self::new(tokenizer, model)
    }

    /// Runs two small batches (a short sentence; two sentences of about 100 tokens) and
    /// waits for them, so the first requests do not pay for what a process does once: on
    /// CUDA, the calling thread's cuBLAS handle, cuBLAS's and our kernels' lazy module
    /// loading, the first allocations. A server calls it before it reports ready. Timed as
    /// start-up phase `warm-up forward`.
    ///
    /// ```
    /// use streampool::Device;
    /// use streampool_nn::{tiny_bert_dir, SentenceEmbedder};
    /// let emb = SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap();
    /// emb.warm_up().unwrap();
    /// ```
    pub fn warm_up(&self) -> Result<()> {
        let long = "the quick brown fox jumps over the lazy dog ".repeat(11);
        timed("warm-up forward", || {
            self.embed(&["warm-up"])?;
            self.embed(&[long.as_str(), long.as_str()])?;
            Ok(())
        })
    }

    /// Pairs a tokenizer with a model; the tokenizer must not produce sequences longer than
    /// the model's positions.
    pub fn new(tokenizer: BertTokenizer, model: BertModel) -> Result<Self> {
        if tokenizer.max_len() > model.config().max_position_embeddings {
            return Err(Error::Input(format!(
                "tokenizer truncates at {} tokens but the model has {} positions",
                tokenizer.max_len(),
                model.config().max_position_embeddings
            )));
        }
        Ok(Self {
            tokenizer,
            model,
            chunk: DEFAULT_EMBED_CHUNK,
            packing: true,
        })
    }

    /// Whether a batch of mixed lengths runs packed (default `true`): its sentences back to
    /// back with no padding ([`BertModel::forward_packed`]), so it costs its real tokens, not
    /// rows x the longest. Packing applies in f16 and bf16 (the dtypes whose attention is the
    /// fused kernel) on devices with packed kernels (CPU, CUDA), to batches with padding; the
    /// embeddings are those of the padded path up to float rounding (cosine >= 0.9999 per
    /// sentence, `tests/packed.rs`). `false` always pads to the longest.
    ///
    /// ```
    /// use streampool::Device;
    /// use streampool_nn::{tiny_bert_dir, ComputeDType, SentenceEmbedder};
    /// let emb = SentenceEmbedder::load_with(&Device::cpu(), tiny_bert_dir(), ComputeDType::F16)
    ///     .unwrap()
    ///     .with_packing(false);
    /// assert!(!emb.packs());
    /// ```
    pub fn with_packing(mut self, packing: bool) -> Self {
        self.packing = packing;
        self
    }

    /// Whether batches of mixed lengths run packed (see [`Self::with_packing`]).
    pub fn packs(&self) -> bool {
        self.packing && self.model.dtype().is_half() && self.model.device().has_packed_kernels()
    }

    /// Sets how many texts [`SentenceEmbedder::embed`] runs as one device batch (at least 1).
    /// A longer list runs in chunks of this size: while the device computes chunk i, the
    /// tokenization pool tokenizes chunk i+1, whose forward is then queued behind it; all
    /// chunks are read back at the end. Each chunk is padded to its own longest text (never
    /// longer than the whole list's padding); the embeddings are those of one big batch
    /// (padding is masked) up to float rounding. Where the device captures graphs, each
    /// chunk shape (rows x padded length) is a graph of its own, as any batch shape is.
    ///
    /// ```
    /// use streampool::Device;
    /// use streampool_nn::{tiny_bert_dir, SentenceEmbedder};
    /// let emb = SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap().with_chunk_size(2);
    /// let texts = ["one", "two words", "and three words", "four"];
    /// assert_eq!(emb.embed(&texts).unwrap().len(), 4);
    /// ```
    pub fn with_chunk_size(mut self, chunk: usize) -> Self {
        self.chunk = chunk.max(1);
        self
    }

    /// The chunk size of [`SentenceEmbedder::embed`].
    pub fn chunk_size(&self) -> usize {
        self.chunk
    }

    /// The embedding width.
    pub fn dim(&self) -> usize {
        self.model.config().hidden_size
    }

    /// The encoder.
    pub fn model(&self) -> &BertModel {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &BertTokenizer {
        &self.tokenizer
    }

    /// Tokenizes `texts` into one padded batch (large batches on the [`TokenizePool`]).
    ///
    /// [`TokenizePool`]: crate::TokenizePool
    pub fn tokenize(&self, texts: &[&str]) -> Result<BertInput> {
        self.tokenizer.encode_batch(texts)
    }

    /// Unit-length embeddings `[batch, dim]` of a tokenized batch, left on the device: packed
    /// when it has padding and [`Self::packs`], else padded.
    pub fn embed_input(&self, input: &BertInput) -> Result<Tensor> {
        if self.packs() {
            if let Some(packed) = PackedInput::from_padded(input).filter(PackedInput::has_padding) {
                return self.embed_packed(&packed);
            }
        }
        self.embed_input_padded(input)
    }

    /// Unit-length embeddings `[batch, dim]` of a packed batch, left on the device.
    pub fn embed_packed(&self, input: &PackedInput) -> Result<Tensor> {
        let (hidden, offsets) = self.model.forward_packed(input)?;
        Ok(hidden.mean_pool_normalize_packed(&offsets)?)
    }

    /// [`Self::embed_input`] on the padded path whatever the batch (to compare the two).
    pub fn embed_input_padded(&self, input: &BertInput) -> Result<Tensor> {
        let hidden = self.model.forward(input)?;
        if self.model.dtype().is_half() {
            let (b, s) = (input.batch_size(), input.seq_len());
            let mask: Vec<f32> = input
                .attention_mask()
                .iter()
                .map(|&m| (m != 0) as u8 as f32)
                .collect();
            let mask = Tensor::from_vec(mask, &[b, s], hidden.device())?;
            return Ok(hidden.mean_pool_normalize(&mask)?);
        }
        l2_normalize(&mean_pool(&hidden, input.attention_mask())?)
    }

    /// One unit-length embedding per text, computed on the calling thread's current stream:
    /// as one batch up to [`SentenceEmbedder::chunk_size`] texts, else in chunks whose
    /// tokenization overlaps the device work of the chunks before. No texts give no
    /// embeddings.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        // Every chunk's forward is queued on this thread's stream as soon as it is
        // tokenized, and nothing is read back until all are queued: while the device runs
        // chunk i, the tokenization pool works on chunk i+1, so the device idles only while
        // the first chunk tokenizes. (Reading chunk i back before queuing chunk i+1 would
        // leave the device idle for each read-back and each queuing.) The embeddings held
        // meanwhile are `[chunk, dim]` each; a chunk's activations go back to the stream's
        // allocator as its forward is queued, as for one batch.
        let mut pending = Vec::with_capacity(texts.len().div_ceil(self.chunk));
        for chunk in texts.chunks(self.chunk) {
            let input = self.tokenize(chunk)?;
            pending.push(self.embed_input(&input)?);
        }
        let mut out = Vec::with_capacity(texts.len());
        for embeddings in &pending {
            self.read_rows(embeddings, &mut out)?;
        }
        Ok(out)
    }

    /// Reads `[rows, dim]` embeddings back and appends them row by row.
    fn read_rows(&self, embeddings: &Tensor, out: &mut Vec<Vec<f32>>) -> Result<()> {
        let flat = embeddings.to_vec::<f32>()?;
        self.check_finite(&flat)?;
        out.extend(flat.chunks_exact(self.dim()).map(<[f32]>::to_vec));
        Ok(())
    }

    /// Fails with [`Error::NonFinite`] if any embedding value is infinite or NaN. Half
    /// precision stores activations past its range as infinities (IEEE rounding, as PyTorch
    /// does), which layer norm turns into NaN; this turns such a result into an error instead
    /// of vectors of NaN. [`SentenceEmbedder::embed`] calls it on everything it returns.
    ///
    /// ```
    /// # use streampool::Device;
    /// # use streampool_nn::SentenceEmbedder;
    /// # let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/tiny-bert");
    /// let emb = SentenceEmbedder::load(&Device::cpu(), dir)?;
    /// assert!(emb.check_finite(&[0.5, -0.25]).is_ok());
    /// assert!(emb.check_finite(&[0.5, f32::NAN]).is_err());
    /// # Ok::<(), streampool_nn::Error>(())
    /// ```
    pub fn check_finite(&self, values: &[f32]) -> Result<()> {
        if values.iter().all(|v| v.is_finite()) {
            return Ok(());
        }
        let dtype = self.model.dtype();
        let advice = if dtype.is_half() {
            format!(
                "an activation exceeded the range of {dtype} (f16: 65504); \
                 run this model in bf16 or f32 (--dtype)"
            )
        } else {
            format!("computed in {dtype}; the weights or inputs hold infinities or NaNs")
        };
        Err(Error::NonFinite(advice))
    }
}

/// `max_seq_length` from `dir/sentence_bert_config.json`, if that file exists.
fn max_seq_length(dir: &Path) -> Result<Option<usize>> {
    let path = dir.join("sentence_bert_config.json");
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|source| Error::Json {
        path: path.clone(),
        source,
    })?;
    match v.get("max_seq_length") {
        None => Ok(None),
        Some(n) => n
            .as_u64()
            .filter(|&n| n > 0)
            .map(|n| Some(n as usize))
            .ok_or_else(|| {
                Error::Config(format!(
                    "{}: max_seq_length must be a positive integer, got {n}",
                    path.display()
                ))
            }),
    }
}
