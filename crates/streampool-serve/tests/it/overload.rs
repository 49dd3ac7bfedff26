//! Overload on loopback: 2x the queue's capacity of concurrent requests against a slow
//! model. Every request is answered (none lost), each either 503 or its own correct answer
//! (none mismatched), and the counts agree with the queue's own statistics.

use std::sync::Arc;
use std::time::Duration;

use crate::util::*;
use serde_json::{json, Value};
use streampool::{Device, Tensor};
use streampool_serve::{ModelSpec, TensorModel};

const MAX_QUEUE: usize = 32;
const MAX_BATCH: usize = 4;
const N: usize = 2 * MAX_QUEUE;
const ROUNDS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twice_the_queue_capacity_loses_and_mixes_nothing() {
    let gate = Gate::default();
    let model_gate = gate.clone();
    // `2x + 1`, 10 ms per batch; the first round's batches also wait at the gate.
    let slow = TensorModel::new(
        Device::cpu(),
        4,
        4,
        Arc::new(move |x: &Tensor| {
            model_gate.wait();
            std::thread::sleep(Duration::from_millis(10));
            x.affine(2.0, 1.0)
        }),
    );
    let mut config = test_config();
    config.batch.max_queue = MAX_QUEUE;
    config.batch.max_batch_size = MAX_BATCH;
    config.batch.workers = 1;
    let s = Arc::new(
        start(
            config,
            vec![ModelSpec::Tensor {
                name: "slow".into(),
                model: slow,
            }],
        )
        .await,
    );
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();

    let (mut total_ok, mut total_refused) = (0u64, 0u64);
    for round in 0..ROUNDS {
        let (submitted0, rejected0) = s.queue_counts("slow");
        let mut tasks = Vec::with_capacity(N);
        for i in 0..N {
            let (client, url) = (client.clone(), s.url("/v2/models/slow/infer"));
            tasks.push(tokio::spawn(async move {
                // Tagged with the request and round, so a swapped answer cannot match.
                let x = [i as f32, round as f32, 0.5 * i as f32, -(i as f32)];
                let body = json!({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": x}]});
                let resp = client.post(url).json(&body).send().await.expect("an answer");
                let status = resp.status().as_u16();
                (x, status, resp.json::<Value>().await.expect("a JSON body"))
            }));
        }
        if round == 0 {
            // With the model held, at most MAX_QUEUE wait and MAX_BATCH run: the rest of the
            // 2x-capacity burst must be refused, whatever the timing.
            wait_until(
                || {
                    let (a, r) = s.queue_counts("slow");
                    (a - submitted0 + r - rejected0) as usize == N
                },
                "every request of the burst to reach the queue",
            )
            .await;
            let (a, _) = s.queue_counts("slow");
            assert!(
                (a - submitted0) as usize <= MAX_QUEUE + MAX_BATCH,
                "accepted beyond capacity"
            );
            gate.open();
        }
        let (mut ok, mut refused) = (0u64, 0u64);
        for t in tasks {
            let (x, status, v) = t.await.expect("client task");
            match status {
                200 => {
                    ok += 1;
                    let want: Vec<f32> = x.iter().map(|v| 2.0 * v + 1.0).collect();
                    assert_eq!(v["outputs"][0]["shape"], json!([1, 4]));
                    assert_close(&floats(&v["outputs"][0]["data"]), &want, 1e-4, "answer");
                }
                503 => {
                    refused += 1;
                    assert!(
                        v["error"].as_str().is_some_and(|m| m.contains("full")),
                        "{v}"
                    );
                }
                other => panic!("round {round}: unexpected status {other}: {v}"),
            }
        }
        let (submitted, rejected) = s.queue_counts("slow");
        assert_eq!(ok + refused, N as u64, "round {round}: lost answers");
        assert_eq!(
            ok,
            submitted - submitted0,
            "round {round}: 200s vs accepted"
        );
        assert_eq!(
            refused,
            rejected - rejected0,
            "round {round}: 503s vs refused"
        );
        if round == 0 {
            assert!(
                refused as usize >= N - MAX_QUEUE - MAX_BATCH,
                "round 0 refused {refused}"
            );
        }
        println!("round {round}: {ok} answered, {refused} refused with 503");
        total_ok += ok;
        total_refused += refused;
    }
    println!("{ROUNDS} rounds of {N}: {total_ok} answered correctly, {total_refused} refused, 0 lost, 0 mismatched");
    let s = Arc::into_inner(s).expect("tasks done");
    s.handle.shutdown().await.unwrap();
}

/// A bulk request counts as one request and is admitted whenever nothing waits, however
/// many inputs it has: 64 sentences through `/v1/embeddings` and 64 rows through KServe,
/// against caps of one request and four tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bulk_request_is_served_not_shed() {
    let mut config = test_config();
    config.batch.max_queue = 1;
    config.batch.max_queue_tokens = 4;
    let s = start(config, Vec::new()).await;
    let texts: Vec<String> = (0..64).map(|i| format!("sentence number {i}")).collect();
    let resp = s
        .post_json(
            "/v1/embeddings",
            &json!({"model": EMBEDDER, "input": texts}),
        )
        .await;
    assert_eq!(resp.status().as_u16(), 200);
    let v: Value = resp.json().await.unwrap();
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 64);
    for i in [0usize, 17, 63] {
        let want = embed_one(&s.embedder, &texts[i]);
        assert_close(
            &floats(&data[i]["embedding"]),
            &want,
            1e-4,
            "bulk embedding",
        );
    }
    let rows: Vec<Vec<f32>> = (0..64)
        .map(|i| (0..MLP_WIDTH).map(|k| ((i + k) % 7) as f32 * 0.1).collect())
        .collect();
    let body = json!({"inputs": [{"name": "input", "shape": [64, MLP_WIDTH], "datatype": "FP32", "data": rows.concat()}]});
    let resp = s.post_json(&format!("/v2/models/{MLP}/infer"), &body).await;
    assert_eq!(resp.status().as_u16(), 200);
    let v: Value = resp.json().await.unwrap();
    let want = mlp_rows(&s.mlp, &rows).concat();
    assert_close(&floats(&v["outputs"][0]["data"]), &want, 1e-4, "bulk rows");
    assert_eq!(s.queue_counts(EMBEDDER), (64, 0));
    assert_eq!(s.queue_counts(MLP), (64, 0));
    s.handle.shutdown().await.unwrap();
}

/// A refusal for an estimated wait carries the estimate: 30 rows wait behind a held batch
/// on a model that takes at least 50 ms per row, so the queue estimates at least 1.5 s and
/// `Retry-After` says at least 2 (whole seconds, rounded up), on KServe's 503 and TEI's 429
/// alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_carries_the_queue_estimate_in_retry_after() {
    let gate = Gate::default();
    let model_gate = gate.clone();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    // `2x + 1`, at least 50 ms per batch; the 5th batch waits at the gate.
    let slow = TensorModel::new(
        Device::cpu(),
        4,
        4,
        Arc::new(move |x: &Tensor| {
            if counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 4 {
                model_gate.wait();
            }
            std::thread::sleep(Duration::from_millis(50));
            x.affine(2.0, 1.0)
        }),
    );
    let mut config = test_config();
    config.batch.workers = 1;
    config.batch.max_queue_wait = Some(Duration::from_millis(1));
    let s = Arc::new(
        start(
            config,
            vec![ModelSpec::Tensor {
                name: "slow".into(),
                model: slow,
            }],
        )
        .await,
    );
    let infer = |rows: usize| {
        let data: Vec<f32> = (0..4 * rows).map(|i| i as f32).collect();
        json!({"inputs": [{"name": "input", "shape": [rows, 4], "datatype": "FP32", "data": data}]})
    };
    // Four batches measure the rate (at most 20 rows/s).
    for _ in 0..4 {
        let resp = s.post_json("/v2/models/slow/infer", &infer(1)).await;
        assert_eq!(resp.status().as_u16(), 200);
    }
    // The 5th batch is held; 30 rows queue behind it as one request (nothing waited).
    let held = {
        let s = s.clone();
        tokio::spawn(async move { s.post_json("/v2/models/slow/infer", &infer(1)).await })
    };
    wait_until(
        || calls.load(std::sync::atomic::Ordering::SeqCst) == 5,
        "the held batch",
    )
    .await;
    let bulk = {
        let s = s.clone();
        tokio::spawn(async move { s.post_json("/v2/models/slow/infer", &infer(30)).await })
    };
    wait_until(
        || s.queue_counts("slow").0 == 5 + 30,
        "the bulk request queued",
    )
    .await;
    let refused = s.post_json("/v2/models/slow/infer", &infer(1)).await;
    assert_eq!(refused.status().as_u16(), 503);
    let retry: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 2, "Retry-After {retry} s for >= 1.5 s queued");
    let v: Value = refused.json().await.unwrap();
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("estimated queue wait"),
        "{v}"
    );
    gate.open();
    assert_eq!(held.await.unwrap().status().as_u16(), 200);
    assert_eq!(bulk.await.unwrap().status().as_u16(), 200);
    let s = Arc::into_inner(s).expect("tasks done");
    s.handle.shutdown().await.unwrap();
}
