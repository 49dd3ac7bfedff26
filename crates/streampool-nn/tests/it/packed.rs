//! Packed (varlen) batches against padded ones, on the CPU backend: the packed
//! forward gives the padded forward's hidden states at the real tokens, and the embedder's
//! packed path gives the padded path's embeddings (cosine >= 0.9999 per sentence), on the
//! shipped tiny-bert and, where installed, all-MiniLM-L6-v2.

use crate::util::cosine;
use streampool::{DType, Device};
use streampool_nn::{
    find_minilm, tiny_bert_dir, BertInput, BertModel, ComputeDType, PackedInput, SentenceEmbedder,
};

/// Sequences of these lengths (ids from a fixed formula; [CLS] first, [SEP] last).
fn sequences(lens: &[usize]) -> Vec<Vec<i64>> {
    lens.iter()
        .enumerate()
        .map(|(i, &n)| {
            (0..n)
                .map(|k| match k {
                    0 => 101,
                    _ if k + 1 == n => 102,
                    _ => 1000 + ((i * 131 + k * 17) % 20000) as i64,
                })
                .collect()
        })
        .collect()
}

#[test]
fn packed_forward_equals_padded_forward_at_real_tokens() {
    let dev = Device::cpu();
    let lens = [3, 17, 1, 40, 9, 2];
    let seqs = sequences(&lens);
    let f32_model = BertModel::load(&dev, tiny_bert_dir()).unwrap();
    for dtype in [ComputeDType::F32, ComputeDType::F16, ComputeDType::Bf16] {
        let model = f32_model.with_dtype(dtype).unwrap();
        let packed = PackedInput::from_sequences(&seqs).unwrap();
        let (hidden, offsets) = model.forward_packed(&packed).unwrap();
        let h = model.config().hidden_size;
        assert_eq!(hidden.dims(), &[lens.iter().sum::<usize>(), h]);
        let got = hidden
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let padded_in = BertInput::from_sequences(&seqs).unwrap();
        let longest = padded_in.seq_len();
        let padded = model
            .forward(&padded_in)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let want: Vec<f32> = lens
            .iter()
            .enumerate()
            .flat_map(|(b, &n)| padded[b * longest * h..][..n * h].to_vec())
            .collect();
        let e = {
            let d: f64 = got
                .iter()
                .zip(&want)
                .map(|(g, w)| f64::from(g - w).powi(2))
                .sum();
            let n: f64 = want.iter().map(|w| f64::from(*w).powi(2)).sum();
            (d / n).sqrt()
        };
        let bound = match dtype {
            ComputeDType::F16 => 2e-3,
            ComputeDType::Bf16 => 2e-2,
            _ => 1e-5,
        };
        println!("tiny-bert {dtype}: packed vs padded hidden states, rel err {e:.2e}");
        assert!(e < bound, "{dtype}: rel err {e:.2e}");
        assert_eq!(
            offsets.to_vec::<i64>().unwrap(),
            vec![0, 3, 20, 21, 61, 70, 72]
        );
    }
}

/// The embedder packs batches with padding in f16/bf16 (and pads otherwise); both paths give
/// the same embeddings.
fn embedder_paths_agree(dir: &std::path::Path, texts: &[String], bound: f64, label: &str) {
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    for dtype in [ComputeDType::F16, ComputeDType::Bf16] {
        let emb = SentenceEmbedder::load_with(&Device::cpu(), dir, dtype).unwrap();
        assert!(emb.packs());
        let input = emb.tokenize(&refs).unwrap();
        assert!(PackedInput::from_padded(&input).unwrap().has_padding());
        let read = |t: streampool::Tensor| t.to_vec::<f32>().unwrap();
        let packed = read(emb.embed_input(&input).unwrap());
        let padded = read(emb.embed_input_padded(&input).unwrap());
        let dim = emb.dim();
        let worst = packed
            .chunks_exact(dim)
            .zip(padded.chunks_exact(dim))
            .map(|(p, q)| cosine(p, q))
            .fold(1.0f64, f64::min);
        println!(
            "{label} {dtype}: packed vs padded, min cosine over {} sentences {worst:.8}",
            texts.len()
        );
        assert!(worst >= bound, "{label} {dtype}: min cosine {worst}");
        // `embed` (text in) takes the packed path too, and packing off gives the padded one.
        let direct = emb.embed(&refs).unwrap().concat();
        assert_eq!(direct, packed);
        let off = emb.with_packing(false);
        assert!(!off.packs());
        assert_eq!(off.embed(&refs).unwrap().concat(), padded);
    }
}

/// Sentences of very different lengths (1 to about 100 words).
fn mixed_texts(n: usize) -> Vec<String> {
    let words = [
        "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "today",
    ];
    (0..n)
        .map(|i| {
            let len = 1 + (i * i * 7 + 3) % 97;
            (0..len)
                .map(|k| words[(i + k * 3) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[test]
fn tiny_bert_packed_embeddings_match_padded() {
    let texts: Vec<String> = mixed_texts(12)
        .into_iter()
        .map(|t| t.split(' ').take(60).collect::<Vec<_>>().join(" "))
        .collect();
    embedder_paths_agree(&tiny_bert_dir(), &texts, 0.9999, "tiny-bert");
}

#[test]
fn minilm_packed_embeddings_match_padded() {
    let dir = match find_minilm() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            return;
        }
    };
    embedder_paths_agree(&dir, &mixed_texts(12), 0.9999, "all-MiniLM-L6-v2");
}

#[test]
fn f32_and_unpadded_batches_stay_padded() {
    let dev = Device::cpu();
    let emb = SentenceEmbedder::load(&dev, tiny_bert_dir()).unwrap();
    assert!(!emb.packs(), "f32 keeps the unfused, padded path");
    let half = SentenceEmbedder::load_with(&dev, tiny_bert_dir(), ComputeDType::F16).unwrap();
    // All sentences of one length: nothing to gain, the padded path (identical results).
    let same = half.tokenize(&["one two", "six ten"]).unwrap();
    assert!(!PackedInput::from_padded(&same).unwrap().has_padding());
    let read = |t: streampool::Tensor| t.to_vec::<f32>().unwrap();
    assert_eq!(
        read(half.embed_input(&same).unwrap()),
        read(half.embed_input_padded(&same).unwrap())
    );
}
