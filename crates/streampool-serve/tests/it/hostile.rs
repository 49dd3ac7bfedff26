//! Hostile requests against a live server: each class of odd input is answered
//! with a clear 4xx (or the documented 422 for a non-finite result), never a crash, a dropped
//! connection, an allocation sized by the client, or a wrong answer under 200; after each,
//! the server still answers a valid request correctly.

// Connections: timeouts, the connection cap, `Expect: 100-continue`, chunked bodies, the
// open-file limit.
mod connections;

use std::time::Duration;

use crate::util::*;
use serde_json::{json, Value};
use streampool_serve::ServeConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const INFER: &str = "/v2/models/mlp/infer";

/// A valid MLP request still gets the in-process model's answer.
async fn still_serves(s: &TestServer) {
    let row: Vec<f32> = (0..MLP_WIDTH).map(|i| (i % 7) as f32 / 7.0 - 0.5).collect();
    let resp = s
        .post_json(
            INFER,
            &json!({"inputs": [{"name": "input", "shape": [1, MLP_WIDTH], "datatype": "FP32",
                    "data": row}]}),
        )
        .await;
    assert_eq!(resp.status(), 200, "a valid request after a hostile one");
    let body: Value = resp.json().await.expect("JSON");
    let want = mlp_rows(&s.mlp, &[row]).concat();
    assert_close(&floats(&body["outputs"][0]["data"]), &want, 1e-4, "output");
}

/// Posts `body` as raw bytes (with `headers`) and returns the status and body text.
async fn post_raw(
    s: &TestServer,
    path: &str,
    body: Vec<u8>,
    headers: &[(&str, String)],
) -> (u16, String) {
    let mut req = s
        .client
        .post(s.url(path))
        .header("content-type", "application/json")
        .body(body);
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let resp = req
        .send()
        .await
        .expect("the server answers (no dropped connection)");
    let status = resp.status().as_u16();
    (status, resp.text().await.expect("body"))
}

/// Posts a KServe binary-extension body: `header` as JSON, then `tail`, with the header's
/// length in `Inference-Header-Content-Length`.
async fn post_binary(s: &TestServer, path: &str, header: Value, tail: &[u8]) -> (u16, String) {
    let header = header.to_string();
    let len = header.len().to_string();
    let mut body = header.into_bytes();
    body.extend_from_slice(tail);
    post_raw(s, path, body, &[("inference-header-content-length", len)]).await
}

async fn expect(s: &TestServer, body: Value, status: u16, needle: &str) {
    let (got, text) = post_raw(s, INFER, body.to_string().into_bytes(), &[]).await;
    assert_eq!(got, status, "{body}: {text}");
    assert!(text.contains(needle), "{body}: {text:?} lacks {needle:?}");
    still_serves(s).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shapes_declaring_more_than_the_data_are_refused_before_allocating() {
    let s = start(test_config(), vec![]).await;
    // A 100-byte body that once aborted the process (it asked for an 8 TiB allocation).
    expect(
        &s,
        json!({"inputs":[{"name":"input","shape":[4294967296u64, 256],"datatype":"FP32","data":[0.0]}]}),
        413,
        "limit",
    )
    .await;
    // Within the element limit, but not what the data holds.
    expect(
        &s,
        json!({"inputs":[{"name":"input","shape":[4, MLP_WIDTH],"datatype":"FP32","data":[0.0]}]}),
        400,
        "do not match",
    )
    .await;
    // BYTES declaring many elements over a few bytes (the binary path allocated per element).
    let header = json!({"inputs":[{"name":"text","shape":[1_000_000_000u64],"datatype":"BYTES",
        "parameters":{"binary_data_size": 9}}]});
    let tail = [5, 0, 0, 0, b'h', b'e', b'l', b'l', b'o'];
    let (got, text) = post_binary(&s, "/v2/models/tiny-bert/infer", header, &tail).await;
    assert_eq!(got, 413, "{text}");
    still_serves(&s).await;
    s.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overflowing_shapes_and_huge_declared_sizes_are_400() {
    let s = start(test_config(), vec![]).await;
    // A shape whose count fits in 64 bits (a server once panicked allocating 8 bytes per
    // element for it), and is far over the element limit.
    expect(
        &s,
        json!({"inputs":[{"name":"input","shape":[3037000500u64, 3037000500u64],"datatype":"FP32","data":[0.0]}]}),
        413,
        "limit",
    )
    .await;
    // A count past 64 bits.
    expect(
        &s,
        json!({"inputs":[{"name":"input","shape":[4294967296u64, 4294967296u64, 2],"datatype":"FP32","data":[0.0]}]}),
        400,
        "overflows",
    )
    .await;
    expect(
        &s,
        json!({"inputs":[{"name":"input","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"datatype":"FP32","data":[0.0]}]}),
        400,
        "dimensions",
    )
    .await;
    // binary_data_size far past the body, and past usize on 32-bit targets.
    let header = json!({"inputs":[{"name":"input","shape":[1, MLP_WIDTH],"datatype":"FP32",
        "parameters":{"binary_data_size": u64::MAX}}]});
    let (got, text) = post_binary(&s, INFER, header, &[]).await;
    assert_eq!(got, 400, "{text}");
    // A header length past the body.
    let (got, text) = post_raw(
        &s,
        INFER,
        b"{}".to_vec(),
        &[(
            "inference-header-content-length",
            "18446744073709551615".into(),
        )],
    )
    .await;
    assert_eq!(got, 400, "{text}");
    still_serves(&s).await;
    s.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_outside_the_datatype_are_400_and_non_finite_outputs_are_never_200() {
    let s = start(test_config(), vec![]).await;
    // 1e39 is past f32's largest value: it used to become inf, and the answer 0.0 under 200.
    expect(
        &s,
        json!({"inputs":[{"name":"input","shape":[1, MLP_WIDTH],"datatype":"FP32",
            "data": vec![1e39; MLP_WIDTH]}]}),
        400,
        "FP32",
    )
    .await;
    // Binary FP32 infinities and NaNs are refused the same way.
    let header = json!({"inputs":[{"name":"input","shape":[1, MLP_WIDTH],"datatype":"FP32",
        "parameters":{"binary_data_size": 4 * MLP_WIDTH}}]});
    let tail: Vec<u8> = (0..MLP_WIDTH)
        .flat_map(|i| if i == 3 { f32::NAN } else { 0.5 }.to_le_bytes())
        .collect();
    let (got, text) = post_binary(&s, INFER, header, &tail).await;
    assert_eq!(got, 400, "{text}");
    assert!(text.contains("finite"), "{text}");
    // INT32 values past i32.
    let (got, text) = post_raw(
        &s,
        "/v2/models/tiny-bert/infer",
        json!({"inputs":[{"name":"input_ids","shape":[1, 2],"datatype":"INT32","data":[101, 4294967297u64]}]})
            .to_string()
            .into_bytes(),
        &[],
    )
    .await;
    assert_eq!(got, 400, "{text}");
    // 1e38 is a valid f32, but the model's output overflows: an error naming the cause, never
    // `null` (NaN) under 200.
    expect(
        &s,
        json!({"inputs":[{"name":"input","shape":[1, MLP_WIDTH],"datatype":"FP32",
            "data": vec![1e38; MLP_WIDTH]}]}),
        422,
        "not finite",
    )
    .await;
    s.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_finite_row_fails_only_its_own_request() {
    // One batch holds both requests (a long window, two requests sent at once): the hostile
    // one gets its error, the other its answer.
    let mut config = test_config();
    config.batch.max_wait = Duration::from_millis(200);
    config.batch.workers = 1;
    let s = start(config, vec![]).await;
    let good_row: Vec<f32> = (0..MLP_WIDTH).map(|i| (i % 5) as f32 / 5.0).collect();
    let good = json!({"inputs":[{"name":"input","shape":[1, MLP_WIDTH],"datatype":"FP32","data": good_row}]});
    let bad = json!({"inputs":[{"name":"input","shape":[1, MLP_WIDTH],"datatype":"FP32","data": vec![1e38; MLP_WIDTH]}]});
    let (g, b) = tokio::join!(s.post_json(INFER, &good), s.post_json(INFER, &bad));
    assert_eq!(b.status(), 422);
    assert_eq!(g.status(), 200);
    let body: Value = g.json().await.expect("JSON");
    let want = mlp_rows(&s.mlp, &[good_row]).concat();
    assert_close(&floats(&body["outputs"][0]["data"]), &want, 1e-4, "output");
    s.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn element_and_body_limits_are_413_naming_the_limit() {
    let config = ServeConfig {
        max_elements: 4 * MLP_WIDTH,
        max_body_bytes: 256 << 10,
        ..test_config()
    };
    let s = start(config, vec![]).await;
    expect(
        &s,
        json!({"inputs":[{"name":"input","shape":[5, MLP_WIDTH],"datatype":"FP32",
            "data": vec![0.5; 5 * MLP_WIDTH]}]}),
        413,
        "1024",
    )
    .await;
    // Over the body limit.
    let (got, text) = post_raw(&s, INFER, vec![b' '; 300 << 10], &[]).await;
    assert_eq!(got, 413, "{text}");
    assert!(text.contains("262144"), "{text}");
    still_serves(&s).await;
    s.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_nesting_is_400_on_every_decoder() {
    let s = start(test_config(), vec![]).await;
    let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
    let bodies = [
        (
            INFER,
            format!(
                r#"{{"inputs":[{{"name":"input","shape":[1],"datatype":"FP32","data":{deep}}}]}}"#
            ),
        ),
        ("/v1/embeddings", format!(r#"{{"input":{deep}}}"#)),
        ("/embed", format!(r#"{{"inputs":{deep}}}"#)),
    ];
    for (path, body) in bodies {
        let (got, text) = post_raw(&s, path, body.into_bytes(), &[]).await;
        assert!(got == 400 || got == 422, "{path}: {got} {text}");
    }
    // Nesting within serde's limit but past ours (8 levels) in KServe data.
    let nested = format!("{}0.5{}", "[".repeat(20), "]".repeat(20));
    expect(
        &s,
        serde_json::from_str(&format!(
            r#"{{"inputs":[{{"name":"input","shape":[1],"datatype":"FP32","data":{nested}}}]}}"#
        ))
        .expect("valid JSON"),
        400,
        "nested",
    )
    .await;
    s.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_times_out_while_other_clients_are_served() {
    let config = ServeConfig {
        body_timeout: Duration::from_millis(500),
        ..test_config()
    };
    let s = start(config, vec![]).await;
    // Declares 1000 bytes and sends 10, then stalls.
    let mut slow = tokio::net::TcpStream::connect(s.handle.addr())
        .await
        .expect("connect");
    slow.write_all(
        format!(
            "POST {INFER} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"inputs\""
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    // Others are served meanwhile.
    still_serves(&s).await;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut answer))
        .await
        .expect("the stalled request is answered within its body timeout")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    still_serves(&s).await;
    s.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedding_routes_refuse_odd_inputs_and_keep_serving() {
    let s = start(test_config(), vec![]).await;
    let cases: Vec<(&str, Value)> = vec![
        ("/v1/embeddings", json!({"input": []})),
        ("/v1/embeddings", json!({"input": [[1, 2], "a"]})),
        ("/v1/embeddings", json!({"input": [[-1]]})),
        (
            "/v1/embeddings",
            json!({"input": [[9_223_372_036_854_775_807i64]]}),
        ),
        ("/v1/embeddings", json!({"input": "x", "dimensions": 1e30})),
        ("/v1/embeddings", json!({"input": vec!["a"; 20_000]})),
        ("/embed", json!({"inputs": vec!["a"; 20_000]})),
        ("/embed", json!({"inputs": [1.5]})),
        (
            "/embed",
            json!({"inputs": "x", "truncation_direction": "Sideways"}),
        ),
        (
            "/v2/models/tiny-bert/infer",
            json!({"inputs":[{"name":"input_ids","shape":[1, 3],"datatype":"INT64","data":[101, 99999999, 102]}]}),
        ),
        (
            "/v2/models/tiny-bert/infer",
            json!({"inputs":[{"name":"text","shape":[2],"datatype":"BYTES","data":["a"]}]}),
        ),
    ];
    for (path, body) in cases {
        let (got, text) = post_raw(&s, path, body.to_string().into_bytes(), &[]).await;
        assert!(
            (400..500).contains(&got),
            "{path} {body}: {got} {text} (a 4xx was expected)"
        );
    }
    still_serves(&s).await;
    s.handle.shutdown().await.expect("shutdown");
}
