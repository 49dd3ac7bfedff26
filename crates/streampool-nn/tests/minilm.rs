//! all-MiniLM-L6-v2 against sentence-transformers (tests/data/minilm_reference.json).
//! Needs the model (scripts/fetch-minilm.sh); each test skips with a message when it is absent.

mod common;

use common::*;
use streampool::Device;
use streampool_nn::{find_minilm, ComputeDType, SentenceEmbedder};

/// The installed model, or `None` after printing why the test is skipped.
fn minilm() -> Option<SentenceEmbedder> {
    match find_minilm() {
        Ok(dir) => Some(SentenceEmbedder::load(&Device::cpu(), dir).expect("load MiniLM")),
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            None
        }
    }
}

#[test]
fn embeddings_match_sentence_transformers() {
    let Some(emb) = minilm() else { return };
    let r = reference("minilm_reference.json");
    let texts = texts(&r);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let input = emb.tokenize(&refs).unwrap();
    assert_eq!(
        input,
        stored_input(&r),
        "token ids differ from the reference"
    );
    let got = emb.embed(&refs).unwrap();
    let (mut worst_d, mut worst_c) = (0.0f64, 1.0f64);
    for (i, (g, s)) in got
        .iter()
        .zip(r["sentences"].as_array().unwrap())
        .enumerate()
    {
        let want = f64s(&s["embedding"]);
        let (d, c) = (max_abs_diff(g, &want), cosine(g, &want));
        assert!(c > 0.9999, "sentence {i}: cosine {c}");
        worst_d = worst_d.max(d);
        worst_c = worst_c.min(c);
    }
    println!("MiniLM embeddings: max abs diff {worst_d:.3e}, min cosine {worst_c:.12} (1 - cos = {:.2e})", 1.0 - worst_c);
    assert!(worst_d < 1e-4, "max abs diff {worst_d}");
}

#[test]
fn first_sentence_token_embeddings_match() {
    let Some(emb) = minilm() else { return };
    let r = reference("minilm_reference.json");
    let text = texts(&r)[0].clone();
    let input = emb.tokenize(&[&text]).unwrap();
    let hidden = emb
        .model()
        .forward(&input)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let want = rows(&r["first_sentence"]["last_hidden_state"]);
    let d = max_abs_diff(&hidden, &want);
    println!("MiniLM first sentence last_hidden_state: max abs diff {d:.3e}");
    assert!(d < 1e-3, "max abs diff {d}");
}

/// f16 and bf16 (weights converted at load, fused attention and pooling) against the fp32
/// sentence-transformers reference: cosine >= 0.999 (f16) and >= 0.998 (bf16) per sentence.
#[test]
fn half_precision_embeddings_match_sentence_transformers() {
    let dir = match find_minilm() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            return;
        }
    };
    let r = reference("minilm_reference.json");
    let texts = texts(&r);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    for (dtype, bound) in [(ComputeDType::F16, 0.999), (ComputeDType::Bf16, 0.998)] {
        let emb = SentenceEmbedder::load_with(&Device::cpu(), &dir, dtype).expect("load MiniLM");
        let got = emb.embed(&refs).unwrap();
        let mut worst = 1.0f64;
        for (i, (g, s)) in got
            .iter()
            .zip(r["sentences"].as_array().unwrap())
            .enumerate()
        {
            let c = cosine(g, &f64s(&s["embedding"]));
            assert!(c >= bound, "{dtype} sentence {i}: cosine {c} < {bound}");
            worst = worst.min(c);
        }
        println!(
            "MiniLM {dtype}: min cosine over {} sentences {worst:.8} (bound {bound})",
            got.len()
        );
    }
}
