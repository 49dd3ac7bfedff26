//! A sentence embedder served through one batch queue per replica: tokenization per request,
//! one batched forward per batch.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use streampool::{Device, Tensor};
use streampool_batch::{BatchConfig, BatchContext, BatchModel, Handle, ModelError, Replicas};
use streampool_nn::pooling::PoolingMode;
use streampool_nn::{BertInput, InputLimit, PackedInput, Prompt, SentenceEmbedder};

use super::RowOutput;
use crate::error::refusal;
use crate::text::{self, TextLimits};
use crate::{Error, ModelConfig, Result};

/// One input of an embedder's queue: a tokenized text (ids with special tokens) and whether
/// its embedding is scaled to unit length.
pub struct EmbedInput {
    /// Token ids, special tokens included.
    pub ids: Vec<i64>,
    /// Scale the embedding to unit length.
    pub normalize: bool,
}

/// The one batch adapter of a sentence embedder, under the server's queues, the Python
/// package's `BatchQueue` and `encode`, and the bench: one output per input, its pooled
/// embedding (unit length when asked), or [`Error::NonFinite`] for that input alone.
///
/// **Packing follows the forward.** Where the embedder packs ([`SentenceEmbedder::packs`]:
/// half precision, BERT family, normalized mean pooling), a batch's unit-length inputs run
/// as one packed forward (every input's tokens back to back, no padding) whenever their
/// lengths differ, so a batch costs its tokens, as the queue budgets it
/// ([`EmbedBatch::packs`] is the embedder's). Inputs that ask for raw (not unit-length)
/// vectors of such a model run padded in a forward of their own, the packed kernels pooling
/// only to unit length; a model that does not pack runs every batch padded to its longest
/// input, and the queue budgets it so.
///
/// ```
/// use std::sync::Arc;
/// use streampool::Device;
/// use streampool_core::{EmbedBatch, EmbedInput};
/// use streampool_nn::{tiny_bert_dir, SentenceEmbedder};
/// let embedder = Arc::new(SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap());
/// let batch = EmbedBatch::new(embedder.clone());
/// let ids = embedder.tokenizer().encode_ids("hello world").unwrap();
/// let rows = batch.run(vec![EmbedInput { ids, normalize: true }]).unwrap();
/// let norm: f32 = rows[0].as_ref().unwrap().iter().map(|x| x * x).sum();
/// assert!((norm - 1.0).abs() < 1e-4);
/// ```
pub struct EmbedBatch {
    embedder: Arc<SentenceEmbedder>,
    /// Batches run packed so far (shared by an endpoint's replicas).
    packed_batches: Arc<AtomicU64>,
}

/// A batch's forward launched on the device and not yet read back (see
/// [`EmbedBatch::launch`]).
pub struct Launched {
    embedder: Arc<SentenceEmbedder>,
    /// Each forward's embeddings `[rows, dim]` on the device, with, per row, its position in
    /// the batch and whether the host still scales it to unit length.
    parts: Vec<(Tensor, Vec<(usize, bool)>)>,
    rows: usize,
}

impl EmbedBatch {
    /// The adapter of `embedder`.
    pub fn new(embedder: Arc<SentenceEmbedder>) -> Self {
        Self::counting(embedder, Arc::new(AtomicU64::new(0)))
    }

    fn counting(embedder: Arc<SentenceEmbedder>, packed_batches: Arc<AtomicU64>) -> Self {
        Self {
            embedder,
            packed_batches,
        }
    }

    /// The embedder it runs.
    pub fn embedder(&self) -> &Arc<SentenceEmbedder> {
        &self.embedder
    }

    /// Token ids of `texts` for [`EmbedBatch::launch`], `prompt` prepended (read once for
    /// all of them), each truncated to the model's token limit as sentence-transformers
    /// truncates: inline when small, else spread over the tokenization pool.
    pub fn tokenize(&self, texts: &[&str], prompt: Option<&str>) -> Result<Vec<Vec<i64>>> {
        let tok = self.embedder.tokenizer();
        let limit = InputLimit::new(tok.max_len(), true);
        let prompt = prompt
            .filter(|p| !p.is_empty())
            .map(|p| tok.prompt(p, &limit))
            .transpose()
            .map_err(refusal)?;
        let bytes = texts.iter().map(|t| t.len()).sum();
        text::tokenize_blocking(texts, bytes, |t| {
            tok.encode_with_prompt(prompt.as_ref(), t, &limit)
                .map_err(refusal)
        })
    }

    /// Batches that ran packed so far.
    pub fn packed_batches(&self) -> u64 {
        self.packed_batches.load(Ordering::Relaxed)
    }

    /// Queues the forward of `inputs` on the calling thread's stream and returns without
    /// waiting for it (read it back with [`Launched::rows`]): a caller with several batches
    /// launches the next before reading the last back, so the device never idles for a
    /// read-back. The first error (e.g. the device out of memory) fails the whole batch.
    pub fn launch(&self, inputs: Vec<EmbedInput>) -> streampool_nn::Result<Launched> {
        let e = &self.embedder;
        let rows = inputs.len();
        let any_raw = inputs.iter().any(|r| !r.normalize);
        // Each forward: its rows (position, ids, whether the host scales it), and whether
        // it pools to unit length on the device.
        type Part = (Vec<(usize, Vec<i64>, bool)>, bool);
        let plan: Vec<Part> = if e.packs() || !any_raw {
            let (unit, raw) = inputs
                .into_iter()
                .enumerate()
                .map(|(i, r)| (i, r.ids, r.normalize))
                .partition(|(_, _, unit)| *unit);
            vec![(unit, true), (raw, false)]
        } else {
            // A padded model with both kinds: one forward for all, the unit-length rows
            // scaled on the host.
            let all = inputs
                .into_iter()
                .enumerate()
                .map(|(i, r)| (i, r.ids, r.normalize))
                .collect();
            vec![(all, false)]
        };
        let mut parts = Vec::with_capacity(plan.len());
        for (members, unit) in plan {
            if members.is_empty() {
                continue;
            }
            let (rows_of, ids): (Vec<(usize, bool)>, Vec<Vec<i64>>) = members
                .into_iter()
                .map(|(i, ids, wants_unit)| ((i, wants_unit && !unit), ids))
                .unzip();
            let mixed = ids.windows(2).any(|w| w[0].len() != w[1].len());
            let out = if unit && mixed && e.packs() {
                self.packed_batches.fetch_add(1, Ordering::Relaxed);
                e.embed_packed(&PackedInput::from_sequences(&ids)?)?
            } else {
                // Padded to the longest (masked); pooled, and scaled on the device when
                // `unit`, whatever the model's own Normalize module says.
                e.embed_input_with(&BertInput::from_sequences(&ids)?, unit)?
            };
            parts.push((out, rows_of));
        }
        Ok(Launched {
            embedder: e.clone(),
            parts,
            rows,
        })
    }

    /// [`EmbedBatch::launch`] and [`Launched::rows`] in one call.
    pub fn run(&self, inputs: Vec<EmbedInput>) -> streampool_nn::Result<Vec<RowOutput>> {
        self.launch(inputs)?.rows()
    }
}

impl Launched {
    /// Waits for the forward and reads it back: one row per input, in input order, each its
    /// embedding (unit length where its input asked) or [`Error::NonFinite`] (a
    /// half-precision overflow fails its own input only, never NaN in an answer).
    pub fn rows(self) -> streampool_nn::Result<Vec<RowOutput>> {
        let dim = self.embedder.dim();
        let mut rows: Vec<Option<RowOutput>> = (0..self.rows).map(|_| None).collect();
        for (tensor, rows_of) in self.parts {
            let flat = tensor.to_vec::<f32>()?;
            for (row, &(i, scale)) in flat.chunks_exact(dim).zip(&rows_of) {
                let mut row = row.to_vec();
                if scale {
                    l2_normalize(&mut row);
                }
                rows[i] = Some(match self.embedder.check_finite(&row) {
                    Ok(()) => Ok(row),
                    Err(e) => Err(Error::NonFinite {
                        input: i,
                        message: e.to_string(),
                    }),
                });
            }
        }
        // Every position is in exactly one part (`launch` partitions them).
        rows.into_iter()
            .map(|r| {
                r.ok_or_else(|| streampool_nn::Error::Input("a batch row was not computed".into()))
            })
            .collect()
    }
}

/// Scales `row` to unit length (a zero row stays zero, as torch's `normalize` with its eps).
///
/// ```
/// let mut row = [3.0, 4.0];
/// streampool_core::l2_normalize(&mut row);
/// assert_eq!(row, [0.6, 0.8]);
/// ```
pub fn l2_normalize(row: &mut [f32]) {
    let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    row.iter_mut().for_each(|x| *x /= norm);
}

impl BatchModel for EmbedBatch {
    type Input = EmbedInput;
    type Output = RowOutput;

    fn forward_batch(
        &self,
        inputs: Vec<EmbedInput>,
        _ctx: &BatchContext,
    ) -> Result<Vec<RowOutput>, ModelError> {
        Ok(self.run(inputs)?)
    }

    fn check_input(&self, r: &EmbedInput) -> Result<(), ModelError> {
        if r.ids.is_empty() {
            return Err(Box::new(Error::InvalidInput(
                "an input has no tokens".into(),
            )));
        }
        Ok(())
    }

    fn input_len(&self, r: &EmbedInput) -> usize {
        r.ids.len()
    }

    /// Tokens: the router balances replicas by the tokens they hold, not the requests.
    fn cost(&self, r: &EmbedInput) -> u64 {
        r.ids.len() as u64
    }

    /// Whether the forward above packs a batch of mixed lengths: the embedder's own answer.
    fn packs(&self) -> bool {
        self.embedder.packs()
    }

    fn device(&self) -> Option<Device> {
        Some(self.embedder.model().device().clone())
    }
}

/// One served sentence-embedding model: tokenizers for counting and truncating, and its
/// replicas (one batch queue each) that requests are routed to.
pub struct EmbedderEndpoint {
    limits: Arc<TextLimits>,
    /// The model's own prompts by text, read once at start-up (see [`Prompt`]).
    prompts: BTreeMap<String, Arc<Prompt>>,
    packed_batches: Arc<AtomicU64>,
    vocab_size: usize,
    dim: usize,
    /// The first replica's embedder (its prompts and pooling, which replicas share).
    embedder: Arc<SentenceEmbedder>,
    batch: BatchConfig,
    replicas: Replicas<EmbedBatch>,
}

impl EmbedderEndpoint {
    /// Serves the `(device label, embedder)` replicas (one model on several devices) with
    /// the limits and batch settings of `config`.
    pub fn new(
        embedders: Vec<(String, Arc<SentenceEmbedder>)>,
        config: &ModelConfig,
    ) -> Result<Self> {
        let Some((_, embedder)) = embedders.first() else {
            return Err(Error::Config(
                "an embedder needs at least one replica".into(),
            ));
        };
        let embedder = embedder.clone();
        let same = |e: &SentenceEmbedder| {
            e.dim() == embedder.dim()
                && e.pooling() == embedder.pooling()
                && e.prompts() == embedder.prompts()
                && e.model().config().vocab_size == embedder.model().config().vocab_size
                && e.tokenizer().max_len() == embedder.tokenizer().max_len()
        };
        if !embedders.iter().all(|(_, e)| same(e)) {
            return Err(Error::Config(
                "replicas of one embedder differ in width, vocabulary, length, pooling or prompts"
                    .into(),
            ));
        }
        let limits = TextLimits::new(embedder.tokenizer(), config);
        let batch = limits.batch_config(config);
        let prompts = embedder
            .prompts()
            .values()
            .filter(|p| !p.is_empty())
            .map(|p| {
                let read = limits
                    .tokenizer
                    .prompt(p, &limits.limit(true))
                    .map_err(|e| Error::Config(format!("the model's prompt: {e}")))?;
                Ok((p.clone(), Arc::new(read)))
            })
            .collect::<Result<_>>()?;
        let vocab_size = embedder.model().config().vocab_size;
        let dim = embedder.dim();
        let first = embedder.clone();
        let packed_batches = Arc::new(AtomicU64::new(0));
        let replicas = Replicas::new(
            embedders.into_iter().map(|(label, embedder)| {
                (
                    label,
                    EmbedBatch::counting(embedder, packed_batches.clone()),
                )
            }),
            batch.clone(),
        )
        .map_err(|e| Error::Config(format!("starting the batch queues: {e}")))?;
        Ok(Self {
            limits: Arc::new(limits),
            prompts,
            packed_batches,
            vocab_size,
            dim,
            embedder: first,
            batch,
            replicas,
        })
    }

    /// Batches of mixed lengths run packed so far, summed over the replicas: the model packs
    /// ([`SentenceEmbedder::packs`]: half precision on the CPU and CUDA, BERT-family with
    /// normalized mean pooling) and every request of the batch asked for unit length.
    pub fn packed_batches(&self) -> u64 {
        self.packed_batches.load(Ordering::Relaxed)
    }

    /// The embedding width.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Checks a request's `dimensions` (OpenAI's and TEI's field): the model's own width,
    /// or none, is accepted; any other is [`Error::InvalidInput`] (a model not trained for
    /// shortened embeddings gives no meaningful prefix of its vectors).
    pub fn check_dimensions(&self, dimensions: Option<usize>) -> Result<()> {
        match dimensions {
            Some(d) if d != self.dim => Err(Error::InvalidInput(format!(
                "dimensions {d} not supported: the model gives {}",
                self.dim
            ))),
            _ => Ok(()),
        }
    }

    /// The longest input accepted, in tokens.
    pub fn max_seq_len(&self) -> usize {
        self.limits.max_seq_len
    }

    /// The replicas (their statistics, labels, load).
    pub fn replicas(&self) -> &Replicas<impl BatchModel> {
        &self.replicas
    }

    /// Whether longer inputs are truncated (else refused).
    pub fn truncates(&self) -> bool {
        self.limits.truncate
    }

    /// The prompt to prepend to a request's texts: `prompt` itself, else the model's prompt
    /// named `prompt_name` (a 400 naming the model's prompts if it has none of that name),
    /// else the model's default prompt, if any.
    pub fn prompt(
        &self,
        prompt_name: Option<&str>,
        prompt: Option<&str>,
    ) -> Result<Option<String>> {
        self.embedder
            .resolve_prompt(prompt_name, prompt)
            .map(|p| p.map(str::to_string))
            .map_err(|e| Error::InvalidInput(e.to_string()))
    }

    /// The pooling, as TEI's `/info` names it: `mean`, `cls` or `last_token`.
    pub fn pooling_name(&self) -> &'static str {
        match self.embedder.pooling().mode {
            PoolingMode::Mean => "mean",
            PoolingMode::Cls => "cls",
            PoolingMode::LastToken => "last_token",
        }
    }

    /// Tokenizes one text: its ids (special tokens included), truncated or refused when
    /// longer than `max_seq_len` (as the server's `truncate` setting says).
    pub fn tokenize(&self, text: &str) -> Result<Vec<i64>> {
        self.tokenize_with(text, self.limits.truncate)
    }

    /// [`EmbedderEndpoint::tokenize`] with the request's own choice to truncate. Only as
    /// much of `text` is read as the limit needs (see [`streampool_nn::InputLimit`]).
    pub fn tokenize_with(&self, text: &str, truncate: bool) -> Result<Vec<i64>> {
        self.limits
            .tokenizer
            .encode_ids_limited(text, &self.limits.limit(truncate))
            .map_err(refusal)
    }

    /// Tokenizes a request's texts, `prompt` prepended to each (read once for all of them,
    /// see [`Prompt`]), in order; the first refusal (in text order) fails the request. Large
    /// requests run on the tokenization pool and stop early at `deadline` or when the
    /// request is dropped (see the `text` module).
    pub async fn tokenize_texts(
        &self,
        texts: Vec<String>,
        prompt: Option<&str>,
        truncate: bool,
        deadline: Instant,
    ) -> Result<Vec<Vec<i64>>> {
        let limit = self.limits.limit(truncate);
        let prompt = self.read_prompt(prompt, &limit)?;
        let bytes: usize = texts.iter().map(String::len).sum();
        let limits = self.limits.clone();
        text::tokenize(texts, bytes, deadline, move |t| {
            limits
                .tokenizer
                .encode_with_prompt(prompt.as_deref(), t, &limit)
                .map_err(refusal)
        })
        .await
    }

    /// Checks (and maybe truncates, as the server's `truncate` setting says) a sequence of
    /// token ids given by the client.
    pub fn check_ids(&self, ids: Vec<i64>) -> Result<Vec<i64>> {
        self.check_ids_with(ids, self.limits.truncate)
    }

    /// [`EmbedderEndpoint::check_ids`] with the request's own choice to truncate.
    pub fn check_ids_with(&self, mut ids: Vec<i64>, truncate: bool) -> Result<Vec<i64>> {
        if ids.is_empty() {
            return Err(Error::InvalidInput("an input has no tokens".into()));
        }
        if let Some(bad) = ids
            .iter()
            .find(|&&id| id < 0 || id as usize >= self.vocab_size)
        {
            return Err(Error::InvalidInput(format!(
                "token id {bad} outside the vocabulary of {} ids",
                self.vocab_size
            )));
        }
        if ids.len() > self.limits.max_seq_len {
            if !truncate {
                return Err(self.limits.too_long(ids.len()));
            }
            ids.truncate(self.limits.max_seq_len);
        }
        Ok(ids)
    }

    /// Embeds tokenized inputs (unit length) through the replicas; all are submitted before
    /// any is awaited, so they can share batches with each other and with other clients'
    /// requests.
    pub fn embed(
        &self,
        inputs: Vec<Vec<i64>>,
        deadline: std::time::Instant,
    ) -> impl std::future::Future<Output = Result<Vec<Vec<f32>>>> + Send + '_ {
        self.embed_with(inputs, true, deadline)
    }

    /// [`EmbedderEndpoint::embed`], unit length only when `normalize` (else the raw
    /// mean-pooled vectors).
    pub fn embed_with(
        &self,
        inputs: Vec<Vec<i64>>,
        normalize: bool,
        deadline: std::time::Instant,
    ) -> impl std::future::Future<Output = Result<Vec<Vec<f32>>>> + Send + '_ {
        let requests = inputs
            .into_iter()
            .map(|ids| EmbedInput { ids, normalize })
            .collect();
        super::run_rows(&self.replicas, requests, deadline)
    }

    /// `prompt` read for joining with texts: the model's own prompts were read at start-up,
    /// any other is read now (once per request).
    fn read_prompt(
        &self,
        prompt: Option<&str>,
        limit: &streampool_nn::InputLimit,
    ) -> Result<Option<Arc<Prompt>>> {
        Ok(match prompt.filter(|p| !p.is_empty()) {
            None => None,
            Some(p) => Some(match self.prompts.get(p) {
                Some(read) => read.clone(),
                None => Arc::new(self.limits.tokenizer.prompt(p, limit).map_err(refusal)?),
            }),
        })
    }

    /// [`EmbedderEndpoint::tokenize_texts`] for a caller on its own thread (no deadline):
    /// large requests are spread over the tokenization pool while it waits.
    pub fn tokenize_texts_blocking(
        &self,
        texts: &[&str],
        prompt: Option<&str>,
        truncate: bool,
    ) -> Result<Vec<Vec<i64>>> {
        let limit = self.limits.limit(truncate);
        let prompt = self.read_prompt(prompt, &limit)?;
        let bytes: usize = texts.iter().map(|t| t.len()).sum();
        text::tokenize_blocking(texts, bytes, |t| {
            self.limits
                .tokenizer
                .encode_with_prompt(prompt.as_deref(), t, &limit)
                .map_err(refusal)
        })
    }

    /// Queues tokenized inputs (as [`EmbedderEndpoint::embed_with`]) and returns their
    /// handles at once, for a caller that waits for each in its own way (blocking with
    /// [`Handle::wait`], or polling it as a future).
    /// With no `deadline`, an input waits as long as its turn takes (admitted while the
    /// queue's limits allow).
    pub fn submit(
        &self,
        inputs: Vec<Vec<i64>>,
        normalize: bool,
        deadline: Option<Instant>,
    ) -> Result<Vec<Handle<RowOutput>>> {
        let requests = inputs
            .into_iter()
            .map(|ids| EmbedInput { ids, normalize })
            .collect();
        match deadline {
            Some(d) => self.replicas.submit_group_with_deadline(requests, d),
            None => self.replicas.submit_group(requests),
        }
        .map_err(Error::from_batch)
    }

    /// Each replica's batch queue settings (the configured ones, with length buckets).
    pub fn batch_config(&self) -> &BatchConfig {
        &self.batch
    }

    /// The first replica's embedder (replicas agree in everything but their device).
    pub fn embedder(&self) -> &Arc<SentenceEmbedder> {
        &self.embedder
    }

    /// Stops accepting inputs; those already queued are answered once they have run.
    pub fn shutdown(&self) {
        self.replicas.shutdown();
    }
}

/// The answer for input `input` of a request from its handle, waiting on the caller's
/// thread: its embedding or its error (a non-finite row names `input`).
///
/// ```
/// use std::sync::Arc;
/// use std::time::{Duration, Instant};
/// use streampool::Device;
/// use streampool_core::{wait_row, EmbedderEndpoint, ModelConfig};
/// use streampool_nn::{tiny_bert_dir, SentenceEmbedder};
/// let embedder = Arc::new(SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap());
/// let e = EmbedderEndpoint::new(vec![("cpu".into(), embedder)], &ModelConfig::default()).unwrap();
/// let ids = e.tokenize_texts_blocking(&["a first text", "a second"], None, false).unwrap();
/// let deadline = Instant::now() + Duration::from_secs(30);
/// let handles = e.submit(ids, true, Some(deadline)).unwrap();
/// let rows: Vec<Vec<f32>> = handles
///     .into_iter()
///     .enumerate()
///     .map(|(i, h)| wait_row(h, i).unwrap())
///     .collect();
/// assert_eq!(rows.len(), 2);
/// ```
pub fn wait_row(handle: Handle<RowOutput>, input: usize) -> Result<Vec<f32>> {
    handle
        .wait()
        .map_err(Error::from_batch)?
        .map_err(|e| super::at_input(e, input))
}
