//! Arbitrary bytes as `config.json` with the real tiny-bert weights: JSON parsing,
//! validation, the model load and (when it loads) one forward pass must each return `Ok` or
//! `Err`, never panic. The seed is tiny-bert's own `config.json`.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use streampool::Device;
use streampool_nn::{BertConfig, BertInput, BertModel};

/// One scratch directory per fuzzing process.
fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("streampool-fuzz-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the scratch directory");
        dir
    })
}

fn tiny_bert_weights() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/tiny-bert/model.safetensors")
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = BertConfig::from_json(text);
    }
    let path = scratch().join("config.json");
    std::fs::write(&path, data).expect("write config.json");
    let Ok(config) = BertConfig::from_file(&path) else {
        return;
    };
    let device = Device::cpu();
    if let Ok(model) = BertModel::load_weights(&device, &config, tiny_bert_weights()) {
        // Ids inside tiny-bert's vocabulary; position and type ids inside its tables.
        let input = BertInput::new(vec![101, 2023, 102], vec![1, 1, 1], None, 1)
            .expect("a well-formed input");
        if let Ok(out) = model.forward(&input) {
            assert_eq!(out.dims(), &[1, 3, config.hidden_size]);
        }
    }
});
