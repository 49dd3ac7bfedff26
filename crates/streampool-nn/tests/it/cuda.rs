//! The models on the CUDA backend (feature `cuda`, needs a GPU): tiny-bert and
//! all-MiniLM-L6-v2 against their references, and 8 threads against one.

use std::sync::Arc;

use crate::util::*;
use streampool::Device;
use streampool_nn::{find_minilm, tiny_bert_dir, ComputeDType, SentenceEmbedder};

fn gpu() -> Device {
    Device::cuda(0).expect("CUDA device 0")
}

#[test]
fn tiny_bert_on_cuda_matches_reference() {
    check_tiny_bert_on(&gpu(), "cuda");
}

#[test]
fn minilm_on_cuda_matches_sentence_transformers() {
    let dir = match find_minilm() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            return;
        }
    };
    let r = reference("minilm_reference.json");
    let emb = SentenceEmbedder::load(&gpu(), &dir).unwrap();
    let got = emb.embed(&refs(&texts(&r))).unwrap();
    for key in ["embedding", "embedding_fp16_weights"] {
        let (d, c) = compare_sentences(&got, &r, key);
        println!(
            "cuda MiniLM ({}) vs {key}: max abs diff {d:.3e}, min cosine {c:.12}",
            dir.display()
        );
        assert!(c > 0.9999, "{key}: min cosine {c}");
    }
}

/// Every compute dtype on the GPU (tensor-core f16/bf16/TF32 matmuls, CUDA graphs, fused
/// attention and pooling) against the fp32 references: tiny-bert vs float64 and MiniLM (when
/// installed) vs sentence-transformers, with the CPU tests' cosine bounds.
#[test]
fn every_dtype_on_cuda_matches_references() {
    let dev = gpu();
    let tiny = reference("tiny_bert_reference.json");
    let minilm = find_minilm().ok();
    if minilm.is_none() {
        eprintln!("MiniLM not installed: tiny-bert only");
    }
    let mini_ref = reference("minilm_reference.json");
    let bounds = [
        (ComputeDType::Tf32, 0.9999, 0.9999),
        (ComputeDType::F16, 0.9999, 0.999),
        (ComputeDType::Bf16, 0.999, 0.998),
    ];
    for (dtype, tiny_bound, mini_bound) in bounds {
        let emb = SentenceEmbedder::load_with(&dev, tiny_bert_dir(), dtype).unwrap();
        // Twice: the second call replays the captured CUDA graph.
        for pass in 0..2 {
            let got = emb.embed(&refs(&texts(&tiny))).unwrap();
            let (d, c) = compare_sentences(&got, &tiny, "embedding");
            println!("cuda tiny-bert {dtype} pass {pass}: max abs diff {d:.3e}, min cosine {c:.8}");
            assert!(c >= tiny_bound, "tiny-bert {dtype}: min cosine {c}");
        }
        if let Some(dir) = &minilm {
            let emb = SentenceEmbedder::load_with(&dev, dir, dtype).unwrap();
            for pass in 0..2 {
                let got = emb.embed(&refs(&texts(&mini_ref))).unwrap();
                let (d, c) = compare_sentences(&got, &mini_ref, "embedding");
                println!(
                    "cuda MiniLM {dtype} pass {pass}: max abs diff {d:.3e}, min cosine {c:.8}"
                );
                assert!(c >= mini_bound, "MiniLM {dtype}: min cosine {c}");
            }
        }
    }
}

#[test]
fn eight_threads_on_cuda_agree_with_one() {
    let r = reference("tiny_bert_reference.json");
    let dir = find_minilm().unwrap_or_else(|_| tiny_bert_dir());
    let emb = Arc::new(SentenceEmbedder::load(&gpu(), &dir).unwrap());
    let all = texts(&r);
    let work: Vec<Vec<&str>> = (0..8)
        .map(|t| {
            (0..1 + t % 4)
                .map(|i| all[(t + 3 * i) % all.len()].as_str())
                .collect()
        })
        .collect();
    let expected: Vec<Vec<Vec<f32>>> = work.iter().map(|w| emb.embed(w).unwrap()).collect();
    let results: Vec<Vec<Vec<Vec<f32>>>> = std::thread::scope(|s| {
        let handles: Vec<_> = work
            .iter()
            .map(|w| {
                let emb = emb.clone();
                s.spawn(move || (0..10).map(|_| emb.embed(w).unwrap()).collect::<Vec<_>>())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (mut worst, mut identical) = (0.0f32, true);
    for (t, rounds) in results.iter().enumerate() {
        for got in rounds {
            for (g, e) in got.iter().zip(&expected[t]) {
                identical &= g == e;
                for (a, b) in g.iter().zip(e) {
                    worst = worst.max((a - b).abs());
                }
            }
        }
    }
    println!(
        "cuda 8 threads ({}): max abs diff vs one thread {worst:.3e}, bit-identical: {identical}",
        dir.display()
    );
    assert!(worst <= 1e-5, "threads differ from one thread by {worst}");
}

/// The families past BERT (tiny checkpoints) on the GPU in every dtype against the float64
/// transformers reference, twice each (the second call replays the CUDA graph): f32 and tf32
/// as the CPU's f32 bounds allow for cuBLAS, f16/bf16 within the CPU half tests' bounds;
/// and the classifier's and reranker's logits.
#[test]
fn families_on_cuda_match_references() {
    use streampool_nn::{tiny_model_dir, Classifier};
    let dev = gpu();
    let all = reference("tiny_models_reference.json");
    // (dtype, max abs diff of unit embeddings, min cosine, logits rel err)
    let bounds = [
        (ComputeDType::F32, 1e-4, 0.99999, 1e-4),
        (ComputeDType::Tf32, 5e-3, 0.9999, 1e-2),
        (ComputeDType::F16, 5e-3, 0.9999, 1e-2),
        (ComputeDType::Bf16, 5e-2, 0.999, 1e-1),
    ];
    for name in [
        "tiny-xlmr",
        "tiny-mpnet",
        "tiny-gte",
        "tiny-nomic",
        "tiny-modernbert",
        "tiny-qwen3",
    ] {
        let r = &all["models"][name];
        for (dtype, tol, min_cos, _) in bounds {
            let emb = SentenceEmbedder::load_with(&dev, tiny_model_dir(name), dtype).unwrap();
            for pass in 0..2 {
                let got = emb.embed(&refs(&texts(r))).unwrap();
                let (d, c) = compare_sentences(&got, r, "embedding");
                println!(
                    "cuda {name} {dtype} pass {pass}: max abs diff {d:.3e}, min cosine {c:.8}"
                );
                assert!(d < tol && c > min_cos, "{name} {dtype}: {d}, {c}");
            }
        }
    }
    let r = &all["models"]["tiny-bert-classifier"];
    let texts: Vec<String> = r["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect();
    let want = rows(&r["logits"]);
    for (dtype, _, _, tol) in bounds {
        let c = Classifier::load_with(&dev, tiny_model_dir("tiny-bert-classifier"), dtype).unwrap();
        let got: Vec<f32> = c.logits(&refs(&texts)).unwrap().concat();
        let e = rel_err(&got, &want);
        println!("cuda classifier {dtype}: logits rel err {e:.3e}");
        assert!(e < tol, "classifier {dtype}: {e}");
    }
}

/// Packed batches on the GPU: a batch of mixed lengths runs packed (varlen attention, packed
/// pooling) in f16/bf16 and gives the padded path's embeddings (cosine >= 0.9999 per
/// sentence), on the eager run and on the graph replays; and MiniLM in f16 with GELU's tanh
/// form in the GEMM epilogue keeps a minimum cosine of 0.99999 to sentence-transformers fp32.
#[test]
fn packed_batches_and_the_gelu_epilogue_on_cuda() {
    let dev = gpu();
    let dir = find_minilm().unwrap_or_else(|_| tiny_bert_dir());
    let words = [
        "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "today",
    ];
    let mixed: Vec<String> = (0..40)
        .map(|i| {
            let len = 1 + (i * i * 7 + 3) % 230;
            (0..len)
                .map(|k| words[(i + k * 3) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let mixed_refs: Vec<&str> = mixed.iter().map(String::as_str).collect();
    for dtype in [ComputeDType::F16, ComputeDType::Bf16] {
        let emb = SentenceEmbedder::load_with(&dev, &dir, dtype).unwrap();
        assert!(emb.packs());
        let input = emb.tokenize(&mixed_refs).unwrap();
        let read = |t: streampool::Tensor| t.to_vec::<f32>().unwrap();
        for pass in 0..3 {
            let packed = read(emb.embed_input(&input).unwrap());
            let padded = read(emb.embed_input_padded(&input).unwrap());
            let dim = emb.dim();
            let worst = packed
                .chunks_exact(dim)
                .zip(padded.chunks_exact(dim))
                .map(|(p, q)| {
                    let q64: Vec<f64> = q.iter().map(|&v| f64::from(v)).collect();
                    cosine(p, &q64)
                })
                .fold(1.0f64, f64::min);
            println!(
                "cuda {} {dtype} pass {pass}: packed vs padded, min cosine over {} sentences {worst:.8}",
                dir.display(),
                mixed.len()
            );
            assert!(worst >= 0.9999, "{dtype} pass {pass}: min cosine {worst}");
        }
    }
    if let Ok(dir) = find_minilm() {
        let r = reference("minilm_reference.json");
        let emb = SentenceEmbedder::load_with(&dev, &dir, ComputeDType::F16).unwrap();
        let got = emb.embed(&refs(&texts(&r))).unwrap();
        let (d, c) = compare_sentences(&got, &r, "embedding");
        println!(
            "cuda MiniLM f16 (tanh GELU epilogue, packed): max abs diff {d:.3e}, min cosine {c:.8}"
        );
        assert!(c >= 0.99999, "MiniLM f16: min cosine {c}");
    }
}
