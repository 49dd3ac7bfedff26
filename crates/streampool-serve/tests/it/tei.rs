//! text-embeddings-inference compatibility (`/embed`, `/`, `/info`, `/health`) with the
//! request examples of TEI's README and OpenAPI document, checked against the in-process
//! embedder; and OpenAI's `/v1/models`.

use crate::util::*;
use serde_json::{json, Value};

fn vectors(v: &Value) -> Vec<Vec<f32>> {
    v.as_array()
        .expect("a JSON list")
        .iter()
        .map(floats)
        .collect()
}

fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

async fn tei_error(resp: reqwest::Response) -> (u16, String, String) {
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.expect("a JSON error body");
    (
        status,
        body["error"].as_str().expect("error").to_string(),
        body["error_type"].as_str().expect("error_type").to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tei_readme_examples() {
    let s = start(test_config(), vec![]).await;
    // TEI README: curl 127.0.0.1:8080/embed -X POST -d '{"inputs":"What is Deep Learning?"}'
    for path in ["/embed", "/"] {
        let resp = s
            .post_json(path, &json!({"inputs": "What is Deep Learning?"}))
            .await;
        assert_eq!(resp.status(), 200, "{path}");
        let got = vectors(&resp.json().await.unwrap());
        assert_eq!(got.len(), 1);
        let want = embed_one(&s.embedder, "What is Deep Learning?");
        assert_close(&got[0], &want, 1e-5, path);
    }
    // TEI README, batch: '{"inputs":["Today is a nice day", "I like you"]}'
    let texts = ["Today is a nice day", "I like you"];
    let resp = s.post_json("/embed", &json!({"inputs": texts})).await;
    assert_eq!(resp.status(), 200);
    let got = vectors(&resp.json().await.unwrap());
    assert_eq!(got.len(), 2);
    for (g, t) in got.iter().zip(texts) {
        assert_close(g, &embed_one(&s.embedder, t), 1e-5, t);
        assert!((norm(g) - 1.0).abs() < 1e-4);
    }
    s.handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tei_normalize_truncate_and_token_ids() {
    let mut config = test_config();
    config.max_seq_len = Some(8);
    let s = start(config, vec![]).await;
    let text = "What is Deep Learning?";
    // normalize: false gives the raw mean-pooled vector; scaled to unit length it is the
    // normalized one.
    let resp = s
        .post_json("/embed", &json!({"inputs": text, "normalize": false}))
        .await;
    assert_eq!(resp.status(), 200);
    let raw = vectors(&resp.json().await.unwrap()).remove(0);
    let n = norm(&raw);
    assert!(
        (n - 1.0).abs() > 1e-3,
        "raw vector already unit length ({n})"
    );
    let scaled: Vec<f32> = raw.iter().map(|x| x / n).collect();
    let ids: Vec<i64> = s.embedder.tokenize(&[text]).unwrap().input_ids().to_vec();
    // Longer than max_seq_len = 8: 413 validation unless the request truncates.
    let long = "one two three four five six seven eight nine ten";
    let (status, msg, kind) =
        tei_error(s.post_json("/embed", &json!({"inputs": long})).await).await;
    assert_eq!((status, kind.as_str()), (413, "validation"), "{msg}");
    let resp = s
        .post_json("/embed", &json!({"inputs": long, "truncate": true}))
        .await;
    assert_eq!(resp.status(), 200);
    // The example text fits in 8 tokens, so nothing above was truncated.
    assert!(ids.len() <= 8, "{ids:?}");
    let want = embed_one(&s.embedder, text);
    assert_close(&scaled, &want, 1e-4, "normalize");
    // Token ids are an input too (TEI's InputType): the same embedding.
    let resp = s.post_json("/embed", &json!({"inputs": [ids]})).await;
    assert_eq!(resp.status(), 200);
    let from_ids = vectors(&resp.json().await.unwrap()).remove(0);
    assert_close(&from_ids, &want, 1e-5, "ids vs text");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tei_errors_have_tei_status_and_body() {
    let mut config = test_config();
    config.max_inputs = 2;
    config.max_body_bytes = 1 << 10;
    let s = start(config, vec![]).await;
    let cases = [
        (json!({"inputs": ["a", "b", "c"]}), 413, "validation"),
        (json!({"inputs": []}), 400, "empty"),
        (json!({"inputs": 42}), 422, "validation"),
        (json!({"input": "typo"}), 422, "validation"),
        (
            json!({"inputs": "x", "truncation_direction": "left"}),
            422,
            "validation",
        ),
        (
            json!({"inputs": "x", "prompt_name": "query"}),
            422,
            "validation",
        ),
        (json!({"inputs": "x".repeat(2000)}), 413, "validation"),
    ];
    for (body, status, kind) in cases {
        let (got, msg, got_kind) = tei_error(s.post_json("/embed", &body).await).await;
        assert_eq!((got, got_kind.as_str()), (status, kind), "{body}: {msg}");
        assert!(!msg.is_empty());
    }
    let resp = s
        .client
        .post(s.url("/embed"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    let (status, _, kind) = tei_error(resp).await;
    assert_eq!((status, kind.as_str()), (422, "validation"));
    s.handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tei_info_and_health() {
    let s = start(test_config(), vec![]).await;
    assert_eq!(s.get("/health").await.status(), 200);
    let info: Value = s.get("/info").await.json().await.unwrap();
    assert_eq!(info["model_id"], EMBEDDER);
    assert_eq!(info["model_type"]["embedding"]["pooling"], "mean");
    assert_eq!(
        info["max_input_length"].as_u64().unwrap() as usize,
        s.embedder.tokenizer().max_len()
    );
    assert_eq!(info["max_client_batch_size"], 16_384);
    assert_eq!(info["auto_truncate"], false);
    for key in [
        "model_dtype",
        "max_concurrent_requests",
        "max_batch_tokens",
        "tokenization_workers",
        "version",
    ] {
        assert!(!info[key].is_null(), "{key} missing in {info}");
    }
    s.handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_models_list_and_lookup() {
    let s = start(test_config(), vec![]).await;
    let list: Value = s.get("/v1/models").await.json().await.unwrap();
    assert_eq!(list["object"], "list");
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![MLP, EMBEDDER]);
    for m in list["data"].as_array().unwrap() {
        assert_eq!(m["object"], "model");
        assert_eq!(m["owned_by"], "streampool");
        assert!(m["created"].as_u64().unwrap() > 1_600_000_000);
    }
    let one: Value = s.get("/v1/models/tiny-bert").await.json().await.unwrap();
    assert_eq!(one["id"], EMBEDDER);
    let missing = s.get("/v1/models/nope").await;
    assert_eq!(missing.status(), 404);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    s.handle.shutdown().await.unwrap();
}
