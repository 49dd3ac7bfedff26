//! The models on the wgpu backend (feature `wgpu`): tiny-bert and all-MiniLM-L6-v2 against
//! their references (lavapipe in CI, NVIDIA's Vulkan driver on the H100). Skips loudly where
//! no wgpu adapter exists at all.
#![cfg(feature = "wgpu")]

mod common;

use common::*;
use streampool::Device;
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
/// cosine 1 - 1e-12, `bench/results/wgpu-2026-11-23/`); on GPUs it always runs.
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
}

#[test]
fn half_dtypes_on_wgpu_fail_at_load_with_a_clear_error() {
    let Some(dev) = gpu() else { return };
    for dtype in [ComputeDType::Tf32, ComputeDType::F16, ComputeDType::Bf16] {
        let e = BertModel::load_with(&dev, tiny_bert_dir(), dtype).unwrap_err();
        assert!(e.to_string().contains("f32 only"), "{dtype}: {e}");
    }
    assert!(BertModel::load_with(&dev, tiny_bert_dir(), ComputeDType::F32).is_ok());
}
