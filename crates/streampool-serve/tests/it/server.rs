//! Every endpoint of the server over real HTTP on 127.0.0.1:0, answers checked against the
//! in-process models.

use std::time::Duration;

use crate::util::*;
use base64::Engine;
use serde_json::{json, Value};
use streampool_serve::{ModelSpec, ServeConfig};

const TEXTS: [&str; 3] = ["hello world", "a b c", "the streampool server answers"];

fn mlp_inputs(n: usize, tag: f32) -> Vec<Vec<f32>> {
    (0..n)
        .map(|r| {
            (0..MLP_WIDTH)
                .map(|c| ((r * 31 + c * 7) % 23) as f32 / 23.0 - 0.5 + tag)
                .collect()
        })
        .collect()
}

async fn error_message(resp: reqwest::Response) -> String {
    let v: Value = resp.json().await.expect("error body is JSON");
    v["error"].as_str().expect("error is a string").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_metadata() {
    let s = start(test_config(), vec![]).await;
    assert_eq!(s.get("/v2/health/live").await.status(), 200);
    assert_eq!(s.get("/v2/health/ready").await.status(), 200);
    let meta: Value = s.get("/v2").await.json().await.unwrap();
    assert_eq!(meta["name"], "streampool");

    let m: Value = s.get("/v2/models/tiny-bert").await.json().await.unwrap();
    assert_eq!(m["name"], EMBEDDER);
    assert_eq!(m["inputs"][0]["name"], "text");
    assert_eq!(m["inputs"][0]["datatype"], "BYTES");
    assert_eq!(m["outputs"][0]["shape"], json!([-1, s.embedder.dim()]));
    let m: Value = s
        .get("/v2/models/mlp/versions/1")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(m["inputs"][0]["shape"], json!([-1, MLP_WIDTH]));
    assert_eq!(m["outputs"][0]["datatype"], "FP32");

    assert_eq!(s.get("/v2/models/mlp/ready").await.status(), 200);
    assert_eq!(
        s.get("/v2/models/tiny-bert/versions/1/ready")
            .await
            .status(),
        200
    );
    for path in [
        "/v2/models/nope",
        "/v2/models/nope/ready",
        "/v2/models/mlp/versions/7",
    ] {
        let resp = s.get(path).await;
        assert_eq!(resp.status(), 404, "{path}");
        assert!(error_message(resp).await.contains("unknown"), "{path}");
    }
    s.handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infer_embedder_matches_in_process_model() {
    let s = start(test_config(), vec![]).await;
    let body = json!({
        "id": "req-1",
        "inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "data": TEXTS}],
    });
    let resp = s.post_json("/v2/models/tiny-bert/infer", &body).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["id"], "req-1");
    assert_eq!(v["model_name"], EMBEDDER);
    let out = &v["outputs"][0];
    assert_eq!(out["name"], "embedding");
    assert_eq!(out["datatype"], "FP32");
    let dim = s.embedder.dim();
    assert_eq!(out["shape"], json!([3, dim]));
    let got = floats(&out["data"]);
    for (i, text) in TEXTS.iter().enumerate() {
        let want = embed_one(&s.embedder, text);
        assert_close(&got[i * dim..(i + 1) * dim], &want, 1e-5, text);
    }

    // The same texts as token ids with an attention mask give the same embeddings.
    let batch = s.embedder.tokenize(&TEXTS).unwrap();
    let seq = batch.seq_len();
    let body = json!({
        "inputs": [
            {"name": "input_ids", "shape": [3, seq], "datatype": "INT64", "data": batch.input_ids()},
            {"name": "attention_mask", "shape": [3, seq], "datatype": "INT64", "data": batch.attention_mask()},
        ],
        "outputs": [{"name": "embedding"}],
    });
    let v: Value = s
        .post_json("/v2/models/tiny-bert/infer", &body)
        .await
        .json()
        .await
        .unwrap();
    assert_close(&floats(&v["outputs"][0]["data"]), &got, 1e-5, "token ids");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infer_mlp_json_and_binary_match_in_process_model() {
    let s = start(test_config(), vec![]).await;
    let rows = mlp_inputs(5, 0.0);
    let want = mlp_rows(&s.mlp, &rows);
    // Nested JSON data.
    let body = json!({"inputs": [{"name": "input", "shape": [5, MLP_WIDTH], "datatype": "FP32", "data": rows}]});
    let v: Value = s
        .post_json("/v2/models/mlp/infer", &body)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["outputs"][0]["shape"], json!([5, MLP_WIDTH]));
    assert_close(
        &floats(&v["outputs"][0]["data"]),
        &want.concat(),
        1e-5,
        "mlp json",
    );

    // Binary-data extension: raw little-endian input after the JSON header, binary output.
    let header = serde_json::to_vec(&json!({
        "inputs": [{"name": "input", "shape": [5, MLP_WIDTH], "datatype": "FP32",
                    "parameters": {"binary_data_size": 5 * MLP_WIDTH * 4}}],
        "outputs": [{"name": "output", "parameters": {"binary_data": true}}],
    }))
    .unwrap();
    let mut body = header.clone();
    body.extend(rows.concat().iter().flat_map(|x| x.to_le_bytes()));
    let resp = s
        .client
        .post(s.url("/v2/models/mlp/infer"))
        .header("Inference-Header-Content-Length", header.len())
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let n: usize = resp.headers()["inference-header-content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let bytes = resp.bytes().await.unwrap();
    let head: Value = serde_json::from_slice(&bytes[..n]).unwrap();
    assert_eq!(
        head["outputs"][0]["parameters"]["binary_data_size"],
        5 * MLP_WIDTH * 4
    );
    let got: Vec<f32> = bytes[n..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_close(&got, &want.concat(), 1e-5, "mlp binary");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_embeddings_single_list_base64_and_usage() {
    let s = start(test_config(), vec![]).await;
    let tokens = |t: &str| s.embedder.tokenize(&[t]).unwrap().seq_len();

    let v: Value = s
        .post_json(
            "/v1/embeddings",
            &json!({"model": EMBEDDER, "input": TEXTS[0]}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["model"], EMBEDDER);
    assert_eq!(v["data"].as_array().unwrap().len(), 1);
    assert_eq!(v["data"][0]["object"], "embedding");
    assert_close(
        &floats(&v["data"][0]["embedding"]),
        &embed_one(&s.embedder, TEXTS[0]),
        1e-5,
        "single",
    );
    assert_eq!(v["usage"]["prompt_tokens"], tokens(TEXTS[0]));
    assert_eq!(v["usage"]["total_tokens"], tokens(TEXTS[0]));

    let v: Value = s
        .post_json(
            "/v1/embeddings",
            &json!({"model": EMBEDDER, "input": TEXTS, "encoding_format": "float"}),
        )
        .await
        .json()
        .await
        .unwrap();
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    for (i, text) in TEXTS.iter().enumerate() {
        assert_eq!(data[i]["index"], i);
        assert_close(
            &floats(&data[i]["embedding"]),
            &embed_one(&s.embedder, text),
            1e-5,
            text,
        );
    }
    let total: usize = TEXTS.iter().map(|t| tokens(t)).sum();
    assert_eq!(v["usage"]["prompt_tokens"], total);

    // base64 (what the openai Python client asks for by default), and no "model": the first
    // embedder is the default.
    let v: Value = s
        .post_json(
            "/v1/embeddings",
            &json!({"input": [TEXTS[2]], "encoding_format": "base64"}),
        )
        .await
        .json()
        .await
        .unwrap();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(v["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let got: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_close(&got, &embed_one(&s.embedder, TEXTS[2]), 1e-5, "base64");

    // Token ids as input.
    let ids = s
        .embedder
        .tokenize(&[TEXTS[1]])
        .unwrap()
        .input_ids()
        .to_vec();
    let v: Value = s
        .post_json(
            "/v1/embeddings",
            &json!({"model": EMBEDDER, "input": [ids]}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_close(
        &floats(&v["data"][0]["embedding"]),
        &embed_one(&s.embedder, TEXTS[1]),
        1e-5,
        "ids",
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_answered_with_status_and_message() {
    let config = ServeConfig {
        max_inputs: 4,
        max_seq_len: Some(8),
        max_body_bytes: 64 << 10,
        ..test_config()
    };
    let s = start(config, vec![]).await;
    let long_text = "one two three four five six seven eight nine ten";
    let cases: Vec<(&str, Value, u16, &str)> = vec![
        (
            "/v2/models/mlp/infer",
            json!({"inputs": [{"name": "input", "shape": [1, MLP_WIDTH], "datatype": "INT64",
            "data": vec![1; MLP_WIDTH]}]}),
            400,
            "must be FP32",
        ),
        (
            "/v2/models/mlp/infer",
            json!({"inputs": [{"name": "input", "shape": [1, 255], "datatype": "FP32",
            "data": vec![1.0; 255]}]}),
            400,
            "shape",
        ),
        (
            "/v2/models/mlp/infer",
            json!({"inputs": [{"name": "input", "shape": [2, MLP_WIDTH], "datatype": "FP32",
            "data": vec![1.0; MLP_WIDTH]}]}),
            400,
            "do not match",
        ),
        (
            "/v2/models/mlp/infer",
            json!({"inputs": [{"name": "input", "shape": [5, MLP_WIDTH], "datatype": "FP32",
            "data": vec![1.0; 5 * MLP_WIDTH]}]}),
            413,
            "exceed the maximum",
        ),
        (
            "/v2/models/mlp/infer",
            json!({"inputs": [{"name": "x", "shape": [1, MLP_WIDTH], "datatype": "FP32",
            "data": vec![1.0; MLP_WIDTH]}]}),
            400,
            "takes",
        ),
        (
            "/v2/models/mlp/infer",
            json!({"inputs": [{"name": "input", "shape": [1, MLP_WIDTH], "datatype": "FP32",
            "data": vec![1.0; MLP_WIDTH]}], "outputs": [{"name": "nope"}]}),
            400,
            "unknown output",
        ),
        (
            "/v2/models/tiny-bert/infer",
            json!({"inputs": [{"name": "text", "shape": [1], "datatype": "FP32",
            "data": [1.0]}]}),
            400,
            "must be BYTES",
        ),
        (
            "/v2/models/tiny-bert/infer",
            json!({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
            "data": [1.5]}]}),
            400,
            "not a valid BYTES",
        ),
        (
            "/v2/models/tiny-bert/infer",
            json!({"inputs": [{"name": "text", "shape": [1, 2], "datatype": "BYTES",
            "data": ["a", "b"]}]}),
            400,
            "shape [N] or [N, 1]",
        ),
        (
            "/v2/models/tiny-bert/infer",
            json!({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
            "data": [long_text]}]}),
            400,
            "exceeds the maximum of 8",
        ),
        (
            "/v2/models/tiny-bert/infer",
            json!({"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64",
            "data": [101, 999999]}]}),
            400,
            "vocabulary",
        ),
        (
            "/v2/models/nope/infer",
            json!({"inputs": []}),
            404,
            "unknown model",
        ),
        (
            "/v2/models/mlp/infer",
            json!({"inputs": "nope"}),
            400,
            "malformed",
        ),
    ];
    for (path, body, status, needle) in cases {
        let resp = s.post_json(path, &body).await;
        assert_eq!(resp.status(), status, "{path} {body}");
        let msg = error_message(resp).await;
        assert!(msg.contains(needle), "{path}: {msg:?} lacks {needle:?}");
    }

    let resp = s
        .client
        .post(s.url("/v2/models/mlp/infer"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert!(error_message(resp).await.contains("malformed"));

    let big = vec![b' '; 65 << 10];
    let resp = s
        .client
        .post(s.url("/v2/models/mlp/infer"))
        .body(big.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert!(error_message(resp).await.contains("limit"));
    let resp = s
        .client
        .post(s.url("/v1/embeddings"))
        .body(big)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);

    // OpenAI route: errors in OpenAI's format.
    let openai_cases = [
        (json!({"model": EMBEDDER, "input": long_text}), 400),
        (
            json!({"model": EMBEDDER, "input": ["a", "b", "c", "d", "e"]}),
            413,
        ),
        (json!({"model": EMBEDDER, "input": []}), 400),
        (json!({"model": EMBEDDER, "input": 3.5}), 400),
        (
            json!({"model": EMBEDDER, "input": "x", "encoding_format": "hex"}),
            400,
        ),
        (json!({"model": MLP, "input": "x"}), 400),
        (json!({"model": "nope", "input": "x"}), 404),
        (json!({"input_typo": "x"}), 400),
    ];
    for (body, status) in openai_cases {
        let resp = s.post_json("/v1/embeddings", &body).await;
        assert_eq!(resp.status(), status, "{body}");
        let v: Value = resp.json().await.unwrap();
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    assert_eq!(s.get("/no/such/route").await.status(), 404);
    s.handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncation_when_configured() {
    let config = ServeConfig {
        max_seq_len: Some(8),
        truncate: true,
        ..test_config()
    };
    let s = start(config, vec![]).await;
    let long_text = "one two three four five six seven eight nine ten";
    let v: Value = s
        .post_json(
            "/v1/embeddings",
            &json!({"model": EMBEDDER, "input": long_text}),
        )
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], 8);
    // The answer is the embedding of the first 8 tokens ([CLS], 6 words, [SEP]).
    let want = embed_one(&s.embedder, "one two three four five six");
    assert_close(
        &floats(&v["data"][0]["embedding"]),
        &want,
        1e-5,
        "truncated",
    );
    s.handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_expose_the_expected_series() {
    let s = start(test_config(), vec![]).await;
    let body = json!({"inputs": [{"name": "input", "shape": [2, MLP_WIDTH], "datatype": "FP32",
        "data": mlp_inputs(2, 0.0)}]});
    assert_eq!(
        s.post_json("/v2/models/mlp/infer", &body).await.status(),
        200
    );
    assert_eq!(
        s.post_json("/v1/embeddings", &json!({"input": "hi"}))
            .await
            .status(),
        200
    );
    assert_eq!(
        s.post_json("/v2/models/mlp/infer", &json!({}))
            .await
            .status(),
        400
    );
    let text = s.get("/metrics").await.text().await.unwrap();
    for series in [
        r#"streampool_http_requests_total{method="POST",route="/v2/models/{name}/infer",code="200"} 1"#,
        r#"streampool_http_requests_total{method="POST",route="/v1/embeddings",code="200"} 1"#,
        r#"streampool_http_errors_total{route="/v2/models/{name}/infer",code="400"} 1"#,
        r#"streampool_http_request_duration_seconds_bucket{le="+Inf",route="/v1/embeddings"} 1"#,
        r#"streampool_http_request_duration_seconds_count{route="/v2/models/{name}/infer"} 2"#,
        r#"streampool_queue_depth{model="mlp",device="cpu"} 0"#,
        r#"streampool_queue_tokens{model="mlp",device="cpu"} 0"#,
        r#"streampool_queue_outstanding{model="mlp",device="cpu"} 0"#,
        r#"streampool_queue_completed_total{model="mlp",device="cpu"} 2"#,
        r#"streampool_queue_completed_total{model="tiny-bert",device="cpu"} 1"#,
        r#"streampool_queue_rejected_total{model="mlp",device="cpu"} 0"#,
        r#"streampool_replica_routed_total{model="mlp",device="cpu"} 2"#,
        r#"streampool_batch_size_bucket{le="2.0",model="mlp",device="cpu"} 1"#,
        r#"streampool_batch_size_bucket{le="+Inf",model="mlp",device="cpu"} 1"#,
        r#"streampool_batch_size_sum{model="mlp",device="cpu"} 2.0"#,
        r#"streampool_queue_latency_seconds{model="mlp",device="cpu",quantile="0.99"}"#,
        r#"streampool_device_busy_seconds_total{model="mlp",device="cpu"}"#,
        r#"streampool_replicas{model="mlp"} 1"#,
        "streampool_ready 1",
        "# TYPE streampool_batch_size histogram",
        "# UNIT streampool_http_request_duration_seconds seconds",
        "# EOF",
    ] {
        assert!(text.contains(series), "missing {series} in\n{text}");
    }
    s.handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_each_get_their_own_result() {
    let s = std::sync::Arc::new(start(test_config(), vec![]).await);
    let mut tasks = Vec::new();
    for client in 0..64usize {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            // Each client's inputs carry its number, so a swapped answer cannot match.
            let rows = mlp_inputs(1 + client % 3, client as f32);
            let want = mlp_rows(&s.mlp, &rows);
            let body = json!({"inputs": [{"name": "input", "shape": [rows.len(), MLP_WIDTH],
                "datatype": "FP32", "data": rows}]});
            let v: Value = s
                .post_json("/v2/models/mlp/infer", &body)
                .await
                .json()
                .await
                .unwrap();
            assert_close(
                &floats(&v["outputs"][0]["data"]),
                &want.concat(),
                1e-4,
                "mlp",
            );

            let text = format!("client number {client} says hello {}", client * 7);
            let v: Value = s
                .post_json(
                    "/v1/embeddings",
                    &json!({"model": EMBEDDER, "input": [&text]}),
                )
                .await
                .json()
                .await
                .unwrap();
            assert_close(
                &floats(&v["data"][0]["embedding"]),
                &embed_one(&s.embedder, &text),
                1e-5,
                &text,
            );
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
    let s = std::sync::Arc::into_inner(s).expect("tasks done");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_is_answered_503_never_a_hang() {
    let gate = Gate::default();
    let mut config = test_config();
    config.batch.max_queue = 2;
    config.batch.max_batch_size = 1;
    config.batch.workers = 1;
    let s = std::sync::Arc::new(
        start(
            config,
            vec![ModelSpec::Tensor {
                name: "slow".into(),
                model: gated_model(gate.clone()),
            }],
        )
        .await,
    );
    const N: u64 = 6;
    let mut tasks = Vec::new();
    for i in 0..N {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let x = [i as f32, 1.0, 2.0, 3.0];
            let body = json!({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": x}]});
            let resp = s.post_json("/v2/models/slow/infer", &body).await;
            let status = resp.status().as_u16();
            let retry_after = resp.headers().get("retry-after").is_some();
            let v: Value = resp.json().await.unwrap();
            (x, status, retry_after, v)
        }));
    }
    // While the gate is closed at most 1 request runs and 2 wait: the rest must be refused.
    wait_until(
        || {
            let (a, r) = s.queue_counts("slow");
            a + r == N
        },
        "every request to reach the queue",
    )
    .await;
    let (accepted, rejected) = s.queue_counts("slow");
    assert!(accepted <= 3, "accepted {accepted} with room for 3");
    gate.open();
    let (mut ok, mut refused) = (0, 0);
    for t in tasks {
        let (x, status, retry_after, v) = t.await.unwrap();
        match status {
            200 => {
                ok += 1;
                let want: Vec<f32> = x.iter().map(|v| 2.0 * v + 1.0).collect();
                assert_close(&floats(&v["outputs"][0]["data"]), &want, 1e-6, "slow");
            }
            503 => {
                refused += 1;
                assert!(retry_after, "503 without Retry-After");
                assert!(v["error"].as_str().unwrap().contains("full"), "{v}");
            }
            other => panic!("unexpected status {other}: {v}"),
        }
    }
    assert_eq!((ok, refused), (accepted, rejected));
    let s = std::sync::Arc::into_inner(s).expect("tasks done");
    s.handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_timeout_is_answered_504() {
    let gate = Gate::default();
    let config = ServeConfig {
        request_timeout: Duration::from_millis(200),
        ..test_config()
    };
    let s = start(
        config,
        vec![ModelSpec::Tensor {
            name: "slow".into(),
            model: gated_model(gate.clone()),
        }],
    )
    .await;
    let body = json!({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]});
    let resp = s.post_json("/v2/models/slow/infer", &body).await;
    assert_eq!(resp.status(), 504);
    assert!(error_message(resp).await.contains("timed out"));
    gate.open();
    s.handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_answers_requests_in_flight() {
    let gate = Gate::default();
    let s = start(
        test_config(),
        vec![ModelSpec::Tensor {
            name: "slow".into(),
            model: gated_model(gate.clone()),
        }],
    )
    .await;
    let (client, url, addr) = (
        s.client.clone(),
        s.url("/v2/models/slow/infer"),
        s.handle.addr(),
    );
    let mut tasks = Vec::new();
    for i in 0..4 {
        let (client, url) = (client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            let x = [i as f32; 4];
            let body = json!({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": x}]});
            let resp = client.post(url).json(&body).send().await.expect("answered");
            (x, resp.status().as_u16(), resp.json::<Value>().await.expect("body"))
        }));
    }
    wait_until(|| s.queue_counts("slow").0 == 4, "4 requests accepted").await;
    let handle = s.handle;
    let shutdown = tokio::spawn(handle.shutdown());
    // The listener closes while the 4 requests are still held at the gate.
    let mut closed = false;
    for _ in 0..300 {
        if tokio::net::TcpStream::connect(addr).await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(closed, "the listener stayed open after shutdown began");
    assert!(
        tasks.iter().all(|t| !t.is_finished()),
        "a request was answered before the gate opened"
    );
    gate.open();
    for t in tasks {
        let (x, status, v) = t.await.unwrap();
        assert_eq!(status, 200, "{v}");
        let want: Vec<f32> = x.iter().map(|v| 2.0 * v + 1.0).collect();
        assert_close(&floats(&v["outputs"][0]["data"]), &want, 1e-6, "in flight");
    }
    shutdown.await.unwrap().unwrap();
}
