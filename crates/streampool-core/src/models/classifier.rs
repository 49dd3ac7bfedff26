//! A sequence classifier (reranker or classifier) served through one batch queue per
//! replica: texts and text pairs are tokenized per request, and pairs share batches with
//! each other and with single texts, as sentences do for an embedder.

use std::sync::Arc;
use std::time::Instant;

use streampool::Device;
use streampool_batch::{BatchContext, BatchModel, ModelError, Replicas};
use streampool_nn::{BertInput, Classifier};

use super::RowOutput;
use crate::error::refusal;
use crate::text::{self, TextLimits};
use crate::{Error, ModelConfig, Result};

/// One input of a classifier's queue: a tokenized text or pair (ids with special tokens,
/// and their token type ids).
pub struct ClassifyInput {
    /// Token ids, special tokens included.
    pub ids: Vec<i64>,
    /// Token type ids (0 for the first text, 1 for the second of a pair).
    pub types: Vec<i64>,
}

/// The one batch adapter of a sequence classifier (a reranker or a classifier), under the
/// server's queues and the Python package's `CrossEncoder`: one output per input, its
/// logits, or [`Error::NonFinite`] for that input alone. Batches run padded to their longest
/// input (masked).
///
/// ```
/// use std::sync::Arc;
/// use streampool::Device;
/// use streampool_core::ClassifyBatch;
/// use streampool_nn::{tiny_model_dir, Classifier};
/// let c = Arc::new(Classifier::load(&Device::cpu(), tiny_model_dir("tiny-xlmr-reranker")).unwrap());
/// let batch = ClassifyBatch::new(c);
/// let inputs = batch.tokenize(&[("a query", Some("a document")), ("one text", None)]).unwrap();
/// let rows = batch.run(inputs).unwrap();
/// assert_eq!(rows.len(), 2);
/// assert_eq!(rows[0].as_ref().unwrap().len(), 1);
/// ```
pub struct ClassifyBatch {
    classifier: Arc<Classifier>,
    /// The limits [`ClassifyBatch::tokenize`] reads texts under (truncating).
    limits: Arc<TextLimits>,
}

impl ClassifyBatch {
    /// The adapter of `classifier`; [`ClassifyBatch::tokenize`] truncates to its limit.
    pub fn new(classifier: Arc<Classifier>) -> Self {
        let config = ModelConfig {
            truncate: true,
            ..ModelConfig::default()
        };
        let limits = Arc::new(TextLimits::new(classifier.tokenizer(), &config));
        Self { classifier, limits }
    }

    /// The classifier it runs.
    pub fn classifier(&self) -> &Arc<Classifier> {
        &self.classifier
    }

    /// Tokenizes texts and `(text, text_pair)` pairs, each truncated to the model's token
    /// limit (a pair longest first, as `tokenizers` and sentence-transformers' `CrossEncoder`
    /// truncate): inline when small, else spread over the tokenization pool.
    pub fn tokenize(&self, items: &[(&str, Option<&str>)]) -> Result<Vec<ClassifyInput>> {
        let bytes = items
            .iter()
            .map(|(a, b)| a.len() + b.map_or(0, str::len))
            .sum();
        text::tokenize_blocking(items, bytes, |(a, b)| {
            let (ids, types) = tokenize_item(&self.limits, a, *b, true)?;
            Ok(ClassifyInput { ids, types })
        })
    }

    /// One batch's logits, one row per input in input order (see the type's docs).
    pub fn run(&self, inputs: Vec<ClassifyInput>) -> streampool_nn::Result<Vec<RowOutput>> {
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
                    Err(Error::NonFinite {
                        input: 0,
                        message: format!(
                            "non-finite logits in {} (run the model in bf16 or f32)",
                            self.classifier.model().dtype()
                        ),
                    })
                }
            })
            .collect())
    }
}

impl BatchModel for ClassifyBatch {
    type Input = ClassifyInput;
    type Output = RowOutput;

    fn forward_batch(
        &self,
        inputs: Vec<ClassifyInput>,
        _ctx: &BatchContext,
    ) -> Result<Vec<RowOutput>, ModelError> {
        Ok(self.run(inputs)?)
    }

    fn check_input(&self, r: &ClassifyInput) -> Result<(), ModelError> {
        if r.ids.is_empty() {
            return Err(Box::new(Error::InvalidInput(
                "an input has no tokens".into(),
            )));
        }
        if r.ids.len() != r.types.len() {
            return Err(Box::new(Error::InvalidInput(format!(
                "an input has {} token ids but {} token type ids",
                r.ids.len(),
                r.types.len()
            ))));
        }
        Ok(())
    }

    fn input_len(&self, r: &ClassifyInput) -> usize {
        r.ids.len()
    }

    fn cost(&self, r: &ClassifyInput) -> u64 {
        r.ids.len() as u64
    }

    fn device(&self) -> Option<Device> {
        Some(self.classifier.model().device().clone())
    }
}

/// One served classifier: its length limit and tokenizers, and its replicas.
pub struct ClassifierEndpoint {
    limits: Arc<TextLimits>,
    labels: Vec<String>,
    replicas: Replicas<ClassifyBatch>,
}

impl ClassifierEndpoint {
    /// Serves the `(device label, classifier)` replicas with the limits and batch settings
    /// of `config`.
    pub fn new(classifiers: Vec<(String, Arc<Classifier>)>, config: &ModelConfig) -> Result<Self> {
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
        let limits = Arc::new(TextLimits::new(first.tokenizer(), config));
        let batch = limits.batch_config(config);
        let replicas = Replicas::new(
            classifiers.into_iter().map(|(label, classifier)| {
                let limits = limits.clone();
                (label, ClassifyBatch { classifier, limits })
            }),
            batch,
        )
        .map_err(|e| Error::Config(format!("starting the batch queues: {e}")))?;
        Ok(Self {
            limits,
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
        self.limits.max_seq_len
    }

    /// Whether longer inputs are truncated by default (else refused).
    pub fn truncates(&self) -> bool {
        self.limits.truncate
    }

    /// The replicas (their statistics, labels, load).
    pub fn replicas(&self) -> &Replicas<impl BatchModel> {
        &self.replicas
    }

    /// Tokenizes a text (`second` `None`) or a pair, truncated (longest first for a pair) or
    /// refused when longer than `max_seq_len` as `truncate` says: its ids and token type ids.
    /// Only as much of each text is read as the limit needs (see
    /// [`streampool_nn::InputLimit`]).
    pub fn tokenize(
        &self,
        first: &str,
        second: Option<&str>,
        truncate: bool,
    ) -> Result<(Vec<i64>, Vec<i64>)> {
        tokenize_item(&self.limits, first, second, truncate)
    }

    /// Tokenizes a request's texts and pairs (see [`ClassifierEndpoint::tokenize`]) in order;
    /// the first refusal fails the request. Large requests run on the tokenization pool and
    /// stop early at `deadline` or when the request is dropped (see the `text` module).
    pub async fn tokenize_items(
        &self,
        items: Vec<(String, Option<String>)>,
        truncate: bool,
        deadline: Instant,
    ) -> Result<Vec<(Vec<i64>, Vec<i64>)>> {
        let bytes: usize = items
            .iter()
            .map(|(a, b)| a.len() + b.as_ref().map_or(0, String::len))
            .sum();
        let limits = self.limits.clone();
        text::tokenize(items, bytes, deadline, move |(a, b)| {
            tokenize_item(&limits, a, b.as_deref(), truncate)
        })
        .await
    }

    /// Tokenizes `(query, text)` for each of `texts`, the query read once for all of them
    /// (a reranker's request), as [`ClassifierEndpoint::tokenize_items`] does.
    pub async fn tokenize_ranked(
        &self,
        query: &str,
        texts: Vec<String>,
        truncate: bool,
        deadline: Instant,
    ) -> Result<Vec<(Vec<i64>, Vec<i64>)>> {
        let limit = self.limits.limit(truncate);
        let first = self
            .limits
            .tokenizer
            .pair_first(query, &limit)
            .map_err(refusal)?;
        let bytes: usize = texts.iter().map(String::len).sum();
        let limits = self.limits.clone();
        text::tokenize(texts, bytes, deadline, move |t| {
            limits
                .tokenizer
                .encode_pair_limited(&first, t, &limit)
                .map_err(refusal)
        })
        .await
    }

    /// Logits of tokenized inputs through the replicas, all submitted before any is awaited.
    pub fn logits(
        &self,
        inputs: Vec<(Vec<i64>, Vec<i64>)>,
        deadline: std::time::Instant,
    ) -> impl std::future::Future<Output = Result<Vec<Vec<f32>>>> + Send + '_ {
        let requests = inputs
            .into_iter()
            .map(|(ids, types)| ClassifyInput { ids, types })
            .collect();
        super::run_rows(&self.replicas, requests, deadline)
    }
}

/// One text or pair under `limits`: its ids and token type ids.
fn tokenize_item(
    limits: &TextLimits,
    first: &str,
    second: Option<&str>,
    truncate: bool,
) -> Result<(Vec<i64>, Vec<i64>)> {
    let limit = limits.limit(truncate);
    let tok = &limits.tokenizer;
    match second {
        Some(b) => tok
            .pair_first(first, &limit)
            .and_then(|a| tok.encode_pair_limited(&a, b, &limit)),
        None => tok.encode_typed_limited(first, &limit),
    }
    .map_err(refusal)
}
