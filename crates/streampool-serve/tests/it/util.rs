//! Shared by the server tests: start a server on 127.0.0.1:0 with the tiny embedder and the
//! demo MLP, and a model whose batches wait at a gate the test opens.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use streampool::{Device, Tensor};
use streampool_nn::{tiny_bert_dir, SentenceEmbedder};
use streampool_serve::{BatchConfig, ModelSpec, ServeConfig, Server, ServerHandle, TensorModel};

pub const EMBEDDER: &str = "tiny-bert";
pub const MLP: &str = "mlp";
pub const MLP_WIDTH: usize = 256;

/// A running server and what the tests compare its answers with.
pub struct TestServer {
    pub handle: ServerHandle,
    pub base: String,
    pub client: reqwest::Client,
    pub embedder: Arc<SentenceEmbedder>,
    pub mlp: TensorModel,
}

impl TestServer {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.client.get(self.url(path)).send().await.expect("GET")
    }

    pub async fn post_json(&self, path: &str, body: &serde_json::Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("POST")
    }

    /// Submitted and rejected counts of a model's queue.
    pub fn queue_counts(&self, model: &str) -> (u64, u64) {
        let s = self
            .handle
            .state()
            .registry()
            .get(model)
            .expect("model served")
            .stats();
        (s.submitted, s.rejected)
    }
}

pub fn test_config() -> ServeConfig {
    ServeConfig {
        addr: "127.0.0.1:0".parse().expect("literal address"),
        batch: BatchConfig {
            max_batch_size: 8,
            max_queue: 256,
            workers: 2,
            ..BatchConfig::default()
        },
        ..ServeConfig::default()
    }
}

/// Starts the tiny embedder and the MLP (plus `extra` models) with `config`.
pub async fn start(config: ServeConfig, extra: Vec<ModelSpec>) -> TestServer {
    let dev = Device::cpu();
    let embedder = Arc::new(SentenceEmbedder::load(&dev, tiny_bert_dir()).expect("tiny-bert"));
    let mlp = TensorModel::mlp(&dev, MLP_WIDTH, 0).expect("mlp");
    let mut models = vec![
        ModelSpec::Embedder {
            name: EMBEDDER.into(),
            embedder: embedder.clone(),
        },
        ModelSpec::Tensor {
            name: MLP.into(),
            model: mlp.clone(),
        },
    ];
    models.extend(extra);
    let handle = Server::start(config, models).await.expect("server starts");
    TestServer {
        base: format!("http://{}", handle.addr()),
        handle,
        client: reqwest::Client::new(),
        embedder,
        mlp,
    }
}

/// The in-process embedding of one text.
pub fn embed_one(e: &SentenceEmbedder, text: &str) -> Vec<f32> {
    e.embed(&[text]).expect("embed").remove(0)
}

/// The in-process MLP output of `rows`.
pub fn mlp_rows(m: &TensorModel, rows: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let flat: Vec<f32> = rows.concat();
    let x = Tensor::from_vec(flat, &[rows.len(), m.in_features()], m.device()).expect("tensor");
    let y = m
        .forward(&x)
        .expect("forward")
        .to_vec::<f32>()
        .expect("to_vec");
    y.chunks(m.out_features()).map(<[f32]>::to_vec).collect()
}

/// Asserts `a` and `b` agree within `tol` (absolute, plus relative to the larger magnitude).
/// A served answer comes from a batch of other requests' rows and the in-process reference
/// from a batch of its own: products of different row counts round differently (the CPU
/// GEMM's tiles, like cuBLAS's kernels, depend on the shape), so MLP answers are compared at
/// the f32 bound of the design, 1e-4, not bit for bit.
pub fn assert_close(a: &[f32], b: &[f32], tol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(close(*x, *y, tol), "{what}[{i}]: {x} vs {y}");
    }
}

/// Whether `x` and `y` agree within `tol`: absolutely for magnitudes up to 1, relative to
/// the larger magnitude above (the measure of [`assert_close`]).
pub fn close(x: f32, y: f32, tol: f32) -> bool {
    (x - y).abs() <= tol * x.abs().max(y.abs()).max(1.0)
}

/// A JSON array of f32 as a Vec.
pub fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

/// A gate that batches of a [`gated_model`] wait at until the test opens it.
#[derive(Clone, Default)]
pub struct Gate {
    /// `true` once open; held only to read or flip the flag.
    open: Arc<(Mutex<bool>, Condvar)>,
}

impl Gate {
    pub fn wait(&self) {
        let (lock, cv) = &*self.open;
        let mut open = lock.lock();
        while !*open {
            cv.wait(&mut open);
        }
    }

    pub fn open(&self) {
        let (lock, cv) = &*self.open;
        *lock.lock() = true;
        cv.notify_all();
    }
}

/// A `[N, 4] -> [N, 4]` model computing `2x + 1` once `gate` is open.
pub fn gated_model(gate: Gate) -> TensorModel {
    TensorModel::new(
        Device::cpu(),
        4,
        4,
        Arc::new(move |x: &Tensor| {
            gate.wait();
            x.affine(2.0, 1.0)
        }),
    )
}

/// Polls until `cond` holds (the server got every request), at most 30 s.
pub async fn wait_until(mut cond: impl FnMut() -> bool, what: &str) {
    for _ in 0..3000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}
