//! models/tiny-bert in f16, bf16 and tf32 against the float64 numpy reference
//! (tests/data/tiny_bert_reference.json). Tolerances are a few times the measured error
//! (printed with `--nocapture`): storage rounding is 2^-11 (f16) and 2^-8 (bf16) relative.

mod common;

use common::*;
use streampool::{DType, Device};
use streampool_nn::{tiny_bert_dir, BertModel, ComputeDType, SentenceEmbedder};

/// (dtype, max abs diff of the last hidden state, min embedding cosine).
const CASES: [(ComputeDType, f64, f64); 3] = [
    (ComputeDType::Tf32, 1e-4, 0.99999),
    (ComputeDType::F16, 1e-2, 0.9999),
    (ComputeDType::Bf16, 1e-1, 0.999),
];

#[test]
fn last_hidden_state_matches_reference_in_every_dtype() {
    let r = reference("tiny_bert_reference.json");
    let input = stored_input(&r);
    let want = rows(&r["first_sentence"]["last_hidden_state"]);
    for (dtype, tol, _) in CASES {
        let model = BertModel::load_with(&Device::cpu(), tiny_bert_dir(), dtype).unwrap();
        assert_eq!(model.dtype(), dtype);
        let last = model.forward(&input).unwrap();
        assert_eq!(last.dtype(), dtype.dtype());
        let got = last
            .narrow(0, 0, 1)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let d = max_abs_diff(&got, &want);
        println!("tiny-bert {dtype}: last hidden state max abs diff {d:.3e} (tolerance {tol:.0e})");
        assert!(d < tol, "{dtype}: max abs diff {d}");
    }
}

#[test]
fn embeddings_match_reference_in_every_dtype() {
    let r = reference("tiny_bert_reference.json");
    let texts = texts(&r);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    for (dtype, _, min_cos) in CASES {
        let emb = SentenceEmbedder::load_with(&Device::cpu(), tiny_bert_dir(), dtype).unwrap();
        let got = emb.embed(&refs).unwrap();
        let mut worst = 1.0f64;
        for (i, (g, s)) in got
            .iter()
            .zip(r["sentences"].as_array().unwrap())
            .enumerate()
        {
            let c = cosine(g, &f64s(&s["embedding"]));
            assert!(c >= min_cos, "{dtype} sentence {i}: cosine {c}");
            worst = worst.min(c);
        }
        println!("tiny-bert {dtype}: min embedding cosine {worst:.8} (bound {min_cos})");
    }
}

#[test]
fn a_half_model_cannot_be_converted_again_and_names_parse() {
    let model = BertModel::load_with(&Device::cpu(), tiny_bert_dir(), ComputeDType::F16).unwrap();
    assert!(model.with_dtype(ComputeDType::Bf16).is_err());
    assert_eq!(
        model.with_dtype(ComputeDType::F16).unwrap().dtype(),
        ComputeDType::F16
    );
    for d in ComputeDType::ALL {
        assert_eq!(d.name().parse::<ComputeDType>().unwrap(), d);
    }
    assert_eq!(
        BertModel::load(&Device::cpu(), tiny_bert_dir())
            .unwrap()
            .dtype(),
        ComputeDType::F32
    );
}
