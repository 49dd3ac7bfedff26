//! Helpers shared by the integration tests: reference files and comparisons.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;

use serde_json::Value;
use streampool::{DType, Device};
use streampool_nn::{tiny_bert_dir, BertInput, BertModel, ComputeDType, SentenceEmbedder};

/// Parses `tests/data/<name>`.
pub fn reference(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn f64s(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

pub fn i64s(v: &Value) -> Vec<i64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_i64().expect("integer"))
        .collect()
}

/// A matrix stored as a list of rows, flattened.
pub fn rows(v: &Value) -> Vec<f64> {
    v.as_array().expect("rows").iter().flat_map(f64s).collect()
}

/// The reference sentences' texts.
pub fn texts(r: &Value) -> Vec<String> {
    r["sentences"]
        .as_array()
        .expect("sentences")
        .iter()
        .map(|s| s["text"].as_str().expect("text").to_string())
        .collect()
}

/// The reference batch exactly as stored (ids, mask, token types).
pub fn stored_input(r: &Value) -> BertInput {
    let s = r["sentences"].as_array().expect("sentences");
    let cat = |key: &str| s.iter().flat_map(|x| i64s(&x[key])).collect::<Vec<_>>();
    BertInput::new(
        cat("input_ids"),
        cat("attention_mask"),
        Some(cat("token_type_ids")),
        s.len(),
    )
    .expect("stored batch is well formed")
}

pub fn max_abs_diff(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y).abs())
        .fold(0.0, f64::max)
}

pub fn cosine(a: &[f32], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// `max |a - b| / max |b|`: the error relative to the reference's scale.
pub fn rel_err(a: &[f32], b: &[f64]) -> f64 {
    let scale = b.iter().map(|y| y.abs()).fold(0.0, f64::max);
    max_abs_diff(a, b) / scale.max(f64::MIN_POSITIVE)
}

/// Worst max-abs-diff and cosine of per-sentence embeddings `got` against the reference's
/// per-sentence field `key`.
pub fn compare_sentences(got: &[Vec<f32>], r: &Value, key: &str) -> (f64, f64) {
    let (mut d, mut c) = (0.0f64, 1.0f64);
    for (g, s) in got
        .iter()
        .zip(r["sentences"].as_array().expect("sentences"))
    {
        let want = f64s(&s[key]);
        d = d.max(max_abs_diff(g, &want));
        c = c.min(cosine(g, &want));
    }
    (d, c)
}

/// `&str`s of owned texts, as `SentenceEmbedder::embed` takes them.
pub fn refs(texts: &[String]) -> Vec<&str> {
    texts.iter().map(String::as_str).collect()
}

/// tiny-bert on `dev` against its float64 reference: every hidden state of the first
/// sentence (max abs diff < 1e-3) and the embeddings of all sentences (min cosine > 0.99999).
/// `label` names the backend in the printed figures.
pub fn check_tiny_bert_on(dev: &Device, label: &str) {
    let r = reference("tiny_bert_reference.json");
    let model = BertModel::load(dev, tiny_bert_dir()).unwrap();
    let states = model.forward_hidden_states(&stored_input(&r)).unwrap();
    for (i, (s, w)) in states
        .iter()
        .zip(r["first_sentence"]["hidden_states"].as_array().unwrap())
        .enumerate()
    {
        let got = s.narrow(0, 0, 1).unwrap().to_vec::<f32>().unwrap();
        let d = max_abs_diff(&got, &rows(w));
        println!("{label} tiny-bert hidden state {i}: max abs diff {d:.3e}");
        assert!(d < 1e-3, "hidden state {i}: max abs diff {d}");
    }
    let emb = SentenceEmbedder::load(dev, tiny_bert_dir()).unwrap();
    let got = emb.embed(&refs(&texts(&r))).unwrap();
    let (d, c) = compare_sentences(&got, &r, "embedding");
    println!("{label} tiny-bert embeddings: max abs diff {d:.3e}, min cosine {c:.12}");
    assert!(c > 0.99999, "min cosine {c}");
}

/// tiny-bert in `dtype` on `dev` against its float64 reference: the last hidden state of the
/// first sentence (max abs diff below `tol`) and every sentence's embedding (cosine at least
/// `min_cos`). `label` names the backend in the printed figures.
pub fn check_tiny_bert_dtype_on(
    dev: &Device,
    label: &str,
    dtype: ComputeDType,
    tol: f64,
    min_cos: f64,
) {
    let r = reference("tiny_bert_reference.json");
    let model = BertModel::load_with(dev, tiny_bert_dir(), dtype).unwrap();
    assert_eq!(model.dtype(), dtype);
    let last = model.forward(&stored_input(&r)).unwrap();
    assert_eq!(last.dtype(), dtype.dtype());
    let got = last
        .narrow(0, 0, 1)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let d = max_abs_diff(&got, &rows(&r["first_sentence"]["last_hidden_state"]));
    println!(
        "{label} tiny-bert {dtype}: last hidden state max abs diff {d:.3e} (tolerance {tol:.0e})"
    );
    assert!(d < tol, "{label} {dtype}: max abs diff {d}");
    let emb = SentenceEmbedder::load_with(dev, tiny_bert_dir(), dtype).unwrap();
    let got = emb.embed(&refs(&texts(&r))).unwrap();
    let mut worst = 1.0f64;
    for (i, (g, s)) in got
        .iter()
        .zip(r["sentences"].as_array().unwrap())
        .enumerate()
    {
        let c = cosine(g, &f64s(&s["embedding"]));
        assert!(c >= min_cos, "{label} {dtype} sentence {i}: cosine {c}");
        worst = worst.min(c);
    }
    println!("{label} tiny-bert {dtype}: min embedding cosine {worst:.8} (bound {min_cos})");
}
