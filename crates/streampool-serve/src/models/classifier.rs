//! A sequence classifier (reranker or classifier) served through one batch queue per
//! replica: texts and text pairs are tokenized per request, and pairs share batches with
//! each other and with single texts, as sentences do for an embedder.

use std::sync::Arc;

use streampool::Device;
use streampool_batch::{BatchConfig, BatchContext, BatchModel, ModelError, Replicas};
use streampool_nn::{BertInput, BertTokenizer, Classifier};

use crate::{Error, Result, ServeConfig};

/// Bucket lengths, as an embedder's: short inputs are not padded to long ones.
const BUCKETS: [usize; 6] = [16, 32, 64, 128, 256, 512];

/// One request of a classifier's queue: a tokenized text or pair (ids with special tokens,
/// and their token type ids).
struct ClassifyRequest {
    ids: Vec<i64>,
    types: Vec<i64>,
}

/// The batch side of one classifier replica: one output per request, its logits.
struct ClassifyBatch {
    classifier: Arc<Classifier>,
}

/// One request's logits, or why it has none (non-finite: its own request fails only).
type ClassifyOutput = std::result::Result<Vec<f32>, String>;

impl BatchModel for ClassifyBatch {
    type Input = ClassifyRequest;
    type Output = ClassifyOutput;

    fn forward_batch(
        &self,
        inputs: Vec<ClassifyRequest>,
        _ctx: &BatchContext,
    ) -> Result<Vec<ClassifyOutput>, ModelError> {
        let seq = inputs.iter().map(|r| r.ids.len()).max().unwrap_or(0);
        let (mut ids, mut mask, mut types) = (Vec::new(), Vec::new(), Vec::new());
        for r in &inputs {
            let pad = seq - r.ids.len();
            ids.extend(r.ids.iter().copied().chain(std::iter::repeat_n(0, pad)));
            mask.extend(std::iter::repeat_n(1, r.ids.len()).chain(std::iter::repeat_n(0, pad)));
            types.extend(r.types.iter().copied().chain(std::iter::repeat_n(0, pad)));
        }
        let input = BertInput::new(ids, mask, Some(types), inputs.len())?;
        let logits = self.classifier.model().logits(&input)?.to_vec::<f32>()?;
        let n = self.classifier.labels().len();
        Ok(logits
            .chunks_exact(n)
            .map(|row| {
                if row.iter().all(|v| v.is_finite()) {
                    Ok(row.to_vec())
                } else {
                    Err(format!(
                        "non-finite logits in {} (run the model in bf16 or f32)",
                        self.classifier.model().dtype()
                    ))
                }
            })
            .collect())
    }

    fn check_input(&self, r: &ClassifyRequest) -> Result<(), ModelError> {
        if r.ids.is_empty() || r.ids.len() != r.types.len() {
            return Err("an input has no tokens".into());
        }
        Ok(())
    }

    fn input_len(&self, r: &ClassifyRequest) -> usize {
        r.ids.len()
    }

    fn cost(&self, r: &ClassifyRequest) -> u64 {
        r.ids.len() as u64
    }

    fn device(&self) -> Option<Device> {
        Some(self.classifier.model().device().clone())
    }
}

/// One served classifier: its tokenizers and its replicas.
pub struct ClassifierEndpoint {
    /// Counts tokens with no truncation, so an over-long input is seen as such.
    full: BertTokenizer,
    /// Truncates to `max_seq_len` (longest first for pairs).
    truncating: BertTokenizer,
    max_seq_len: usize,
    truncate: bool,
    labels: Vec<String>,
    replicas: Replicas<ClassifyBatch>,
}

impl ClassifierEndpoint {
    /// Serves the `(device label, classifier)` replicas with the limits and batch settings
    /// of `config`.
    pub fn new(classifiers: Vec<(String, Arc<Classifier>)>, config: &ServeConfig) -> Result<Self> {
        let Some((_, first)) = classifiers.first() else {
            return Err(Error::Config(
                "a classifier needs at least one replica".into(),
            ));
        };
        let first = first.clone();
        if !classifiers
            .iter()
            .all(|(_, c)| c.labels() == first.labels())
        {
            return Err(Error::Config(
                "replicas of one classifier differ in labels".into(),
            ));
        }
        let model_max = first.tokenizer().max_len();
        let max_seq_len = config.max_seq_len.unwrap_or(model_max).min(model_max);
        let tokenizer = |max_len| {
            BertTokenizer::new(first.tokenizer().inner().clone(), max_len)
                .map_err(|e| Error::Config(format!("tokenizer: {e}")))
        };
        let mut buckets: Vec<usize> = BUCKETS.into_iter().filter(|&b| b < max_seq_len).collect();
        buckets.push(max_seq_len);
        let batch = BatchConfig {
            buckets,
            ..config.batch.clone()
        };
        let replicas = Replicas::new(
            classifiers
                .into_iter()
                .map(|(label, classifier)| (label, ClassifyBatch { classifier })),
            batch,
        )
        .map_err(Error::Batch)?;
        Ok(Self {
            full: tokenizer(usize::MAX)?,
            truncating: tokenizer(max_seq_len)?,
            max_seq_len,
            truncate: config.truncate,
            labels: first.labels().to_vec(),
            replicas,
        })
    }

    /// The label names, by class index.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The longest input accepted, in tokens.
    pub fn max_seq_len(&self) -> usize {
        self.max_seq_len
    }

    /// Whether longer inputs are truncated by default (else refused).
    pub fn truncates(&self) -> bool {
        self.truncate
    }

    /// The replicas (their statistics, labels, load).
    pub fn replicas(&self) -> &Replicas<impl BatchModel> {
        &self.replicas
    }

    /// Tokenizes a text (`second` `None`) or a pair, truncated or refused when longer than
    /// `max_seq_len` as `truncate` says.
    pub fn tokenize(
        &self,
        first: &str,
        second: Option<&str>,
        truncate: bool,
    ) -> Result<(Vec<i64>, Vec<i64>)> {
        let encode = |tok: &BertTokenizer| {
            let input = match second {
                Some(s) => tok.encode_pairs(&[(first, s)]),
                None => tok.encode_batch_general(&[first]),
            }
            .map_err(|e| Error::BadRequest(format!("tokenizing: {e}")))?;
            Ok::<_, Error>((input.input_ids().to_vec(), input.token_type_ids().to_vec()))
        };
        let (ids, types) = encode(&self.full)?;
        if ids.len() <= self.max_seq_len {
            return Ok((ids, types));
        }
        if !truncate {
            return Err(Error::InputTooLong(format!(
                "input of {} tokens exceeds the maximum of {} (not truncating)",
                ids.len(),
                self.max_seq_len
            )));
        }
        encode(&self.truncating)
    }

    /// Logits of tokenized inputs through the replicas, all submitted before any is awaited.
    pub fn logits(
        &self,
        inputs: Vec<(Vec<i64>, Vec<i64>)>,
        deadline: std::time::Instant,
    ) -> impl std::future::Future<Output = Result<Vec<Vec<f32>>>> + Send + '_ {
        let requests = inputs
            .into_iter()
            .map(|(ids, types)| ClassifyRequest { ids, types })
            .collect();
        let answers = super::run_all(&self.replicas, requests, deadline);
        async move {
            answers
                .await?
                .into_iter()
                .enumerate()
                .map(|(i, row)| row.map_err(|e| Error::NonFinite(format!("input {i}: {e}"))))
                .collect()
        }
    }
}
