//! Each family past BERT as a short composition of the shared layers: how its checkpoint
//! names the weights, and which options its attention, MLP and norms take. BERT and
//! RoBERTa (XLM-RoBERTa, CamemBERT) share BERT's layer
//! ([`TransformerEncoderLayer::load_bert`](crate::TransformerEncoderLayer::load_bert)).

pub(crate) mod gte;
pub(crate) mod modernbert;
pub(crate) mod mpnet;
pub(crate) mod nomic;
pub(crate) mod qwen3;
