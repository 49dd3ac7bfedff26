//! Bad files and bad inputs give `Err` with a message naming the problem, never a panic.

use std::path::{Path, PathBuf};

use safetensors::SafeTensors;

use crate::util::in_own_process;
use streampool::Device;
use streampool_nn::settings::Settings;
use streampool_nn::{
    find_minilm, tiny_bert_dir, BertConfig, BertInput, BertModel, BertTokenizer, ComputeDType,
    Error, SentenceEmbedder, WeightFile, MINILM_DIR_ENV,
};

/// A fresh folder holding a copy of tiny-bert's files, removed when dropped.
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("streampool-nn-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::fs::copy(tiny_bert_dir().join(f), dir.join(f)).unwrap();
    }
    Scratch(dir)
}

fn load_err(dir: &Path) -> String {
    let err = BertModel::load(&Device::cpu(), dir).unwrap_err();
    err.to_string()
}

fn set_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

#[test]
fn missing_files_are_named() {
    let msg = load_err(Path::new("/nonexistent/model"));
    assert!(msg.contains("/nonexistent/model/config.json"), "{msg}");

    let dir = scratch("missing");
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let msg = load_err(&dir);
    assert!(msg.contains("model.safetensors"), "{msg}");

    std::fs::copy(
        tiny_bert_dir().join("model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    let err = SentenceEmbedder::load(&Device::cpu(), &*dir).err().unwrap();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

#[test]
fn truncated_weights_are_rejected() {
    let dir = scratch("truncated");
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    for len in [4, 100, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&path, &bytes[..len]).unwrap();
        let err = WeightFile::open(&path).err().unwrap();
        assert!(
            matches!(err, Error::SafeTensors { .. }),
            "{len} bytes: {err:?}"
        );
        let msg = load_err(&dir);
        assert!(
            msg.contains("model.safetensors") && msg.contains("not a valid safetensors file"),
            "{len} bytes: {msg}"
        );
    }
}

#[test]
fn wrong_shapes_name_the_tensor_and_expected_shape() {
    let dir = scratch("shapes");
    set_config(&dir, |c| c["intermediate_size"] = 128.into());
    let msg = load_err(&dir);
    assert!(
        msg.contains("encoder.layer.0.intermediate.dense.weight")
            && msg.contains("[64, 32]")
            && msg.contains("expected [128, 32]"),
        "{msg}"
    );

    let dir = scratch("positions");
    set_config(&dir, |c| c["max_position_embeddings"] = 512.into());
    let msg = load_err(&dir);
    assert!(
        msg.contains("embeddings.position_embeddings.weight") && msg.contains("[512, 32]"),
        "{msg}"
    );
}

#[test]
fn missing_and_integer_tensors_are_named() {
    let dir = scratch("missing-tensor");
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let dropped = "encoder.layer.1.output.LayerNorm.bias";
    let kept: Vec<_> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != dropped)
        .collect();
    safetensors::serialize_to_file(kept, None, &path).unwrap();
    let msg = load_err(&dir);
    assert!(msg.contains(dropped) && msg.contains("missing"), "{msg}");

    let file = WeightFile::open(tiny_bert_dir().join("model.safetensors")).unwrap();
    let err = file.get("embeddings.position_ids", &[1, 128]).unwrap_err();
    assert!(err.to_string().contains("embeddings.position_ids"), "{err}");
    assert!(matches!(err, Error::TensorDType { .. }), "{err:?}");
}

#[test]
fn bad_configs_are_rejected() {
    let dir = scratch("bad-json");
    std::fs::write(dir.join("config.json"), "{ \"hidden_size\": ").unwrap();
    let msg = load_err(&dir);
    assert!(
        msg.contains("config.json") && msg.contains("invalid JSON"),
        "{msg}"
    );

    let dir = scratch("missing-key");
    set_config(&dir, |c| {
        c.as_object_mut().unwrap().remove("vocab_size");
    });
    let msg = load_err(&dir);
    assert!(msg.contains("vocab_size"), "{msg}");

    let cases: [(&str, serde_json::Value, &str); 4] = [
        ("num_attention_heads", 3.into(), "not a multiple"),
        ("hidden_act", "swish".into(), "swish"),
        (
            "position_embedding_type",
            "relative_key".into(),
            "relative_key",
        ),
        ("num_attention_heads", 0.into(), "num_attention_heads"),
    ];
    for (key, value, needle) in cases {
        let dir = scratch("bad-value");
        set_config(&dir, |c| c[key] = value.clone());
        let msg = load_err(&dir);
        assert!(
            msg.contains(needle) && msg.contains("config"),
            "{key}: {msg}"
        );
    }
    assert!(BertConfig::from_json("[]").is_err());
}

#[test]
fn bad_tokenizer_file_is_rejected() {
    let dir = scratch("tokenizer");
    std::fs::write(dir.join("tokenizer.json"), "{\"model\": 7}").unwrap();
    let err = BertTokenizer::from_file(dir.join("tokenizer.json"), 128)
        .err()
        .unwrap();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
    assert!(SentenceEmbedder::load(&Device::cpu(), &*dir).is_err());
}

#[test]
fn bad_inputs_are_errors() {
    let model = BertModel::load(&Device::cpu(), tiny_bert_dir()).unwrap();
    let vocab = model.config().vocab_size as i64;
    let out_of_range = BertInput::from_sequences(&[vec![101, vocab, 102]]).unwrap();
    let err = model.forward(&out_of_range).unwrap_err();
    assert!(err.to_string().contains(&vocab.to_string()), "{err}");

    let too_long = BertInput::from_sequences(&[vec![101; 129]]).unwrap();
    let err = model.forward(&too_long).unwrap_err();
    assert!(err.to_string().contains("128 positions"), "{err}");

    let bad_type = BertInput::new(vec![101, 102], vec![1, 1], Some(vec![0, 2]), 1).unwrap();
    assert!(model.forward(&bad_type).is_err());
    let bad_mask = BertInput::new(vec![101, 102], vec![1, 3], None, 1).unwrap();
    assert!(model.forward(&bad_mask).is_err());
    assert!(BertInput::new(vec![101, 102, 103], vec![1, 1, 1], None, 2).is_err());
    assert!(BertInput::new(vec![101, 102], vec![1], None, 1).is_err());
    assert!(BertInput::from_sequences(&[]).is_err());

    // The model still works after the errors.
    let ok = BertInput::from_sequences(&[vec![101, 102]]).unwrap();
    assert_eq!(model.forward(&ok).unwrap().dims(), &[1, 2, 32]);

    let emb = SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap();
    assert!(emb.embed(&[]).unwrap().is_empty());
    // Long texts are truncated to the model's positions, not rejected.
    let long = "word ".repeat(500);
    assert_eq!(emb.embed(&[&long]).unwrap()[0].len(), 32);
}

#[test]
fn find_minilm_reports_a_bad_override() {
    // In a process of its own: the settings are fixed once per process, and the other tests
    // of this binary look for the real model.
    in_own_process("errors::find_minilm_reports_a_bad_override", || {
        let mut s = Settings::from_env();
        s.minilm_dir = Some("/nonexistent/minilm".into());
        streampool_nn::settings::set(s).expect("the first use of the settings in this process");
        let err = find_minilm().unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains(MINILM_DIR_ENV) && msg.contains("/nonexistent/minilm"),
            "{msg}"
        );
    });
}

/// f16 activations past 65504 become infinities on store and NaN after layer norm: `embed`
/// reports that as an error naming the dtype instead of returning NaN vectors; the same
/// weights in f32 give finite unit vectors.
#[test]
fn half_precision_overflow_is_an_error_not_nan() {
    let dir = scratch("overflow");
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let scaled_name = "embeddings.word_embeddings.weight";
    // tiny-bert stores f16; the scaled table is written as f32 (its values, up to about
    // 1e6, fit f32 but not f16).
    let view = st.tensor(scaled_name).unwrap();
    assert_eq!(view.dtype(), safetensors::Dtype::F16);
    let shape = view.shape().to_vec();
    let scaled: Vec<u8> = view
        .data()
        .chunks_exact(2)
        .flat_map(|b| (half::f16::from_le_bytes([b[0], b[1]]).to_f32() * 1e7).to_le_bytes())
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            if name == scaled_name {
                let v = safetensors::tensor::TensorView::new(
                    safetensors::Dtype::F32,
                    shape.clone(),
                    &scaled,
                )
                .unwrap();
                (name, v)
            } else {
                (name, view)
            }
        })
        .collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();

    let texts = ["an input that overflows in f16"];
    let f32_emb = SentenceEmbedder::load_with(&Device::cpu(), &*dir, ComputeDType::F32).unwrap();
    let v = f32_emb.embed(&texts).unwrap();
    assert!(v[0].iter().all(|x| x.is_finite()), "f32 stays finite");

    let f16_emb = SentenceEmbedder::load_with(&Device::cpu(), &*dir, ComputeDType::F16).unwrap();
    let err = f16_emb.embed(&texts).unwrap_err();
    assert!(matches!(err, Error::NonFinite(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("f16") && msg.contains("bf16 or f32"), "{msg}");
}
