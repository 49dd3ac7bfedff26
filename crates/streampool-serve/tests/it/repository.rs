//! Models loaded, replaced and unloaded while the server serves (KServe v2's repository
//! extension): requests to other models, and to a model being replaced, see no error; an
//! unloaded model is gone (404) and its memory freed; a load that does not fit the budget
//! is refused with 507 and what it needs.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::util::*;
use serde_json::{json, Value};
use streampool::Device;
use streampool_core::{LoaderConfig, ModelLoader, SETTINGS_FILE};
use streampool_nn::tiny_bert_dir;
use streampool_serve::{AppState, Server, ServerHandle};

/// A repository holding copies of the tiny embedder under `names` (settings text each).
fn repository(tag: &str, models: &[(&str, &str)]) -> PathBuf {
    let root = std::env::temp_dir().join(format!("sp-serve-repo-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for (name, settings) in models {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for f in std::fs::read_dir(tiny_bert_dir()).unwrap().flatten() {
            if f.path().is_file() {
                std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
            }
        }
        std::fs::write(dir.join(SETTINGS_FILE), settings).unwrap();
    }
    root
}

/// A server on one CPU device with the repository at `root`, `initial` loaded.
async fn start_managed(root: &Path, initial: &[&str], budget: Option<u64>) -> ServerHandle {
    let config = test_config();
    let loader = Arc::new(ModelLoader::new(
        vec![Device::cpu()],
        LoaderConfig {
            memory_budget: budget,
            model: config.model_config(),
            ..LoaderConfig::default()
        },
        Some(root.to_path_buf()),
    ));
    let state = AppState::with_loader(config, vec![], Some(loader.clone())).unwrap();
    for name in initial {
        loader.load(state.registry(), name).unwrap();
    }
    Server::serve_state(state).await.unwrap()
}

async fn post(client: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    let r = client.post(url).json(&body).send().await.expect("POST");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn entry<'a>(index: &'a Value, name: &str) -> &'a Value {
    index
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in {index}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn models_load_replace_and_unload_while_others_serve() {
    let root = repository("live", &[("alpha", ""), ("beta", "priority = \"high\"\n")]);
    let server = start_managed(&root, &["alpha"], None).await;
    let base = format!("http://{}", server.addr());
    let client = reqwest::Client::new();

    // Clients keep calling alpha through everything below.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut load = Vec::new();
    for c in 0..4 {
        let (client, base) = (client.clone(), base.clone());
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let body = json!({"model": "alpha", "input": [format!("client {c} says hi")]});
                let (status, _) = post(&client, format!("{base}/v1/embeddings"), body).await;
                if status == 200 { &ok } else { &failed }.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }

    let index = |client: reqwest::Client, base: String| async move {
        post(&client, format!("{base}/v2/repository/index"), json!({})).await
    };
    let (status, idx) = index(client.clone(), base.clone()).await;
    assert_eq!(status, 200);
    assert_eq!(entry(&idx, "alpha")["state"], "READY");
    assert_eq!(entry(&idx, "beta")["state"], "UNAVAILABLE");
    assert!(entry(&idx, "alpha")["memory_bytes"].as_u64().unwrap() > 0);

    // Load beta while alpha serves.
    let (status, body) = post(
        &client,
        format!("{base}/v2/repository/models/beta/load"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = post(
        &client,
        format!("{base}/v1/embeddings"),
        json!({"model": "beta", "input": ["now served"]}),
    )
    .await;
    assert_eq!(status, 200);
    let (_, idx) = index(client.clone(), base.clone()).await;
    assert_eq!(entry(&idx, "beta")["state"], "READY");
    assert_eq!(entry(&idx, "beta")["priority"], "high");
    let (_, ready_only) = post(
        &client,
        format!("{base}/v2/repository/index"),
        json!({"ready": true}),
    )
    .await;
    assert_eq!(ready_only.as_array().unwrap().len(), 2);

    // Replace alpha under load: its clients see no error.
    let before = ok.load(Ordering::Relaxed);
    let (status, body) = post(
        &client,
        format!("{base}/v2/repository/models/alpha/load"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // Unload beta: gone for new requests.
    let (status, _) = post(
        &client,
        format!("{base}/v2/repository/models/beta/unload"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = post(
        &client,
        format!("{base}/v1/embeddings"),
        json!({"model": "beta", "input": ["gone"]}),
    )
    .await;
    assert_eq!(status, 404);
    let r = client
        .get(format!("{base}/v2/models/beta"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let (_, idx) = index(client.clone(), base.clone()).await;
    assert_eq!(entry(&idx, "beta")["state"], "UNAVAILABLE");
    let (status, _) = post(
        &client,
        format!("{base}/v2/repository/models/beta/unload"),
        json!({}),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = post(
        &client,
        format!("{base}/v2/repository/models/nope/load"),
        json!({}),
    )
    .await;
    assert_eq!(status, 404);

    // Memory per model in /metrics.
    let metrics = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("streampool_model_memory_bytes{model=\"alpha\",device=\"cpu\"}"),
        "{metrics}"
    );

    // Let the clients run a little on the replaced alpha, then stop them.
    wait_until(
        || ok.load(Ordering::Relaxed) > before + 20,
        "alpha answers after its replacement",
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.await.unwrap();
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "alpha's clients saw errors"
    );
    server.shutdown().await.unwrap();
    std::fs::remove_dir_all(root).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_past_the_memory_budget_is_refused_with_507() {
    let root = repository("budget", &[("alpha", ""), ("beta", "")]);
    let need = streampool_core::weight_bytes(&root.join("alpha"), streampool_nn::ComputeDType::F32)
        .unwrap();
    let server = start_managed(&root, &["alpha"], Some(need * 3 / 2)).await;
    let base = format!("http://{}", server.addr());
    let client = reqwest::Client::new();
    let (status, body) = post(
        &client,
        format!("{base}/v2/repository/models/beta/load"),
        json!({}),
    )
    .await;
    assert_eq!(status, 507, "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(
        message.contains("needs") && message.contains("free"),
        "{message}"
    );
    // alpha still serves, and unloading it makes room for beta.
    let (status, _) = post(
        &client,
        format!("{base}/v1/embeddings"),
        json!({"model": "alpha", "input": ["still here"]}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = post(
        &client,
        format!("{base}/v2/repository/models/alpha/unload"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = post(
        &client,
        format!("{base}/v2/repository/models/beta/load"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    server.shutdown().await.unwrap();
    std::fs::remove_dir_all(root).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_settings_file_is_a_400_and_changes_nothing() {
    let root = repository(
        "bad",
        &[("alpha", ""), ("broken", "priority = \"urgent\"\n")],
    );
    let server = start_managed(&root, &["alpha"], None).await;
    let base = format!("http://{}", server.addr());
    let client = reqwest::Client::new();
    let (status, body) = post(
        &client,
        format!("{base}/v2/repository/models/broken/load"),
        json!({}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("urgent"), "{body}");
    let (_, idx) = post(&client, format!("{base}/v2/repository/index"), json!({})).await;
    assert_eq!(entry(&idx, "broken")["state"], "UNAVAILABLE");
    assert_eq!(entry(&idx, "alpha")["state"], "READY");
    server.shutdown().await.unwrap();
    std::fs::remove_dir_all(root).unwrap();
}
