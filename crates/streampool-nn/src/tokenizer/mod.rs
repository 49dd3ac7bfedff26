//! Tokenization with Hugging Face `tokenizers`, batched with padding and attention masks:
//! an exact fast path for ASCII text on BERT-style tokenizers (`ascii.rs`), large batches
//! spread over the process's tokenization pool (`pool.rs`), and rows written straight into
//! the flat buffers [`BertInput`] holds (`batch.rs`).

mod ascii;
mod batch;
mod bounded;
mod pool;

use std::path::Path;

use rayon::prelude::*;
use tokenizers::{
    Encoding, PaddingDirection, PaddingParams, PaddingStrategy, PostProcessor, Token, Tokenizer,
    TruncationDirection, TruncationParams, TruncationStrategy,
};

use crate::{BertInput, Error, Result};
use ascii::{AsciiWordPiece, Scratch};
use batch::{Padding, Rows};
pub use bounded::{InputLimit, PairFirst, Prompt};
pub use pool::TokenizePool;

/// Batches whose texts hold fewer bytes than this are tokenized on the calling thread: on
/// the fast path that is a few microseconds, less than handing the work to the pool.
const PARALLEL_MIN_BYTES: usize = 2048;

/// A `tokenizer.json` tokenizer that pads each batch to its longest sentence and truncates
/// to the model's maximum length. The file's own padding setting (MiniLM ships a fixed 128)
/// is replaced by pad-to-longest, as sentence-transformers does; the pad id and token, the
/// padding side and `pad_to_multiple_of` are kept.
///
/// Results are those of `tokenizers`' own `encode_batch` with these settings, bit for bit
/// ([`BertTokenizer::encode_batch_general`] is that path, kept as the reference); they are
/// computed faster: ASCII text on a BERT-style pipeline (BertNormalizer, BertPreTokenizer,
/// WordPiece: all-MiniLM-L6-v2 and the BERT family) takes an exact byte-level path with no
/// per-token allocation, other text goes through `tokenizers` one text at a time, a large
/// batch is spread over the [`TokenizePool`], and ids and masks are written straight into
/// the batch's flat buffers.
///
/// ```
/// use streampool_nn::{tiny_bert_dir, BertTokenizer};
/// let tok = BertTokenizer::from_file(tiny_bert_dir().join("tokenizer.json"), 128).unwrap();
/// let batch = tok.encode_batch(&["hello world", "hi"]).unwrap();
/// assert_eq!(batch.input_ids()[..4], [101, 7592, 2088, 102]); // [CLS] hello world [SEP]
/// assert_eq!(batch.attention_mask()[4..], [1, 1, 1, 0]);       // "hi" padded to 4
/// assert!(tok.has_fast_path());
/// ```
#[derive(Debug, Clone)]
pub struct BertTokenizer {
    /// As loaded, with pad-to-longest and truncation to `max_len`: what [`Self::inner`]
    /// returns and [`Self::encode_batch_general`] runs.
    inner: Tokenizer,
    /// `inner` without padding (a single `encode` pads too when `pad_to_multiple_of` is
    /// set): texts the fast path does not take, one at a time.
    unpadded: Tokenizer,
    /// `unpadded` without truncation either: the content tokens of a text, all of them (for
    /// [`InputLimit`]'s bounded reading, which truncates by its own limit).
    raw: Tokenizer,
    /// The special tokens a single sequence gets before and after its content, when the
    /// post-processor adds them that simply (see `special_layout`).
    layout: Option<(Vec<u32>, Vec<u32>)>,
    max_len: usize,
    fast: Option<Fast>,
    padding: Padding,
    /// Token type ids of a single sequence are not all zero (or the special tokens could not
    /// be laid out): every batch goes through `tokenizers`' `encode_batch`, whose rows carry
    /// their type ids.
    typed: bool,
}

/// The fast path of a qualifying tokenizer and where its special tokens go.
#[derive(Debug, Clone)]
struct Fast {
    words: AsciiWordPiece,
    prefix: Vec<u32>,
    suffix: Vec<u32>,
    /// Content tokens kept: `max_len` less the special tokens.
    content_max: usize,
    truncate_left: bool,
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
    /// truncation (to `max_len`, which must leave room for the special tokens).
    pub fn new(mut inner: Tokenizer, max_len: usize) -> Result<Self> {
        let specials = inner
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(false));
        if max_len == 0 || max_len < specials {
            return Err(Error::Input(format!(
                "tokenizer max_len {max_len} leaves no room: at least 1 and the {specials} \
                 special tokens needed"
            )));
        }
        let padding = PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            ..inner.get_padding().cloned().unwrap_or_default()
        };
        inner.with_padding(Some(padding.clone()));
        let truncation = TruncationParams {
            max_length: max_len,
            ..inner.get_truncation().cloned().unwrap_or_default()
        };
        inner
            .with_truncation(Some(truncation.clone()))
            .map_err(|e| Error::Tokenizer(format!("truncation to {max_len}: {e}")))?;
        let mut unpadded = inner.clone();
        unpadded.with_padding(None);
        let mut raw = unpadded.clone();
        raw.with_truncation(None)
            .map_err(|e| Error::Tokenizer(format!("removing truncation: {e}")))?;

        let layout = special_layout(&inner);
        let typed = layout.is_none() || padding.pad_type_id != 0;
        let fast = layout.clone().and_then(|(prefix, suffix)| {
            let simple =
                truncation.stride == 0 && truncation.strategy != TruncationStrategy::OnlySecond;
            simple.then_some(())?;
            Some(Fast {
                words: AsciiWordPiece::new(&inner)?,
                content_max: max_len - prefix.len() - suffix.len(),
                prefix,
                suffix,
                truncate_left: truncation.direction == TruncationDirection::Left,
            })
        });
        Ok(Self {
            inner,
            unpadded,
            raw,
            layout,
            max_len,
            fast,
            padding: Padding {
                id: padding.pad_id,
                left: matches!(padding.direction, PaddingDirection::Left),
                multiple: padding.pad_to_multiple_of,
            },
            typed,
        })
    }

    /// The truncation length.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The wrapped tokenizer (with this tokenizer's padding and truncation).
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }

    /// Whether ASCII texts take the byte-level fast path (the tokenizer is BERT-style: see
    /// the type's docs). Either way the results are those of `tokenizers`.
    pub fn has_fast_path(&self) -> bool {
        self.fast.is_some() && !self.typed
    }

    /// Whether `text` itself takes the fast path (an ASCII text without added tokens such as
    /// `[CLS]`, on a tokenizer that [has one](Self::has_fast_path)); for tests and
    /// diagnostics: the ids are the same either way.
    ///
    /// ```
    /// use streampool_nn::{tiny_bert_dir, BertTokenizer};
    /// let tok = BertTokenizer::from_file(tiny_bert_dir().join("tokenizer.json"), 128).unwrap();
    /// assert!(tok.takes_fast_path("Hello, world!"));
    /// assert!(!tok.takes_fast_path("café"));
    /// assert!(!tok.takes_fast_path("a [MASK] b"));
    /// ```
    pub fn takes_fast_path(&self, text: &str) -> bool {
        match (&self.fast, self.typed) {
            (Some(f), false) => f.words.encode(
                &self.unpadded,
                text,
                &mut Scratch::default(),
                &mut Vec::new(),
            ),
            _ => false,
        }
    }

    /// Tokenizes `texts` (special tokens added) into one padded batch. Empty `texts` is an
    /// error (a batch has at least one row). A batch of more than a couple of kilobytes of
    /// text is spread over [`TokenizePool::global`]; the result is the same either way.
    pub fn encode_batch(&self, texts: &[&str]) -> Result<BertInput> {
        check_batch(texts)?;
        let pool = TokenizePool::global();
        if self.typed {
            // `tokenizers`' rayon parallelism runs on whatever pool calls it: ours.
            return pool.install(|| self.encode_batch_general(texts));
        }
        let bytes: usize = texts.iter().map(|t| t.len()).sum();
        if texts.len() < 2 || pool.threads() < 2 || bytes < PARALLEL_MIN_BYTES {
            return self.encode_batch_serial(texts);
        }
        self.encode_batch_with(texts, pool)
    }

    /// [`Self::encode_batch`] on `pool` whatever the batch's size: the texts are split into
    /// a few runs per pool thread, each run tokenized into one buffer, then the rows are
    /// copied into the padded batch in parallel. Called from one of `pool`'s threads it
    /// runs there, splitting as well.
    pub fn encode_batch_with(&self, texts: &[&str], pool: &TokenizePool) -> Result<BertInput> {
        check_batch(texts)?;
        pool.install(|| {
            if self.typed {
                return self.encode_batch_general(texts);
            }
            let grain = texts.len().div_ceil(4 * pool.threads()).max(1);
            let parts: Vec<Result<Rows>> = texts
                .par_chunks(grain)
                .map(|run| self.encode_rows(run))
                .collect();
            // The first error in text order, as the serial path reports it.
            let parts = parts.into_iter().collect::<Result<Vec<_>>>()?;
            batch::assemble(&parts, &self.padding, true)
        })
    }

    /// [`Self::encode_batch`] on the calling thread only (no pool; a tokenizer whose rows
    /// carry type ids still uses `tokenizers`' own parallelism).
    ///
    /// ```
    /// use streampool_nn::{tiny_bert_dir, BertTokenizer, TokenizePool};
    /// let tok = BertTokenizer::from_file(tiny_bert_dir().join("tokenizer.json"), 128).unwrap();
    /// let texts = ["Hello, world!", "naïve café", "a [MASK] token", ""];
    /// let serial = tok.encode_batch_serial(&texts).unwrap();
    /// assert_eq!(serial, tok.encode_batch_general(&texts).unwrap()); // tokenizers' own
    /// assert_eq!(serial, tok.encode_batch_with(&texts, TokenizePool::global()).unwrap());
    /// ```
    pub fn encode_batch_serial(&self, texts: &[&str]) -> Result<BertInput> {
        check_batch(texts)?;
        if self.typed {
            return self.encode_batch_general(texts);
        }
        let rows = self.encode_rows(texts)?;
        batch::assemble(std::slice::from_ref(&rows), &self.padding, false)
    }

    /// The batch as `tokenizers`' own `encode_batch` builds it (full `Encoding`s: tokens,
    /// offsets, words; padded by `tokenizers`; in parallel on the rayon pool it is called
    /// from, rayon's global one outside any pool, unless `TOKENIZERS_PARALLELISM` is false),
    /// then widened into a [`BertInput`]: the path this type took before its fast paths, and
    /// the reference they are tested against.
    pub fn encode_batch_general(&self, texts: &[&str]) -> Result<BertInput> {
        check_batch(texts)?;
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

    /// Tokenizes `(first, second)` text pairs into one padded batch, as a cross-encoder reads
    /// them (`[CLS] a [SEP] b [SEP]` for BERT, `<s> a </s></s> b </s>` for RoBERTa; token type
    /// ids where the tokenizer sets them), truncated to [`Self::max_len`] longest-first.
    ///
    /// ```
    /// use streampool_nn::{tiny_bert_dir, BertTokenizer};
    /// let tok = BertTokenizer::from_file(tiny_bert_dir().join("tokenizer.json"), 128).unwrap();
    /// let b = tok.encode_pairs(&[("hello", "world")]).unwrap();
    /// assert_eq!(b.input_ids(), &[101, 7592, 102, 2088, 102]);
    /// assert_eq!(b.token_type_ids(), &[0, 0, 0, 1, 1]);
    /// ```
    pub fn encode_pairs(&self, pairs: &[(&str, &str)]) -> Result<BertInput> {
        if pairs.is_empty() {
            return Err(Error::Input("no text pairs to tokenize".into()));
        }
        let inputs: Vec<tokenizers::EncodeInput> =
            pairs.iter().map(|&(a, b)| (a, b).into()).collect();
        let encodings = TokenizePool::global().install(|| {
            self.inner
                .encode_batch(inputs, true)
                .map_err(|e| Error::Tokenizer(e.to_string()))
        })?;
        let widen = |v: &[u32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<_>>();
        let (mut ids, mut mask, mut types) = (Vec::new(), Vec::new(), Vec::new());
        for e in &encodings {
            ids.extend(widen(e.get_ids()));
            mask.extend(widen(e.get_attention_mask()));
            types.extend(widen(e.get_type_ids()));
        }
        BertInput::new(ids, mask, Some(types), pairs.len())
    }

    /// The ids of one text, special tokens included, truncated to [`Self::max_len`]; not
    /// padded. The ids a batch holds for this text, without the padding.
    ///
    /// ```
    /// use streampool_nn::{tiny_bert_dir, BertTokenizer};
    /// let tok = BertTokenizer::from_file(tiny_bert_dir().join("tokenizer.json"), 3).unwrap();
    /// assert_eq!(tok.encode_ids("hello world").unwrap(), [101, 7592, 102]);
    /// ```
    pub fn encode_ids(&self, text: &str) -> Result<Vec<i64>> {
        let mut ids = Vec::new();
        self.encode_row(text, &mut Scratch::default(), &mut ids)?;
        Ok(ids.into_iter().map(i64::from).collect())
    }

    /// Tokenizes a run of texts into one buffer.
    fn encode_rows(&self, texts: &[&str]) -> Result<Rows> {
        let bytes: usize = texts.iter().map(|t| t.len()).sum();
        // About one token per four bytes of English, plus the special tokens.
        let mut rows = Rows::with_capacity(texts.len(), bytes / 4 + 2 * texts.len());
        let mut scratch = Scratch::default();
        for text in texts {
            self.encode_row(text, &mut scratch, rows.ids_mut())?;
            rows.end_row();
        }
        Ok(rows)
    }

    /// Appends one text's ids (special tokens included, truncated) to `out`.
    fn encode_row(&self, text: &str, scratch: &mut Scratch, out: &mut Vec<u32>) -> Result<()> {
        if let Some(f) = &self.fast {
            let start = out.len();
            out.extend_from_slice(&f.prefix);
            let content = out.len();
            if f.words.encode(&self.unpadded, text, scratch, out) {
                let n = out.len() - content;
                if n > f.content_max {
                    if f.truncate_left {
                        out.drain(content..content + n - f.content_max);
                    } else {
                        out.truncate(content + f.content_max);
                    }
                }
                out.extend_from_slice(&f.suffix);
                return Ok(());
            }
            out.truncate(start);
        }
        let encoding = self
            .unpadded
            .encode_fast(text, true)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        out.extend_from_slice(encoding.get_ids());
        Ok(())
    }
}

fn check_batch(texts: &[&str]) -> Result<()> {
    if texts.is_empty() {
        return Err(Error::Input("no texts to tokenize".into()));
    }
    Ok(())
}

/// The special tokens a single sequence gets before and after its content, if the
/// post-processor adds them that simply (BERT's `[CLS] $A [SEP]`) with type id 0
/// throughout; `None` otherwise. Found by running the post-processor on placeholder ids.
fn special_layout(tok: &Tokenizer) -> Option<(Vec<u32>, Vec<u32>)> {
    const PLACEHOLDER: u32 = u32::MAX;
    let Some(processor) = tok.get_post_processor() else {
        return Some((Vec::new(), Vec::new()));
    };
    let probe = |n: usize| -> Option<Encoding> {
        let tokens = (0..n)
            .map(|i| Token::new(PLACEHOLDER, "x".into(), (i, i + 1)))
            .collect();
        processor
            .process(Encoding::from_tokens(tokens, 0), None, true)
            .ok()
    };
    let (one, two) = (probe(1)?, probe(2)?);
    let ids = one.get_ids();
    let at = ids.iter().position(|&i| i == PLACEHOLDER)?;
    let (prefix, suffix) = (ids[..at].to_vec(), ids[at + 1..].to_vec());
    let expect: Vec<u32> = prefix
        .iter()
        .chain(&[PLACEHOLDER, PLACEHOLDER])
        .chain(&suffix)
        .copied()
        .collect();
    let simple = !suffix.contains(&PLACEHOLDER)
        && two.get_ids() == expect.as_slice()
        && one
            .get_type_ids()
            .iter()
            .chain(two.get_type_ids())
            .all(|&t| t == 0)
        && processor.added_tokens(false) == prefix.len() + suffix.len();
    simple.then_some((prefix, suffix))
}
