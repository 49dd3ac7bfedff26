//! Each family past BERT as a short composition of the shared layers: how its checkpoint
//! names the weights, and which options its attention, MLP and norms take. BERT and
//! RoBERTa (XLM-RoBERTa, CamemBERT) share BERT's layer
//! ([`TransformerEncoderLayer::load_bert`](crate::TransformerEncoderLayer::load_bert)).

pub(crate) mod gte;
pub(crate) mod modernbert;
pub(crate) mod mpnet;
pub(crate) mod nomic;
pub(crate) mod qwen3;

use streampool::Device;

use crate::layers::{LinearParams, MultiheadAttention};
use crate::weights::WeightFile;
use crate::{BertConfig, Result};

/// One layer's weights: the tensors under `prefix` in `file`, for the families whose
/// checkpoints name a layer's parts themselves.
pub(crate) struct LayerWeights<'a> {
    pub(crate) file: &'a WeightFile,
    pub(crate) prefix: &'a str,
    pub(crate) device: &'a Device,
}

impl LayerWeights<'_> {
    /// Linear parameters `name` (`out` x `inp`), with a bias where the checkpoint has one.
    pub(crate) fn linear(&self, name: &str, out: usize, inp: usize) -> Result<LinearParams> {
        LinearParams::load_optional_bias(self.file, &format!("{}.{name}", self.prefix), out, inp)
    }

    /// Attention from a fused projection `qkv` (query, key, value rows, `hidden_size` each)
    /// and the output projection `out`.
    pub(crate) fn fused_attention(
        &self,
        qkv: &str,
        out: &str,
        c: &BertConfig,
    ) -> Result<MultiheadAttention> {
        let h = c.hidden_size;
        MultiheadAttention::from_fused_qkv(
            &self.linear(qkv, 3 * h, h)?,
            &self.linear(out, h, h)?,
            c.num_attention_heads,
            self.device,
        )
    }
}
