//! Helpers shared by the integration tests: reference files, the crate's closeness measures
//! (max abs diff, cosine, relative error: every tolerance of the tests is one of these), and
//! [`in_own_process`] for a test that changes what a process has only one of.

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

/// `max |a - b|`, in f64, against a reference `b` in f64 or f32.
pub fn max_abs_diff<R: Copy + Into<f64>>(a: &[f32], b: &[R]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y.into()).abs())
        .fold(0.0, f64::max)
}

/// The cosine of the angle between `a` and `b` (in f64 or f32), computed in f64; 0 when
/// either is all zeros.
pub fn cosine<R: Copy + Into<f64>>(a: &[f32], b: &[R]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y.into()).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&y| y.into().powi(2)).sum::<f64>().sqrt();
    dot / (na * nb).max(1e-300)
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
/// `label` names the backend in the printed figures. For the GPU backends' modules.
#[cfg(any(feature = "cuda", feature = "wgpu"))]
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

/// Runs the test `name` (its path in this binary: `module::test`) alone in a child process of
/// this test binary and fails if it fails there; in that child, runs `body`. For a test that
/// changes what a process has only one of (an environment variable): the other tests of this
/// binary run in parallel in this process and would see the change.
pub fn in_own_process(name: &str, body: impl FnOnce()) {
    const CHILD: &str = "STREAMPOOL_NN_TEST_CHILD";
    if std::env::var_os(CHILD).is_some_and(|v| v == name) {
        return body();
    }
    let out = std::process::Command::new(std::env::current_exe().expect("this test binary"))
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, name)
        .output()
        .expect("start this test binary again");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    print!("{text}");
    assert!(
        out.status.success() && text.contains("test result: ok. 1 passed"),
        "{name} in its own process: {}",
        out.status
    );
}
