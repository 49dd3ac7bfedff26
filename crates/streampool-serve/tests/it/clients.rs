//! Clients no one here wrote: NVIDIA's `tritonclient[http]`, OpenAI's `openai` and (when
//! installed) Hugging Face's `huggingface_hub` Python
//! packages against the server on 127.0.0.1 (`tests/clients/test_clients.py`), checked
//! against the in-process models. CI installs the packages (`.ci/run`); without them this test
//! prints a loud SKIP and passes.

use std::process::Command;

use crate::util::*;
use serde_json::json;

const PACKAGES: &str = "import tritonclient.http, openai, numpy";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_and_openai_clients() {
    let probe = Command::new("python3").args(["-c", PACKAGES]).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!(
            "\n!!!!!!!!!! SKIPPED: python3 with tritonclient[http], openai and numpy is not \
             available; install them with `python3 -m pip install 'tritonclient[http]' openai \
             numpy` (CI does, in .ci/run) !!!!!!!!!!\n"
        );
        return;
    }
    let config = test_config();
    let max_inputs = config.max_inputs;
    let s = start(config, vec![]).await;

    let texts = [
        "The quick brown fox jumps over the lazy dog.",
        "Streams, events and a caching allocator.",
        "hello",
    ];
    let vectors: Vec<Vec<f32>> = texts.iter().map(|t| embed_one(&s.embedder, t)).collect();
    let tokens: Vec<usize> = texts
        .iter()
        .map(|t| s.embedder.tokenize(&[t]).unwrap().seq_len())
        .collect();
    let inputs: Vec<Vec<f32>> = (0..4)
        .map(|r| {
            (0..MLP_WIDTH)
                .map(|c| ((r * 13 + c) % 17) as f32 / 17.0 - 0.5)
                .collect()
        })
        .collect();
    let outputs = mlp_rows(&s.mlp, &inputs);
    let expected = json!({
        "max_inputs": max_inputs,
        "embedder": {"name": EMBEDDER, "dim": s.embedder.dim(), "texts": texts,
                     "vectors": vectors, "tokens": tokens},
        "mlp": {"name": MLP, "inputs": inputs, "outputs": outputs},
    });
    let dir = std::env::temp_dir().join(format!("streampool-clients-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("expected.json");
    std::fs::write(&path, serde_json::to_vec(&expected).unwrap()).unwrap();

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients/test_clients.py");
    let url = s.handle.addr().to_string();
    let args = [
        script.to_string(),
        "--url".into(),
        url,
        "--expected".into(),
        path.display().to_string(),
    ];
    // The script blocks; run it off the async workers so the server keeps serving.
    let out = tokio::task::spawn_blocking(move || Command::new("python3").args(args).output())
        .await
        .unwrap()
        .expect("python3 runs");
    let _ = std::fs::remove_dir_all(&dir);
    println!("{}", String::from_utf8_lossy(&out.stdout));
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "client checks failed: {}", out.status);
    s.handle.shutdown().await.unwrap();
}
