//! One model on several devices: two separate CPU devices stand in for two GPUs. Specs of
//! one name become replicas behind the router; answers match the single-device model;
//! `/metrics` has a series per device; misconfigured replica sets are refused.

use std::sync::Arc;

use crate::util::*;
use serde_json::json;
use streampool::{Device, DeviceConfig};
use streampool_nn::{tiny_bert_dir, SentenceEmbedder};
use streampool_serve::{Error, ModelSpec, Server, TensorModel};

fn two_cpus() -> Vec<Device> {
    (0..2)
        .map(|_| Device::cpu_with(DeviceConfig::default()).expect("cpu device"))
        .collect()
}

fn replicated_specs(devices: &[Device]) -> Vec<ModelSpec> {
    let mut specs = Vec::new();
    for dev in devices {
        let embedder = SentenceEmbedder::load(dev, tiny_bert_dir()).expect("tiny-bert");
        specs.push(ModelSpec::Embedder {
            name: EMBEDDER.into(),
            embedder: Arc::new(embedder),
        });
        specs.push(ModelSpec::Tensor {
            name: MLP.into(),
            model: TensorModel::mlp(dev, MLP_WIDTH, 0).expect("mlp"),
        });
    }
    specs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_device_replicas_answer_like_one_and_report_per_device() {
    let handle = Server::start(test_config(), replicated_specs(&two_cpus()))
        .await
        .expect("server starts");
    let base = format!("http://{}", handle.addr());
    let client = reqwest::Client::new();
    // The reference: the same models on the process-wide CPU device.
    let cpu = Device::cpu();
    let embedder = SentenceEmbedder::load(&cpu, tiny_bert_dir()).unwrap();
    let mlp = TensorModel::mlp(&cpu, MLP_WIDTH, 0).unwrap();
    let mut tasks = Vec::new();
    for c in 0..48usize {
        let (client, base) = (client.clone(), base.clone());
        let rows: Vec<Vec<f32>> = (0..1 + c % 3)
            .map(|r| {
                (0..MLP_WIDTH)
                    .map(|k| ((c * 7 + r * 3 + k) % 19) as f32 / 19.0 - 0.5)
                    .collect()
            })
            .collect();
        let want = mlp_rows(&mlp, &rows);
        let text = format!("client {c} asks about streams");
        let want_vec = embed_one(&embedder, &text);
        tasks.push(tokio::spawn(async move {
            let body = json!({"inputs": [{"name": "input", "shape": [rows.len(), MLP_WIDTH],
                "datatype": "FP32", "data": rows}]});
            let resp = client
                .post(format!("{base}/v2/models/mlp/infer"))
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            let v: serde_json::Value = resp.json().await.unwrap();
            let got = floats(&v["outputs"][0]["data"]);
            assert_close(&got, &want.concat(), 1e-4, "mlp");
            let resp = client
                .post(format!("{base}/embed"))
                .json(&json!({"inputs": text}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            let v: serde_json::Value = resp.json().await.unwrap();
            assert_close(&floats(&v[0]), &want_vec, 1e-5, "embedding");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let model = handle.state().registry().get(MLP).unwrap();
    assert_eq!(model.labels(), vec!["cpu:0", "cpu:1"]);
    let per = model.replica_stats();
    let routed: u64 = per.iter().map(|r| r.routed).sum();
    assert_eq!(routed, (0..48u64).map(|c| 1 + c % 3).sum::<u64>());
    assert_eq!(model.stats().completed, routed);
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for series in [
        r#"streampool_replicas{model="mlp"} 2"#,
        r#"streampool_replicas{model="tiny-bert"} 2"#,
        r#"streampool_queue_completed_total{model="mlp",device="cpu:0"}"#,
        r#"streampool_queue_completed_total{model="mlp",device="cpu:1"}"#,
        r#"streampool_device_busy_seconds_total{model="tiny-bert",device="cpu:1"}"#,
        r#"streampool_queue_outstanding{model="tiny-bert",device="cpu:0"} 0"#,
    ] {
        assert!(text.contains(series), "missing {series} in\n{text}");
    }
    assert_eq!(
        client
            .get(format!("{base}/v2/health/ready"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    handle.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misconfigured_replica_sets_are_refused() {
    let devices = two_cpus();
    let mlp = |dev: &Device, width| ModelSpec::Tensor {
        name: MLP.into(),
        model: TensorModel::mlp(dev, width, 0).unwrap(),
    };
    let config = test_config;
    // Two replicas on one device.
    let same = vec![mlp(&devices[0], 8), mlp(&devices[0], 8)];
    assert!(matches!(
        Server::start(config(), same).await,
        Err(Error::Config(_))
    ));
    // Replicas of different shapes.
    let shapes = vec![mlp(&devices[0], 8), mlp(&devices[1], 16)];
    assert!(matches!(
        Server::start(config(), shapes).await,
        Err(Error::Config(_))
    ));
    // An embedder and a tensor model under one name.
    let embedder = SentenceEmbedder::load(&devices[1], tiny_bert_dir()).unwrap();
    let kinds = vec![
        mlp(&devices[0], 8),
        ModelSpec::Embedder {
            name: MLP.into(),
            embedder: Arc::new(embedder),
        },
    ];
    assert!(matches!(
        Server::start(config(), kinds).await,
        Err(Error::Config(_))
    ));
}
