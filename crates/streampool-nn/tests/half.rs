//! models/tiny-bert in f16, bf16 and tf32 against the float64 numpy reference
//! (tests/data/tiny_bert_reference.json). Tolerances are a few times the measured error
//! (printed with `--nocapture`): storage rounding is 2^-11 (f16) and 2^-8 (bf16) relative.

mod common;

use common::*;
use streampool::Device;
use streampool_nn::{tiny_bert_dir, BertModel, ComputeDType};

/// (dtype, max abs diff of the last hidden state, min embedding cosine).
const CASES: [(ComputeDType, f64, f64); 3] = [
    (ComputeDType::Tf32, 1e-4, 0.99999),
    (ComputeDType::F16, 1e-2, 0.9999),
    (ComputeDType::Bf16, 1e-1, 0.999),
];

#[test]
fn tiny_bert_matches_reference_in_every_dtype() {
    for (dtype, tol, min_cos) in CASES {
        check_tiny_bert_dtype_on(&Device::cpu(), "cpu", dtype, tol, min_cos);
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
