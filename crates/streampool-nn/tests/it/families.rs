//! The model families past BERT (XLM-RoBERTa, MPNet, GTE, NomicBERT, ModernBERT, Qwen3) and
//! the classification heads
//! (reranker, classifier), on their tiny checkpoints (`models/tiny-*`, made by
//! `scripts/make_tiny_models.py`) against float64 outputs of Hugging Face `transformers`
//! (`tests/data/tiny_models_reference.json`, `scripts/tiny_models_reference.py`): token ids,
//! hidden states, pooled embeddings with and without prompts, logits. f32 must be within
//! 1e-4 relative; f16 and bf16 (CPU backend, the same contract as the CUDA kernels) within a
//! few times their storage rounding.

use crate::util::*;
use serde_json::Value;
use streampool::Device;
use streampool_nn::pooling::PoolingMode;
use streampool_nn::{
    tiny_model_dir, BertModel, Classifier, ComputeDType, Family, Reranker, SentenceEmbedder,
};

const EMBEDDERS: [(&str, Family, PoolingMode); 6] = [
    ("tiny-xlmr", Family::Roberta, PoolingMode::Cls),
    ("tiny-mpnet", Family::MPNet, PoolingMode::Mean),
    ("tiny-gte", Family::Gte, PoolingMode::Cls),
    ("tiny-nomic", Family::NomicBert, PoolingMode::Mean),
    ("tiny-modernbert", Family::ModernBert, PoolingMode::Mean),
    ("tiny-qwen3", Family::Qwen3, PoolingMode::LastToken),
];

fn model_ref(name: &str) -> Value {
    reference("tiny_models_reference.json")["models"][name].clone()
}

/// The real tokens of each row of a padded batch (ids where the mask is 1), wherever the
/// padding is.
fn unpadded(ids: &[i64], mask: &[i64], seq: usize) -> Vec<Vec<i64>> {
    ids.chunks_exact(seq)
        .zip(mask.chunks_exact(seq))
        .map(|(i, m)| {
            i.iter()
                .zip(m)
                .filter(|(_, &m)| m == 1)
                .map(|(&i, _)| i)
                .collect()
        })
        .collect()
}

#[test]
fn families_are_picked_from_config() {
    for (name, family, mode) in EMBEDDERS {
        let emb = SentenceEmbedder::load(&Device::cpu(), tiny_model_dir(name)).unwrap();
        assert_eq!(emb.model().family(), family, "{name}");
        assert_eq!(emb.pooling().mode, mode, "{name}");
        assert!(emb.pooling().normalize, "{name}");
    }
}

#[test]
fn tokenizers_reproduce_reference_ids() {
    for (name, _, _) in EMBEDDERS {
        let r = model_ref(name);
        let emb = SentenceEmbedder::load(&Device::cpu(), tiny_model_dir(name)).unwrap();
        let got = emb.tokenize(&refs(&texts(&r))).unwrap();
        let s = r["sentences"].as_array().unwrap();
        let want: Vec<Vec<i64>> = s
            .iter()
            .map(|x| {
                let (i, m) = (i64s(&x["input_ids"]), i64s(&x["attention_mask"]));
                unpadded(&i, &m, i.len()).remove(0)
            })
            .collect();
        let got = unpadded(got.input_ids(), got.attention_mask(), got.seq_len());
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn hidden_states_match_transformers_in_f32() {
    for (name, _, _) in EMBEDDERS {
        let r = model_ref(name);
        let emb = SentenceEmbedder::load(&Device::cpu(), tiny_model_dir(name)).unwrap();
        let input = emb.tokenize(&refs(&texts(&r))).unwrap();
        let hidden = emb.model().forward(&input).unwrap();
        let (seq, h) = (input.seq_len(), emb.dim());
        for (i, s) in r["sentences"].as_array().unwrap().iter().enumerate() {
            let Some(want) = s.get("last_hidden_state") else {
                continue;
            };
            let row = hidden.narrow(0, i, 1).unwrap().to_vec::<f32>().unwrap();
            let mask = &input.attention_mask()[i * seq..(i + 1) * seq];
            let got: Vec<f32> = row
                .chunks_exact(h)
                .zip(mask)
                .filter(|(_, &m)| m == 1)
                .flat_map(|(r, _)| r.to_vec())
                .collect();
            let e = rel_err(&got, &rows(want));
            println!("{name} sentence {i} last_hidden_state: rel err {e:.2e}");
            assert!(e < 1e-4, "{name} sentence {i}: rel err {e}");
        }
    }
}

#[test]
fn embeddings_match_transformers_in_f32_with_and_without_prompts() {
    for (name, _, _) in EMBEDDERS {
        let r = model_ref(name);
        let emb = SentenceEmbedder::load(&Device::cpu(), tiny_model_dir(name)).unwrap();
        let texts = texts(&r);
        let got = emb.embed(&refs(&texts)).unwrap();
        let (d, c) = compare_sentences(&got, &r, "embedding");
        println!("{name} embeddings: max abs diff {d:.2e}, min cosine {c:.12}");
        assert!(
            d < 1e-4 && c > 0.99999,
            "{name}: max abs diff {d}, min cosine {c}"
        );
        if let Some(prompt_name) = r["prompt_name"].as_str() {
            let prompt = emb.prompt(prompt_name).unwrap();
            assert_eq!(prompt, r["prompt"].as_str().unwrap());
            let got = emb.embed_with_prompt(&refs(&texts), Some(prompt)).unwrap();
            let want = r["prompted_embeddings"].as_array().unwrap();
            for (g, w) in got.iter().zip(want) {
                let (d, c) = (max_abs_diff(g, &f64s(w)), cosine(g, &f64s(w)));
                assert!(d < 1e-4 && c > 0.99999, "{name} prompted: {d}, {c}");
            }
            // The prompt changes the vectors (it is part of the pooled tokens).
            let plain = emb.embed(&refs(&texts)).unwrap();
            assert!(
                max_abs_diff(
                    &got[0],
                    &plain[0].iter().map(|&x| x as f64).collect::<Vec<_>>()
                ) > 1e-3
            );
        }
    }
}

#[test]
fn a_sentence_alone_matches_its_row_in_a_padded_batch() {
    // Padding (right for these, however the model's own tokenizer pads) must not reach real
    // tokens: causal, rotary and relative-bias models included.
    for (name, _, _) in EMBEDDERS {
        let r = model_ref(name);
        let emb = SentenceEmbedder::load(&Device::cpu(), tiny_model_dir(name)).unwrap();
        let text = texts(&r)[1].clone(); // "Hello!", the shortest but one
        let alone = &emb.embed(&[&text]).unwrap()[0];
        let d = max_abs_diff(alone, &f64s(&r["sentences"][1]["embedding"]));
        assert!(d < 1e-4, "{name}: {d}");
    }
}

#[test]
fn half_precision_stays_within_its_rounding() {
    // (dtype, max abs diff of unit embeddings, min cosine)
    let cases = [
        (ComputeDType::F16, 5e-3, 0.9999),
        (ComputeDType::Bf16, 5e-2, 0.999),
    ];
    for (name, _, _) in EMBEDDERS {
        let r = model_ref(name);
        for (dtype, tol, min_cos) in cases {
            let emb =
                SentenceEmbedder::load_with(&Device::cpu(), tiny_model_dir(name), dtype).unwrap();
            let got = emb.embed(&refs(&texts(&r))).unwrap();
            let (d, c) = compare_sentences(&got, &r, "embedding");
            println!("{name} {dtype}: max abs diff {d:.2e}, min cosine {c:.8}");
            assert!(d < tol && c > min_cos, "{name} {dtype}: {d}, {c}");
        }
    }
}

/// Logits of `r`'s batch against its float64 logits: the worst error relative to the
/// largest logit.
fn logits_err(got: &[Vec<f32>], r: &Value) -> f64 {
    let got: Vec<f32> = got.concat();
    let want = rows(&r["logits"]);
    rel_err(&got, &want)
}

#[test]
fn classifier_logits_match_transformers() {
    let r = model_ref("tiny-bert-classifier");
    let dir = tiny_model_dir("tiny-bert-classifier");
    let c = Classifier::load(&Device::cpu(), &dir).unwrap();
    assert_eq!(c.model().family(), Family::Bert);
    let labels: Vec<String> = (0..3)
        .map(|i| r["id2label"][i.to_string()].as_str().unwrap().to_string())
        .collect();
    assert_eq!(c.labels(), labels.as_slice());
    let texts: Vec<String> = r["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    let e = logits_err(&c.logits(&refs(&texts)).unwrap(), &r);
    println!("classifier logits: rel err {e:.2e}");
    assert!(e < 1e-4, "rel err {e}");
    let p = c.predict(&refs(&texts)).unwrap();
    assert!(p.iter().all(|s| (s.iter().sum::<f32>() - 1.0).abs() < 1e-5));
    for (dtype, tol) in [(ComputeDType::F16, 1e-2), (ComputeDType::Bf16, 1e-1)] {
        let c = Classifier::load_with(&Device::cpu(), &dir, dtype).unwrap();
        let e = logits_err(&c.logits(&refs(&texts)).unwrap(), &r);
        println!("classifier logits {dtype}: rel err {e:.2e}");
        assert!(e < tol, "{dtype}: rel err {e}");
    }
}

#[test]
fn reranker_scores_match_transformers() {
    let r = model_ref("tiny-xlmr-reranker");
    let dir = tiny_model_dir("tiny-xlmr-reranker");
    let rr = Reranker::load(&Device::cpu(), &dir).unwrap();
    assert_eq!(rr.classifier().model().family(), Family::Roberta);
    let query = r["query"].as_str().unwrap();
    let texts: Vec<String> = r["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    // The pair encoding is the reference's, token for token.
    let pairs: Vec<(&str, &str)> = texts.iter().map(|t| (query, t.as_str())).collect();
    let input = rr.classifier().tokenizer().encode_pairs(&pairs).unwrap();
    let want_ids: Vec<Vec<i64>> = r["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(i64s)
        .collect();
    let want_mask: Vec<Vec<i64>> = r["attention_mask"]
        .as_array()
        .unwrap()
        .iter()
        .map(i64s)
        .collect();
    let want: Vec<Vec<i64>> = want_ids
        .iter()
        .zip(&want_mask)
        .map(|(i, m)| unpadded(i, m, i.len()).remove(0))
        .collect();
    assert_eq!(
        unpadded(input.input_ids(), input.attention_mask(), input.seq_len()),
        want
    );
    let raw = rr.scores(query, &refs(&texts), true).unwrap();
    let e = logits_err(&raw.iter().map(|&x| vec![x]).collect::<Vec<_>>(), &r);
    println!("reranker logits: rel err {e:.2e}");
    assert!(e < 1e-4, "rel err {e}");
    let s = rr.scores(query, &refs(&texts), false).unwrap();
    for (p, l) in s.iter().zip(&raw) {
        assert!((p - 1.0 / (1.0 + (-l).exp())).abs() < 1e-6);
    }
}

#[test]
fn models_without_a_head_are_not_classifiers_and_families_check_their_configs() {
    let dev = Device::cpu();
    assert!(Classifier::load(&dev, tiny_model_dir("tiny-xlmr")).is_err());
    assert!(Reranker::load(&dev, tiny_model_dir("tiny-bert-classifier")).is_err()); // 3 labels
    let m = BertModel::load(&dev, tiny_model_dir("tiny-xlmr")).unwrap();
    // RoBERTa positions start at pad_token_id + 1: 66 rows, 64 usable.
    assert_eq!(m.max_positions(), 64);
    let too_long = streampool_nn::BertInput::from_sequences(&[vec![0; 65]]).unwrap();
    assert!(m.forward(&too_long).is_err());
    // NomicBERT's own configs use GPT-2's keys.
    let nomic = streampool_nn::BertConfig::from_json(
        r#"{"model_type": "nomic_bert", "architectures": ["NomicBertModel"], "vocab_size": 30528,
            "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": 3072, "n_positions": 8192,
            "activation_function": "swiglu", "layer_norm_epsilon": 1e-12, "rotary_emb_base": 1000,
            "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": false, "prenorm": false,
            "qkv_proj_bias": false, "type_vocab_size": 2}"#,
    )
    .unwrap();
    assert_eq!(nomic.family().unwrap(), Family::NomicBert);
    assert_eq!(
        (nomic.hidden_size, nomic.intermediate_size, nomic.head_dim()),
        (768, 3072, 64)
    );
    assert_eq!(nomic.rope_base().unwrap(), 1000.0);
    // ModernBERT's older configs: every third layer global, one rotary base per kind.
    let modern = streampool_nn::BertConfig::from_json(
        r#"{"model_type": "modernbert", "vocab_size": 50368, "hidden_size": 768,
            "num_hidden_layers": 22, "num_attention_heads": 12, "intermediate_size": 1152,
            "max_position_embeddings": 8192, "hidden_activation": "gelu", "norm_eps": 1e-5,
            "global_attn_every_n_layers": 3, "local_attention": 128,
            "global_rope_theta": 160000.0, "local_rope_theta": 10000.0}"#,
    )
    .unwrap();
    assert_eq!(modern.family().unwrap(), Family::ModernBert);
    let sliding: Vec<bool> = (0..6).map(|i| modern.is_sliding_layer(i)).collect();
    assert_eq!(sliding, [false, true, true, false, true, true]);
    assert_eq!(modern.sliding_half_window(), 64);
    assert_eq!(modern.rope_base_of(false).unwrap(), 160000.0);
    assert_eq!(modern.rope_base_of(true).unwrap(), 10000.0);
    assert_eq!(modern.layer_norm_eps, 1e-5);
    for bad in [
        r#"{"model_type": "nomic_bert", "vocab_size": 10, "n_embd": 8, "n_layer": 1, "n_head": 2,
            "n_inner": 16, "n_positions": 8, "activation_function": "swiglu",
            "rotary_emb_fraction": 0.5}"#,
        r#"{"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 8}"#,
        r#"{"model_type": "qwen3", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 3, "num_key_value_heads": 2, "head_dim": 4,
            "intermediate_size": 16, "max_position_embeddings": 8, "hidden_act": "silu"}"#,
        r#"{"model_type": "gte", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 8,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 10.0}}"#,
    ] {
        assert!(streampool_nn::BertConfig::from_json(bad).is_err(), "{bad}");
    }
}

/// A scratch copy of a tiny model folder whose sentence-transformers files a test rewrites.
fn scratch_copy(name: &str, tag: &str) -> std::path::PathBuf {
    let src = tiny_model_dir(name);
    let dst = std::env::temp_dir().join(format!("sp-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(dst.join("1_Pooling")).unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "modules.json",
        "1_Pooling/config.json",
        "config_sentence_transformers.json",
    ] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    dst
}

#[test]
fn pooling_and_prompt_files_are_read_and_checked() {
    let dev = Device::cpu();
    // No Normalize module: raw CLS vectors (not unit length).
    let dir = scratch_copy("tiny-xlmr", "nonorm");
    let modules = r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
        {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"}]"#;
    std::fs::write(dir.join("modules.json"), modules).unwrap();
    // A default prompt: applied when a call names none.
    std::fs::write(
        dir.join("config_sentence_transformers.json"),
        r#"{"prompts": {"query": "query: "}, "default_prompt_name": "query"}"#,
    )
    .unwrap();
    let emb = SentenceEmbedder::load(&dev, &dir).unwrap();
    assert!(!emb.pooling().normalize);
    assert_eq!(emb.default_prompt(), Some("query: "));
    let v = emb.embed(&["paris"]).unwrap().remove(0);
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() > 1e-3, "norm {norm}");
    let explicit = emb
        .embed_with_prompt(&["paris"], Some("query: "))
        .unwrap()
        .remove(0);
    assert_eq!(v, explicit);
    assert!(emb.resolve_prompt(Some("query"), Some("x")).is_err());
    assert!(emb
        .prompt("passage")
        .unwrap_err()
        .to_string()
        .contains("query"));
    // Unsupported pooling modes and a default naming no prompt are errors at load.
    for (file, text) in [
        (
            "1_Pooling/config.json",
            r#"{"pooling_mode_max_tokens": true, "pooling_mode_mean_tokens": false}"#,
        ),
        (
            "1_Pooling/config.json",
            r#"{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": true}"#,
        ),
        (
            "config_sentence_transformers.json",
            r#"{"prompts": {}, "default_prompt_name": "query"}"#,
        ),
    ] {
        let dir = scratch_copy("tiny-xlmr", "bad");
        std::fs::write(dir.join(file), text).unwrap();
        let err = SentenceEmbedder::load(&dev, &dir).err().expect(text);
        println!("{text}: {err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn half_precision_takes_the_fused_attention_where_it_covers_the_family() {
    // BERT/RoBERTa and GTE (rotary applied to the fused projection first) run the fused
    // kernel in f16/bf16; MPNet (score bias) and Qwen3 (causal, grouped-query, q/k norms)
    // run matmul + softmax + matmul. On the CPU f32 takes the same paths (its fused kernel
    // runs f32 too); on GPUs f32 stays unfused.
    let dev = Device::cpu();
    for (name, fused) in [
        ("tiny-xlmr", true),
        ("tiny-gte", true),
        ("tiny-nomic", true),
        ("tiny-modernbert", false),
        ("tiny-mpnet", false),
        ("tiny-qwen3", false),
    ] {
        let m = BertModel::load_with(&dev, tiny_model_dir(name), ComputeDType::F16).unwrap();
        assert_eq!(m.fused_attention(), fused, "{name}");
        let m = BertModel::load(&dev, tiny_model_dir(name)).unwrap();
        assert_eq!(m.fused_attention(), fused, "{name} f32 on the CPU");
    }
}
