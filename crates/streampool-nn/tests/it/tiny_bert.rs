//! models/tiny-bert against the float64 numpy reference (tests/data/tiny_bert_reference.json).

use crate::util::*;
use streampool::Device;
use streampool_nn::{tiny_bert_dir, BertModel, SentenceEmbedder};

#[test]
fn tokenizer_reproduces_reference_ids() {
    let r = reference("tiny_bert_reference.json");
    let emb = SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap();
    let texts = texts(&r);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let got = emb.tokenize(&refs).unwrap();
    let want = stored_input(&r);
    assert_eq!(got.seq_len(), r["batch_seq_len"].as_u64().unwrap() as usize);
    assert_eq!(got, want);
}

#[test]
fn hidden_states_match_reference() {
    let r = reference("tiny_bert_reference.json");
    let model = BertModel::load(&Device::cpu(), tiny_bert_dir()).unwrap();
    let input = stored_input(&r);
    let states = model.forward_hidden_states(&input).unwrap();
    let want = r["first_sentence"]["hidden_states"].as_array().unwrap();
    assert_eq!(states.len(), want.len());
    assert_eq!(states.len(), model.config().num_hidden_layers + 1);
    let (seq, h) = (input.seq_len(), model.config().hidden_size);
    for (i, (s, w)) in states.iter().zip(want).enumerate() {
        assert_eq!(s.dims(), &[input.batch_size(), seq, h]);
        // Sentence 0 is the first `seq * h` values of the batch.
        let got = s.narrow(0, 0, 1).unwrap().to_vec::<f32>().unwrap();
        let d = max_abs_diff(&got, &rows(w));
        println!("hidden state {i}: max abs diff {d:.3e}");
        assert!(d < 1e-4, "hidden state {i}: max abs diff {d}");
    }
    let last = model.forward(&input).unwrap();
    let got = last.narrow(0, 0, 1).unwrap().to_vec::<f32>().unwrap();
    let d = max_abs_diff(&got, &rows(&r["first_sentence"]["last_hidden_state"]));
    println!("last_hidden_state: max abs diff {d:.3e}");
    assert!(d < 1e-4, "last hidden state: max abs diff {d}");
}

#[test]
fn embeddings_match_reference() {
    let r = reference("tiny_bert_reference.json");
    let emb = SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap();
    let texts = texts(&r);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let got = emb.embed(&refs).unwrap();
    let (mut worst_d, mut worst_c) = (0.0f64, 1.0f64);
    for (i, (g, s)) in got
        .iter()
        .zip(r["sentences"].as_array().unwrap())
        .enumerate()
    {
        let want = f64s(&s["embedding"]);
        let (d, c) = (max_abs_diff(g, &want), cosine(g, &want));
        assert!(d < 1e-4, "sentence {i}: max abs diff {d}");
        assert!(c > 0.99999, "sentence {i}: cosine {c}");
        worst_d = worst_d.max(d);
        worst_c = worst_c.min(c);
    }
    println!("tiny-bert embeddings: max abs diff {worst_d:.3e}, min cosine {worst_c:.12} (1 - cos = {:.2e})", 1.0 - worst_c);
}

#[test]
fn one_sentence_alone_matches_its_row_in_the_batch() {
    // Padding must not leak into real tokens: sentence 0 encoded alone (no padding) gives the
    // same embedding as in the padded batch.
    let r = reference("tiny_bert_reference.json");
    let emb = SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap();
    let text = texts(&r)[0].clone();
    let alone = &emb.embed(&[&text]).unwrap()[0];
    let want = f64s(&r["sentences"][0]["embedding"]);
    let d = max_abs_diff(alone, &want);
    assert!(d < 1e-4, "max abs diff {d}");
}
