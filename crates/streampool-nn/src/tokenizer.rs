//! Tokenization with Hugging Face `tokenizers`, batched with padding and attention masks.

use std::path::Path;

use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

use crate::{BertInput, Error, Result};

/// A `tokenizer.json` tokenizer that pads each batch to its longest sentence and truncates
/// to the model's maximum length. The file's own padding setting (MiniLM ships a fixed 128)
/// is replaced by pad-to-longest, as sentence-transformers does; the pad id and token are kept.
///
/// ```
/// use streampool_nn::{tiny_bert_dir, BertTokenizer};
/// let tok = BertTokenizer::from_file(tiny_bert_dir().join("tokenizer.json"), 128).unwrap();
/// let batch = tok.encode_batch(&["hello world", "hi"]).unwrap();
/// assert_eq!(batch.input_ids()[..4], [101, 7592, 2088, 102]); // [CLS] hello world [SEP]
/// assert_eq!(batch.attention_mask()[4..], [1, 1, 1, 0]);       // "hi" padded to 4
/// ```
pub struct BertTokenizer {
    inner: Tokenizer,
    max_len: usize,
}

impl BertTokenizer {
    /// Reads `tokenizer.json` at `path`; sequences are truncated to `max_len` tokens
    /// (special tokens included).
    pub fn from_file(path: impl AsRef<Path>, max_len: usize) -> Result<Self> {
        let path = path.as_ref();
        if !path.is_file() {
            return Err(Error::io(
                path,
                std::io::Error::new(std::io::ErrorKind::NotFound, "tokenizer file not found"),
            ));
        }
        let inner = Tokenizer::from_file(path)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        Self::new(inner, max_len)
    }

    /// Wraps a loaded tokenizer, overriding its padding (to the batch's longest) and its
    /// truncation (to `max_len`).
    pub fn new(mut inner: Tokenizer, max_len: usize) -> Result<Self> {
        if max_len == 0 {
            return Err(Error::Input("tokenizer max_len must be positive".into()));
        }
        let padding = PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            ..inner.get_padding().cloned().unwrap_or_default()
        };
        inner.with_padding(Some(padding));
        let truncation = TruncationParams {
            max_length: max_len,
            ..inner.get_truncation().cloned().unwrap_or_default()
        };
        inner
            .with_truncation(Some(truncation))
            .map_err(|e| Error::Tokenizer(format!("truncation to {max_len}: {e}")))?;
        Ok(Self { inner, max_len })
    }

    /// The truncation length.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The wrapped tokenizer.
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }

    /// Tokenizes `texts` (special tokens added) into one padded batch. Empty `texts` is an
    /// error (a batch has at least one row).
    pub fn encode_batch(&self, texts: &[&str]) -> Result<BertInput> {
        if texts.is_empty() {
            return Err(Error::Input("no texts to tokenize".into()));
        }
        let encodings = self
            .inner
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        let widen = |v: &[u32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<_>>();
        let (mut ids, mut mask, mut types) = (Vec::new(), Vec::new(), Vec::new());
        for e in &encodings {
            ids.extend(widen(e.get_ids()));
            mask.extend(widen(e.get_attention_mask()));
            types.extend(widen(e.get_type_ids()));
        }
        BertInput::new(ids, mask, Some(types), texts.len())
    }
}
