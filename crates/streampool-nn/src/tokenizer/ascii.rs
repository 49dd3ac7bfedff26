//! An exact fast path for BERT-style tokenizers on ASCII text: the normalizer, pre-tokenizer
//! and WordPiece of a `tokenizer.json` replayed over bytes, with no per-token allocation.
//!
//! Why: `tokenizers` spends most of its time outside WordPiece. Measured on this project's
//! CPU (tiny-bert's tokenizer, which is MiniLM's), a 32-token sentence costs about 1.3 us per
//! token through `encode_fast`, of which normalization and pre-tokenization take about
//! 1.1 us (a `NormalizedString` keeps an alignment per byte and is rebuilt by every
//! normalization step), and WordPiece itself about 60 ns. On ASCII text every one of those
//! steps reduces to a byte test, so this path scans the bytes once and looks each word up in
//! the model's own vocabulary.
//!
//! Exactness: it is used only when the tokenizer is `BertNormalizer` (with `clean_text`) +
//! `BertPreTokenizer` + `WordPiece`, and only for texts that are ASCII and contain none of the
//! tokenizer's added tokens; everything else goes through `tokenizers` itself. On ASCII, the
//! normalizer's steps are: drop control characters (`\t`, `\n`, `\r` become spaces, the others
//! are removed without splitting the word), lowercase when asked; accents and CJK handling
//! have nothing to act on. The pre-tokenizer splits on spaces (dropped) and ASCII punctuation
//! (each mark its own word). WordPiece is replayed step for step: a word longer than
//! `max_input_chars_per_word` is `[UNK]`, else greedy longest-prefix matching with the
//! continuing-subword prefix, and a word with an unmatched remainder is one `[UNK]`.
//! `tests/it/tokenize.rs` checks the result against `tokenizers` on thousands of generated texts.

use tokenizers::models::wordpiece::WordPiece;
use tokenizers::models::ModelWrapper;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{Model, Tokenizer};

/// What the fast path needs to know about a qualifying tokenizer.
#[derive(Debug, Clone)]
pub(super) struct AsciiWordPiece {
    lowercase: bool,
    unk_id: u32,
    prefix: String,
    max_word_chars: usize,
    /// Contents of the tokenizer's added tokens: a text containing one goes through
    /// `tokenizers` (which would match it before normalizing).
    added: Vec<Vec<u8>>,
    /// First bytes of `added`, to test only where a match can start.
    added_first: [bool; 128],
}

/// Per-thread buffers of the fast path, reused from text to text.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    word: String,
    piece: String,
}

impl AsciiWordPiece {
    /// The fast path for `tok`, if its pipeline is one this module replays exactly.
    pub(super) fn new(tok: &Tokenizer) -> Option<Self> {
        let Some(NormalizerWrapper::BertNormalizer(norm)) = tok.get_normalizer() else {
            return None;
        };
        if !norm.clean_text {
            return None;
        }
        let Some(PreTokenizerWrapper::BertPreTokenizer(_)) = tok.get_pre_tokenizer() else {
            return None;
        };
        let wp = wordpiece(tok)?;
        let unk_id = wp.token_to_id(&wp.unk_token)?;
        let added: Vec<Vec<u8>> = tok
            .get_added_tokens_decoder()
            .into_values()
            .map(|t| {
                // A token matched after normalization (lowercased, ...) could appear in a text
                // in another spelling; only exact-content matching is screened for here.
                (!t.normalized).then(|| t.content.into_bytes())
            })
            .collect::<Option<_>>()?;
        if added.iter().any(Vec::is_empty) {
            return None;
        }
        let mut added_first = [false; 128];
        for t in &added {
            match t[0] {
                b if b < 128 => added_first[b as usize] = true,
                // A token starting with a non-ASCII byte never occurs in an ASCII text.
                _ => {}
            }
        }
        Some(Self {
            lowercase: norm.lowercase,
            unk_id,
            prefix: wp.continuing_subword_prefix.clone(),
            max_word_chars: wp.max_input_chars_per_word,
            added,
            added_first,
        })
    }

    /// Appends the ids of `text` (no special tokens, not truncated) to `out`, or returns
    /// `false` with `out` as it was when `text` is not for this path (not ASCII, or holds an
    /// added token). `tok` must be the tokenizer this was built from.
    pub(super) fn encode(
        &self,
        tok: &Tokenizer,
        text: &str,
        scratch: &mut Scratch,
        out: &mut Vec<u32>,
    ) -> bool {
        // `new` succeeded on this tokenizer, so its model is WordPiece.
        let Some(wp) = wordpiece(tok) else {
            return false;
        };
        let start_len = out.len();
        let bytes = text.as_bytes();
        let word = &mut scratch.word;
        word.clear();
        for (i, &b) in bytes.iter().enumerate() {
            if b >= 0x80 {
                out.truncate(start_len);
                return false;
            }
            if self.added_first[b as usize] && self.added.iter().any(|t| bytes[i..].starts_with(t))
            {
                out.truncate(start_len);
                return false;
            }
            match b {
                b' ' | b'\t' | b'\n' | b'\r' => {
                    self.word_ids(wp, word, &mut scratch.piece, out);
                    word.clear();
                }
                // Other control characters (and NUL, DEL) are removed by clean_text before
                // splitting: they do not end a word.
                0x00..=0x1f | 0x7f => {}
                _ if b.is_ascii_punctuation() => {
                    self.word_ids(wp, word, &mut scratch.piece, out);
                    word.clear();
                    word.push(b as char);
                    self.word_ids(wp, word, &mut scratch.piece, out);
                    word.clear();
                }
                _ => word.push(if self.lowercase {
                    b.to_ascii_lowercase()
                } else {
                    b
                } as char),
            }
        }
        self.word_ids(wp, word, &mut scratch.piece, out);
        true
    }

    /// WordPiece on one (ASCII) word, as `WordPiece::tokenize` does it.
    fn word_ids(&self, wp: &WordPiece, word: &str, piece: &mut String, out: &mut Vec<u32>) {
        if word.is_empty() {
            return;
        }
        if word.len() > self.max_word_chars {
            out.push(self.unk_id);
            return;
        }
        let mark = out.len();
        let mut start = 0;
        while start < word.len() {
            let mut end = word.len();
            let mut found = None;
            while start < end {
                let id = if start == 0 {
                    wp.token_to_id(&word[..end])
                } else {
                    piece.clear();
                    piece.push_str(&self.prefix);
                    piece.push_str(&word[start..end]);
                    wp.token_to_id(piece)
                };
                if id.is_some() {
                    found = id;
                    break;
                }
                end -= 1;
            }
            match found {
                Some(id) => {
                    out.push(id);
                    start = end;
                }
                None => {
                    out.truncate(mark);
                    out.push(self.unk_id);
                    return;
                }
            }
        }
    }
}

fn wordpiece(tok: &Tokenizer) -> Option<&WordPiece> {
    match tok.get_model() {
        ModelWrapper::WordPiece(wp) => Some(wp),
        _ => None,
    }
}
