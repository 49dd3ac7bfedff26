//! The tasks past embeddings: TEI's `/rerank` and `/predict` on the tiny cross-encoder
//! (`models/tiny-xlmr-reranker`) and classifier (`models/tiny-bert-classifier`), with the
//! request examples of TEI's README and OpenAPI document, checked against the in-process
//! `Reranker` / `Classifier`; and prompts (`prompt_name`, `prompt`) on TEI's `/embed`,
//! OpenAI's `/v1/embeddings` and KServe's request parameters, on `models/tiny-xlmr` (CLS
//! pooling, prompts "query" and "passage").

use std::sync::Arc;

use serde_json::{json, Value};
use streampool::Device;
use streampool_nn::{tiny_model_dir, Classifier, Reranker, SentenceEmbedder};
use streampool_serve::{BatchConfig, ModelSpec, ServeConfig, Server, ServerHandle};

use crate::util::{assert_close, close};

fn config() -> ServeConfig {
    ServeConfig {
        addr: "127.0.0.1:0".parse().expect("literal address"),
        batch: BatchConfig {
            max_batch_size: 8,
            workers: 2,
            ..BatchConfig::default()
        },
        max_inputs: 16,
        ..ServeConfig::default()
    }
}

async fn serve(models: Vec<ModelSpec>) -> (ServerHandle, String) {
    let handle = Server::start(config(), models)
        .await
        .expect("server starts");
    let base = format!("http://{}", handle.addr());
    (handle, base)
}

async fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .expect("request sent");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("a JSON body"))
}

fn classifier(name: &str) -> Arc<Classifier> {
    Arc::new(Classifier::load(&Device::cpu(), tiny_model_dir(name)).expect("classifier"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerank_answers_teis_examples_as_the_library_does() {
    let c = classifier("tiny-xlmr-reranker");
    let (handle, base) = serve(vec![ModelSpec::Classifier {
        name: "reranker".into(),
        classifier: c.clone(),
    }])
    .await;
    let reranker = Reranker::new(
        Classifier::load(&Device::cpu(), tiny_model_dir("tiny-xlmr-reranker")).unwrap(),
    )
    .unwrap();
    // TEI README: {"query":"What is Deep Learning?", "texts": ["Deep Learning is not...",
    // "Deep learning is..."]}
    let query = "What is Deep Learning?";
    let texts = ["Deep Learning is not...", "Deep learning is..."];
    for raw in [false, true] {
        let (status, body) = post(
            &base,
            "/rerank",
            &json!({"query": query, "texts": texts, "raw_scores": raw}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let want = reranker.scores(query, &texts, raw).unwrap();
        let ranks = body.as_array().unwrap();
        assert_eq!(ranks.len(), 2);
        // Best first, each with its index; no text unless asked.
        let scores: Vec<f32> = ranks
            .iter()
            .map(|r| r["score"].as_f64().unwrap() as f32)
            .collect();
        assert!(scores[0] >= scores[1]);
        for r in ranks {
            let i = r["index"].as_u64().unwrap() as usize;
            let got = r["score"].as_f64().unwrap() as f32;
            assert!(
                (got - want[i]).abs() < 1e-5,
                "raw {raw}: {got} vs {}",
                want[i]
            );
            assert!(r.get("text").is_none());
        }
    }
    let (status, body) = post(
        &base,
        "/rerank",
        &json!({"query": query, "texts": texts, "return_text": true}),
    )
    .await;
    assert_eq!(status, 200);
    for r in body.as_array().unwrap() {
        let i = r["index"].as_u64().unwrap() as usize;
        assert_eq!(r["text"], texts[i]);
    }
    // Truncation: a passage longer than the model's 64 tokens is refused unless truncated.
    let long = "the quick brown fox jumps over the lazy dog ".repeat(20);
    let (status, body) = post(&base, "/rerank", &json!({"query": query, "texts": [long]})).await;
    assert_eq!(
        (status, body["error_type"].as_str()),
        (413, Some("validation"))
    );
    let (status, _) = post(
        &base,
        "/rerank",
        &json!({"query": query, "texts": [long], "truncate": true}),
    )
    .await;
    assert_eq!(status, 200);
    // TEI's errors: empty texts 400 "empty", too many 413, malformed 422.
    let (status, body) = post(&base, "/rerank", &json!({"query": query, "texts": []})).await;
    assert_eq!((status, body["error_type"].as_str()), (400, Some("empty")));
    let many = vec!["x"; 17];
    let (status, _) = post(&base, "/rerank", &json!({"query": query, "texts": many})).await;
    assert_eq!(status, 413);
    let (status, body) = post(&base, "/rerank", &json!({"query": 3})).await;
    assert_eq!(
        (status, body["error_type"].as_str()),
        (422, Some("validation"))
    );
    // /embed has no embedder here: TEI's 424.
    let (status, _) = post(&base, "/embed", &json!({"inputs": "x"})).await;
    assert_eq!(status, 424);
    // /info describes the reranker.
    let info: Value = reqwest::get(format!("{base}/info"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(info["model_type"]["reranker"].is_object(), "{info}");
    handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predict_answers_single_pair_and_batch_inputs() {
    let c = classifier("tiny-bert-classifier");
    let (handle, base) = serve(vec![ModelSpec::Classifier {
        name: "classifier".into(),
        classifier: c.clone(),
    }])
    .await;
    // TEI README: {"inputs":"I like you. I love you"}; `/` answers the same (huggingface_hub).
    let text = "I like you. I love you";
    let want = c.predict(&[text]).unwrap().remove(0);
    for path in ["/predict", "/"] {
        let (status, body) = post(&base, path, &json!({"inputs": text})).await;
        assert_eq!(status, 200, "{path}: {body}");
        let preds = body.as_array().unwrap();
        assert_eq!(preds.len(), 3);
        let scores: Vec<f64> = preds.iter().map(|p| p["score"].as_f64().unwrap()).collect();
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "best first");
        for p in preds {
            let i = c
                .labels()
                .iter()
                .position(|l| l == p["label"].as_str().unwrap())
                .unwrap();
            assert!((p["score"].as_f64().unwrap() as f32 - want[i]).abs() < 1e-5);
        }
    }
    // A pair is one input; a list of strings and pairs is a batch, answered in order.
    let (status, body) = post(
        &base,
        "/predict",
        &json!({"inputs": ["a question", "an answer"]}),
    )
    .await;
    assert_eq!(status, 200);
    let pair = c
        .logits_pairs(&[("a question", "an answer")])
        .unwrap()
        .remove(0);
    let top = &body.as_array().unwrap()[0];
    let i = c
        .labels()
        .iter()
        .position(|l| l == top["label"].as_str().unwrap())
        .unwrap();
    let want = streampool_nn::tasks::scores(&pair);
    assert!((top["score"].as_f64().unwrap() as f32 - want[i]).abs() < 1e-5);
    let batch = json!({"inputs": ["one", ["two", "three"], "four"], "raw_scores": true});
    let (status, body) = post(&base, "/predict", &batch).await;
    assert_eq!(status, 200);
    let rows = body.as_array().unwrap();
    assert_eq!(rows.len(), 3);
    let logits = c.logits(&["four"]).unwrap().remove(0);
    for p in rows[2].as_array().unwrap() {
        let i = c
            .labels()
            .iter()
            .position(|l| l == p["label"].as_str().unwrap())
            .unwrap();
        assert!((p["score"].as_f64().unwrap() as f32 - logits[i]).abs() < 1e-4);
    }
    // A three-label model is not a reranker.
    let (status, body) = post(&base, "/rerank", &json!({"query": "q", "texts": ["t"]})).await;
    assert_eq!(
        (status, body["error_type"].as_str()),
        (422, Some("validation"))
    );
    let (status, body) = post(&base, "/predict", &json!({"inputs": [1, 2]})).await;
    assert_eq!(
        (status, body["error_type"].as_str()),
        (422, Some("validation"))
    );
    // KServe: texts to logits.
    let infer =
        json!({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["four"]}]});
    let (status, body) = post(&base, "/v2/models/classifier/infer", &infer).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outputs"][0]["shape"], json!([1, 3]));
    let got: Vec<f32> = body["outputs"][0]["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    assert_close(&got, &logits, 1e-4, "logits");
    handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_on_every_route_match_the_library() {
    let emb =
        Arc::new(SentenceEmbedder::load(&Device::cpu(), tiny_model_dir("tiny-xlmr")).unwrap());
    let (handle, base) = serve(vec![ModelSpec::Embedder {
        name: "xlmr".into(),
        embedder: emb.clone(),
    }])
    .await;
    let text = "what is the capital of France?";
    let prompt = emb.prompt("query").unwrap().to_string();
    let want = emb
        .embed_with_prompt(&[text], Some(&prompt))
        .unwrap()
        .remove(0);
    let plain = emb.embed(&[text]).unwrap().remove(0);
    let close = |got: &Value, want: &[f32]| {
        let g: Vec<f32> = got
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        g.len() == want.len() && g.iter().zip(want).all(|(a, b)| close(*a, *b, 1e-5))
    };
    // TEI /embed prompt_name.
    let (status, body) = post(
        &base,
        "/embed",
        &json!({"inputs": text, "prompt_name": "query"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(close(&body[0], &want));
    let (status, body) = post(&base, "/embed", &json!({"inputs": text})).await;
    assert_eq!(status, 200);
    assert!(close(&body[0], &plain) && !close(&body[0], &want));
    let (status, body) = post(
        &base,
        "/embed",
        &json!({"inputs": text, "prompt_name": "nope"}),
    )
    .await;
    assert_eq!(
        (status, body["error_type"].as_str()),
        (422, Some("validation"))
    );
    assert!(
        body["error"].as_str().unwrap().contains("passage"),
        "{body}"
    );
    // OpenAI /v1/embeddings: prompt_name or prompt (extensions), not both.
    for extra in [json!({"prompt_name": "query"}), json!({"prompt": prompt})] {
        let mut req = json!({"input": text, "model": "xlmr"});
        req.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, body) = post(&base, "/v1/embeddings", &req).await;
        assert_eq!(status, 200, "{body}");
        assert!(close(&body["data"][0]["embedding"], &want));
    }
    let both = json!({"input": text, "prompt_name": "query", "prompt": "x"});
    let (status, _) = post(&base, "/v1/embeddings", &both).await;
    assert_eq!(status, 400);
    // KServe: request parameters.
    let infer = json!({
        "parameters": {"prompt_name": "query"},
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]
    });
    let (status, body) = post(&base, "/v2/models/xlmr/infer", &infer).await;
    assert_eq!(status, 200, "{body}");
    assert!(close(&body["outputs"][0]["data"], &want));
    // /info names the CLS pooling.
    let info: Value = reqwest::get(format!("{base}/info"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["model_type"]["embedding"]["pooling"], "cls");
    handle.shutdown().await.unwrap();
}

/// `huggingface_hub`'s `InferenceClient.text_classification` (the client of TEI's classifier
/// servers; it posts `{"inputs", "parameters"}` to the server's root) against the server, when
/// python3 has `huggingface_hub` (CI installs it); a loud SKIP otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huggingface_hub_text_classification() {
    const PROBE: &str = "import huggingface_hub";
    let probe = std::process::Command::new("python3")
        .args(["-c", PROBE])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "\n!!!!!!!!!! SKIPPED: python3 with huggingface_hub is not available !!!!!!!!!!\n"
        );
        return;
    }
    let c = classifier("tiny-bert-classifier");
    let (handle, base) = serve(vec![ModelSpec::Classifier {
        name: "classifier".into(),
        classifier: c.clone(),
    }])
    .await;
    let text = "I like you. I love you";
    let want = c.predict(&[text]).unwrap().remove(0);
    let script = format!(
        "from huggingface_hub import InferenceClient\n\
         r = InferenceClient(model={base:?}).text_classification({text:?})\n\
         print(r.label, r.score)"
    );
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args(["-c", &script])
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut words = stdout.split_whitespace();
    let (label, score) = (
        words.next().unwrap(),
        words.next().unwrap().parse::<f32>().unwrap(),
    );
    // The client keeps the best label.
    let best = (0..want.len())
        .max_by(|&a, &b| want[a].total_cmp(&want[b]))
        .unwrap();
    assert_eq!(label, c.labels()[best]);
    assert!(
        (score - want[best]).abs() < 1e-5,
        "{score} vs {}",
        want[best]
    );
    handle.shutdown().await.unwrap();
}

/// A half-precision embedder packs: a served batch of mixed lengths runs with no padding
/// (the queue budgets such batches by their tokens), and its embeddings are the in-process
/// ones; a batch whose requests ask for raw (unnormalized) vectors runs padded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_mixed_lengths_run_packed_in_half_precision() {
    use streampool_nn::{tiny_bert_dir, ComputeDType};
    use streampool_serve::ServedModel;
    let dev = Device::cpu();
    let embedder = Arc::new(
        SentenceEmbedder::load_with(&dev, tiny_bert_dir(), ComputeDType::F16).expect("f16"),
    );
    assert!(embedder.packs());
    let (handle, base) = serve(vec![ModelSpec::Embedder {
        name: "tiny-bert-f16".into(),
        embedder: embedder.clone(),
    }])
    .await;
    let packed = || match &*handle.state().registry().get("tiny-bert-f16").unwrap() {
        ServedModel::Embedder(e) => e.packed_batches(),
        _ => unreachable!("an embedder was served"),
    };
    let texts: Vec<String> = (1..=8).map(|n| "word ".repeat(n * 5)).collect();
    let (status, body) = post(&base, "/v1/embeddings", &json!({"input": texts})).await;
    assert_eq!(status, 200, "{body}");
    assert!(packed() >= 1, "the mixed-length batch ran padded");
    for (i, t) in texts.iter().enumerate() {
        let got: Vec<f32> = serde_json::from_value(body["data"][i]["embedding"].clone()).unwrap();
        let want = embedder.embed(&[t.as_str()]).unwrap().remove(0);
        let cos: f32 = got.iter().zip(&want).map(|(a, b)| a * b).sum();
        assert!(
            cos > 0.9999,
            "text {i}: cosine {cos} to the in-process embedding"
        );
    }
    let before = packed();
    let (status, _) = post(
        &base,
        "/embed",
        &json!({"inputs": texts, "normalize": false}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(packed(), before, "raw vectors run padded");
    handle.shutdown().await.unwrap();
}

/// A device out of memory on a served batch answers the requests of that batch 503 with
/// `Retry-After`, on every route in its protocol's format, and the server goes on serving
/// (the CPU backend with an allocator limit between what a short request and a batch of
/// long ones need).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_out_of_memory_answers_503_and_the_server_keeps_serving() {
    use streampool::DeviceConfig;
    use streampool_nn::tiny_bert_dir;
    let long: Vec<String> = (0..8)
        .map(|i| format!("{i} {}", "word ".repeat(200)))
        .collect();
    let long_refs: Vec<&str> = long.iter().map(String::as_str).collect();
    // What each needs, measured on a device with no limit and of its own: the process-wide
    // CPU device's peak counts whatever the other tests of this binary ran on it.
    let probe = Device::cpu_with(DeviceConfig::default()).expect("a probe device");
    let e = SentenceEmbedder::load(&probe, tiny_bert_dir()).expect("tiny-bert");
    e.embed(&["a short one"]).expect("short");
    let small = probe.allocator_stats().peak_reserved;
    e.embed(&long_refs).expect("long");
    let large = probe.allocator_stats().peak_reserved;
    assert!(large > small + (1 << 20), "{small} vs {large}");
    let limited = Device::cpu_with(DeviceConfig {
        memory_limit: Some(small + (large - small) / 4),
        ..DeviceConfig::default()
    })
    .expect("a limited device");
    let embedder = Arc::new(SentenceEmbedder::load(&limited, tiny_bert_dir()).expect("load"));
    let mut config = config();
    config.truncate = true;
    config.batch.workers = 1;
    let handle = Server::start(
        config,
        vec![ModelSpec::Embedder {
            name: "tiny-bert".into(),
            embedder,
        }],
    )
    .await
    .expect("server starts");
    let base = format!("http://{}", handle.addr());
    let client = reqwest::Client::new();
    let routes = [
        ("/v1/embeddings", json!({"input": long})),
        ("/embed", json!({"inputs": long})),
        (
            "/v2/models/tiny-bert/infer",
            json!({"inputs": [{"name": "text", "shape": [8], "datatype": "BYTES", "data": long}]}),
        ),
    ];
    for (path, body) in &routes {
        let resp = client
            .post(format!("{base}{path}"))
            .json(body)
            .send()
            .await
            .expect("sent");
        assert_eq!(resp.status(), 503, "{path}");
        assert_eq!(resp.headers()["retry-after"], "1", "{path}");
        let err: Value = resp.json().await.expect("JSON");
        let message = match *path {
            "/v1/embeddings" => err["error"]["message"].as_str(),
            _ => err["error"].as_str(),
        };
        assert!(
            message.is_some_and(|m| m.contains("out of memory")),
            "{path}: {err}"
        );
        // The server goes on serving what fits.
        let (status, body) = post(&base, "/v1/embeddings", &json!({"input": "a short one"})).await;
        assert_eq!(status, 200, "after {path}: {body}");
    }
    handle.shutdown().await.unwrap();
}

/// `/v1/rerank` in the Cohere/Jina shape ranks as TEI's `/rerank` (and the library) does:
/// the same sigmoid scores best first, `top_n`, documents as strings or objects and back with
/// `return_documents`, and clear refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cohere_rerank_ranks_as_the_library_does() {
    let c = classifier("tiny-xlmr-reranker");
    let (handle, base) = serve(vec![
        ModelSpec::Classifier {
            name: "reranker".into(),
            classifier: c,
        },
        ModelSpec::Classifier {
            name: "labels".into(),
            classifier: classifier("tiny-bert-classifier"),
        },
    ])
    .await;
    let reranker = Reranker::new(
        Classifier::load(&Device::cpu(), tiny_model_dir("tiny-xlmr-reranker")).unwrap(),
    )
    .unwrap();
    let query = "What is Deep Learning?";
    let docs = [
        "Deep Learning is not...",
        "Deep learning is...",
        "A recipe for bread.",
    ];
    let want = reranker.scores(query, &docs, false).unwrap();
    let mut order: Vec<usize> = (0..docs.len()).collect();
    order.sort_by(|&a, &b| want[b].total_cmp(&want[a]));
    let (status, body) = post(
        &base,
        "/v1/rerank",
        &json!({"model": "reranker", "query": query, "documents": docs}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    for (r, &i) in results.iter().zip(&order) {
        assert_eq!(r["index"], i, "{body}");
        let got = r["relevance_score"].as_f64().unwrap() as f32;
        assert!((got - want[i]).abs() < 1e-5, "{got} vs {}", want[i]);
        assert!(r.get("document").is_none(), "no documents unless asked");
    }
    assert!(body["usage"]["total_tokens"].as_u64().unwrap() > 0);
    assert_eq!(body["meta"]["billed_units"]["search_units"], 1);
    // Objects in, top_n, documents back; the first classifier of one label by default.
    let objects: Vec<Value> = docs.iter().map(|d| json!({"text": d})).collect();
    let (status, body) = post(
        &base,
        "/v1/rerank",
        &json!({"query": query, "documents": objects, "top_n": 2, "return_documents": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for (r, &i) in results.iter().zip(&order) {
        assert_eq!(r["index"], i);
        assert_eq!(r["document"]["text"], docs[i]);
    }
    // Refusals in the /v1 error format.
    for (req, needle) in [
        (json!({"query": query, "documents": []}), "empty"),
        (
            json!({"query": query, "documents": docs, "max_chunks_per_doc": 2}),
            "max_chunks_per_doc",
        ),
        (
            json!({"model": "labels", "query": query, "documents": docs}),
            "not a reranker",
        ),
        (
            json!({"query": query, "documents": docs, "top_n": 0}),
            "top_n",
        ),
        (json!({"query": query}), "malformed"),
    ] {
        let (status, body) = post(&base, "/v1/rerank", &req).await;
        assert_eq!(status, 400, "{req}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{req}: {body}");
    }
    handle.shutdown().await.unwrap();
}

/// A request of far more inputs than a batch holds is split into batches by the queue and
/// answered in full, in order, each input as the library embeds it; past `max_inputs`
/// (16,384 by default) a request is a clear 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_inputs_are_answered_as_one_request() {
    use streampool_nn::tiny_bert_dir;
    let embedder = Arc::new(SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap());
    let config = ServeConfig {
        addr: "127.0.0.1:0".parse().expect("literal address"),
        ..ServeConfig::default()
    };
    let handle = Server::start(
        config,
        vec![ModelSpec::Embedder {
            name: "tiny-bert".into(),
            embedder: embedder.clone(),
        }],
    )
    .await
    .expect("server starts");
    let base = format!("http://{}", handle.addr());
    let texts: Vec<String> = (0..10_000).map(|i| format!("text number {i}")).collect();
    let (status, body) = post(
        &base,
        "/v1/embeddings",
        &json!({"input": texts, "encoding_format": "float"}),
    )
    .await;
    assert_eq!(status, 200);
    let data = body["data"].as_array().expect("data");
    assert_eq!(data.len(), texts.len());
    for i in [0, 4_321, 9_999] {
        assert_eq!(data[i]["index"], i);
        let got: Vec<f32> = serde_json::from_value(data[i]["embedding"].clone()).unwrap();
        let want = embedder.embed(&[texts[i].as_str()]).unwrap().remove(0);
        assert_close(&got, &want, 1e-5, &format!("input {i}"));
    }
    let too_many = vec!["x"; 100_000];
    let (status, body) = post(&base, "/v1/embeddings", &json!({"input": too_many})).await;
    assert_eq!(status, 413, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("exceed the maximum of 16384"), "{body}");
    handle.shutdown().await.unwrap();
}
