//! all-MiniLM-L6-v2 against sentence-transformers (tests/data/minilm_reference.json).
//! Needs the model (scripts/fetch-minilm.sh); each test skips with a message when it is absent.

use crate::util::*;
use streampool::Device;
use streampool_nn::accuracy::{AccuracyThresholds, GateCache, GateSource, GATE_TOP_K};
use streampool_nn::{find_minilm, Activation, ComputeDType, LoadOptions, SentenceEmbedder};

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

/// The GELU of f16/bf16 layers: the tanh approximation (the default in half
/// precision, which CUDA computes in the GEMM epilogue) against BERT's erf form, both against
/// the fp32 sentence-transformers embeddings. The tanh form is used only if f16 keeps a
/// minimum cosine of 0.99999 to the reference; bf16's own rounding is coarser (its erf run is
/// below that already: 0.99995), so its bound is that the switch lowers that minimum by
/// under 1e-5. (Measured on this CPU backend, 2026-11-24: f16 0.99999834 tanh, 0.99999915
/// erf; bf16 0.99994999 tanh, 0.99995033 erf.)
#[test]
fn half_precision_gelu_forms() {
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
    let want: Vec<Vec<f64>> = r["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| f64s(&s["embedding"]))
        .collect();
    let min_cos = |a: &[Vec<f32>], b: &dyn Fn(usize) -> Vec<f64>| {
        a.iter()
            .enumerate()
            .map(|(i, g)| cosine(g, &b(i)))
            .fold(1.0f64, f64::min)
    };
    for dtype in [ComputeDType::F16, ComputeDType::Bf16] {
        let tanh = SentenceEmbedder::load_with(&Device::cpu(), &dir, dtype).expect("load MiniLM");
        assert_eq!(
            tanh.model().config().activation().unwrap(),
            Activation::Gelu,
            "MiniLM's config names the erf GELU"
        );
        let erf = SentenceEmbedder::new(
            tanh.tokenizer().clone(),
            tanh.model().with_mlp_activation(Activation::Gelu),
        )
        .unwrap();
        let (t, e) = (tanh.embed(&refs).unwrap(), erf.embed(&refs).unwrap());
        let t_ref = min_cos(&t, &|i| want[i].clone());
        let e_ref = min_cos(&e, &|i| want[i].clone());
        let t_e = min_cos(&t, &|i| e[i].iter().map(|&v| f64::from(v)).collect());
        println!(
            "MiniLM {dtype}, {} sentences: min cosine to fp32 sentence-transformers: tanh GELU \
             {t_ref:.8}, erf GELU {e_ref:.8}; tanh vs erf {t_e:.8}",
            t.len()
        );
        if dtype == ComputeDType::F16 {
            assert!(t_ref >= 0.99999, "f16 with tanh GELU: min cosine {t_ref}");
        }
        assert!(
            e_ref - t_ref < 1e-5,
            "{dtype}: tanh GELU lowers the min cosine from {e_ref} to {t_ref}"
        );
    }
}

/// MiniLM in int8 passes the accuracy gate against its f32 on the gate corpus (loading it
/// runs the gate and would refuse it otherwise; no cache, so this load measures).
#[test]
fn int8_passes_the_accuracy_gate() {
    let dir = match find_minilm() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            return;
        }
    };
    let opts = LoadOptions {
        dtype: ComputeDType::Int8,
        gate_cache: GateCache::Off,
        ..LoadOptions::default()
    };
    let emb = SentenceEmbedder::load_with_options(&Device::cpu(), dir, &opts)
        .expect("MiniLM int8 passes the gate");
    let report = emb.accuracy_report().expect("the gate ran");
    assert_eq!(emb.accuracy_source(), Some(GateSource::Measured));
    println!("MiniLM int8 vs f32: {report}");
    assert_eq!(report.k, GATE_TOP_K);
    assert!(report.passes(&AccuracyThresholds::default()));
}
