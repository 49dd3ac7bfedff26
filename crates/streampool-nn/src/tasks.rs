//! Sequence classification: classifiers (`/predict`) and cross-encoder rerankers (`/rerank`)
//! over a `*ForSequenceClassification` checkpoint.

use std::path::Path;

use streampool::phases::timed;
use streampool::Device;

use crate::{BertInput, BertModel, BertTokenizer, ComputeDType, Error, Result};

/// A text classifier: logits and labelled scores per text (or text pair), from a checkpoint
/// whose `config.json` names a `*ForSequenceClassification` architecture (BERT or RoBERTa
/// family: cross-encoders, sentiment and NLI classifiers, bge-reranker). `Send + Sync`.
///
/// ```
/// use streampool::Device;
/// use streampool_nn::Classifier;
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/tiny-bert-classifier");
/// let c = Classifier::load(&Device::cpu(), dir).unwrap();
/// assert_eq!(c.labels(), ["negative", "neutral", "positive"]);
/// let scores = c.predict(&["hello world"]).unwrap();
/// let total: f32 = scores[0].iter().sum();
/// assert!((total - 1.0).abs() < 1e-5); // softmax over the labels
/// ```
pub struct Classifier {
    tokenizer: BertTokenizer,
    model: BertModel,
    labels: Vec<String>,
}

impl Classifier {
    /// Loads a classification checkpoint folder in f32.
    pub fn load(device: &Device, dir: impl AsRef<Path>) -> Result<Self> {
        Self::load_with(device, dir, ComputeDType::F32)
    }

    /// Loads a classification checkpoint folder (`config.json`, `model.safetensors`,
    /// `tokenizer.json`) with weights in `dtype`; inputs are truncated to the model's
    /// positions (or `sentence_bert_config.json`'s `max_seq_length`).
    ///
    /// # Errors
    /// A quantized dtype (`int8`) is refused ([`Error::UnsupportedDType`]): the accuracy gate
    /// measures embeddings, and a quantized model runs only behind a gate.
    pub fn load_with(device: &Device, dir: impl AsRef<Path>, dtype: ComputeDType) -> Result<Self> {
        if dtype.is_quantized() {
            return Err(Error::UnsupportedDType {
                dtype,
                device: device.name(),
                reason: "classifiers and rerankers have no accuracy gate yet (it measures \
                         sentence embeddings); load them in f32, f16 or bf16"
                    .into(),
            });
        }
        let dir = dir.as_ref();
        let model = BertModel::load_with(device, dir, dtype)?;
        let max_len = crate::embedder::max_seq_length(dir)?
            .unwrap_or(usize::MAX)
            .min(model.max_positions());
        let tokenizer = timed("tokenizer loaded", || {
            BertTokenizer::from_file(dir.join("tokenizer.json"), max_len)
        })?;
        Self::new(tokenizer, model)
    }

    /// Pairs a tokenizer with a model that has a classification head.
    pub fn new(tokenizer: BertTokenizer, model: BertModel) -> Result<Self> {
        let Some(n) = model.num_labels() else {
            return Err(Error::Config(
                "not a classifier: config.json names no *ForSequenceClassification \
                 architecture"
                    .into(),
            ));
        };
        let labels = (0..n).map(|i| model.config().label(i)).collect();
        Ok(Self {
            tokenizer,
            model,
            labels,
        })
    }

    /// The label names, by class index.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The model.
    pub fn model(&self) -> &BertModel {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &BertTokenizer {
        &self.tokenizer
    }

    /// Logits `[labels]` per row of a tokenized batch.
    pub fn logits_input(&self, input: &BertInput) -> Result<Vec<Vec<f32>>> {
        let flat = self.model.logits(input)?.to_vec::<f32>()?;
        if flat.iter().any(|v| !v.is_finite()) {
            return Err(Error::NonFinite(format!(
                "classifier logits in {} hold infinities or NaNs",
                self.model.dtype()
            )));
        }
        Ok(flat
            .chunks_exact(self.labels.len())
            .map(<[f32]>::to_vec)
            .collect())
    }

    /// Raw logits per text.
    pub fn logits(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        self.logits_input(&self.tokenizer.encode_batch_general(texts)?)
    }

    /// Raw logits per `(first, second)` pair (a cross-encoder's input).
    pub fn logits_pairs(&self, pairs: &[(&str, &str)]) -> Result<Vec<Vec<f32>>> {
        self.logits_input(&self.tokenizer.encode_pairs(pairs)?)
    }

    /// Scores per text, by class index: softmax over the labels, or the sigmoid of the one
    /// logit of a single-label model (as TEI's `/predict` without `raw_scores`).
    pub fn predict(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>> {
        Ok(self.logits(texts)?.iter().map(|l| scores(l)).collect())
    }
}

/// Softmax over `logits`, or the sigmoid of a single logit.
///
/// ```
/// use streampool_nn::tasks::scores;
/// assert_eq!(scores(&[0.0]), vec![0.5]);
/// assert_eq!(scores(&[1.0, 1.0]), vec![0.5, 0.5]);
/// ```
pub fn scores(logits: &[f32]) -> Vec<f32> {
    if let [x] = logits {
        return vec![sigmoid(*x)];
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f64> = logits.iter().map(|&x| ((x - max) as f64).exp()).collect();
    let sum: f64 = exp.iter().sum();
    exp.iter().map(|e| (e / sum) as f32).collect()
}

/// `1 / (1 + e^-x)`.
pub fn sigmoid(x: f32) -> f32 {
    (1.0 / (1.0 + (-(x as f64)).exp())) as f32
}

/// A cross-encoder reranker: scores how well each text answers a query, reading each
/// (query, text) pair together; a single-label `*ForSequenceClassification` checkpoint
/// (bge-reranker, cross-encoder/ms-marco-*). Pairs are one batch.
///
/// ```
/// use streampool::Device;
/// use streampool_nn::Reranker;
/// let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/tiny-xlmr-reranker");
/// let r = Reranker::load(&Device::cpu(), dir).unwrap();
/// let s = r.scores("capital of France?", &["Paris", "a fox"], false).unwrap();
/// assert!(s.iter().all(|&p| (0.0..=1.0).contains(&p))); // sigmoid scores
/// ```
pub struct Reranker {
    classifier: Classifier,
}

impl Reranker {
    /// Loads a single-label classification checkpoint folder in f32.
    pub fn load(device: &Device, dir: impl AsRef<Path>) -> Result<Self> {
        Self::load_with(device, dir, ComputeDType::F32)
    }

    /// Loads a single-label classification checkpoint folder with weights in `dtype`.
    pub fn load_with(device: &Device, dir: impl AsRef<Path>, dtype: ComputeDType) -> Result<Self> {
        Self::new(Classifier::load_with(device, dir, dtype)?)
    }

    /// A reranker over a classifier of one label.
    pub fn new(classifier: Classifier) -> Result<Self> {
        if classifier.labels().len() != 1 {
            return Err(Error::Config(format!(
                "a reranker has one label; this model has {}",
                classifier.labels().len()
            )));
        }
        Ok(Self { classifier })
    }

    /// The classifier underneath.
    pub fn classifier(&self) -> &Classifier {
        &self.classifier
    }

    /// One score per text for `query`: the sigmoid of the logit, or the logit itself when
    /// `raw`.
    pub fn scores(&self, query: &str, texts: &[&str], raw: bool) -> Result<Vec<f32>> {
        let pairs: Vec<(&str, &str)> = texts.iter().map(|&t| (query, t)).collect();
        Ok(self
            .classifier
            .logits_pairs(&pairs)?
            .into_iter()
            .map(|l| if raw { l[0] } else { sigmoid(l[0]) })
            .collect())
    }
}
