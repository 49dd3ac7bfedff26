//! `SentenceEmbedder::embed` in chunks (tokenization of chunk i+1 overlapping the device work
//! of chunk i) gives the embeddings of one big batch: each chunk pads to its own longest text,
//! and padding is masked.

use streampool::Device;

use crate::util::max_abs_diff;
use streampool_nn::{find_minilm, tiny_bert_dir, SentenceEmbedder, DEFAULT_EMBED_CHUNK};

/// Texts of very different lengths, so chunks pad to different lengths than the whole batch.
fn texts() -> Vec<String> {
    (0..11)
        .map(|i| {
            let words = ["the", "cat", "sat", "on", "a", "mat", "quietly", "today"];
            (0..1 + (i * 5) % 23)
                .map(|k| words[(i + k) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// The largest element difference between chunked and single-batch embeddings, over
/// several chunk sizes (1, 2, 3, 4 and 5 rows).
fn max_chunking_diff(load: impl Fn() -> SentenceEmbedder) -> f32 {
    let texts = texts();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let whole = load().with_chunk_size(usize::MAX).embed(&refs).unwrap();
    assert_eq!(whole.len(), refs.len());
    let mut worst = 0.0f32;
    for chunk in 1..=5 {
        let emb = load().with_chunk_size(chunk);
        assert_eq!(emb.chunk_size(), chunk);
        let got = emb.embed(&refs).unwrap();
        assert_eq!(
            got.len(),
            whole.len(),
            "chunk {chunk}: one embedding per text"
        );
        for (g, w) in got.iter().zip(&whole) {
            worst = worst.max(max_abs_diff(g, w) as f32);
        }
    }
    worst
}

#[test]
fn tiny_bert_chunked_embeddings_equal_one_batch() {
    let diff =
        max_chunking_diff(|| SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap());
    eprintln!("tiny-bert: largest chunked vs one-batch difference {diff:e}");
    assert!(diff <= 1e-6, "chunked embeddings differ by {diff}");
}

#[test]
fn minilm_chunked_embeddings_equal_one_batch() {
    let dir = match find_minilm() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            return;
        }
    };
    let diff = max_chunking_diff(|| SentenceEmbedder::load(&Device::cpu(), &dir).unwrap());
    eprintln!("all-MiniLM-L6-v2: largest chunked vs one-batch difference {diff:e}");
    assert!(diff <= 1e-6, "chunked embeddings differ by {diff}");
}

#[test]
fn chunk_size_defaults_and_floors_at_one() {
    let emb = SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap();
    assert_eq!(emb.chunk_size(), DEFAULT_EMBED_CHUNK);
    let emb = emb.with_chunk_size(0);
    assert_eq!(emb.chunk_size(), 1);
    assert!(emb.embed(&[]).unwrap().is_empty());
    assert_eq!(emb.embed(&["one", "two"]).unwrap().len(), 2);
}

/// The serial path the overlapped `embed` must reproduce: each chunk tokenized on this
/// thread alone, embedded and read back before the next.
fn serial_chunks(emb: &SentenceEmbedder, texts: &[&str], chunk: usize) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    for run in texts.chunks(chunk) {
        let input = emb.tokenizer().encode_batch_serial(run).unwrap();
        let flat = emb.embed_input(&input).unwrap().to_vec::<f32>().unwrap();
        out.extend(flat.chunks_exact(emb.dim()).map(<[f32]>::to_vec));
    }
    out
}

/// Mixed lengths, ASCII and not, long enough that chunks tokenize on the pool.
fn long_texts() -> Vec<String> {
    (0..40)
        .map(|i| {
            let words = [
                "the", "Cat", "sat,", "on", "a", "mat", "quietly", "today", "café",
            ];
            (0..1 + (i * 7) % 60)
                .map(|k| words[(i + k) % words.len()])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[test]
fn overlapped_chunks_equal_the_serial_path_bit_for_bit() {
    let texts = long_texts();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    for chunk in [3, 16, 40] {
        let emb = SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir())
            .unwrap()
            .with_chunk_size(chunk);
        assert_eq!(
            emb.embed(&refs).unwrap(),
            serial_chunks(&emb, &refs, chunk),
            "chunk {chunk}"
        );
    }
}

#[test]
fn embed_from_many_threads_and_from_pool_threads() {
    let texts = long_texts();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let emb = SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir())
        .unwrap()
        .with_chunk_size(8);
    let want = serial_chunks(&emb, &refs, 8);
    std::thread::scope(|s| {
        for _ in 0..6 {
            s.spawn(|| assert_eq!(emb.embed(&refs).unwrap(), want));
        }
    });
    // From every thread of the tokenization pool at once: each call's own tokenization runs
    // inline there, and the forwards wait only for the CPU streams.
    let pool = streampool_nn::TokenizePool::global();
    let got: Vec<_> = pool.install(|| {
        use rayon::prelude::*;
        (0..pool.threads() + 1)
            .into_par_iter()
            .map(|_| emb.embed(&refs).unwrap())
            .collect()
    });
    assert!(got.iter().all(|g| g == &want));
}
