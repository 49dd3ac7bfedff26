//! What the load generator sends: deterministic English-like sentences (a fixed seed, so
//! every run and every machine sends the same text) and the request bodies built from them.
//!
//! Every word is one WordPiece token in BERT's uncased vocabulary (all-MiniLM-L6-v2 and the
//! shipped tiny-bert share it), and a sentence is its words plus a full stop, so a sentence
//! of `n` words is `n + 3` tokens with `[CLS]` and `[SEP]`: short sentences are 10-16 tokens,
//! long ones exactly 128. `token_counts` checks this with a model's own tokenizer.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{json, Value};

/// Common English words, most frequent first, each one token in BERT's uncased vocabulary
/// (checked against `models/tiny-bert/tokenizer.json`; the corpus test re-checks the counts).
#[rustfmt::skip]
const WORDS: [&str; 256] = [
    "the", "of", "and", "to", "in", "is", "was", "he", "for", "it", "with", "as", "his", "on",
    "be", "at", "by", "had", "are", "but", "from", "or", "have", "an", "they", "which", "one",
    "you", "were", "her", "all", "she", "there", "would", "their", "we", "him", "been", "has",
    "when", "who", "will", "more", "no", "if", "out", "so", "said", "what", "up", "its", "about",
    "into", "than", "them", "can", "only", "other", "new", "some", "could", "time", "these",
    "two", "may", "then", "do", "first", "any", "my", "now", "such", "like", "our", "over", "man",
    "me", "even", "most", "made", "after", "also", "did", "many", "before", "must", "through",
    "back", "years", "where", "much", "your", "way", "well", "down", "should", "because", "each",
    "just", "those", "people", "how", "too", "little", "state", "good", "very", "make", "world",
    "still", "own", "see", "men", "work", "long", "get", "here", "between", "both", "life",
    "being", "under", "never", "day", "same", "another", "know", "while", "last", "might", "us",
    "great", "old", "year", "off", "come", "since", "against", "go", "came", "right", "used",
    "take", "three", "states", "himself", "few", "house", "use", "during", "without", "again",
    "place", "around", "however", "home", "small", "found", "thought", "went", "say", "part",
    "once", "general", "high", "upon", "school", "every", "does", "got", "left", "number",
    "course", "war", "until", "always", "away", "something", "fact", "though", "water", "less",
    "public", "put", "think", "almost", "hand", "enough", "far", "took", "head", "yet",
    "government", "system", "better", "set", "told", "nothing", "night", "end", "why", "called",
    "eyes", "find", "going", "look", "asked", "later", "knew", "point", "next", "program", "city",
    "business", "give", "group", "toward", "young", "days", "let", "room", "president", "side",
    "social", "given", "present", "several", "order", "national", "possible", "rather", "second",
    "face", "per", "among", "form", "important", "often", "things", "looked", "early", "white",
    "case", "become", "large", "big", "need", "four", "within", "felt", "along", "children",
    "saw", "best", "church", "ever",
];

/// Sentence lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Corpus {
    /// 10 to 16 tokens (7 to 13 words and a full stop).
    Short,
    /// Exactly 128 tokens (125 words and a full stop).
    Long,
    /// Long-tailed mixed lengths, 8 to 256 tokens (median 39, mean 70): sentence `i` has the
    /// token count of sentence `i` of `bench`'s `minilm-mix` workload, so a served run and
    /// the in-process packed forward of that workload do the same work.
    Mixed,
}

/// The fixed seed of every corpus.
const SEED: u64 = 0x5eed_1234_abcd_0019;

/// SplitMix64: a tiny, well-mixed deterministic generator (no dependency, same on every
/// platform).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform value in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `count` sentences of `corpus`, the same on every call. Words are drawn with a skew toward
/// the front of the list (index = 256 u^2), so frequent words recur as in real text.
pub fn sentences(corpus: Corpus, count: usize) -> Vec<String> {
    let mut rng = SplitMix(SEED ^ corpus as u64);
    let mixed = match corpus {
        Corpus::Mixed => crate::commands::bench::mix_lengths(count),
        _ => Vec::new(),
    };
    (0..count)
        .map(|i| {
            let words = match corpus {
                Corpus::Short => 7 + (rng.next() % 7) as usize,
                Corpus::Long => 125,
                // `[CLS]`, the full stop and `[SEP]` are the other three tokens.
                Corpus::Mixed => mixed[i].saturating_sub(3).max(1),
            };
            let mut s = String::with_capacity(words * 7);
            for k in 0..words {
                let u = rng.unit();
                let w = WORDS[((u * u) * WORDS.len() as f64) as usize % WORDS.len()];
                if k == 0 {
                    // Capitalized as a sentence starts; the uncased tokenizer lowercases it.
                    let mut c = w.chars();
                    if let Some(first) = c.next() {
                        s.extend(first.to_uppercase());
                        s.push_str(c.as_str());
                    }
                } else {
                    s.push(' ');
                    s.push_str(w);
                }
            }
            s.push('.');
            s
        })
        .collect()
}

/// Token counts (special tokens included) of `texts` under the `tokenizer.json` at `path`
/// (or in the folder `path`), as (min, mean, max).
pub fn token_counts(path: &Path, texts: &[String]) -> Result<(usize, f64, usize)> {
    let file = if path.is_dir() {
        path.join("tokenizer.json")
    } else {
        path.to_path_buf()
    };
    // A limit above any sentence here, so nothing is truncated while counting.
    let tok = streampool_nn::BertTokenizer::from_file(&file, 4096)
        .with_context(|| format!("loading {}", file.display()))?;
    let mut counts = Vec::with_capacity(texts.len());
    for t in texts {
        let enc = tok
            .inner()
            .encode(t.as_str(), true)
            .map_err(|e| anyhow::anyhow!("tokenizing {t:?}: {e}"))?;
        counts.push(enc.get_ids().len());
    }
    let min = counts.iter().copied().min().unwrap_or(0);
    let max = counts.iter().copied().max().unwrap_or(0);
    let mean = counts.iter().sum::<usize>() as f64 / counts.len().max(1) as f64;
    Ok((min, mean, max))
}

/// The embedding API a request goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Route {
    /// OpenAI `POST /v1/embeddings`: `{"input": ..., "model"?, "encoding_format"?}`.
    Openai,
    /// text-embeddings-inference `POST /embed`: `{"inputs": ...}`.
    Tei,
}

impl Route {
    /// The request path.
    pub fn path(self) -> &'static str {
        match self {
            Route::Openai => "/v1/embeddings",
            Route::Tei => "/embed",
        }
    }
}

/// How OpenAI's route answers each embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// A JSON list of floats.
    Float,
    /// Base64 of the little-endian f32 bytes.
    Base64,
}

/// The JSON body of one request over `inputs`: a single string when there is one input (the
/// common client shape), else a list.
pub fn body(route: Route, encoding: Encoding, model: Option<&str>, inputs: &[&str]) -> Vec<u8> {
    let input: Value = match inputs {
        [one] => json!(one),
        many => json!(many),
    };
    let v = match route {
        Route::Openai => {
            let mut v = json!({ "input": input });
            if let Some(m) = model {
                v["model"] = json!(m);
            }
            if encoding == Encoding::Base64 {
                v["encoding_format"] = json!("base64");
            }
            v
        }
        Route::Tei => json!({ "inputs": input }),
    };
    // Serializing a `Value` of strings cannot fail.
    serde_json::to_vec(&v).unwrap_or_default()
}

/// `pool` complete HTTP/1.1 requests (head and body) of `per_request` sentences each, taken
/// in turn from a corpus of `corpus`, ready to write as they are: the hot loop only writes
/// bytes.
pub fn requests(
    host: &str,
    route: Route,
    encoding: Encoding,
    model: Option<&str>,
    corpus: Corpus,
    per_request: usize,
    pool: usize,
) -> Vec<Vec<u8>> {
    let texts = sentences(corpus, (pool * per_request).clamp(1, 8192));
    (0..pool)
        .map(|r| {
            let inputs: Vec<&str> = (0..per_request)
                .map(|i| texts[(r * per_request + i) % texts.len()].as_str())
                .collect();
            let body = body(route, encoding, model, &inputs);
            let mut req = format!(
                "POST {} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {}\r\n\r\n",
                route.path(),
                body.len()
            )
            .into_bytes();
            req.extend_from_slice(&body);
            req
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences_are_fixed_and_tokenize_to_their_lengths() {
        assert_eq!(sentences(Corpus::Short, 50), sentences(Corpus::Short, 50));
        assert_ne!(
            sentences(Corpus::Short, 2)[0],
            sentences(Corpus::Short, 2)[1]
        );
        let tok = streampool_nn::tiny_bert_dir();
        let (min, mean, max) = token_counts(&tok, &sentences(Corpus::Short, 500)).unwrap();
        assert!(
            min >= 10 && max <= 16 && (12.0..14.0).contains(&mean),
            "{min} {mean} {max}"
        );
        let mixed = sentences(Corpus::Mixed, 64);
        let want = crate::commands::bench::mix_lengths(64);
        for (s, w) in mixed.iter().zip(&want) {
            let (n, _, _) = token_counts(&tok, std::slice::from_ref(s)).unwrap();
            assert_eq!(n, *w, "{s}");
        }
        let (min, _, max) = token_counts(&tok, &sentences(Corpus::Long, 100)).unwrap();
        assert_eq!((min, max), (128, 128));
    }

    #[test]
    fn bodies_have_the_shape_of_each_api() {
        let one: Value =
            serde_json::from_slice(&body(Route::Openai, Encoding::Float, None, &["a"])).unwrap();
        assert_eq!(one, json!({"input": "a"}));
        let v: Value = serde_json::from_slice(&body(
            Route::Openai,
            Encoding::Base64,
            Some("m"),
            &["a", "b"],
        ))
        .unwrap();
        assert_eq!(
            v,
            json!({"input": ["a", "b"], "model": "m", "encoding_format": "base64"})
        );
        let v: Value =
            serde_json::from_slice(&body(Route::Tei, Encoding::Float, None, &["a", "b"])).unwrap();
        assert_eq!(v, json!({"inputs": ["a", "b"]}));
        let reqs = requests("h:1", Route::Tei, Encoding::Float, None, Corpus::Long, 3, 4);
        assert_eq!(reqs.len(), 4);
        let text = String::from_utf8(reqs[1].clone()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("POST /embed HTTP/1.1\r\nHost: h:1\r\n"));
        assert!(head.ends_with(&format!("Content-Length: {}", body.len())));
    }
}
