//! A sentence embedder served through one batch queue per replica: tokenization per request,
//! one batched forward per batch.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use streampool::Device;
use streampool_batch::{BatchContext, BatchModel, ModelError, Replicas};
use streampool_nn::pooling::{l2_normalize, PoolingMode};
use streampool_nn::{BertInput, PackedInput, Prompt, SentenceEmbedder};

use super::RowOutput;
use crate::text::{self, refusal, TextLimits};
use crate::{Error, Result, ServeConfig};

/// One request of an embedder's queue: a tokenized sentence (ids with special tokens) and
/// whether its embedding is scaled to unit length.
struct EmbedRequest {
    ids: Vec<i64>,
    normalize: bool,
}

/// The batch side of one embedder replica: one output per request, its pooled embedding (the
/// model's pooling; unit length when asked).
struct EmbedBatch {
    embedder: Arc<SentenceEmbedder>,
    /// Batches run packed (no padding): the endpoint's [`EmbedderEndpoint::packed_batches`].
    packed_batches: Arc<AtomicU64>,
}

impl BatchModel for EmbedBatch {
    type Input = EmbedRequest;
    type Output = RowOutput;

    fn forward_batch(
        &self,
        inputs: Vec<EmbedRequest>,
        _ctx: &BatchContext,
    ) -> Result<Vec<RowOutput>, ModelError> {
        let (ids, normalize): (Vec<Vec<i64>>, Vec<bool>) =
            inputs.into_iter().map(|r| (r.ids, r.normalize)).unzip();
        let all_normalized = normalize.iter().all(|&n| n);
        let mixed = ids.windows(2).any(|w| w[0].len() != w[1].len());
        let flat = if all_normalized && mixed && self.embedder.packs() {
            // Mixed lengths where the embedder packs (its pooling is normalized mean pooling,
            // what the requests asked for): concatenated with no padding, so the batch costs
            // its tokens, as the queue budgeted it (`packs`).
            self.packed_batches.fetch_add(1, Ordering::Relaxed);
            let input = PackedInput::from_sequences(&ids)?;
            self.embedder.embed_packed(&input)?.to_vec::<f32>()?
        } else {
            // Padded to the batch's longest input (masked); pooled and normalized on the
            // device when every request asked for unit length (whatever the model's own
            // Normalize module says), else normalized per row below.
            let input = BertInput::from_sequences(&ids)?;
            self.embedder
                .embed_input_with(&input, all_normalized)?
                .to_vec::<f32>()?
        };
        let mut rows: Vec<Vec<f32>> = flat
            .chunks_exact(self.embedder.dim())
            .map(<[f32]>::to_vec)
            .collect();
        if !all_normalized {
            for (row, _) in rows.iter_mut().zip(&normalize).filter(|(_, &n)| n) {
                let x = streampool::Tensor::from_vec(
                    std::mem::take(row),
                    &[1, self.embedder.dim()],
                    self.embedder.model().device(),
                )?;
                *row = l2_normalize(&x)?.to_vec::<f32>()?;
            }
        }
        // A half-precision overflow becomes an error for its own request, never NaN in a
        // response.
        Ok(rows
            .into_iter()
            .map(|row| match self.embedder.check_finite(&row) {
                Ok(()) => Ok(row),
                Err(e) => Err(e.to_string()),
            })
            .collect())
    }

    fn check_input(&self, r: &EmbedRequest) -> Result<(), ModelError> {
        if r.ids.is_empty() {
            return Err("an input has no tokens".into());
        }
        Ok(())
    }

    fn input_len(&self, r: &EmbedRequest) -> usize {
        r.ids.len()
    }

    /// Tokens: the router balances replicas by the tokens they hold, not the requests.
    fn cost(&self, r: &EmbedRequest) -> u64 {
        r.ids.len() as u64
    }

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
    replicas: Replicas<EmbedBatch>,
}

impl EmbedderEndpoint {
    /// Serves the `(device label, embedder)` replicas (one model on several devices) with
    /// the limits and batch settings of `config`.
    pub fn new(
        embedders: Vec<(String, Arc<SentenceEmbedder>)>,
        config: &ServeConfig,
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
                let packed_batches = packed_batches.clone();
                (
                    label,
                    EmbedBatch {
                        embedder,
                        packed_batches,
                    },
                )
            }),
            batch,
        )
        .map_err(Error::Batch)?;
        Ok(Self {
            limits: Arc::new(limits),
            prompts,
            packed_batches,
            vocab_size,
            dim,
            embedder: first,
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
            .map_err(|e| Error::BadRequest(e.to_string()))
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
        let prompt = match prompt.filter(|p| !p.is_empty()) {
            None => None,
            Some(p) => Some(match self.prompts.get(p) {
                Some(read) => read.clone(),
                None => Arc::new(self.limits.tokenizer.prompt(p, &limit).map_err(refusal)?),
            }),
        };
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
            return Err(Error::BadRequest("an input has no tokens".into()));
        }
        if let Some(bad) = ids
            .iter()
            .find(|&&id| id < 0 || id as usize >= self.vocab_size)
        {
            return Err(Error::BadRequest(format!(
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
            .map(|ids| EmbedRequest { ids, normalize })
            .collect();
        super::run_rows(&self.replicas, requests, deadline)
    }
}
