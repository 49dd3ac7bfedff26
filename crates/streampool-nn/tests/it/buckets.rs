//! Shape buckets on the CPU backend: a bucketed batch gives the embeddings of the batch as
//! given (padded path, packed path, f32 and f16), the bucketed inputs keep the real rows and
//! tokens in front, and a mixed-length corpus meets a bounded number of shapes.

use crate::util::cosine;
use streampool::Device;
use streampool_nn::{
    tiny_bert_dir, BertInput, ComputeDType, PackedInput, SentenceEmbedder, ShapeBuckets,
    FILLER_SEQ_LEN,
};

/// Texts whose token counts are off the bucket grid (so the buckets add rows and padding).
fn texts(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let words = 3 + (i * 37) % 61;
            (0..words)
                .map(|k| ["alpha", "beta", "gamma", "delta", "eps"][(i + k) % 5])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn embeddings(emb: &SentenceEmbedder, texts: &[&str], padded: bool) -> Vec<f32> {
    let input = emb.tokenize(texts).unwrap();
    let t = if padded {
        emb.embed_input_padded(&input).unwrap()
    } else {
        emb.embed_input(&input).unwrap()
    };
    assert_eq!(t.dims(), &[texts.len(), emb.dim()]);
    t.to_vec::<f32>().unwrap()
}

#[test]
fn bucketed_batches_embed_as_the_batch_given() {
    let owned = texts(19);
    let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
    for dtype in [ComputeDType::F32, ComputeDType::F16] {
        let load = |b: ShapeBuckets| {
            SentenceEmbedder::load_with(&Device::cpu(), tiny_bert_dir(), dtype)
                .unwrap()
                .with_shape_buckets(b)
        };
        let (on, off) = (load(ShapeBuckets::default()), load(ShapeBuckets::OFF));
        let input = on.tokenize(&refs).unwrap();
        // 19 rows are off the grid (17..32 step by 2): the buckets add a row.
        let b = ShapeBuckets::default();
        let bucketed = b.pad_input(&input, 512).unwrap();
        assert_eq!(bucketed.batch_size(), 20);
        assert_eq!(bucketed.seq_len(), b.round(input.seq_len()));
        // f16 on the CPU packs batches with padding; f32 pads. Both paths, both settings.
        for padded in [true, false] {
            let (x, y) = (
                embeddings(&on, &refs, padded),
                embeddings(&off, &refs, padded),
            );
            let worst = x
                .chunks_exact(on.dim())
                .zip(y.chunks_exact(on.dim()))
                .map(|(p, q)| cosine(p, q))
                .fold(1.0f64, f64::min);
            let bound = if dtype == ComputeDType::F32 {
                0.99999
            } else {
                0.999
            };
            assert!(
                worst >= bound,
                "{dtype} padded={padded}: min cosine {worst}"
            );
        }
        // `embed` (chunked) goes through the same paths.
        let chunked = on.embed(&refs).unwrap();
        assert_eq!(chunked.len(), 19);
    }
}

#[test]
fn bucketed_inputs_keep_the_real_rows_and_tokens_first() {
    let b = ShapeBuckets::default();
    let seqs: Vec<Vec<i64>> = (0..19)
        .map(|i| (0..(3 + i * 7)).map(|k| 100 + k as i64).collect())
        .collect();
    let padded = BertInput::from_sequences(&seqs).unwrap();
    let out = b.pad_input(&padded, 512).unwrap();
    // 19 rows of up to 129 tokens: 20 rows (step 2 past 16) of 144 (step 16 past 128).
    assert_eq!((out.batch_size(), out.seq_len()), (20, 144));
    let (s, s2) = (padded.seq_len(), out.seq_len());
    for r in 0..19 {
        assert_eq!(
            &out.input_ids()[r * s2..r * s2 + s],
            &padded.input_ids()[r * s..(r + 1) * s]
        );
        assert!(out.attention_mask()[r * s2 + s..(r + 1) * s2]
            .iter()
            .all(|&m| m == 0));
    }
    // The extra row repeats the last real one.
    assert_eq!(
        &out.input_ids()[19 * s2..],
        &out.input_ids()[18 * s2..19 * s2]
    );
    // The model's positions cap the length.
    assert_eq!(b.pad_input(&padded, 133).unwrap().seq_len(), 133);
    assert!(ShapeBuckets::OFF.pad_input(&padded, 512).is_none());

    let packed = PackedInput::from_sequences(&seqs).unwrap();
    let tokens = packed.tokens();
    // 1,254 tokens: 1,280 (step 128 past 1,024), the 26 extra in one filler sequence.
    let out = b.pad_packed(&packed, 192).unwrap();
    assert_eq!((tokens, out.tokens(), out.batch_size()), (1254, 1280, 20));
    assert_eq!(&out.offsets()[..20], packed.offsets());
    assert_eq!(&out.input_ids()[..tokens], packed.input_ids());
    // Filler sequences never outgrow the length bound, so the batch keeps its bound, and
    // are short (their attention costs what their tokens do, not the longest sequence's).
    assert_eq!(out.max_len(), packed.max_len());
    let long = ShapeBuckets::default()
        .pad_packed(
            &PackedInput::from_sequences(&vec![vec![1i64; 300]; 9]).unwrap(),
            320,
        )
        .unwrap();
    // 2,700 tokens: 2,816 (step 256 past 2,048), the 116 extra in sequences of at most 64.
    assert_eq!(long.tokens(), 2816);
    let filler_lens: Vec<usize> = long.offsets()[9..]
        .windows(2)
        .map(|w| w[1] - w[0])
        .collect();
    assert!(
        filler_lens.iter().all(|&l| l <= FILLER_SEQ_LEN),
        "{filler_lens:?}"
    );
    assert_eq!(filler_lens.iter().sum::<usize>(), 116);
    assert_eq!(long.max_len(), 300);
    let small = b.pad_packed(&packed, 8).unwrap();
    assert!(small.offsets()[19..].windows(2).all(|w| w[1] - w[0] <= 8));
    assert_eq!(small.batch_size(), b.round(small.batch_size()));
    // A batch already on the grid stays as it is.
    let on_grid = PackedInput::from_sequences(&vec![vec![1i64; 16]; 8]).unwrap();
    assert!(b.pad_packed(&on_grid, 64).is_none());
}

#[test]
fn a_mixed_corpus_meets_a_bounded_number_of_shapes() {
    // Batches of 256 texts of 3..=220 words (about 1.3 tokens a word), as a corpus in chunks:
    // without buckets nearly every batch is a new packed shape; with them a handful.
    let b = ShapeBuckets::default();
    let mut state = 12345u64;
    let mut next = || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        state >> 33
    };
    let mut exact = std::collections::BTreeSet::new();
    let mut bucketed = std::collections::BTreeSet::new();
    for _ in 0..200 {
        let seqs: Vec<Vec<i64>> = (0..256)
            .map(|_| vec![7i64; 2 + ((3 + next() % 218) * 13 / 10) as usize])
            .collect();
        let p = PackedInput::from_sequences(&seqs).unwrap();
        exact.insert((p.batch_size(), p.tokens()));
        let q = b.pad_packed(&p, 256).unwrap_or(p);
        bucketed.insert((q.batch_size(), q.tokens()));
    }
    assert!(exact.len() > 150, "{} exact shapes", exact.len());
    assert!(bucketed.len() <= 5, "{bucketed:?}");
}
