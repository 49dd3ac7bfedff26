//! One shared model, 8 threads, different inputs: every output equals the single-threaded
//! result bit for bit (the CPU backend runs each stream's kernels in a fixed order).

use std::sync::Arc;

use streampool::Device;
use streampool_nn::{find_minilm, tiny_bert_dir, SentenceEmbedder};

const THREADS: usize = 8;

/// Thread `t`'s input: a different window of the reference sentences (1 to 4 of them), so the
/// threads run different batch sizes and padded lengths at once.
fn inputs(texts: &[String]) -> Vec<Vec<String>> {
    (0..THREADS)
        .map(|t| {
            let n = 1 + t % 4;
            (0..n)
                .map(|i| texts[(t + 3 * i) % texts.len()].clone())
                .collect()
        })
        .collect()
}

fn bits(v: &[Vec<f32>]) -> Vec<Vec<u32>> {
    v.iter()
        .map(|row| row.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// Embeds every thread's input once on this thread, then from `THREADS` threads at once
/// (`rounds` times each), and checks that every result is bit-identical.
fn check(emb: SentenceEmbedder, rounds: usize) {
    let texts = crate::util::texts(&crate::util::reference("tiny_bert_reference.json"));
    let work = inputs(&texts);
    let emb = Arc::new(emb);
    let expected: Vec<(Vec<Vec<u32>>, Vec<u32>)> = work
        .iter()
        .map(|w| {
            let refs: Vec<&str> = w.iter().map(String::as_str).collect();
            let hidden = emb
                .model()
                .forward(&emb.tokenize(&refs).unwrap())
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            (
                bits(&emb.embed(&refs).unwrap()),
                hidden.iter().map(|x| x.to_bits()).collect(),
            )
        })
        .collect();
    // Different inputs really do give different outputs (so a mix-up would be caught).
    assert_ne!(expected[0].0[0], expected[1].0[0]);

    std::thread::scope(|s| {
        let handles: Vec<_> = work
            .iter()
            .map(|w| {
                let emb = emb.clone();
                s.spawn(move || {
                    let refs: Vec<&str> = w.iter().map(String::as_str).collect();
                    (0..rounds)
                        .map(|_| {
                            let input = emb.tokenize(&refs).unwrap();
                            let hidden = emb.model().forward(&input).unwrap();
                            let hidden: Vec<u32> = hidden
                                .to_vec::<f32>()
                                .unwrap()
                                .iter()
                                .map(|x| x.to_bits())
                                .collect();
                            (bits(&emb.embed(&refs).unwrap()), hidden)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for (t, h) in handles.into_iter().enumerate() {
            for (round, got) in h.join().expect("worker panicked").iter().enumerate() {
                assert!(
                    got.0 == expected[t].0,
                    "thread {t}, round {round}: embeddings differ from the single-threaded result"
                );
                assert!(
                    got.1 == expected[t].1,
                    "thread {t}, round {round}: hidden states differ from the single-threaded result"
                );
            }
        }
    });
}

#[test]
fn tiny_bert_from_8_threads_is_bit_identical() {
    let emb = SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap();
    check(emb, 20);
}

#[test]
fn minilm_from_8_threads_is_bit_identical() {
    let dir = match find_minilm() {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("SKIPPED: {e}");
            return;
        }
    };
    check(SentenceEmbedder::load(&Device::cpu(), dir).unwrap(), 2);
}
