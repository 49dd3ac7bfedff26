//! Arbitrary bytes as `model.safetensors` next to a valid tiny `config.json`: opening the
//! file, reading every tensor, loading the whole model and (when it loads) one forward pass
//! must each return `Ok` or `Err`, never panic.
//!
//! The seed `seeds/safetensors_load/tiny.safetensors` is a valid file for [`CONFIG`]
//! (F32 tensors plus one F16 and one BF16), so mutations start close to the accepted format.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use streampool::Device;
use streampool_nn::{BertConfig, BertInput, BertModel, WeightFile};

/// A 1-layer, 4-wide BERT: small enough that a forward pass costs microseconds.
const CONFIG: &str = r#"{"vocab_size": 5, "hidden_size": 4, "num_hidden_layers": 1,
    "num_attention_heads": 2, "intermediate_size": 6, "max_position_embeddings": 3,
    "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12}"#;

/// One scratch directory per fuzzing process (libFuzzer runs inputs one after another).
fn scratch() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("streampool-fuzz-st-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the scratch directory");
        std::fs::write(dir.join("config.json"), CONFIG).expect("write config.json");
        dir
    })
}

fuzz_target!(|data: &[u8]| {
    let dir = scratch();
    let weights = dir.join("model.safetensors");
    std::fs::write(&weights, data).expect("write model.safetensors");
    let config = BertConfig::from_json(CONFIG).expect("the fixed config is valid");

    // The narrowest entry: header parsing, then each tensor read as whatever shape the
    // config expects for it and as a wrong shape.
    if let Ok(file) = WeightFile::open(&weights) {
        for name in file.names() {
            let _ = file.get(&name, &[config.hidden_size]);
            let _ = file.get(&name, &[config.vocab_size, config.hidden_size]);
            if let Ok(t) = file.get(&name, &[config.hidden_size, config.hidden_size]) {
                assert_eq!(t.data().len(), 16, "{name}: data does not fill its shape");
            }
        }
    }

    // The full model load, and a forward pass over in-range ids when it loads.
    let device = Device::cpu();
    if let Ok(model) = BertModel::load(&device, dir) {
        let input = BertInput::new(vec![0, 4, 2], vec![1, 1, 0], Some(vec![0, 1, 0]), 1)
            .expect("a well-formed input");
        if let Ok(out) = model.forward(&input) {
            assert_eq!(out.dims(), &[1, 3, 4]);
        }
    }
});
