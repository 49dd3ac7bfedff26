//! A sentence embedder served through its own batch queue: tokenization per request, one
//! batched forward per batch.

use std::sync::Arc;

use streampool::Device;
use streampool_batch::{BatchConfig, BatchContext, BatchModel, BatchQueue, ModelError};
use streampool_nn::{BertInput, SentenceEmbedder};
use tokenizers::Tokenizer;

use crate::{Error, Result, ServeConfig};

/// Bucket lengths for token sequences: short inputs are not batched with (and padded to)
/// long ones.
const BUCKETS: [usize; 6] = [16, 32, 64, 128, 256, 512];

/// The batch side of an embedder: one request is one tokenized sentence (ids with special
/// tokens), one output its unit-length embedding.
struct EmbedBatch {
    embedder: Arc<SentenceEmbedder>,
}

impl BatchModel for EmbedBatch {
    type Input = Vec<i64>;
    type Output = Vec<f32>;

    fn forward_batch(
        &self,
        inputs: Vec<Vec<i64>>,
        _ctx: &BatchContext,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        // Padded to the batch's longest input rather than to the bucket: every input of the
        // batch fits either way, and the padding is masked, so the shorter pad only saves work.
        let input = BertInput::from_sequences(&inputs)?;
        let flat = self.embedder.embed_input(&input)?.to_vec::<f32>()?;
        Ok(flat
            .chunks_exact(self.embedder.dim())
            .map(<[f32]>::to_vec)
            .collect())
    }

    fn check_input(&self, ids: &Vec<i64>) -> Result<(), ModelError> {
        if ids.is_empty() {
            return Err("an input has no tokens".into());
        }
        Ok(())
    }

    fn input_len(&self, ids: &Vec<i64>) -> usize {
        ids.len()
    }

    fn device(&self) -> Option<Device> {
        Some(self.embedder.model().device().clone())
    }
}

/// One served sentence-embedding model: tokenizers for counting and truncating, and the
/// queue its requests are batched in.
pub struct EmbedderEndpoint {
    /// Counts tokens with no truncation, so an over-long input is seen as such.
    full: Tokenizer,
    /// Truncates to `max_seq_len` (used only for inputs found too long, when truncating).
    truncating: Tokenizer,
    max_seq_len: usize,
    truncate: bool,
    vocab_size: usize,
    dim: usize,
    queue: BatchQueue<EmbedBatch>,
}

impl EmbedderEndpoint {
    /// Serves `embedder` with the limits and batch settings of `config`.
    pub fn new(embedder: Arc<SentenceEmbedder>, config: &ServeConfig) -> Result<Self> {
        let model_max = embedder.tokenizer().max_len();
        let max_seq_len = config.max_seq_len.unwrap_or(model_max).min(model_max);
        let tokenizer = |truncation| -> Result<Tokenizer> {
            let mut t = embedder.tokenizer().inner().clone();
            t.with_padding(None);
            t.with_truncation(truncation)
                .map_err(|e| Error::Config(format!("tokenizer truncation: {e}")))?;
            Ok(t)
        };
        let full = tokenizer(None)?;
        let truncating = tokenizer(Some(tokenizers::TruncationParams {
            max_length: max_seq_len,
            ..Default::default()
        }))?;
        let mut buckets: Vec<usize> = BUCKETS.into_iter().filter(|&b| b < max_seq_len).collect();
        buckets.push(max_seq_len);
        let batch = BatchConfig {
            buckets,
            ..config.batch.clone()
        };
        let vocab_size = embedder.model().config().vocab_size;
        let dim = embedder.dim();
        let queue = BatchQueue::new(EmbedBatch { embedder }, batch).map_err(Error::Batch)?;
        Ok(Self {
            full,
            truncating,
            max_seq_len,
            truncate: config.truncate,
            vocab_size,
            dim,
            queue,
        })
    }

    /// The embedding width.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The longest input accepted, in tokens.
    pub fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// The statistics of this model's batch queue.
    pub fn queue_stats(&self) -> streampool_batch::StatsSnapshot {
        self.queue.stats()
    }

    /// Tokenizes one text: its ids (special tokens included), truncated or refused when
    /// longer than `max_seq_len`.
    pub fn tokenize(&self, text: &str) -> Result<Vec<i64>> {
        let widen = |e: tokenizers::Encoding| e.get_ids().iter().map(|&x| i64::from(x)).collect();
        let enc = self
            .full
            .encode(text, true)
            .map_err(|e| Error::BadRequest(format!("tokenizing: {e}")))?;
        if enc.len() <= self.max_seq_len {
            return Ok(widen(enc));
        }
        if !self.truncate {
            return Err(Error::BadRequest(format!(
                "input of {} tokens exceeds the maximum of {} (the server does not truncate)",
                enc.len(),
                self.max_seq_len
            )));
        }
        self.truncating
            .encode(text, true)
            .map(widen)
            .map_err(|e| Error::BadRequest(format!("tokenizing: {e}")))
    }

    /// Checks (and maybe truncates) a sequence of token ids given by the client.
    pub fn check_ids(&self, mut ids: Vec<i64>) -> Result<Vec<i64>> {
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
        if ids.len() > self.max_seq_len {
            if !self.truncate {
                return Err(Error::BadRequest(format!(
                    "input of {} tokens exceeds the maximum of {} (the server does not truncate)",
                    ids.len(),
                    self.max_seq_len
                )));
            }
            ids.truncate(self.max_seq_len);
        }
        Ok(ids)
    }

    /// Embeds tokenized inputs through the queue; all are submitted before any is awaited, so
    /// they can share batches with each other and with other clients' requests.
    pub fn embed(
        &self,
        inputs: Vec<Vec<i64>>,
        deadline: std::time::Instant,
    ) -> impl std::future::Future<Output = Result<Vec<Vec<f32>>>> + Send + '_ {
        super::run_all(&self.queue, inputs, deadline)
    }
}
