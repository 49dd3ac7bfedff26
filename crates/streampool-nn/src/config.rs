//! Model configuration read from a Hugging Face `config.json`.

use std::path::Path;

use serde::Deserialize;

use std::collections::BTreeMap;

use serde::Deserializer;
use streampool::GateActivation;

use crate::{Activation, Error, Result};

/// The model families this crate builds, picked from `config.json`'s `model_type` (or, when
/// it has none, its `architectures`). Each is a composition of the shared layers:
///
/// | family | `model_type` | positions | attention | MLP | norms |
/// |---|---|---|---|---|---|
/// | `Bert` | `bert` | absolute | bidirectional | GELU | post-norm LayerNorm |
/// | `Roberta` | `roberta`, `xlm-roberta`, `camembert` | absolute from `pad_token_id + 1` | bidirectional | GELU | post-norm LayerNorm |
/// | `MPNet` | `mpnet` | absolute from `pad_token_id + 1`, plus a relative bias | bidirectional, score bias | GELU | post-norm LayerNorm |
/// | `Gte` | `gte`, `new` (Alibaba GTE) | rotary | bidirectional | GeGLU | post-norm LayerNorm |
/// | `NomicBert` | `nomic_bert` | rotary | bidirectional | SwiGLU, no biases | post-norm LayerNorm |
/// | `ModernBert` | `modernbert` | rotary, one base per layer kind | bidirectional, global or a sliding window per layer | GeGLU, no biases | pre-norm LayerNorm without bias |
/// | `Qwen3` | `qwen3` | rotary | causal, grouped-query, q/k RMSNorm | SwiGLU | pre-norm RMSNorm |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// BERT, MiniLM, bge (BERT-based).
    Bert,
    /// RoBERTa, XLM-RoBERTa, CamemBERT (multilingual-e5, bge-m3, bge-reranker).
    Roberta,
    /// MPNet (all-mpnet-base-v2).
    MPNet,
    /// Alibaba GTE (gte-*-v1.5, gte-multilingual).
    Gte,
    /// NomicBERT (nomic-embed-text-v1, v1.5).
    NomicBert,
    /// ModernBERT (gte-modernbert, modernbert-embed).
    ModernBert,
    /// Qwen3 (Qwen3-Embedding).
    Qwen3,
}

impl Family {
    fn from_model_type(model_type: &str, architectures: &[String]) -> Result<Self> {
        let by_type = match model_type {
            "bert" => Some(Self::Bert),
            "roberta" | "xlm-roberta" | "camembert" => Some(Self::Roberta),
            "mpnet" => Some(Self::MPNet),
            "gte" | "new" => Some(Self::Gte),
            "nomic_bert" => Some(Self::NomicBert),
            "modernbert" => Some(Self::ModernBert),
            "qwen3" => Some(Self::Qwen3),
            _ => None,
        };
        if let Some(f) = by_type {
            return Ok(f);
        }
        let arch = architectures.first().map(String::as_str).unwrap_or("");
        let by_arch = [
            ("XLMRoberta", Self::Roberta),
            ("Camembert", Self::Roberta),
            ("Roberta", Self::Roberta),
            ("MPNet", Self::MPNet),
            ("Gte", Self::Gte),
            ("NewModel", Self::Gte),
            ("NomicBert", Self::NomicBert),
            ("ModernBert", Self::ModernBert),
            ("Qwen3", Self::Qwen3),
            ("Bert", Self::Bert),
        ];
        if model_type.is_empty() {
            if let Some((_, f)) = by_arch.iter().find(|(p, _)| arch.starts_with(p)) {
                return Ok(*f);
            }
            if arch.is_empty() {
                // Older BERT configs name neither.
                return Ok(Self::Bert);
            }
        }
        Err(Error::Config(format!(
            "model_type {model_type:?} (architectures {architectures:?}) is not supported; \
             supported: bert, roberta, xlm-roberta, camembert, mpnet, gte (new), nomic_bert, modernbert, qwen3"
        )))
    }

    /// Whether word positions come from a learned table offset by `pad_token_id + 1`
    /// (RoBERTa's convention).
    pub fn offsets_positions(self) -> bool {
        matches!(self, Self::Roberta | Self::MPNet)
    }

    /// Whether positions are rotary (no position table).
    pub fn is_rotary(self) -> bool {
        matches!(
            self,
            Self::Gte | Self::NomicBert | Self::ModernBert | Self::Qwen3
        )
    }

    /// Whether attention is causal (a decoder used as an embedder).
    pub fn is_causal(self) -> bool {
        matches!(self, Self::Qwen3)
    }
}

/// The settings of a transformer (the keys of Hugging Face's `BertConfig`, and of the other
/// families' configs: see [`Family`]; unknown keys are ignored).
///
/// ```
/// use streampool_nn::BertConfig;
/// let c = BertConfig::from_json(r#"{"vocab_size": 100, "hidden_size": 8,
///     "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16,
///     "max_position_embeddings": 32}"#).unwrap();
/// assert_eq!(c.head_dim(), 4);
/// assert!(BertConfig::from_json(r#"{"vocab_size": 100}"#).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BertConfig {
    pub vocab_size: usize,
    // The aliases are the GPT-2-style keys of NomicBERT's own configs (nomic-embed-text).
    #[serde(alias = "n_embd")]
    pub hidden_size: usize,
    #[serde(alias = "n_layer")]
    pub num_hidden_layers: usize,
    #[serde(alias = "n_head")]
    pub num_attention_heads: usize,
    #[serde(alias = "n_inner")]
    pub intermediate_size: usize,
    #[serde(alias = "n_positions")]
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab_size")]
    pub type_vocab_size: usize,
    #[serde(
        default = "default_hidden_act",
        alias = "activation_function",
        alias = "hidden_activation"
    )]
    pub hidden_act: String,
    #[serde(
        default = "default_layer_norm_eps",
        alias = "layer_norm_epsilon",
        alias = "norm_eps"
    )]
    pub layer_norm_eps: f64,
    #[serde(default, deserialize_with = "null_as_default")]
    pub pad_token_id: usize,
    #[serde(default = "default_position_embedding_type")]
    pub position_embedding_type: String,
    /// `bert`, `xlm-roberta`, `qwen3`, ...: picks the [`Family`].
    #[serde(default, deserialize_with = "null_as_default")]
    pub model_type: String,
    /// `BertModel`, `XLMRobertaForSequenceClassification`, ...: a `*ForSequenceClassification`
    /// checkpoint has a classification head.
    #[serde(default, deserialize_with = "null_as_default")]
    pub architectures: Vec<String>,
    /// Key/value heads of grouped-query attention (default: `num_attention_heads`).
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Head width when it is not `hidden_size / num_attention_heads` (Qwen3).
    #[serde(default, rename = "head_dim")]
    pub head_dim_override: Option<usize>,
    /// RMSNorm epsilon (families with RMSNorm).
    #[serde(default)]
    pub rms_norm_eps: Option<f64>,
    /// Rotary base, older configs' key (`rotary_emb_base` in NomicBERT's).
    #[serde(default, alias = "rotary_emb_base")]
    pub rope_theta: Option<f64>,
    /// NomicBERT's share of each head that rotates (only 1 is supported).
    #[serde(default)]
    pub rotary_emb_fraction: Option<f64>,
    /// NomicBERT's interleaved rotary pairs (only the rotate-half form is supported).
    #[serde(default)]
    pub rotary_emb_interleaved: Option<bool>,
    /// NomicBERT's pre-norm layers (only post-norm is supported).
    #[serde(default)]
    pub prenorm: Option<bool>,
    /// ModernBERT: each layer's attention, `full_attention` or `sliding_attention`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub layer_types: Vec<String>,
    /// ModernBERT's older key: every n-th layer (from 0) is global, the others slide.
    #[serde(default)]
    pub global_attn_every_n_layers: Option<usize>,
    /// ModernBERT: the sliding window's total width (a query sees keys within half of it).
    #[serde(default)]
    pub local_attention: Option<usize>,
    /// ModernBERT's older keys: the rotary bases of global and sliding layers.
    #[serde(default)]
    pub global_rope_theta: Option<f64>,
    #[serde(default)]
    pub local_rope_theta: Option<f64>,
    /// Rotary settings, newer configs' key (`rope_type` must be `default`).
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    /// Buckets of MPNet's relative position bias.
    #[serde(default)]
    pub relative_attention_num_buckets: Option<usize>,
    /// Whether Qwen3's attention projections have biases.
    #[serde(default)]
    pub attention_bias: Option<bool>,
    /// Label names of a classification head, by index (as strings, as in `config.json`).
    #[serde(default, deserialize_with = "null_as_default")]
    pub id2label: BTreeMap<String, String>,
    /// Classes of a classification head, when `id2label` is absent.
    #[serde(default)]
    pub num_labels: Option<usize>,
}

/// `null` as the type's default (configs write `"pad_token_id": null`).
fn null_as_default<'de, D, T>(d: D) -> std::result::Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn default_type_vocab_size() -> usize {
    2
}
fn default_hidden_act() -> String {
    "gelu".into()
}
fn default_layer_norm_eps() -> f64 {
    1e-12
}
fn default_position_embedding_type() -> String {
    "absolute".into()
}

impl BertConfig {
    /// Parses and validates a configuration from JSON text.
    pub fn from_json(text: &str) -> Result<Self> {
        let c: BertConfig =
            serde_json::from_str(text).map_err(|e| Error::Config(format!("config JSON: {e}")))?;
        c.validate()?;
        Ok(c)
    }

    /// Reads and validates `config.json` at `path`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let c: BertConfig = serde_json::from_str(&text).map_err(|source| Error::Json {
            path: path.to_path_buf(),
            source,
        })?;
        c.validate()
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        Ok(c)
    }

    /// Checks that the settings describe a model this crate can build.
    pub fn validate(&self) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(Error::Config(format!("{name} must be positive")));
            }
        }
        if self.head_dim_override.is_none()
            && !self.hidden_size.is_multiple_of(self.num_attention_heads)
        {
            return Err(Error::Config(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            )));
        }
        if !(self.layer_norm_eps >= 0.0 && self.layer_norm_eps.is_finite()) {
            return Err(Error::Config(format!(
                "layer_norm_eps must be a finite number >= 0, got {}",
                self.layer_norm_eps
            )));
        }
        let family = self.family()?;
        // Rotary families may have no token types at all (gte-*-v1.5: 0).
        if self.type_vocab_size == 0 && !family.is_rotary() {
            return Err(Error::Config("type_vocab_size must be positive".into()));
        }
        if self.position_embedding_type != "absolute" {
            return Err(Error::Config(format!(
                "position_embedding_type {:?} is not supported (only \"absolute\")",
                self.position_embedding_type
            )));
        }
        let kv = self.kv_heads();
        if kv == 0 || !self.num_attention_heads.is_multiple_of(kv) {
            return Err(Error::Config(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {kv}",
                self.num_attention_heads
            )));
        }
        if family.is_rotary() {
            if !self.head_dim().is_multiple_of(2) {
                return Err(Error::Config(format!(
                    "rotary positions need an even head width, got {}",
                    self.head_dim()
                )));
            }
            self.rope_base_of(false)?;
            self.rope_base_of(true)?;
            self.gate_activation()?;
            if self.rotary_emb_fraction.is_some_and(|f| f != 1.0)
                || self.rotary_emb_interleaved == Some(true)
                || self.prenorm == Some(true)
            {
                return Err(Error::Config(
                    "rotary_emb_fraction other than 1, interleaved rotary pairs and prenorm \
                     are not supported"
                        .into(),
                ));
            }
        } else {
            self.activation()?;
        }
        if family.offsets_positions() && self.pad_token_id + 1 >= self.max_position_embeddings {
            return Err(Error::Config(format!(
                "pad_token_id {} leaves no positions of {}",
                self.pad_token_id, self.max_position_embeddings
            )));
        }
        Ok(())
    }

    /// The model family ([`Family`]), from `model_type` or `architectures`.
    pub fn family(&self) -> Result<Family> {
        Family::from_model_type(&self.model_type, &self.architectures)
    }

    /// Whether the checkpoint is a `*ForSequenceClassification` (reranker or classifier).
    pub fn is_sequence_classifier(&self) -> bool {
        self.architectures
            .iter()
            .any(|a| a.ends_with("ForSequenceClassification"))
    }

    /// Classes of the classification head: `id2label`'s size, else `num_labels`, else 2 (as
    /// transformers' default).
    pub fn labels(&self) -> usize {
        if !self.id2label.is_empty() {
            return self.id2label.len();
        }
        self.num_labels.unwrap_or(2)
    }

    /// The name of class `i` (`LABEL_i` when the config names none, as transformers).
    pub fn label(&self, i: usize) -> String {
        self.id2label
            .get(&i.to_string())
            .cloned()
            .unwrap_or_else(|| format!("LABEL_{i}"))
    }

    /// The longest sequence the model takes: its position table's rows less the RoBERTa
    /// offset, or `max_position_embeddings` for rotary families.
    pub fn max_positions(&self) -> usize {
        match self.family() {
            Ok(f) if f.offsets_positions() => {
                self.max_position_embeddings - (self.pad_token_id + 1)
            }
            _ => self.max_position_embeddings,
        }
    }

    /// The feed-forward activation named by `hidden_act`.
    pub fn activation(&self) -> Result<Activation> {
        crate::layers::activation::parse(&self.hidden_act)
    }

    /// The gate activation of a gated MLP, named by `hidden_act`.
    pub fn gate_activation(&self) -> Result<GateActivation> {
        crate::layers::activation::parse_gate(&self.hidden_act)
    }

    /// Whether layer `i` attends within a sliding window (ModernBERT's local layers):
    /// `layer_types`, else every layer not a multiple of `global_attn_every_n_layers` (3).
    pub fn is_sliding_layer(&self, i: usize) -> bool {
        if self.family().ok() != Some(Family::ModernBert) {
            return false;
        }
        match self.layer_types.get(i) {
            Some(kind) => kind == "sliding_attention",
            None => !i.is_multiple_of(self.global_attn_every_n_layers.unwrap_or(3).max(1)),
        }
    }

    /// Half the sliding window: a query attends keys at most this far (ModernBERT:
    /// `local_attention / 2`, 64 by default).
    pub fn sliding_half_window(&self) -> usize {
        self.local_attention.unwrap_or(128) / 2
    }

    /// The rotary base of sliding (`sliding`) or global layers: a per-kind entry of
    /// `rope_parameters` (ModernBERT's `full_attention` / `sliding_attention`), else its
    /// older `local_rope_theta` / `global_rope_theta`, else [`Self::rope_base`].
    pub fn rope_base_of(&self, sliding: bool) -> Result<f64> {
        let key = if sliding {
            "sliding_attention"
        } else {
            "full_attention"
        };
        if let Some(p) = self.rope_parameters.as_ref().and_then(|p| p.get(key)) {
            if let Some(kind) = p.get("rope_type").and_then(|t| t.as_str()) {
                if kind != "default" {
                    return Err(Error::Config(format!(
                        "rope_type {kind:?} is not supported (only \"default\")"
                    )));
                }
            }
            if let Some(t) = p.get("rope_theta").and_then(|t| t.as_f64()) {
                return Ok(t);
            }
        }
        let older = if sliding {
            self.local_rope_theta
        } else {
            self.global_rope_theta
        };
        match older {
            Some(t) => Ok(t),
            // ModernBERT's defaults: 10000 for sliding layers, 160000 for global ones.
            None if self.family().ok() == Some(Family::ModernBert) => {
                Ok(if sliding { 10_000.0 } else { 160_000.0 })
            }
            None => self.rope_base(),
        }
    }

    /// The rotary base: `rope_parameters.rope_theta`, else `rope_theta`, else 10000.
    pub fn rope_base(&self) -> Result<f64> {
        if let Some(p) = &self.rope_parameters {
            if let Some(kind) = p.get("rope_type").and_then(|t| t.as_str()) {
                if kind != "default" {
                    return Err(Error::Config(format!(
                        "rope_type {kind:?} is not supported (only \"default\")"
                    )));
                }
            }
            if let Some(t) = p.get("rope_theta").and_then(|t| t.as_f64()) {
                return Ok(t);
            }
        }
        Ok(self.rope_theta.unwrap_or(10_000.0))
    }

    /// Key/value heads (grouped-query attention), `num_attention_heads` when not set.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.head_dim_override
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// The normalisation epsilon: `rms_norm_eps` for RMSNorm families, else `layer_norm_eps`.
    pub fn norm_eps(&self) -> f32 {
        match self.family() {
            Ok(Family::Qwen3) => self.rms_norm_eps.unwrap_or(1e-6) as f32,
            _ => self.layer_norm_eps as f32,
        }
    }
}
