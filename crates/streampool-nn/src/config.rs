//! Model configuration read from a Hugging Face `config.json`.

use std::path::Path;

use serde::Deserialize;

use crate::{Activation, Error, Result};

/// The settings of a BERT-family encoder (the keys of Hugging Face's `BertConfig`; unknown
/// keys are ignored).
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
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab_size")]
    pub type_vocab_size: usize,
    #[serde(default = "default_hidden_act")]
    pub hidden_act: String,
    #[serde(default = "default_layer_norm_eps")]
    pub layer_norm_eps: f64,
    #[serde(default)]
    pub pad_token_id: usize,
    #[serde(default = "default_position_embedding_type")]
    pub position_embedding_type: String,
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
            ("type_vocab_size", self.type_vocab_size),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(Error::Config(format!("{name} must be positive")));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
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
        if self.position_embedding_type != "absolute" {
            return Err(Error::Config(format!(
                "position_embedding_type {:?} is not supported (only \"absolute\")",
                self.position_embedding_type
            )));
        }
        self.activation()?;
        Ok(())
    }

    /// The feed-forward activation named by `hidden_act`.
    pub fn activation(&self) -> Result<Activation> {
        crate::layers::activation::parse(&self.hidden_act)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }
}
