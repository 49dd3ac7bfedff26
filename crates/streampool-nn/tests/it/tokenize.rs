//! Tokenization: the ASCII fast path, the pool and the flat batch buffers give exactly what
//! `tokenizers`' own `encode_batch` gives (ids, mask, type ids, padded length), on generated
//! texts that exercise every rule the fast path replays; parallel equals serial; errors; many
//! threads at once and calls from inside rayon pools do not deadlock.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use streampool_nn::{tiny_bert_dir, BertInput, BertTokenizer, TokenizePool};
use tokenizers::Tokenizer;

/// The shipped tiny-bert's tokenizer, which is all-MiniLM-L6-v2's (same sha256).
fn tokenizer_json() -> serde_json::Value {
    let text = std::fs::read_to_string(tiny_bert_dir().join("tokenizer.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn load(json: &serde_json::Value, max_len: usize) -> BertTokenizer {
    let inner: Tokenizer = json.to_string().parse().unwrap();
    BertTokenizer::new(inner, max_len).unwrap()
}

fn minilm(max_len: usize) -> BertTokenizer {
    load(&tokenizer_json(), max_len)
}

/// Words in the vocabulary, words that split into pieces, words that do not match at all,
/// and one over WordPiece's 100-character limit.
const WORDS: &[&str] = &[
    "the", "The", "CAT", "sat", "on", "mat", "tokenization", "unbelievably", "streampool",
    "xqzv", "Qwertyuiopasdf", "GPU's", "h100", "42", "3.14", "e-mail", "don't", "a", "I",
    "embeddings", "wordpiece", "##ing", "[cls]", "[MASK", "SEP]",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
];
/// Added tokens, matched in the raw text before normalizing (such texts take the general path).
const ADDED: &[&str] = &["[CLS]x", "[UNK]", "[PAD]", "a[MASK]b", "[SEP]"];
/// Everything between words: spaces, the whitespace controls, other controls (removed
/// without splitting), NUL, DEL, every ASCII punctuation mark.
const GLUE: &[&str] = &[
    " ", " ", " ", "  ", "\t", "\n", "\r\n", "\x0b", "\x0c", "\x01", "\x1f", "\0", "\x7f", ",",
    ".", "!", "?", "'", "\"", "(", ")", "-", "_", "/", "\\", "$", "%", "&", "*", "+", "<", "=",
    ">", "@", "[", "]", "^", "`", "{", "|", "}", "~", ":", ";", "#",
];
/// Non-ASCII pieces (the general path): accents, CJK, emoji, non-breaking space.
const UNICODE: &[&str] = &["café", "naïve", "北京", "🙂", "\u{a0}", "Straße", "ǅ"];

fn text(rng: &mut StdRng, ascii: bool) -> String {
    let mut s = String::new();
    for _ in 0..rng.gen_range(0..40) {
        if rng.gen_bool(0.01) {
            s.push_str(ADDED[rng.gen_range(0..ADDED.len())]);
        } else if rng.gen_bool(0.55) {
            s.push_str(WORDS[rng.gen_range(0..WORDS.len())]);
        } else if rng.gen_bool(0.15) {
            // Random letters: mostly unknown words, split into pieces or [UNK].
            for _ in 0..rng.gen_range(1..12) {
                s.push(rng.gen_range(b'A'..=b'z') as char);
            }
        } else {
            s.push_str(GLUE[rng.gen_range(0..GLUE.len())]);
        }
        if !ascii && rng.gen_bool(0.1) {
            s.push_str(UNICODE[rng.gen_range(0..UNICODE.len())]);
        }
    }
    s
}

fn texts(seed: u64, n: usize, ascii: bool) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut v: Vec<String> = (0..n).map(|_| text(&mut rng, ascii)).collect();
    v.extend(["", " ", "\t\n", "[CLS]", "hello [SEP] world", "[MASK]"].map(String::from));
    v
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Row `i` of a batch as (ids, mask, type ids).
fn row(b: &BertInput, i: usize) -> (&[i64], &[i64], &[i64]) {
    let s = b.seq_len();
    let r = i * s..(i + 1) * s;
    (
        &b.input_ids()[r.clone()],
        &b.attention_mask()[r.clone()],
        &b.token_type_ids()[r],
    )
}

/// Compares batches of 16 texts (so padding varies) and every text alone, fast against
/// `tokenizers`, reporting the first text that differs.
fn assert_same_as_tokenizers(tok: &BertTokenizer, texts: &[String]) {
    for batch in texts.chunks(16) {
        let batch = refs(batch);
        let want = tok.encode_batch_general(&batch).unwrap();
        let got = tok.encode_batch_serial(&batch).unwrap();
        if got != want {
            let i = (0..batch.len())
                .find(|&i| got.seq_len() != want.seq_len() || row(&got, i) != row(&want, i))
                .unwrap_or(0);
            panic!(
                "text {:?}: got {:?} (seq {}), tokenizers {:?} (seq {})",
                batch[i],
                row(&got, i),
                got.seq_len(),
                row(&want, i),
                want.seq_len()
            );
        }
        for (i, t) in batch.iter().enumerate() {
            let ids = tok.encode_ids(t).unwrap();
            let (want_ids, want_mask, _) = row(&want, i);
            let unpadded: Vec<i64> = want_ids
                .iter()
                .zip(want_mask)
                .filter_map(|(&id, &m)| (m == 1).then_some(id))
                .collect();
            assert_eq!(ids, unpadded, "encode_ids({t:?})");
        }
    }
}

#[test]
fn fast_path_equals_tokenizers_on_generated_ascii_and_unicode() {
    let tok = minilm(128);
    assert!(tok.has_fast_path());
    let ascii = texts(1, 1500, true);
    // Most ASCII texts take the fast path (the others hold an added token such as [CLS]);
    // no text with a non-ASCII character does.
    let fast = ascii.iter().filter(|t| tok.takes_fast_path(t)).count();
    assert!(
        fast >= ascii.len() * 3 / 5,
        "{fast} of {} on the fast path",
        ascii.len()
    );
    assert_same_as_tokenizers(&tok, &ascii);
    let unicode = texts(2, 500, false);
    let fast = unicode.iter().filter(|t| tok.takes_fast_path(t)).count();
    assert!(fast < unicode.len(), "every text on the fast path");
    assert!(unicode
        .iter()
        .filter(|t| !t.is_ascii())
        .all(|t| !tok.takes_fast_path(t)));
    assert_same_as_tokenizers(&tok, &unicode);
}

#[test]
fn truncation_and_padding_settings_are_tokenizers_own() {
    let base = tokenizer_json();
    let ascii = texts(3, 300, true);
    // Truncation to a few tokens (content cut on the right), then to exactly the specials.
    for max_len in [2, 3, 9] {
        assert_same_as_tokenizers(&load(&base, max_len), &ascii);
    }
    // Left truncation and left padding to a multiple of 8, from the file's settings.
    let mut json = base.clone();
    json["truncation"]["direction"] = "Left".into();
    json["padding"]["direction"] = "Left".into();
    json["padding"]["pad_to_multiple_of"] = 8.into();
    let tok = load(&json, 12);
    assert!(tok.has_fast_path());
    assert_same_as_tokenizers(&tok, &ascii);
    // No lowercasing.
    let mut json = base.clone();
    json["normalizer"]["lowercase"] = false.into();
    assert_same_as_tokenizers(&load(&json, 64), &ascii);
    // Padding with a non-zero type id: rows carry type ids, so batches are tokenizers' own.
    let mut json = base.clone();
    json["padding"]["pad_type_id"] = 1.into();
    let tok = load(&json, 64);
    assert!(!tok.has_fast_path());
    let batch = refs(&ascii[..40]);
    let want = tok.encode_batch_general(&batch).unwrap();
    assert!(want.token_type_ids().contains(&1));
    assert_eq!(tok.encode_batch(&batch).unwrap(), want);
    assert_eq!(tok.encode_batch_serial(&batch).unwrap(), want);
    // A pipeline the fast path does not replay (clean_text off) goes through tokenizers.
    let mut json = base;
    json["normalizer"]["clean_text"] = false.into();
    let tok = load(&json, 64);
    assert!(!tok.has_fast_path());
    assert_same_as_tokenizers(&tok, &ascii);
}

#[test]
fn pool_batches_equal_serial_batches_bit_for_bit() {
    let tok = minilm(256);
    let pool = TokenizePool::new(3).unwrap();
    assert_eq!(pool.threads(), 3);
    // Mixed lengths, ASCII and not, from 1 to 400 texts (runs of 1 text and of many).
    let all = texts(4, 400, false);
    for n in [1, 2, 7, 64, all.len()] {
        let batch = refs(&all[..n]);
        let serial = tok.encode_batch_serial(&batch).unwrap();
        assert_eq!(
            tok.encode_batch_with(&batch, &pool).unwrap(),
            serial,
            "{n} texts"
        );
        assert_eq!(tok.encode_batch(&batch).unwrap(), serial, "{n} texts");
    }
}

#[test]
fn empty_and_invalid_inputs_are_errors() {
    let tok = minilm(128);
    let pool = TokenizePool::new(2).unwrap();
    assert!(tok.encode_batch(&[]).is_err());
    assert!(tok.encode_batch_serial(&[]).is_err());
    assert!(tok.encode_batch_with(&[], &pool).is_err());
    assert!(tok.encode_batch_general(&[]).is_err());
    // MiniLM adds [CLS] and [SEP]: a limit of 0 or 1 leaves no room.
    let inner: Tokenizer = tokenizer_json().to_string().parse().unwrap();
    for max_len in [0, 1] {
        let err = BertTokenizer::new(inner.clone(), max_len).unwrap_err();
        assert!(err.to_string().contains("no room"), "{err}");
    }
    // Empty strings are texts: [CLS] [SEP].
    assert_eq!(tok.encode_ids("").unwrap(), [101, 102]);
}

#[test]
fn many_threads_at_once_get_their_own_results() {
    let tok = minilm(128);
    let all = texts(5, 200, false);
    let expected: Vec<BertInput> = (0..8)
        .map(|t| {
            tok.encode_batch_serial(&refs(&all[t * 20..t * 20 + 40]))
                .unwrap()
        })
        .collect();
    std::thread::scope(|s| {
        for (t, want) in expected.iter().enumerate() {
            let (tok, all) = (&tok, &all);
            s.spawn(move || {
                for _ in 0..10 {
                    let got = tok.encode_batch(&refs(&all[t * 20..t * 20 + 40])).unwrap();
                    assert_eq!(&got, want, "thread {t}");
                }
            });
        }
    });
}

#[test]
fn calls_from_inside_pools_do_not_deadlock() {
    let tok = minilm(128);
    let all = texts(6, 120, true);
    let batch = refs(&all);
    let want = tok.encode_batch_serial(&batch).unwrap();
    // From the global pool's own threads, every one of them busy with a nested batch.
    let global = TokenizePool::global();
    let got: Vec<BertInput> = global.install(|| {
        (0..2 * global.threads())
            .into_par_iter()
            .map(|_| tok.encode_batch(&batch).unwrap())
            .collect()
    });
    assert!(got.iter().all(|g| g == &want));
    // From a pool of our own inside another of ours, and from a foreign rayon pool.
    let small = TokenizePool::new(2).unwrap();
    let nested = small.install(|| tok.encode_batch_with(&batch, &small).unwrap());
    assert_eq!(nested, want);
    let foreign = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let got: Vec<BertInput> = foreign.install(|| {
        (0..6)
            .into_par_iter()
            .map(|_| tok.encode_batch(&batch).unwrap())
            .collect()
    });
    assert!(got.iter().all(|g| g == &want));
}

#[test]
fn spawned_jobs_hand_results_back_and_survive_panics() {
    let pool = TokenizePool::new(2).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    pool.spawn(move || tx.send(pool_thread_name()).unwrap());
    let name = rx.recv().unwrap();
    assert!(name.starts_with("streampool-tok-"), "{name}");
    // A panicking job drops its sender: the receiver sees a closed channel, not a hang,
    // and the pool keeps working.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    pool.spawn(move || {
        let _tx = tx;
        panic!("a job fails");
    });
    assert!(rx.recv().is_err());
    assert_eq!(pool.install(|| 40 + 2), 42);
}

fn pool_thread_name() -> String {
    std::thread::current().name().unwrap_or("").to_string()
}

/// The shipped tiny models whose tokenizers cover the pipelines the bounded reader meets:
/// BERT's WordPiece (with the ASCII fast path), XLM-R's Metaspace and Unigram, Qwen3's
/// byte-level BPE, MPNet's RoBERTa-style pair layout.
const BOUNDED_MODELS: &[&str] = &["tiny-bert", "tiny-xlmr", "tiny-qwen3", "tiny-mpnet"];

fn model_tokenizer_json(model: &str) -> serde_json::Value {
    let path = tiny_bert_dir()
        .parent()
        .unwrap()
        .join(model)
        .join("tokenizer.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `tokenizers` itself on whole texts and pairs: the reference the bounded reader must equal.
struct WholeText {
    /// No truncation, no padding.
    raw: Tokenizer,
    /// Truncated (longest first) to each limit the tests use.
    truncating: std::collections::HashMap<usize, Tokenizer>,
}

impl WholeText {
    fn new(json: &serde_json::Value, limits: &[usize]) -> Self {
        let mut raw: Tokenizer = json.to_string().parse().unwrap();
        raw.with_padding(None);
        raw.with_truncation(None).unwrap();
        let truncating = limits
            .iter()
            .map(|&max_length| {
                let mut t = raw.clone();
                t.with_truncation(Some(tokenizers::TruncationParams {
                    max_length,
                    ..Default::default()
                }))
                .unwrap();
                (max_length, t)
            })
            .collect();
        Self { raw, truncating }
    }

    /// The ids and type ids of the text or pair truncated to `max_tokens`, or `None` when it
    /// is longer and not to be truncated.
    fn encode(
        &self,
        max_tokens: usize,
        truncate: bool,
        first: &str,
        second: Option<&str>,
    ) -> Option<(Vec<i64>, Vec<i64>)> {
        let input = || -> tokenizers::EncodeInput {
            match second {
                Some(b) => (first, b).into(),
                None => first.into(),
            }
        };
        let full = self.raw.encode(input(), true).unwrap();
        if full.get_ids().len() > max_tokens && !truncate {
            return None;
        }
        let e = self.truncating[&max_tokens].encode(input(), true).unwrap();
        let widen = |v: &[u32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<_>>();
        Some((widen(e.get_ids()), widen(e.get_type_ids())))
    }
}

/// Long texts of every kind the reader must cut well: generated prose (ASCII and not), long
/// whitespace runs, one enormous word, CJK without spaces, a character NFKC expands 18-fold,
/// combining accents.
fn long_texts(seed: u64, n: usize) -> Vec<String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let odd = [
        " ".repeat(300),
        "a".repeat(400),
        "北京".repeat(150),
        "\u{FDFA}".repeat(60),
        "e\u{301}".repeat(120),
        "\n\t ".repeat(50),
    ];
    (0..n)
        .map(|_| {
            let mut s = String::new();
            while s.len() < 2500 && rng.gen_bool(0.95) {
                if rng.gen_bool(0.15) {
                    s.push_str(&odd[rng.gen_range(0..odd.len())]);
                } else {
                    let ascii = rng.gen_bool(0.5);
                    s.push_str(&text(&mut rng, ascii));
                }
                s.push_str(GLUE[rng.gen_range(0..3)]);
            }
            s
        })
        .collect()
}

#[test]
fn bounded_reading_equals_tokenizers_on_the_whole_text() {
    use streampool_nn::InputLimit;
    for model in BOUNDED_MODELS {
        let json = model_tokenizer_json(model);
        let tok = load(&json, 512);
        let limits = [6, 9, 16, 41];
        let reference = WholeText::new(&json, &limits);
        for (i, t) in long_texts(7, 60).iter().enumerate() {
            assert!(
                t.len() < 4096,
                "below the byte cap, so every answer is exact"
            );
            for max_tokens in limits {
                for truncate in [true, false] {
                    let limit = InputLimit::new(max_tokens, truncate);
                    let want = reference.encode(max_tokens, truncate, t, None);
                    match (tok.encode_ids_limited(t, &limit), want) {
                        (Ok(got), Some((ids, _))) => {
                            assert_eq!(got, ids, "{model} text {i} limit {max_tokens}: {t:?}")
                        }
                        (Err(streampool_nn::Error::InputTooLong { max, .. }), None) => {
                            assert_eq!(max, max_tokens)
                        }
                        (got, want) => panic!(
                            "{model} text {i} limit {max_tokens} truncate {truncate}: got \
                             {got:?}, tokenizers {want:?}: {t:?}"
                        ),
                    }
                }
            }
        }
    }
}

#[test]
fn pairs_read_their_first_text_once_and_equal_tokenizers() {
    use streampool_nn::InputLimit;
    for model in BOUNDED_MODELS {
        let json = model_tokenizer_json(model);
        let tok = load(&json, 512);
        let texts = long_texts(11, 30);
        let limits = [9, 16, 40];
        let reference = WholeText::new(&json, &limits);
        let queries = [&texts[0][..], "a short query", &texts[1][..], ""];
        for q in queries {
            for max_tokens in limits {
                for truncate in [true, false] {
                    let limit = InputLimit::new(max_tokens, truncate);
                    let first = match tok.pair_first(q, &limit) {
                        Ok(f) => f,
                        Err(e) => panic!("{model}: reading the query {q:?}: {e}"),
                    };
                    for (i, t) in texts.iter().enumerate() {
                        let want = reference.encode(max_tokens, truncate, q, Some(t));
                        let got = tok.encode_pair_limited(&first, t, &limit);
                        match (got, want) {
                            (Ok(got), Some(want)) => assert_eq!(
                                got, want,
                                "{model} pair ({q:?}, text {i}) limit {max_tokens}"
                            ),
                            (Err(streampool_nn::Error::InputTooLong { .. }), None) => {}
                            (got, want) => panic!(
                                "{model} pair ({q:?}, text {i}) limit {max_tokens} truncate \
                                 {truncate}: got {got:?}, tokenizers {want:?}"
                            ),
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_prompt_read_once_equals_tokenizing_prompt_and_text() {
    use streampool_nn::InputLimit;
    for model in BOUNDED_MODELS {
        let json = model_tokenizer_json(model);
        let tok = load(&json, 512);
        let texts = long_texts(13, 30);
        let limits = [48, 96];
        let reference = WholeText::new(&json, &limits);
        for prompt in [
            "query: ",
            "Represent this sentence for searching:",
            "passage:",
            "北京 ",
        ] {
            for max_tokens in limits {
                let limit = InputLimit::new(max_tokens, true);
                let p = tok.prompt(prompt, &limit).unwrap();
                for t in texts.iter().map(String::as_str).chain(["", "x", " y"]) {
                    let joined = format!("{prompt}{t}");
                    let (want, _) = reference.encode(max_tokens, true, &joined, None).unwrap();
                    let got = tok.encode_with_prompt(Some(&p), t, &limit).unwrap();
                    assert_eq!(got, want, "{model} prompt {prompt:?} text {t:?}");
                }
            }
        }
    }
}

#[test]
fn past_the_byte_cap_nothing_more_is_read() {
    use streampool_nn::{Error, InputLimit, TokenCount};
    let tok = minilm(512);
    let limit = InputLimit {
        max_tokens: 16,
        truncate: true,
        max_bytes: 1000,
    };
    // 4 MB of spaces and one word: nothing past the first kilobyte is read.
    let spaces = format!("{}word", " ".repeat(4 << 20));
    assert_eq!(tok.encode_ids_limited(&spaces, &limit).unwrap(), [101, 102]);
    let strict = InputLimit {
        truncate: false,
        ..limit
    };
    assert!(matches!(
        tok.encode_ids_limited(&spaces, &strict),
        Err(Error::InputTooLarge { bytes, max: 1000, max_tokens: 16 }) if bytes == spaces.len()
    ));
    // A long text that settles early is too long, with a lower bound for its count.
    let long = "word ".repeat(1 << 20);
    assert!(matches!(
        tok.encode_ids_limited(&long, &strict),
        Err(Error::InputTooLong {
            tokens: TokenCount::MoreThan(16),
            max: 16
        })
    ));
    // A prompt that leaves no room, or ends in a long run read with every input, is refused.
    assert!(tok.prompt(&"word ".repeat(20), &limit).is_err());
    assert!(tok
        .prompt(&format!("a{}", " ".repeat(300)), &limit)
        .is_err());
}
