//! Sequence-classification heads (`*ForSequenceClassification`): cross-encoder rerankers and
//! classifiers read the first token's hidden state.

use streampool::{DType, Device, Tensor};

use crate::layers::{Linear, LinearParams};
use crate::weights::WeightFile;
use crate::{BertConfig, ComputeDType, Error, Family, Result};

/// The head on the first token's (`[CLS]`, `<s>`) hidden state: BERT's `tanh(pooler)` then
/// `classifier`, or RoBERTa's `classifier.dense`, tanh, `classifier.out_proj`; both are two
/// linear layers with a tanh between.
#[derive(Debug, Clone)]
pub(crate) struct ClassificationHead {
    dense: Linear,
    out: Linear,
}

impl ClassificationHead {
    /// Loads the head of `config`'s family; `prefix` is the encoder's (`bert.`, `roberta.`).
    pub(crate) fn load(
        file: &WeightFile,
        prefix: &str,
        c: &BertConfig,
        device: &Device,
    ) -> Result<Self> {
        let (h, n) = (c.hidden_size, c.labels());
        let (dense, out) = match c.family()? {
            Family::Bert => (format!("{prefix}pooler.dense"), "classifier".to_string()),
            Family::Roberta => (
                "classifier.dense".to_string(),
                "classifier.out_proj".to_string(),
            ),
            other => {
                return Err(Error::Config(format!(
                    "sequence classification is supported for BERT and RoBERTa-family \
                     checkpoints, not {other:?}"
                )))
            }
        };
        Ok(Self {
            dense: Linear::new(&LinearParams::load(file, &dense, h, h)?, device)?,
            out: Linear::new(&LinearParams::load(file, &out, n, h)?, device)?,
        })
    }

    pub(crate) fn with_dtype(&self, dtype: ComputeDType) -> Result<Self> {
        Ok(Self {
            dense: self.dense.with_dtype(dtype)?,
            out: self.out.with_dtype(dtype)?,
        })
    }

    pub(crate) fn labels(&self) -> usize {
        self.out.out_features()
    }

    /// Logits `F32` `[batch, labels]` of `hidden: [batch, seq, h]`.
    pub(crate) fn forward(&self, hidden: &Tensor) -> Result<Tensor> {
        let &[b, _, h] = hidden.dims() else {
            return Err(Error::Input(format!(
                "classification head takes [batch, seq, hidden], got {:?}",
                hidden.dims()
            )));
        };
        let first = hidden.narrow(1, 0, 1)?.reshape(&[b, h])?;
        let x = self.dense.forward(&first)?.tanh()?;
        Ok(self.out.forward(&x)?.to_dtype(DType::F32)?)
    }
}
