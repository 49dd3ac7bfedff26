//! The models on the wgpu backend (feature `wgpu`): tiny-bert and all-MiniLM-L6-v2 against
//! their references (lavapipe in CI, NVIDIA's Vulkan driver on the H100). Skips loudly where
//! no wgpu adapter exists at all.

use crate::util::*;
use streampool::{DType, Device};
use streampool_nn::{find_minilm, tiny_bert_dir, BertModel, ComputeDType, SentenceEmbedder};

fn gpu() -> Option<Device> {
    match Device::wgpu() {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("!!! NO WGPU ADAPTER, SKIPPED: {e}");
            None
        }
    }
}

#[test]
fn tiny_bert_on_wgpu_matches_reference() {
    let Some(dev) = gpu() else { return };
    check_tiny_bert_on(&dev, "wgpu");
}

/// On Mesa's software Vulkan (llvmpipe) MiniLM takes over two minutes on CI's two cores, so
/// there it runs only with `STREAMPOOL_WGPU_MINILM=1` (it passed so: max abs diff 1.6e-7,
/// cosine 1 - 1e-12, on 2026-11-23); on GPUs it always runs.
#[test]
fn minilm_on_wgpu_matches_sentence_transformers() {
    let Some(dev) = gpu() else { return };
    if dev.name().contains("llvmpipe")
        && std::env::var("STREAMPOOL_WGPU_MINILM").as_deref() != Ok("1")
    {
        eprintln!(
            "SKIPPED on {} (software Vulkan, slow): set STREAMPOOL_WGPU_MINILM=1 to run",
            dev.name()
        );
        return;
    }
    let dir = match find_minilm() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            return;
        }
    };
    let r = reference("minilm_reference.json");
    let emb = SentenceEmbedder::load(&dev, &dir).unwrap();
    let got = emb.embed(&refs(&texts(&r))).unwrap();
    let (d, c) = compare_sentences(&got, &r, "embedding");
    println!(
        "wgpu MiniLM ({}) on {}: max abs diff {d:.3e}, min cosine {c:.12}",
        dir.display(),
        dev.name()
    );
    assert!(c >= 0.9999, "min cosine {c}");
    // f16 (weights converted at load), where the adapter has SHADER_F16: half precision's
    // bound for embeddings (cosine 0.999), per sentence.
    if has_f16(&dev) {
        let emb = SentenceEmbedder::load_with(&dev, &dir, ComputeDType::F16).unwrap();
        let got = emb.embed(&refs(&texts(&r))).unwrap();
        let (d, c) = compare_sentences(&got, &r, "embedding");
        println!(
            "wgpu MiniLM f16 on {}: max abs diff {d:.3e}, min cosine {c:.12}",
            dev.name()
        );
        assert!(c >= 0.999, "f16 min cosine {c}");
    }
}

/// Whether the device computes in F16 (its adapter has `SHADER_F16`); says so loudly if not.
fn has_f16(dev: &Device) -> bool {
    let ok = streampool::Tensor::zeros(&[1], dev)
        .and_then(|t| t.to_dtype(DType::F16))
        .is_ok();
    if !ok {
        eprintln!(
            "!!! {} has no SHADER_F16: the F16 model checks are SKIPPED",
            dev.name()
        );
    }
    ok
}

/// tiny-bert in f16 (WGSL `enable f16`: fused attention and mean-pool kernels, f32
/// statistics) and tf32 (full f32 on wgpu) against the float64 reference, with the CPU
/// backend's bounds (`half.rs`).
#[test]
fn tiny_bert_f16_and_tf32_on_wgpu_match_reference() {
    let Some(dev) = gpu() else { return };
    check_tiny_bert_dtype_on(&dev, "wgpu", ComputeDType::Tf32, 1e-4, 0.99999);
    if has_f16(&dev) {
        check_tiny_bert_dtype_on(&dev, "wgpu", ComputeDType::F16, 1e-2, 0.9999);
    }
}

/// BF16 fails at load with an error naming WGSL (no bf16 type); F16 loads where the adapter
/// has SHADER_F16 and fails at load naming the feature where it does not.
#[test]
fn bf16_on_wgpu_fails_at_load_with_a_clear_error() {
    let Some(dev) = gpu() else { return };
    let e = BertModel::load_with(&dev, tiny_bert_dir(), ComputeDType::Bf16).unwrap_err();
    assert!(e.to_string().contains("WGSL"), "{e}");
    match BertModel::load_with(&dev, tiny_bert_dir(), ComputeDType::F16) {
        Ok(m) => assert!(has_f16(&dev) && m.dtype() == ComputeDType::F16),
        Err(e) => assert!(
            !has_f16(&dev) && e.to_string().contains("SHADER_F16"),
            "{e}"
        ),
    }
    assert!(BertModel::load_with(&dev, tiny_bert_dir(), ComputeDType::F32).is_ok());
}

/// Int8 is the CPU's alone: refused at load with a typed error, by the model and by the
/// embedder (before its accuracy gate would run).
#[test]
fn int8_on_wgpu_is_refused_at_load() {
    use streampool_nn::Error;
    let Some(dev) = gpu() else { return };
    let e = BertModel::load_with(&dev, tiny_bert_dir(), ComputeDType::Int8).unwrap_err();
    assert!(
        matches!(
            e,
            Error::UnsupportedDType {
                dtype: ComputeDType::Int8,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("CPU"), "{e}");
    let e = SentenceEmbedder::load_with(&dev, tiny_bert_dir(), ComputeDType::Int8).err();
    assert!(matches!(e, Some(Error::UnsupportedDType { .. })), "{e:?}");
}

/// The families past BERT on wgpu: XLM-RoBERTa and MPNet use only kernels wgpu has and
/// match the float64 reference; GTE and Qwen3 need RMSNorm / rotary / gated kernels that
/// wgpu lacks, and fail with a clear `Unavailable` error instead of a wrong answer.
#[test]
fn families_on_wgpu_match_reference_or_say_unavailable() {
    use streampool_nn::tiny_model_dir;
    let Some(dev) = gpu() else { return };
    let all = reference("tiny_models_reference.json");
    for name in ["tiny-xlmr", "tiny-mpnet"] {
        let r = &all["models"][name];
        let emb = SentenceEmbedder::load(&dev, tiny_model_dir(name)).unwrap();
        let got = emb.embed(&refs(&texts(r))).unwrap();
        let (d, c) = compare_sentences(&got, r, "embedding");
        println!("wgpu {name}: max abs diff {d:.3e}, min cosine {c:.10}");
        assert!(d < 1e-4 && c > 0.99999, "{name}: {d}, {c}");
    }
    for name in ["tiny-gte", "tiny-nomic", "tiny-modernbert", "tiny-qwen3"] {
        let emb = SentenceEmbedder::load(&dev, tiny_model_dir(name)).unwrap();
        let err = emb.embed(&["hello"]).unwrap_err().to_string();
        println!("wgpu {name}: {err}");
        assert!(err.contains("unavailable"), "{name}: {err}");
    }
}
