//! The request paths as fuzzers drive them: the cargo-fuzz targets (`fuzz/fuzz_targets/
//! serve_*.rs`, coverage-guided, under AddressSanitizer) and the mutation run that CI makes
//! in `cargo test` (`tests/it/fuzz_replay.rs`) call the same functions, so both search the same
//! code. Not a stable API: hidden from the docs.
//!
//! A finding is a panic, an abort (an allocation the allocator refuses: the fuzzers bound
//! single allocations), or an `Err` from [`Harness::run`]: a 500 answer, a body that is not
//! the JSON its content type says, or a `null` (a NaN or infinity) in a 200 answer.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request};
use axum::Router;
use serde_json::Value;
use streampool::Device;
use streampool_nn::{tiny_bert_dir, SentenceEmbedder};
use tower::ServiceExt;

use crate::kserve::tensors::{self, InferRequest, HEADER_LENGTH};
use crate::{router, AppState, BatchConfig, ModelSpec, ServeConfig, TensorModel};

/// Width of the harness's MLP (`FP32 [N, 8] -> [N, 8]`).
pub const MLP_WIDTH: usize = 8;
/// The harness's element limit per KServe request.
pub const MAX_ELEMENTS: usize = 4096;

/// The routes a fuzz input can reach; its first byte picks one (modulo their number).
const ROUTES: [(&str, bool); 8] = [
    ("/v2/models/mlp/infer", false),
    ("/v2/models/mlp/infer", true),
    ("/v2/models/tiny-bert/infer", false),
    ("/v2/models/tiny-bert/infer", true),
    ("/v1/embeddings", false),
    ("/embed", false),
    ("/", false),
    ("/v2/models/mlp/versions/1/infer", false),
];

/// The request a fuzz input stands for: byte 0 picks the route; for the routes that take
/// the KServe binary extension, bytes 1-2 give the JSON header's length (little-endian,
/// modulo the body's length + 1); the rest is the body.
pub fn request(data: &[u8]) -> Request<Body> {
    let (&pick, rest) = data.split_first().unwrap_or((&0, &[]));
    let (path, binary) = ROUTES[usize::from(pick) % ROUTES.len()];
    let mut builder = Request::post(path).header(header::CONTENT_TYPE, "application/json");
    let body = if binary && rest.len() >= 2 {
        let (len, body) = rest.split_at(2);
        let len = usize::from(u16::from_le_bytes([len[0], len[1]])) % (body.len() + 1);
        builder = builder.header(HEADER_LENGTH, len);
        body
    } else {
        rest
    };
    // Every part of the request is valid by construction (a fixed method, path and
    // headers), so building it cannot fail.
    builder
        .body(Body::from(body.to_vec()))
        .expect("a request of fixed, valid parts")
}

/// The KServe decoder alone: the binary split, the JSON request, and every input decoded
/// within [`MAX_ELEMENTS`]. Errors are expected answers; panics and aborts are findings.
pub fn decode_kserve(data: &[u8]) {
    let (header_len, body) = match data.split_first_chunk::<2>() {
        Some((len, body)) => {
            let len = usize::from(u16::from_le_bytes(*len)) % (body.len() + 2);
            (Some(len.to_string()), body)
        }
        None => (None, data),
    };
    let Ok((json, binary)) = tensors::split_body(body, header_len.as_deref()) else {
        return;
    };
    if let Ok(req) = serde_json::from_slice::<InferRequest>(json) {
        if let Ok(inputs) = tensors::decode_inputs(&req, binary, MAX_ELEMENTS) {
            let elements: usize = inputs
                .iter()
                .map(|i| i.shape.iter().product::<usize>())
                .sum();
            assert!(elements <= MAX_ELEMENTS, "decoded past the element limit");
            for i in &inputs {
                let n: usize = i.shape.iter().product();
                let held = match &i.data {
                    tensors::Data::F32(v) => {
                        assert!(
                            v.iter().all(|x| x.is_finite()),
                            "a non-finite FP32 accepted"
                        );
                        v.len()
                    }
                    tensors::Data::I64(v) => v.len(),
                    tensors::Data::Bytes(v) => v.len(),
                };
                assert_eq!(held, n, "decoded values differ from the shape's count");
            }
        }
    }
}

/// The OpenAI and TEI `input(s)` decoder alone.
pub fn decode_embeddings_input(data: &[u8]) {
    if let Ok(value) = serde_json::from_slice::<Value>(data) {
        if let Ok(crate::openai::Input::Tokens(rows)) = crate::openai::parse_input(value) {
            assert!(!rows.is_empty(), "an empty token list accepted");
        }
    }
}

/// A server (the tiny embedder and an 8-wide MLP on the CPU, small limits) driven in
/// process through its router as a tower service: no sockets.
pub struct Harness {
    app: Router,
    rt: tokio::runtime::Runtime,
    _state: Arc<AppState>,
}

impl Harness {
    /// Loads the models and builds the router.
    pub fn new() -> crate::Result<Self> {
        let dev = Device::cpu();
        let embedder = Arc::new(SentenceEmbedder::load(&dev, tiny_bert_dir())?);
        let mlp = TensorModel::mlp(&dev, MLP_WIDTH, 0)?;
        let config = ServeConfig {
            max_body_bytes: 64 << 10,
            max_inputs: 16,
            max_elements: MAX_ELEMENTS,
            max_seq_len: Some(32),
            request_timeout: Duration::from_secs(10),
            batch: BatchConfig {
                max_batch_size: 8,
                max_queue: 64,
                workers: 1,
                ..BatchConfig::default()
            },
            ..ServeConfig::default()
        };
        let state = AppState::new(
            config,
            vec![
                ModelSpec::Embedder {
                    name: "tiny-bert".into(),
                    embedder,
                },
                ModelSpec::Tensor {
                    name: "mlp".into(),
                    model: mlp,
                },
            ],
        )?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()?;
        Ok(Self {
            app: router(state.clone()),
            rt,
            _state: state,
        })
    }

    /// Sends the request `data` stands for ([`request`]) and checks the answer: `Ok` with
    /// its status, or `Err` naming the finding.
    pub fn run(&self, data: &[u8]) -> Result<u16, String> {
        let req = request(data);
        self.rt.block_on(async {
            // The router's error type is `Infallible`.
            let resp = match self.app.clone().oneshot(req).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            };
            let status = resp.status().as_u16();
            let json = resp
                .headers()
                .get(header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
            let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
                .await
                .map_err(|e| format!("reading the answer: {e}"))?;
            if status == 500 {
                return Err(format!("500: {}", String::from_utf8_lossy(&body)));
            }
            if json {
                let v: Value = serde_json::from_slice(&body).map_err(|e| {
                    format!(
                        "{status} answer is not JSON ({e}): {}",
                        String::from_utf8_lossy(&body)
                    )
                })?;
                if status == 200 && has_null(&v) {
                    return Err(format!("200 answer with null (a NaN or infinity): {v}"));
                }
            }
            Ok(status)
        })
    }
}

fn has_null(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(items) => items.iter().any(has_null),
        // `id` and `param` may be null by protocol; answers of 200 carry numbers elsewhere.
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| k != "id" && k != "param" && has_null(v)),
        _ => false,
    }
}
