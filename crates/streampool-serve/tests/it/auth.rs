//! Who may call (`ServeConfig::api_key`), and a panicking handler staying in its request.

use crate::util::*;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use serde_json::{json, Value};
use streampool::Device;
use streampool_serve::{harden, ApiKey, AppState, ModelSpec, ServeConfig, TensorModel};
use tower::ServiceExt;

const KEY: &str = "sp-test-key-0123456789abcdef";

fn mlp_request() -> Value {
    json!({"inputs": [{"name": "input", "shape": [1, MLP_WIDTH], "datatype": "FP32",
            "data": vec![0.25; MLP_WIDTH]}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_model_route_needs_the_key_and_probes_stay_open() {
    let config = ServeConfig {
        api_key: Some(ApiKey::new(KEY).expect("key")),
        ..test_config()
    };
    let s = start(config, vec![]).await;
    let posts: [(&str, Value); 4] = [
        ("/v2/models/mlp/infer", mlp_request()),
        ("/v1/embeddings", json!({"input": "hello"})),
        ("/embed", json!({"inputs": "hello"})),
        ("/", json!({"inputs": "hello"})),
    ];
    for (path, body) in &posts {
        for auth in [None, Some("Bearer wrong-key"), Some("Basic abc"), Some(KEY)] {
            let mut req = s.client.post(s.url(path)).json(body);
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            let resp = req.send().await.expect("POST");
            assert_eq!(resp.status(), 401, "{path} with {auth:?}");
            assert_eq!(
                resp.headers()["www-authenticate"],
                "Bearer",
                "{path}: a 401 names the scheme"
            );
            let err: Value = resp.json().await.expect("a JSON error");
            // Each protocol's own error format.
            let message = match *path {
                "/v1/embeddings" => err["error"]["message"].as_str(),
                _ => err["error"].as_str(),
            };
            assert!(
                message.is_some_and(|m| m.contains("API key")),
                "{path}: {err}"
            );
            let tei = matches!(*path, "/embed" | "/");
            assert_eq!(err.get("error_type").is_some(), tei, "{path}: {err}");
        }
        let resp = s
            .client
            .post(s.url(path))
            .bearer_auth(KEY)
            .json(body)
            .send()
            .await
            .expect("POST");
        assert_eq!(resp.status(), 200, "{path} with the key");
    }
    // TEI's other routes answer a missing key in TEI's format too.
    for path in ["/rerank", "/predict"] {
        let resp = s
            .client
            .post(s.url(path))
            .json(&json!({}))
            .send()
            .await
            .expect("POST");
        assert_eq!(resp.status(), 401, "{path}");
        let err: Value = resp.json().await.expect("a JSON error");
        assert_eq!(err["error_type"], "unauthorized", "{path}: {err}");
    }
    for path in [
        "/v2/models/mlp",
        "/v1/models",
        "/info",
        "/v2",
        "/no-such-route",
    ] {
        assert_eq!(s.get(path).await.status(), 401, "{path} without the key");
    }
    let resp = s
        .client
        .get(s.url("/v2/models/mlp"))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("GET");
    assert_eq!(resp.status(), 200);
    for path in ["/v2/health/live", "/v2/health/ready", "/health", "/metrics"] {
        assert_eq!(s.get(path).await.status(), 200, "{path} stays open");
    }
    let metrics = s.get("/metrics").await.text().await.expect("text");
    let refused = metrics
        .lines()
        .find(|l| l.starts_with("streampool_http_unauthorized_total"))
        .expect("the unauthorized counter");
    // 4 refused tries on each of 4 routes, 2 more TEI routes, 5 GETs.
    assert!(refused.ends_with(" 23"), "{refused}");
    s.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_be_protected_and_no_key_means_open() {
    let config = ServeConfig {
        api_key: Some(ApiKey::new(KEY).expect("key")),
        protect_metrics: true,
        ..test_config()
    };
    let s = start(config, vec![]).await;
    assert_eq!(s.get("/metrics").await.status(), 401);
    let resp = s
        .client
        .get(s.url("/metrics"))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("GET");
    assert_eq!(resp.status(), 200);
    assert_eq!(s.get("/v2/health/ready").await.status(), 200);
    s.handle.shutdown().await.expect("shutdown");

    // Without a key, everything is open, as before.
    let s = start(test_config(), vec![]).await;
    let resp = s.post_json("/v2/models/mlp/infer", &mlp_request()).await;
    assert_eq!(resp.status(), 200);
    s.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_answers_500_for_its_request_only() {
    let mlp = TensorModel::mlp(&Device::cpu(), MLP_WIDTH, 0).expect("mlp");
    let state = AppState::new(
        test_config(),
        vec![ModelSpec::Tensor {
            name: MLP.into(),
            model: mlp,
        }],
    )
    .expect("state");
    // The server's own routes plus one that panics, behind the server's layers.
    let app = harden(
        streampool_serve::routes(&state).route(
            "/boom",
            get(|| async {
                if true {
                    panic!("a bug in a handler");
                }
                "unreachable"
            }),
        ),
        state.clone(),
    );
    let boom = app
        .clone()
        .oneshot(Request::get("/boom").body(Body::empty()).expect("request"))
        .await
        .expect("the service answers");
    assert_eq!(boom.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = axum::body::to_bytes(boom.into_body(), 1 << 20)
        .await
        .expect("body");
    let err: Value = serde_json::from_slice(&body).expect("JSON");
    assert!(
        err["error"]
            .as_str()
            .is_some_and(|m| m.contains("panicked")),
        "{err}"
    );
    // The same service goes on answering valid requests.
    let ok = app
        .clone()
        .oneshot(
            Request::post("/v2/models/mlp/infer")
                .header("content-type", "application/json")
                .body(Body::from(mlp_request().to_string()))
                .expect("request"),
        )
        .await
        .expect("the service answers");
    assert_eq!(ok.status(), StatusCode::OK);
    let metrics = app
        .oneshot(
            Request::get("/metrics")
                .body(Body::empty())
                .expect("request"),
        )
        .await
        .expect("metrics");
    let text = axum::body::to_bytes(metrics.into_body(), 1 << 20)
        .await
        .expect("body");
    let text = String::from_utf8_lossy(&text);
    assert!(
        text.lines().any(|l| l == "streampool_http_panics_total 1"),
        "{text}"
    );
    drop(state);
}
