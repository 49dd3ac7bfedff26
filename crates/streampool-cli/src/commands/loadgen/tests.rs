//! The load generator against an in-process server (counts add up, every answer checked,
//! the server's phase timing read back) and against a fake server whose answers are wrong
//! in known ways (each counted as the error it is).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use streampool::Device;
use streampool_nn::{tiny_bert_dir, SentenceEmbedder};
use streampool_serve::{ModelSpec, ServeConfig, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::check::Expect;
use super::run::{run_point, Load, Target};
use super::{corpus, summarize, Corpus, Encoding, Point, Route, Shape};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// One point of `n` requests (no warm-up) against `target`.
async fn point(
    target: &Target,
    route: Route,
    encoding: Encoding,
    corpus: Corpus,
    k: usize,
    concurrency: usize,
    n: u64,
) -> Point {
    let requests = Arc::new(corpus::requests(
        &target.host,
        route,
        encoding,
        None,
        corpus,
        k,
        16,
    ));
    let expect = Arc::new(Expect::new(route, encoding, k, None));
    let load = Load {
        concurrency,
        warmup: Duration::ZERO,
        duration: None,
        requests: Some(n),
        timeout: Duration::from_secs(30),
    };
    let m = run_point(
        target,
        &load,
        requests,
        expect.clone(),
        Some(std::process::id()),
    )
    .await;
    let shape = Shape {
        url: format!("http://{}", target.host),
        route,
        encoding,
        corpus,
        inputs_per_request: k,
        tokens: None,
        client_threads: 2,
    };
    summarize(&m, &shape, &load, expect.dim())
}

#[test]
fn counts_add_up_against_an_in_process_server() {
    runtime().block_on(async {
        let embedder = Arc::new(SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap());
        let dim = embedder.dim();
        let config = ServeConfig {
            addr: "127.0.0.1:0".parse().unwrap(),
            ..ServeConfig::default()
        };
        let spec = ModelSpec::Embedder {
            name: "tiny-bert".into(),
            embedder,
        };
        let server = Server::start(config, vec![spec]).await.unwrap();
        server.state().metrics().set_phase_timing(true);
        let target = Target {
            addr: server.addr(),
            host: server.addr().to_string(),
        };
        let cases = [
            (Route::Openai, Encoding::Float, Corpus::Short, 3, 4, 240),
            (Route::Openai, Encoding::Base64, Corpus::Long, 1, 2, 60),
            (Route::Tei, Encoding::Float, Corpus::Short, 8, 3, 90),
        ];
        for (route, encoding, corpus, k, conns, n) in cases {
            let p = point(&target, route, encoding, corpus, k, conns, n).await;
            let what = format!("{route:?} {encoding:?} {corpus:?} k={k}: {p:?}");
            assert_eq!(p.requests, n, "{what}");
            assert_eq!(p.answered.values().sum::<u64>() + p.io_errors, n, "{what}");
            assert_eq!(p.answered.get(&200), Some(&n), "{what}");
            assert_eq!((p.errors, p.malformed, p.served), (0, 0, n), "{what}");
            assert_eq!(p.sentences, n * k as u64, "{what}");
            assert_eq!(p.dim, dim, "{what}");
            assert!(p.latency_ms.p50 > 0.0 && p.latency_ms.p99 >= p.latency_ms.p50);
            assert!(p.bytes_sent > 0 && p.bytes_received > 0);
            assert!(p.loadgen_cpu.cores > 0.0, "{what}");
            let server = p.server.as_ref().expect("metrics read");
            // Every request went through each phase of the handler once.
            for phase in ["read", "parse", "tokenize", "queue", "encode", "total"] {
                let count = server.phases.get(phase).map(|m| m.count);
                assert_eq!(count, Some(n as f64), "{phase}: {what}");
            }
            assert!(server.batches.is_some_and(|b| b >= 1.0), "{what}");
            assert!(server.mean_batch_size.is_some_and(|b| b >= 1.0), "{what}");
        }
        server.shutdown().await.unwrap();
    });
}

/// Canned answers of a fake TEI server for 2 inputs of width 3, in the order served, and
/// what each counts as.
fn answers() -> Vec<Vec<u8>> {
    let with_length = |status: &str, extra: &str, body: &str| {
        format!(
            "HTTP/1.1 {status}\r\n{extra}Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    };
    vec![
        // 0: well-formed.
        with_length("200 OK", "", "[[1,2,3],[0.5,-1,2.5e-3]]"),
        // 1: well-formed, chunked.
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n[[1,2,3],\r\n8\r\n[4,5,6]]\r\n0\r\n\r\n"
            .to_vec(),
        // 2: malformed: one embedding for two inputs.
        with_length("200 OK", "", "[[1,2,3]]"),
        // 3: malformed: a width that differs.
        with_length("200 OK", "", "[[1,2,3],[4,5]]"),
        // 4: an error status.
        with_length("503 Service Unavailable", "Retry-After: 1\r\n", r#"{"error":"full"}"#),
        // 5: malformed: not JSON.
        with_length("200 OK", "", "hello"),
        // 6: well-formed, then the server closes the connection.
        with_length("200 OK", "Connection: close\r\n", "[[1,2,3],[4,5,6]]"),
        // 7: a transport error: the connection drops with no answer.
        Vec::new(),
        // 8: malformed: the width differs from the width seen before.
        with_length("200 OK", "", "[[1,2,3,4],[4,5,6,7]]"),
    ]
}

/// Serves [`answers`] in turn (over all connections), one per request read.
async fn fake_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        let answers = Arc::new(answers());
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            let (next, answers) = (next.clone(), answers.clone());
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    // One request: the head, then Content-Length bytes of body.
                    let mut chunk = [0u8; 4096];
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                    let len: usize = head
                        .split("content-length:")
                        .nth(1)
                        .and_then(|r| r.split("\r\n").next())
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while buf.len() < head_end + len {
                        match sock.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    buf.drain(..head_end + len);
                    if head.starts_with("get ") {
                        // The load generator reading /metrics: not one of the answers.
                        let none = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n";
                        if sock.write_all(none).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    let answer = &answers[next.fetch_add(1, Ordering::SeqCst) % answers.len()];
                    if answer.is_empty() {
                        return; // drop the connection unanswered
                    }
                    if sock.write_all(answer).await.is_err() {
                        return;
                    }
                    if answer.windows(17).any(|w| w == b"Connection: close") {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn malformed_answers_and_transport_errors_are_counted_as_errors() {
    runtime().block_on(async {
        let addr = fake_server().await;
        let target = Target {
            addr,
            host: addr.to_string(),
        };
        // One client, so the answers come in the order above: each appears twice.
        let p = point(
            &target,
            Route::Tei,
            Encoding::Float,
            Corpus::Short,
            2,
            1,
            18,
        )
        .await;
        assert_eq!(p.requests, 18, "{p:?}");
        assert_eq!(p.io_errors, 2, "{p:?}");
        assert_eq!(p.answered.get(&200), Some(&14), "{p:?}");
        assert_eq!(p.answered.get(&503), Some(&2), "{p:?}");
        assert_eq!(p.malformed, 8, "{p:?}");
        assert_eq!(p.served, 6, "{p:?}");
        assert_eq!(p.sentences, 12, "{p:?}");
        assert_eq!(p.errors, 2 + 2 + 8, "{p:?}");
        assert_eq!(p.dim, 3);
        if let Some(s) = &p.server {
            assert!(s.phases.is_empty(), "the fake server has no phase timing");
        }
        let e = p.first_error.as_deref().unwrap_or("");
        assert!(
            e.contains("malformed") && e.contains("1 embeddings for 2"),
            "{e}"
        );
    });
}
