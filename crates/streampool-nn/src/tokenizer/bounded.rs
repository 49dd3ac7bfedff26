//! Reading only as much of an input as its token limit needs.
//!
//! A model of 512 tokens needs no 4 MB text: sentence-transformers truncates it to its first
//! 512 tokens, and a server that tokenizes all 4 MB first (as `tokenizers` does when asked
//! to truncate) pays for every byte, several times over when a query or a prompt is repeated
//! per input. Here the cost of one input is bounded by its limit, not its size:
//!
//! - **A prefix at a time.** A text longer than a few bytes per token of its limit is read as
//!   a prefix, doubled until it holds more tokens than the limit (then the text is settled:
//!   truncated to the limit, or refused as too long) or the text ends. The work is at most
//!   about twice what the limit needs.
//! - **Only tokens the whole text would have.** A prefix cut inside a word may tokenize that
//!   word differently, so the tokens of the prefix's last word (the pre-tokenizer's last
//!   split, from `tokenizers`' word ids) are not counted. Every split before it is the same
//!   split of the whole text: pre-tokenizers split on whitespace, punctuation or a regex that
//!   looks one character ahead, and normalizers act per character or per combining sequence,
//!   so a cut changes at most the split it falls in. On the ASCII fast path, a cut just
//!   before a whitespace character ends a word exactly (BERT's pre-tokenizer splits there),
//!   so nothing is dropped. The tests compare every path with `tokenizers` on the whole text.
//! - **A byte cap.** A text whose first [`InputLimit::max_bytes`] bytes still hold fewer
//!   tokens than the limit (long runs of whitespace, one enormous word) is read no further:
//!   truncated as if it ended there, or refused when not truncating.
//! - **Once per request.** A pair's first text (a reranker's query) is read once
//!   ([`PairFirst`]) and joined with each second text's tokens by the post-processor, with
//!   `tokenizers`' own longest-first truncation; a prompt is read once ([`Prompt`]): its
//!   tokens up to its last word are fixed whatever follows, and only that last word is read
//!   again with each text.
//!
//! Where this differs from reading everything: text past the byte cap is never read.
//! Tokenizers that truncate from the left are read whole, up to the byte cap (a prefix cannot
//! settle which tokens come last).

use tokenizers::utils::truncation::{truncate_encodings, TruncationParams};
use tokenizers::{Encoding, PostProcessor, Token, TruncationDirection, TruncationStrategy};

use super::ascii::Scratch;
use super::BertTokenizer;
use crate::error::TokenCount;
use crate::{Error, Result};

/// Bytes read per token of the limit before a text is settled by the byte cap (see
/// [`InputLimit::new`]). Natural text runs 3 to 6 bytes per token (2 to 4 for CJK, whose
/// characters are tokens of their own), so the cap sits far above anything a model could
/// use, and still bounds the work for a 512-token model at 16 KiB per input.
pub const BYTES_PER_TOKEN: usize = 32;

/// The first prefix read of a long text, in bytes per token needed: most text settles on it.
const FIRST_READ_BYTES_PER_TOKEN: usize = 8;

/// The longest end of a prompt (its last word and what follows it) read again with every
/// input; longer ones are refused, since a request could otherwise buy that much work per
/// input.
pub const MAX_PROMPT_TAIL_BYTES: usize = 256;

/// How much of one input a text model reads, and what happens to an input longer than its
/// limit.
///
/// ```
/// use streampool_nn::{tiny_bert_dir, BertTokenizer, InputLimit};
/// let tok = BertTokenizer::from_file(tiny_bert_dir().join("tokenizer.json"), 128).unwrap();
/// let limit = InputLimit::new(4, true);
/// // Only the first few hundred bytes of a 1 MB text are read: [CLS] hello hello [SEP].
/// let long = "hello ".repeat(200_000);
/// assert_eq!(tok.encode_ids_limited(&long, &limit).unwrap(), [101, 7592, 7592, 102]);
/// let strict = InputLimit::new(4, false);
/// assert!(tok.encode_ids_limited(&long, &strict).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputLimit {
    /// The longest input in tokens, special tokens included.
    pub max_tokens: usize,
    /// Longer inputs are truncated to `max_tokens` (`true`) or refused (`false`).
    pub truncate: bool,
    /// The most bytes read of one input (see the module docs).
    pub max_bytes: usize,
}

impl InputLimit {
    /// A limit of `max_tokens` that reads at most [`BYTES_PER_TOKEN`] bytes per token of it
    /// (at least 4 KiB).
    pub fn new(max_tokens: usize, truncate: bool) -> Self {
        Self {
            max_tokens,
            truncate,
            max_bytes: max_tokens.saturating_mul(BYTES_PER_TOKEN).max(4096),
        }
    }
}

impl InputLimit {
    /// The refusal of `text` for being longer than the byte cap with nothing settled.
    fn too_large(&self, text: &str) -> Error {
        Error::InputTooLarge {
            bytes: text.len(),
            max: self.max_bytes,
            max_tokens: self.max_tokens,
        }
    }
}

/// The content tokens read of one text.
enum Read {
    /// All of the text.
    Whole(Vec<u32>),
    /// A prefix's tokens, each one the whole text's own, at least as many as were needed.
    Prefix(Vec<u32>),
    /// The text is longer than the byte cap, and its first `max_bytes` bytes settle nothing:
    /// their tokens, read as if the text ended there.
    Capped(Vec<u32>),
}

/// A prompt read once for a whole request: prepended to each of its texts with
/// [`BertTokenizer::encode_with_prompt`], with the result of tokenizing `prompt + text`.
#[derive(Debug, Clone)]
pub struct Prompt {
    /// Tokens of the prompt before its last word: the same whatever text follows.
    head: Vec<u32>,
    /// The prompt from its last word on, read again with each text.
    tail: String,
    /// The prompt's own tokens, all of them.
    tokens: usize,
}

impl Prompt {
    /// The prompt's tokens (without special tokens).
    pub fn tokens(&self) -> usize {
        self.tokens
    }
}

/// The first text of pairs read once for a whole request (a reranker's query): joined with
/// each second text by [`BertTokenizer::encode_pair_limited`].
#[derive(Debug, Clone)]
pub struct PairFirst {
    ids: Vec<u32>,
    whole: bool,
}

impl BertTokenizer {
    /// The ids of one text, special tokens included, under `limit`: its tokens when they
    /// fit; else truncated to `limit.max_tokens` or refused ([`Error::InputTooLong`]), as
    /// `limit.truncate` says. The same ids as tokenizing the whole text (see the module docs
    /// for what is read and the two exceptions); past the byte cap
    /// [`Error::InputTooLarge`] when not truncating.
    pub fn encode_ids_limited(&self, text: &str, limit: &InputLimit) -> Result<Vec<i64>> {
        self.encode_with_prompt(None, text, limit)
    }

    /// [`Self::encode_ids_limited`] of `prompt + text`, the prompt read once per request.
    ///
    /// ```
    /// use streampool_nn::{tiny_bert_dir, BertTokenizer, InputLimit};
    /// let tok = BertTokenizer::from_file(tiny_bert_dir().join("tokenizer.json"), 128).unwrap();
    /// let limit = InputLimit::new(128, false);
    /// let prompt = tok.prompt("query: ", &limit).unwrap();
    /// let joined = tok.encode_with_prompt(Some(&prompt), "hello world", &limit).unwrap();
    /// assert_eq!(joined, tok.encode_ids_limited("query: hello world", &limit).unwrap());
    /// ```
    pub fn encode_with_prompt(
        &self,
        prompt: Option<&Prompt>,
        text: &str,
        limit: &InputLimit,
    ) -> Result<Vec<i64>> {
        self.encode_single(prompt, text, limit).map(|(ids, _)| ids)
    }

    /// [`Self::encode_ids_limited`] with the token type ids the post-processor gives a single
    /// sequence (what a classifier reads).
    ///
    /// ```
    /// use streampool_nn::{tiny_bert_dir, BertTokenizer, InputLimit};
    /// let tok = BertTokenizer::from_file(tiny_bert_dir().join("tokenizer.json"), 128).unwrap();
    /// let (ids, types) = tok.encode_typed_limited("hello", &InputLimit::new(8, false)).unwrap();
    /// assert_eq!((ids, types), (vec![101, 7592, 102], vec![0, 0, 0]));
    /// ```
    pub fn encode_typed_limited(
        &self,
        text: &str,
        limit: &InputLimit,
    ) -> Result<(Vec<i64>, Vec<i64>)> {
        self.encode_single(None, text, limit)
    }

    fn encode_single(
        &self,
        prompt: Option<&Prompt>,
        text: &str,
        limit: &InputLimit,
    ) -> Result<(Vec<i64>, Vec<i64>)> {
        let content_max = self.content_max(limit, false)?;
        let (head, read) = match prompt {
            None => (&[][..], self.read(text, content_max + 1, limit)?),
            Some(p) => {
                // The tail, and no more of the text than the byte cap allows.
                let end = floor_char_boundary(text, limit.max_bytes);
                let joined = format!("{}{}", p.tail, &text[..end]);
                let need = (content_max + 1).saturating_sub(p.head.len());
                let read = match self.read(&joined, need, limit)? {
                    // The text went past the cap: what was read is a prefix, not the whole.
                    Read::Whole(ids) if end < text.len() => Read::Capped(ids),
                    other => other,
                };
                (&p.head[..], read)
            }
        };
        let (body, whole) = match read {
            Read::Whole(ids) => (ids, true),
            Read::Prefix(ids) => (ids, false),
            Read::Capped(ids) if limit.truncate => (ids, true),
            Read::Capped(_) => return Err(limit.too_large(text)),
        };
        let mut content = Vec::with_capacity((head.len() + body.len()).min(content_max + 1));
        content.extend_from_slice(head);
        content.extend_from_slice(&body);
        if content.len() > content_max {
            if !limit.truncate {
                let added = limit.max_tokens - content_max;
                return Err(Error::InputTooLong {
                    tokens: if whole {
                        TokenCount::Exactly(content.len() + added)
                    } else {
                        TokenCount::MoreThan(limit.max_tokens)
                    },
                    max: limit.max_tokens,
                });
            }
            if self.truncates_left() {
                content.drain(..content.len() - content_max);
            } else {
                content.truncate(content_max);
            }
        }
        self.with_specials(content)
    }

    /// Reads `prompt` once for a request's texts (see [`Self::encode_with_prompt`]). Refused
    /// when it leaves no room for a text under `limit`, or when its last word (with what
    /// follows it) is longer than [`MAX_PROMPT_TAIL_BYTES`].
    pub fn prompt(&self, prompt: &str, limit: &InputLimit) -> Result<Prompt> {
        let content_max = self.content_max(limit, false)?;
        let refuse = |why: String| Error::Input(format!("prompt: {why}"));
        if prompt.len() > limit.max_bytes {
            return Err(refuse(format!(
                "{} bytes exceeds the maximum of {} bytes read per input",
                prompt.len(),
                limit.max_bytes
            )));
        }
        let enc = self.encode_raw(prompt)?;
        let tokens = enc.get_ids().len();
        if tokens >= content_max {
            return Err(refuse(format!(
                "its {tokens} tokens leave no room for the input within the limit of {} tokens",
                limit.max_tokens
            )));
        }
        let split = last_word_start(&enc);
        let tail_from = enc.get_offsets().get(split).map_or(0, |o| o.0);
        let p = Prompt {
            head: enc.get_ids()[..split].to_vec(),
            tail: prompt.get(tail_from..).unwrap_or(prompt).to_string(),
            tokens,
        };
        // A prompt whose head depends on what follows (a pre-tokenizer that treats the start
        // of a text specially after an added token, say) is read whole with each text; the
        // probes catch such pipelines.
        let exact = ["x", " x", "1 x", "。"].iter().all(|probe| {
            let joined = format!("{prompt}{probe}");
            let whole = self.encode_raw(&joined).map(|e| e.get_ids().to_vec());
            let parts = self
                .encode_raw(&format!("{}{probe}", p.tail))
                .map(|e| [&p.head[..], e.get_ids()].concat());
            matches!((whole, parts), (Ok(a), Ok(b)) if a == b)
        });
        let p = if exact {
            p
        } else {
            Prompt {
                head: Vec::new(),
                tail: prompt.to_string(),
                tokens,
            }
        };
        if p.tail.len() > MAX_PROMPT_TAIL_BYTES {
            return Err(refuse(format!(
                "it ends with {} bytes read again with every input (a last word, or characters \
                 that form no token); at most {MAX_PROMPT_TAIL_BYTES}",
                p.tail.len()
            )));
        }
        Ok(p)
    }

    /// Reads the first text of pairs once for a request (see
    /// [`Self::encode_pair_limited`]).
    pub fn pair_first(&self, first: &str, limit: &InputLimit) -> Result<PairFirst> {
        let (ids, whole) = self.read_pair_side(first, limit)?;
        Ok(PairFirst { ids, whole })
    }

    /// The ids and token type ids of the pair `(first, second)` as a cross-encoder reads it
    /// (`[CLS] a [SEP] b [SEP]` for BERT), truncated longest-first to `limit.max_tokens` or
    /// refused, as [`Self::encode_ids_limited`] does for one text; `first` was read once by
    /// [`Self::pair_first`].
    ///
    /// ```
    /// use streampool_nn::{tiny_bert_dir, BertTokenizer, InputLimit};
    /// let tok = BertTokenizer::from_file(tiny_bert_dir().join("tokenizer.json"), 128).unwrap();
    /// let limit = InputLimit::new(128, false);
    /// let query = tok.pair_first("hello", &limit).unwrap();
    /// let (ids, types) = tok.encode_pair_limited(&query, "world", &limit).unwrap();
    /// assert_eq!(ids, [101, 7592, 102, 2088, 102]);
    /// assert_eq!(types, [0, 0, 0, 1, 1]);
    /// ```
    pub fn encode_pair_limited(
        &self,
        first: &PairFirst,
        second: &str,
        limit: &InputLimit,
    ) -> Result<(Vec<i64>, Vec<i64>)> {
        let budget = self.content_max(limit, true)?;
        let (second_ids, second_whole) = self.read_pair_side(second, limit)?;
        let total = first.ids.len() + second_ids.len();
        if total > budget && !limit.truncate {
            let added = limit.max_tokens - budget;
            return Err(Error::InputTooLong {
                tokens: if first.whole && second_whole {
                    TokenCount::Exactly(total + added)
                } else {
                    TokenCount::MoreThan(limit.max_tokens)
                },
                max: limit.max_tokens,
            });
        }
        let a = encoding_of(&first.ids, 0);
        let b = encoding_of(&second_ids, 1);
        let tokenizer_params = self.inner.get_truncation();
        let params = TruncationParams {
            max_length: budget,
            strategy: tokenizer_params.map_or(TruncationStrategy::LongestFirst, |t| t.strategy),
            direction: tokenizer_params.map_or(TruncationDirection::Right, |t| t.direction),
            stride: 0,
        };
        let (a, b) =
            truncate_encodings(a, Some(b), &params).map_err(|e| Error::Tokenizer(e.to_string()))?;
        let joined = self.post_process(a, b)?;
        let widen = |v: &[u32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<_>>();
        Ok((widen(joined.get_ids()), widen(joined.get_type_ids())))
    }

    /// One text of a pair: its content tokens as `tokenizers` counts them before its
    /// longest-first truncation, and whether that is all of them. `tokenizers` stops
    /// tokenizing a sequence at the end of the word in which it reaches `max_tokens`, and its
    /// longest-first truncation then compares those counts; so a text is read here up to that
    /// same word (with the word ids of `tokenizers`' own encoding), and both texts of a pair
    /// come out exactly as `tokenizers` truncates them.
    fn read_pair_side(&self, text: &str, limit: &InputLimit) -> Result<(Vec<u32>, bool)> {
        let max = limit.max_bytes;
        let stop = limit.max_tokens;
        let mut target = stop.saturating_mul(FIRST_READ_BYTES_PER_TOKEN).max(32);
        if text.len() <= target.min(max) {
            // Short texts (the common case) on the fast path, when they stop short of the limit.
            let ids = self.content_all(text)?;
            if ids.len() < stop {
                return Ok((ids, true));
            }
        }
        let left = self.truncates_left();
        if left && text.len() > max {
            return Err(limit.too_large(text));
        }
        loop {
            let whole = text.len() <= target.min(max) || left;
            let end = if whole {
                text.len()
            } else {
                cut(text, target.min(max)).0
            };
            let enc = self.encode_raw(&text[..end])?;
            let stable = if whole {
                enc.len()
            } else {
                last_word_start(&enc)
            };
            if let Some(at) = word_end_reaching(&enc, stop, left).filter(|&at| at <= stable) {
                let ids = enc.get_ids();
                let kept = if left {
                    &ids[ids.len() - at..]
                } else {
                    &ids[..at]
                };
                return Ok((kept.to_vec(), whole && at == ids.len()));
            }
            if whole {
                return Ok((enc.get_ids().to_vec(), true));
            }
            if target >= max {
                return if limit.truncate {
                    Ok((enc.get_ids().to_vec(), true))
                } else {
                    Err(limit.too_large(text))
                };
            }
            target = target.saturating_mul(2);
        }
    }

    /// Content tokens allowed under `limit` for a single text or a pair: the limit less the
    /// special tokens the post-processor adds; an error when they leave no room.
    fn content_max(&self, limit: &InputLimit, pair: bool) -> Result<usize> {
        let added = self
            .inner
            .get_post_processor()
            .map_or(0, |p| p.added_tokens(pair));
        limit.max_tokens.checked_sub(added).filter(|&n| n > 0).ok_or_else(|| {
            Error::Input(format!(
                "a limit of {} tokens leaves no room for content besides the {added} special tokens",
                limit.max_tokens
            ))
        })
    }

    fn truncates_left(&self) -> bool {
        self.inner
            .get_truncation()
            .is_some_and(|t| t.direction == TruncationDirection::Left)
    }

    /// Reads `text` until `need` content tokens are settled, the text ends, or the byte cap
    /// is reached (see the module docs).
    fn read(&self, text: &str, need: usize, limit: &InputLimit) -> Result<Read> {
        let max = limit.max_bytes;
        if self.truncates_left() {
            // Which tokens come last is settled only by reading to the end.
            return if text.len() <= max {
                Ok(Read::Whole(self.content_all(text)?))
            } else {
                Err(limit.too_large(text))
            };
        }
        let mut target = need.saturating_mul(FIRST_READ_BYTES_PER_TOKEN).max(32);
        loop {
            if text.len() <= target.min(max) {
                return Ok(Read::Whole(self.content_all(text)?));
            }
            let capped = target >= max;
            let (end, at_space) = cut(text, target.min(max));
            let (ids, stable) = self.content_stable(&text[..end], at_space)?;
            if stable >= need {
                let mut ids = ids;
                ids.truncate(stable);
                return Ok(Read::Prefix(ids));
            }
            if capped {
                return Ok(Read::Capped(ids));
            }
            target = target.saturating_mul(2);
        }
    }

    /// Every content token of `text` (no special tokens): the fast path where it applies.
    fn content_all(&self, text: &str) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        if let Some(f) = &self.fast {
            if f.words
                .encode(&self.unpadded, text, &mut Scratch::default(), &mut out)
            {
                return Ok(out);
            }
            out.clear();
        }
        let enc = self
            .raw
            .encode_fast(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The content tokens of a prefix of a longer text, and how many of them (from the
    /// start) the whole text has too: all of them where the fast path reads a prefix that
    /// ends just before whitespace, else all but its last word's.
    fn content_stable(&self, prefix: &str, at_space: bool) -> Result<(Vec<u32>, usize)> {
        if at_space {
            if let Some(f) = &self.fast {
                let mut out = Vec::new();
                if f.words
                    .encode(&self.unpadded, prefix, &mut Scratch::default(), &mut out)
                {
                    let n = out.len();
                    return Ok((out, n));
                }
            }
        }
        let enc = self.encode_raw(prefix)?;
        let stable = last_word_start(&enc);
        Ok((enc.get_ids().to_vec(), stable))
    }

    /// `tokenizers`' encoding of `text` without special tokens, truncation or padding, with
    /// word ids and byte offsets.
    fn encode_raw(&self, text: &str) -> Result<Encoding> {
        self.raw
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// `content` (already within the limit) with the special tokens of a single sequence, and
    /// its token type ids.
    fn with_specials(&self, content: Vec<u32>) -> Result<(Vec<i64>, Vec<i64>)> {
        let widen = |v: &[u32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<_>>();
        if let Some((prefix, suffix)) = &self.layout {
            // The simple layout has type id 0 throughout (`special_layout`).
            let ids: Vec<i64> = prefix
                .iter()
                .chain(&content)
                .chain(suffix)
                .map(|&x| i64::from(x))
                .collect();
            let types = vec![0; ids.len()];
            return Ok((ids, types));
        }
        let joined = self.post_process(encoding_of(&content, 0), None)?;
        Ok((widen(joined.get_ids()), widen(joined.get_type_ids())))
    }

    /// Special tokens and type ids for a text or a pair, as `tokenizers`' `post_process` adds
    /// them.
    fn post_process(&self, a: Encoding, b: Option<Encoding>) -> Result<Encoding> {
        let joined = match self.inner.get_post_processor() {
            Some(p) => p.process(a, b, true),
            None => {
                let mut all = <dyn PostProcessor>::default_process(
                    std::iter::once(a).chain(b).collect(),
                    true,
                )
                .map_err(|e| Error::Tokenizer(e.to_string()))?;
                // `default_process` merges everything into one encoding.
                Ok(all.pop().unwrap_or_default())
            }
        };
        joined.map_err(|e| Error::Tokenizer(e.to_string()))
    }
}

/// An encoding of bare ids (what a post-processor needs: ids, and the type id it may keep).
fn encoding_of(ids: &[u32], type_id: u32) -> Encoding {
    let tokens = ids
        .iter()
        .map(|&id| Token::new(id, String::new(), (0, 0)))
        .collect();
    Encoding::from_tokens(tokens, type_id)
}

/// Where the last word's tokens start (the pre-tokenizer's last split): the number of tokens
/// that come before it. `enc.len()` when no token has a word.
fn last_word_start(enc: &Encoding) -> usize {
    let words = enc.get_word_ids();
    match words.iter().rev().find_map(|w| *w) {
        Some(last) => words
            .iter()
            .position(|w| *w == Some(last))
            .unwrap_or(words.len()),
        None => words.len(),
    }
}

/// How many tokens `tokenizers` keeps of `enc` when it stops at the end of the word in which
/// the count reaches `stop` (from the end, for left truncation); `None` when it never does.
fn word_end_reaching(enc: &Encoding, stop: usize, from_end: bool) -> Option<usize> {
    let words = enc.get_word_ids();
    let n = words.len();
    if n < stop {
        return None;
    }
    // Index (in reading order) of the token at which the count reaches `stop`, then the
    // last token of its word.
    let mut kept = stop;
    let at = |k: usize| if from_end { n - k } else { k - 1 };
    let word = words[at(kept)];
    while kept < n && word.is_some() && words[at(kept + 1)] == word {
        kept += 1;
    }
    Some(kept)
}

/// The largest char boundary of `text` at or below `at`.
fn floor_char_boundary(text: &str, at: usize) -> usize {
    if at >= text.len() {
        return text.len();
    }
    // Invariant: 0 is a char boundary, so the search ends.
    (0..=at)
        .rev()
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(0)
}

/// Where to cut `text` (longer than `target`) for a prefix of about `target` bytes: just
/// before a whitespace character that follows a non-whitespace one, if there is one in the
/// last half of the prefix (`true`), else at a char boundary (`false`).
fn cut(text: &str, target: usize) -> (usize, bool) {
    let end = floor_char_boundary(text, target);
    let floor = end / 2;
    // Whether the character after the one looked at is whitespace.
    let mut after_space = text[end..].starts_with(char::is_whitespace);
    for (i, c) in text[..end].char_indices().rev() {
        let boundary = i + c.len_utf8();
        if boundary < floor || boundary == 0 {
            break;
        }
        let space = c.is_whitespace();
        if !space && after_space {
            return (boundary, true);
        }
        after_space = space;
    }
    (end, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_before_whitespace_that_ends_a_word() {
        assert_eq!(cut("hello world again", 8), (5, true));
        assert_eq!(cut("hello world again", 11), (11, true));
        assert_eq!(cut("aaaaaaaaaaaa", 6), (6, false));
        // Never inside a character.
        assert_eq!(cut("éééééé", 5), (4, false));
        assert_eq!(cut("ab   cd", 4), (2, true));
    }

    #[test]
    fn floor_char_boundary_stays_in_the_text() {
        assert_eq!(floor_char_boundary("héllo", 2), 1);
        assert_eq!(floor_char_boundary("héllo", 3), 3);
        assert_eq!(floor_char_boundary("hi", 10), 2);
    }
}
