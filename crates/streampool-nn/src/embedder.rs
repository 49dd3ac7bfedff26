//! Sentence embeddings: tokenizer + model + the model's pooling (mean, CLS or last token) +
//! L2 normalisation where it has one, with its named prompts.

use std::collections::BTreeMap;
use std::path::Path;

use streampool::phases::timed;
use streampool::{Device, Tensor};

use crate::accuracy::{self, AccuracyReport, GateSource, GateStore, LoadOptions, QuantizationGate};
use crate::bert::packed_len_bound;
use crate::pooling::{read_json, Pooling, PoolingMode};
use crate::{
    BertInput, BertModel, BertTokenizer, ComputeDType, Error, Family, PackedInput, Result,
    ShapeBuckets,
};

/// Turns sentences into vectors as sentence-transformers does, with the pooling and prompts
/// of the model's own files: mean pooling and unit length for all-MiniLM-L6-v2, the first
/// token for bge and gte, the last token for Qwen3-Embedding (see [`Pooling`]). Any
/// [`Family`](crate::Family) the model loader supports. `Send + Sync`: share one
/// `Arc<SentenceEmbedder>` between threads.
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
    pooling: Pooling,
    /// Named prompts (`config_sentence_transformers.json`), prepended to texts.
    prompts: BTreeMap<String, String>,
    /// The prompt applied when a call names none.
    default_prompt: Option<String>,
    /// Most texts per device batch in [`SentenceEmbedder::embed`]; see
    /// [`SentenceEmbedder::with_chunk_size`].
    chunk: usize,
    /// Whether batches of mixed lengths run packed; see [`SentenceEmbedder::with_packing`].
    packing: bool,
    /// How batch shapes are rounded; see [`SentenceEmbedder::with_shape_buckets`].
    buckets: ShapeBuckets,
    /// What the accuracy gate measured when the model was loaded in a quantized dtype, and
    /// whether this load measured it or read it from the gate's cache.
    accuracy: Option<(AccuracyReport, GateSource)>,
}

/// The default [`SentenceEmbedder::with_chunk_size`]: a batch of up to 256 texts runs as one
/// device batch; a larger one in chunks of 256, tokenizing each chunk on the tokenization
/// pool while the device runs the ones before (a batch of 512 hides the tokenization of its
/// second half).
pub const DEFAULT_EMBED_CHUNK: usize = 256;

impl SentenceEmbedder {
    /// Loads a model folder: `config.json`, `model.safetensors` and `tokenizer.json`, and
    /// where present sentence-transformers' `modules.json` with its pooling module's config
    /// (pooling mode, `Normalize`) and `config_sentence_transformers.json` (prompts). Inputs
    /// are truncated to `max_seq_length` of `sentence_bert_config.json` when the folder has
    /// one (256 for all-MiniLM-L6-v2), never beyond the model's positions.
    pub fn load(device: &Device, dir: impl AsRef<Path>) -> Result<Self> {
        Self::load_with(device, dir, ComputeDType::F32)
    }

    /// As [`Self::load`], with the model's weights and activations in `dtype` (see
    /// [`ComputeDType`]); embeddings are `f32` whatever the dtype. f16 and bf16 use the fused
    /// mean-pool-and-normalize kernel.
    ///
    /// A quantized dtype (`int8`) runs the accuracy gate with its default thresholds and
    /// refuses a model that misses them: [`Self::load_with_options`] says more.
    pub fn load_with(device: &Device, dir: impl AsRef<Path>, dtype: ComputeDType) -> Result<Self> {
        Self::load_with_options(
            device,
            dir,
            &LoadOptions {
                dtype,
                ..LoadOptions::default()
            },
        )
    }

    /// As [`Self::load_with`], with every load setting. In a quantized dtype (`int8`) with
    /// [`QuantizationGate::Enforce`] (the default) the model is loaded in f32 too, both embed
    /// the gate corpus ([`crate::accuracy`]), and a model that misses `thresholds` is refused
    /// with [`Error::AccuracyGate`] (what was measured is then in the error, else in
    /// [`Self::accuracy_report`]). The gate costs two passes over 2,000 sentences (about
    /// 40,000 tokens) the first time a machine loads a model in a dtype; the report is kept
    /// in [`LoadOptions::gate_cache`], keyed by the model's files and the dtype's arithmetic,
    /// and later loads apply their thresholds to it without measuring (a hash of the files,
    /// tens of milliseconds). [`QuantizationGate::Force`] skips the gate.
    ///
    /// ```
    /// use streampool::Device;
    /// use streampool_nn::accuracy::QuantizationGate;
    /// use streampool_nn::{tiny_bert_dir, ComputeDType, LoadOptions, SentenceEmbedder};
    /// let opts = LoadOptions {
    ///     dtype: ComputeDType::Int8,
    ///     gate: QuantizationGate::Force,
    ///     ..LoadOptions::default()
    /// };
    /// let emb = SentenceEmbedder::load_with_options(&Device::cpu(), tiny_bert_dir(), &opts).unwrap();
    /// assert_eq!(emb.model().dtype(), ComputeDType::Int8);
    /// assert!(emb.accuracy_report().is_none()); // forced: not measured
    /// ```
    pub fn load_with_options(
        device: &Device,
        dir: impl AsRef<Path>,
        options: &LoadOptions,
    ) -> Result<Self> {
        let dtype = options.dtype;
        crate::layers::check_quantized_on(device, dtype)?;
        if !dtype.is_quantized() || options.gate == QuantizationGate::Force {
            return Self::load_model(device, dir.as_ref(), dtype);
        }
        let dir = dir.as_ref();
        let store = GateStore::open(&options.gate_cache, dir, dtype)?;
        if let Some(report) = store.as_ref().and_then(GateStore::get) {
            // Refused before anything is loaded when the kept report misses the thresholds.
            let report = accuracy::enforce(report, dtype, &options.thresholds)?;
            let mut quantized = Self::load_model(device, dir, dtype)?;
            quantized.accuracy = Some((report, GateSource::Cached));
            return Ok(quantized);
        }
        let reference = Self::load_model(device, dir, ComputeDType::F32)?;
        let model = reference.model.with_dtype(dtype)?;
        let mut quantized =
            Self::new(reference.tokenizer.clone(), model)?.with_pooling(reference.pooling);
        quantized.prompts = reference.prompts.clone();
        quantized.default_prompt = reference.default_prompt.clone();
        let report = timed("accuracy gate", || {
            accuracy::measure(&reference, &quantized, &accuracy::gate_corpus())
        })?;
        if let Some(store) = &store {
            store.put(&report);
        }
        let report = accuracy::enforce(report, dtype, &options.thresholds)?;
        quantized.accuracy = Some((report, GateSource::Measured));
        Ok(quantized)
    }

    /// What the accuracy gate measured when this embedder was loaded in a quantized dtype
    /// (`None` for float dtypes, and when the gate was forced off).
    pub fn accuracy_report(&self) -> Option<AccuracyReport> {
        self.accuracy.map(|(r, _)| r)
    }

    /// Whether [`Self::accuracy_report`] was measured by this load or read from the gate's
    /// cache (`None` when there is no report).
    pub fn accuracy_source(&self) -> Option<GateSource> {
        self.accuracy.map(|(_, s)| s)
    }

    fn load_model(device: &Device, dir: &Path, dtype: ComputeDType) -> Result<Self> {
        let model = BertModel::load_with(device, dir, dtype)?;
        let pooling = Pooling::from_dir(dir)?;
        let (prompts, default_prompt) = prompts(dir)?;
        let max_len = max_seq_length(dir)?
            .unwrap_or(usize::MAX)
            .min(model.max_positions());
        let tokenizer = timed("tokenizer loaded", || {
            BertTokenizer::from_file(dir.join("tokenizer.json"), max_len)
        })?;
        let mut emb = Self::new(tokenizer, model)?.with_pooling(pooling);
        emb.prompts = prompts;
        emb.default_prompt = default_prompt;
        Ok(emb)
    }

    /// This embedder with another pooling.
    pub fn with_pooling(mut self, pooling: Pooling) -> Self {
        self.pooling = pooling;
        self
    }

    /// The pooling (from the model's sentence-transformers files).
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// The model's named prompts (`config_sentence_transformers.json`'s `prompts`).
    pub fn prompts(&self) -> &BTreeMap<String, String> {
        &self.prompts
    }

    /// The prompt named `name`, or an error that lists the model's prompts.
    ///
    /// ```
    /// use streampool::Device;
    /// use streampool_nn::{tiny_bert_dir, SentenceEmbedder};
    /// let emb = SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap();
    /// assert!(emb.prompt("query").is_err()); // tiny-bert has no prompts
    /// ```
    pub fn prompt(&self, name: &str) -> Result<&str> {
        self.prompts.get(name).map(String::as_str).ok_or_else(|| {
            Error::Input(format!(
                "prompt_name {} is not one of this model's prompts ({})",
                crate::Quoted(name),
                if self.prompts.is_empty() {
                    "it has none".to_string()
                } else {
                    self.prompts.keys().cloned().collect::<Vec<_>>().join(", ")
                }
            ))
        })
    }

    /// The prompt applied when a call names none (`default_prompt_name`), if any.
    pub fn default_prompt(&self) -> Option<&str> {
        self.default_prompt.as_deref()
    }

    /// The prompt to prepend: `prompt` itself, else the one named `prompt_name`, else the
    /// default; both given is an error (as sentence-transformers' `encode`).
    pub fn resolve_prompt<'a>(
        &'a self,
        prompt_name: Option<&str>,
        prompt: Option<&'a str>,
    ) -> Result<Option<&'a str>> {
        match (prompt_name, prompt) {
            (Some(_), Some(_)) => Err(Error::Input(
                "give either prompt or prompt_name, not both".into(),
            )),
            (_, Some(p)) => Ok(Some(p)),
            (Some(name), None) => self.prompt(name).map(Some),
            (None, None) => Ok(self.default_prompt()),
        }
    }

    /// [`Self::embed`] with `prompt` prepended to every text (sentence-transformers' `prompt`;
    /// its tokens are pooled too, as `include_prompt`). `None` applies the default prompt, if
    /// the model has one.
    ///
    /// ```
    /// use streampool::Device;
    /// use streampool_nn::{tiny_bert_dir, SentenceEmbedder};
    /// let emb = SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap();
    /// let a = emb.embed_with_prompt(&["paris"], Some("query: ")).unwrap();
    /// let b = emb.embed(&["query: paris"]).unwrap();
    /// assert_eq!(a, b);
    /// ```
    pub fn embed_with_prompt(&self, texts: &[&str], prompt: Option<&str>) -> Result<Vec<Vec<f32>>> {
        match prompt.or(self.default_prompt()) {
            Some(p) if !p.is_empty() => {
                let owned: Vec<String> = texts.iter().map(|t| format!("{p}{t}")).collect();
                let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
                self.embed_raw(&refs)
            }
            _ => self.embed_raw(texts),
        }
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

    /// Pays before traffic what a new machine's first batches would: one forward at each
    /// power-of-two token count from 2,048 up to the bucket of `max_tokens` (a batch's
    /// largest token count; padding and bucketing included), so that every cuBLASLt tuning
    /// bucket such batches meet is timed now, or read from the tuning cache where an earlier
    /// process on this machine timed it ([`streampool::TuningCache`]). Sequences of up to
    /// 128 tokens, on the path real batches take (packed where [`Self::packs`]). On a device
    /// without tuning (the CPU) it costs the forwards alone; `max_tokens` 0 does nothing.
    ///
    /// ```
    /// use streampool::Device;
    /// use streampool_nn::{tiny_bert_dir, SentenceEmbedder};
    /// let emb = SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap();
    /// emb.warm_up_tuning(4096).unwrap();
    /// ```
    pub fn warm_up_tuning(&self, max_tokens: usize) -> Result<()> {
        if max_tokens == 0 {
            return Ok(());
        }
        let top = self.buckets.round(max_tokens).next_power_of_two();
        let len = self.tokenizer.max_len().clamp(2, 128);
        let vocab = self.model.config().vocab_size.max(1) as i64;
        timed("warm-up tuning", || {
            let mut tokens = 2048usize;
            while tokens <= top.max(2048) {
                let rows = tokens.div_ceil(len);
                let sequences: Vec<Vec<i64>> = (0..rows)
                    .map(|r| {
                        (0..len)
                            .map(|k| {
                                let id = match k {
                                    0 => 101,
                                    _ if k + 1 == len => 102,
                                    _ => 1000 + ((r * 131 + k * 17) % 20_000) as i64,
                                };
                                id % vocab
                            })
                            .collect()
                    })
                    .collect();
                let out = if self.packs() {
                    self.embed_packed(&PackedInput::from_sequences(&sequences)?)?
                } else {
                    self.embed_input_padded(&BertInput::from_sequences(&sequences)?)?
                };
                // Read back: the forward (and its tuning) is done before the next size.
                out.to_vec::<f32>()?;
                tokens *= 2;
            }
            Ok(())
        })
    }

    /// Pairs a tokenizer with a model; the tokenizer must not produce sequences longer than
    /// the model's positions.
    /// Pools by the mean and normalizes, with no prompts; see [`Self::with_pooling`].
    pub fn new(tokenizer: BertTokenizer, model: BertModel) -> Result<Self> {
        if tokenizer.max_len() > model.max_positions() {
            return Err(Error::Input(format!(
                "tokenizer truncates at {} tokens but the model has {} positions",
                tokenizer.max_len(),
                model.max_positions()
            )));
        }
        Ok(Self {
            tokenizer,
            model,
            pooling: Pooling {
                mode: PoolingMode::Mean,
                normalize: true,
            },
            prompts: BTreeMap::new(),
            default_prompt: None,
            chunk: DEFAULT_EMBED_CHUNK,
            packing: true,
            buckets: ShapeBuckets::default(),
            accuracy: None,
        })
    }

    /// Whether a batch of mixed lengths runs packed (default `true`): its sentences back to
    /// back with no padding ([`BertModel::forward_packed`]), so it costs its real tokens, not
    /// rows x the longest. Packing applies in f16 and bf16 (the dtypes whose attention is the
    /// fused kernel) on devices with packed kernels (CPU, CUDA), to batches with padding; the
    /// embeddings are those of the padded path up to float rounding (cosine >= 0.9999 per
    /// sentence, `tests/it/packed.rs`). `false` always pads to the longest.
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

    /// How batch shapes are rounded up before they run (default [`ShapeBuckets::default`]:
    /// 8 steps per octave), so a corpus or a server meets a bounded number of shapes and
    /// reuses each one's cuBLASLt plans and CUDA graph instead of setting up a new shape for
    /// almost every batch. A padded batch gets masked padding columns and copies of its last
    /// row; a packed batch gets sequences of padding tokens and empty sequences. The extra
    /// rows are computed and dropped: the embeddings are those of the batch as given, up to
    /// float rounding. [`ShapeBuckets::OFF`] runs every batch at its own shape.
    ///
    /// ```
    /// use streampool::Device;
    /// use streampool_nn::{tiny_bert_dir, SentenceEmbedder, ShapeBuckets};
    /// let emb = SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir())
    ///     .unwrap()
    ///     .with_shape_buckets(ShapeBuckets::OFF);
    /// assert_eq!(emb.shape_buckets(), ShapeBuckets::OFF);
    /// ```
    pub fn with_shape_buckets(mut self, buckets: ShapeBuckets) -> Self {
        self.buckets = buckets;
        self
    }

    /// How batch shapes are rounded (see [`Self::with_shape_buckets`]).
    pub fn shape_buckets(&self) -> ShapeBuckets {
        self.buckets
    }

    /// Whether batches of mixed lengths run packed (see [`Self::with_packing`]).
    /// Packing covers BERT-family models (absolute positions, plain attention) with
    /// normalized mean pooling: the packed kernels' case.
    pub fn packs(&self) -> bool {
        self.packing
            && self.model.dtype().is_half()
            && self.model.device().has_packed_kernels()
            && self.model.family() == Family::Bert
            && self.pooling.mode == PoolingMode::Mean
            && self.pooling.normalize
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

    /// Embeddings `F32` `[batch, dim]` of a tokenized batch (the model's pooling; unit
    /// length where it normalizes), left on the device: packed when it has padding and
    /// [`Self::packs`], else padded.
    pub fn embed_input(&self, input: &BertInput) -> Result<Tensor> {
        // A mask without a zero has no padding to drop: `from_padded` would copy every id
        // into a packed batch only to find that (1.2 ms of host time per 512 x 128 batch on
        // a 2-core development machine, with the device idle before the forward; +4.6% at
        // 512 x 128 on the H100, in one call against the code before), so such batches go
        // straight to the padded path, where `from_padded` would also have sent them.
        if self.packs() && input.attention_mask().contains(&0) {
            if let Some(packed) = PackedInput::from_padded(input).filter(PackedInput::has_padding) {
                return self.embed_packed(&packed);
            }
        }
        self.embed_input_padded(input)
    }

    /// Unit-length mean-pooled embeddings `[batch, dim]` of a packed batch, left on the
    /// device (run at its bucket shape, [`Self::with_shape_buckets`]).
    pub fn embed_packed(&self, input: &PackedInput) -> Result<Tensor> {
        let bucketed = self
            .buckets
            .pad_packed(input, packed_len_bound(input.max_len()));
        let (hidden, offsets) = self
            .model
            .forward_packed(bucketed.as_ref().unwrap_or(input))?;
        let pooled = hidden.mean_pool_normalize_packed(&offsets)?;
        first_rows(pooled, input.batch_size())
    }

    /// [`Self::embed_input`] on the padded path whatever the batch (to compare the two).
    pub fn embed_input_padded(&self, input: &BertInput) -> Result<Tensor> {
        self.embed_input_with(input, self.pooling.normalize)
    }

    /// [`Self::embed_input`], unit length or not as `normalize` says (the server's
    /// `normalize` request field).
    /// Runs at the batch's bucket shape ([`Self::with_shape_buckets`]).
    pub fn embed_input_with(&self, input: &BertInput, normalize: bool) -> Result<Tensor> {
        let bucketed = self.buckets.pad_input(input, self.model.max_positions());
        let run = bucketed.as_ref().unwrap_or(input);
        let hidden = self.model.forward(run)?;
        let pooled = self
            .pooling
            .pool(&hidden, run.attention_mask(), normalize)?;
        first_rows(pooled, input.batch_size())
    }

    /// One embedding per text (the model's pooling; unit length where it normalizes; its
    /// default prompt, if any, prepended), computed on the calling thread's current stream:
    /// as one batch up to [`SentenceEmbedder::chunk_size`] texts, else in chunks whose
    /// tokenization overlaps the device work of the chunks before. No texts give no
    /// embeddings.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        self.embed_with_prompt(texts, None)
    }

    /// [`Self::embed`] with no prompt at all.
    fn embed_raw(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
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

/// The prompts and the default prompt of `dir/config_sentence_transformers.json`, if that
/// file exists.
fn prompts(dir: &Path) -> Result<(BTreeMap<String, String>, Option<String>)> {
    let path = dir.join("config_sentence_transformers.json");
    if !path.is_file() {
        return Ok((BTreeMap::new(), None));
    }
    let v = read_json(&path)?;
    let mut prompts = BTreeMap::new();
    if let Some(map) = v["prompts"].as_object() {
        for (name, p) in map {
            let p = p.as_str().ok_or_else(|| {
                Error::Config(format!(
                    "{}: prompt {name:?} is not a string",
                    path.display()
                ))
            })?;
            prompts.insert(name.clone(), p.to_string());
        }
    }
    let default = match v["default_prompt_name"].as_str() {
        None => None,
        Some(name) => Some(prompts.get(name).cloned().ok_or_else(|| {
            Error::Config(format!(
                "{}: default_prompt_name {name:?} names no prompt",
                path.display()
            ))
        })?),
    };
    Ok((prompts, default))
}

/// The first `rows` rows of `[bucket rows, dim]` embeddings (all of them when no rows were
/// added).
fn first_rows(pooled: Tensor, rows: usize) -> Result<Tensor> {
    if pooled.dims()[0] == rows {
        return Ok(pooled);
    }
    Ok(pooled.narrow(0, 0, rows)?.contiguous()?)
}

/// `max_seq_length` from `dir/sentence_bert_config.json`, if that file exists.
pub(crate) fn max_seq_length(dir: &Path) -> Result<Option<usize>> {
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
