//! A real checkpoint (any supported family) against sentence-transformers' own f32
//! embeddings: cosine >= 0.99999 per sentence. Needs `STREAMPOOL_REAL_MODEL_DIR` (the model
//! folder) and `STREAMPOOL_REAL_MODEL_REF` (JSON from `scripts/real_model_reference.py`);
//! prints `SKIPPED` and passes without them (CI does not download these checkpoints:
//! `scripts/check-real-models.sh` runs it and keeps the log).

use crate::util::*;
use streampool::Device;
use streampool_nn::SentenceEmbedder;

#[test]
fn real_checkpoint_matches_sentence_transformers() {
    let (Some(dir), Some(reference)) = (
        std::env::var_os("STREAMPOOL_REAL_MODEL_DIR"),
        std::env::var_os("STREAMPOOL_REAL_MODEL_REF"),
    ) else {
        println!("SKIPPED: STREAMPOOL_REAL_MODEL_DIR / STREAMPOOL_REAL_MODEL_REF not set");
        return;
    };
    let text = std::fs::read_to_string(&reference).unwrap();
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    let emb = SentenceEmbedder::load(&Device::cpu(), &dir).unwrap();
    println!(
        "{}: family {:?}, pooling {:?}, dim {}, max tokens {}",
        std::path::Path::new(&dir).display(),
        emb.model().family(),
        emb.pooling(),
        emb.dim(),
        emb.tokenizer().max_len()
    );
    let texts = texts(&r);
    let got = emb.embed(&refs(&texts)).unwrap();
    let (d, c) = compare_sentences(&got, &r, "embedding");
    println!("f32 vs sentence-transformers: max abs diff {d:.3e}, min cosine {c:.9}");
    assert!(c >= 0.99999, "min cosine {c}");
    if let Some(name) = r["prompt_name"].as_str() {
        let got = emb
            .embed_with_prompt(&refs(&texts), Some(emb.prompt(name).unwrap()))
            .unwrap();
        let min = got
            .iter()
            .zip(r["prompted_embeddings"].as_array().unwrap())
            .map(|(g, w)| cosine(g, &f64s(w)))
            .fold(1.0, f64::min);
        println!("with prompt {name:?}: min cosine {min:.9}");
        assert!(min >= 0.99999, "prompted min cosine {min}");
    }
}
