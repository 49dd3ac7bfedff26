//! Drain on shutdown, under load: SIGTERM with many requests in flight answers every one of
//! them correctly, refuses new connections at once, and then stops; a drain that cannot
//! finish (a stuck model) gives up after `drain_timeout` instead of hanging.
//!
//! The requests are held in flight by a gated model, so "in flight when the signal came"
//! does not depend on timing. The first test sends a real SIGTERM to this test process,
//! after installing its own listener so that the signal can never take its default action.

use std::time::Duration;

use crate::util::*;
use serde_json::{json, Value};
use streampool_serve::{Error, ModelSpec, ServeConfig};
use tokio::signal::unix::{signal, SignalKind};

/// Requests in flight when the signal comes.
const N: usize = 64;
/// Requests tried after the signal, each on a new connection.
const LATE: usize = 8;
/// A test that neither finishes nor fails within this has hung: fail it instead.
const HANG: Duration = Duration::from_secs(60);

/// Opens the gate when dropped, also while a failed assertion unwinds: the queue's worker
/// threads, joined when the server's state is dropped, must never be left at a closed gate
/// (the test would hang instead of failing).
struct OpenOnDrop(Gate);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}

fn gated_config() -> ServeConfig {
    let mut config = test_config();
    config.batch.workers = 1;
    config.batch.max_batch_size = 8;
    config
}

/// Sends `N` tagged requests (`[i, -i, 0.5, i / 8]`) to the gated model, each on its own
/// task; returns each request's input, status and body.
fn send_tagged(
    client: &reqwest::Client,
    url: &str,
    n: usize,
) -> Vec<tokio::task::JoinHandle<([f32; 4], u16, Value)>> {
    (0..n)
        .map(|i| {
            let (client, url) = (client.clone(), url.to_string());
            tokio::spawn(async move {
                let x = [i as f32, -(i as f32), 0.5, i as f32 / 8.0];
                let body = json!({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": x}]});
                let resp = client.post(url).json(&body).send().await.expect("an answer");
                let status = resp.status().as_u16();
                (x, status, resp.json::<Value>().await.expect("a JSON body"))
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_every_request_in_flight_and_refuses_new_connections() {
    // From here on SIGTERM is caught by tokio's handler, never the default "terminate".
    let _own = signal(SignalKind::terminate()).expect("a SIGTERM listener");
    let gate = Gate::default();
    let _open = OpenOnDrop(gate.clone());
    let s = start(
        gated_config(),
        vec![ModelSpec::Tensor {
            name: "gated".into(),
            model: gated_model(gate.clone()),
        }],
    )
    .await;
    let addr = s.handle.addr();
    let client = reqwest::Client::builder()
        .timeout(HANG)
        .build()
        .expect("client");
    let tasks = send_tagged(&client, &s.url("/v2/models/gated/infer"), N);
    // All N accepted by the queue (none can finish: the gate is closed).
    wait_until(
        || s.queue_counts("gated").0 as usize == N,
        "every request to reach the queue",
    )
    .await;

    let TestServer { handle, .. } = s;
    let server = tokio::spawn(handle.run_until_signal());
    // The server registers its SIGTERM listener when its task first runs; signal until the
    // listener is closed, which is the first thing a drain does.
    let mut refused = false;
    for _ in 0..500 {
        // SAFETY: kill(2) with our own pid and a signal number has no memory effects; the
        // listener installed above turns SIGTERM into a tokio notification.
        assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGTERM) }, 0);
        tokio::time::sleep(Duration::from_millis(20)).await;
        match tokio::net::TcpStream::connect(addr).await {
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                refused = true;
                break;
            }
            Err(e) => panic!("connect failed otherwise: {e}"),
        }
    }
    assert!(refused, "the listener still accepts after SIGTERM");

    // New requests on new connections: refused at connect, not queued, not hung.
    let fresh = reqwest::Client::builder()
        .timeout(HANG)
        .build()
        .expect("client");
    for _ in 0..LATE {
        let e = fresh
            .get(format!("http://{addr}/v2/health/live"))
            .send()
            .await
            .expect_err("a new connection after SIGTERM");
        assert!(e.is_connect(), "not a connect error: {e}");
    }
    // The gate holds every request, so the drain cannot have finished.
    assert!(
        !server.is_finished(),
        "shutdown ended with requests in flight"
    );

    gate.open();
    for t in tasks {
        let (x, status, v) = t.await.expect("client task");
        assert_eq!(status, 200, "request {x:?} during the drain: {v}");
        let want: Vec<f32> = x.iter().map(|v| 2.0 * v + 1.0).collect();
        assert_eq!(v["outputs"][0]["shape"], json!([1, 4]));
        assert_close(&floats(&v["outputs"][0]["data"]), &want, 1e-4, "answer");
    }
    tokio::time::timeout(HANG, server)
        .await
        .expect("the drain ended")
        .expect("server task")
        .expect("a clean shutdown");
    println!("SIGTERM with {N} in flight: {N} answered correctly, {LATE} new connections refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_that_cannot_finish_gives_up_after_the_drain_timeout() {
    let gate = Gate::default();
    let _open = OpenOnDrop(gate.clone());
    let mut config = gated_config();
    config.drain_timeout = Duration::from_millis(300);
    let s = start(
        config,
        vec![ModelSpec::Tensor {
            name: "gated".into(),
            model: gated_model(gate.clone()),
        }],
    )
    .await;
    let tasks = send_tagged(&s.client, &s.url("/v2/models/gated/infer"), 4);
    wait_until(
        || s.queue_counts("gated").0 == 4,
        "the requests to reach the queue",
    )
    .await;
    let result = tokio::time::timeout(HANG, s.handle.shutdown())
        .await
        .expect("shutdown returned, bounded by drain_timeout");
    assert!(
        matches!(result, Err(Error::DrainTimeout(d)) if d == Duration::from_millis(300)),
        "{result:?}"
    );
    // The abandoned requests are still served by the detached server task once the model
    // moves again; nothing was lost or mixed up by the timed-out drain.
    gate.open();
    for t in tasks {
        let (x, status, v) = t.await.expect("client task");
        assert_eq!(status, 200, "{v}");
        let want: Vec<f32> = x.iter().map(|v| 2.0 * v + 1.0).collect();
        assert_close(&floats(&v["outputs"][0]["data"]), &want, 1e-4, "answer");
    }
}
