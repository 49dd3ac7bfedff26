//! What tenants cost and how closely their limits hold, on the CPU backend:
//!
//! 1. **Key check.** With 1,000 tenants (half with plain keys, half with `key_sha256`),
//!    the lookup alone (SHA-256 of the token, one hash-map probe, a constant-time 32-byte
//!    comparison) for known and unknown keys, and lookup + admission + outcome under limits;
//!    then what the whole check adds to a request through the router in process (no
//!    sockets): `GET /v2/models/mlp` without keys against the same with 1,000 tenants,
//!    rounds alternating (each round starting with another configuration), medians. Both
//!    are timed in the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`; the router runs on a
//!    current-thread runtime, so all its work is on this thread): on a shared machine the
//!    other processes' load then stretches no figure.
//! 2. **Limits over 10 s.** A live server on loopback; one tenant driven at twice its rate
//!    by several paced clients (a request is sent on its tick whatever the earlier ones
//!    became), requests counted by the time they were sent. Requests per second on a cheap
//!    route, and tokens per second on `/v1/embeddings` (the tiny embedder, tokens counted
//!    from `usage`); each over a 10 s window that starts with the bucket full (the burst of
//!    one second's worth is then allowed on top) and over the next 10 s (the tenant already
//!    at its limit: the rate alone).
//!
//! ```text
//! cargo bench -p streampool-serve --bench tenants -- [--json OUT.json] [--quick]
//! ```
//!
//! (cargo runs benchmarks in the crate's folder: give `--json` an absolute path.)
//!
//! Run any other way (`cargo test --benches` runs it without `--bench`), or with `--quick`,
//! it does a short pass of each part: a check that it works, not figures.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use serde_json::{json, Value};
use streampool::Device;
use streampool_nn::{tiny_bert_dir, SentenceEmbedder};
use streampool_serve::tenants::Outcome;
use streampool_serve::{router, AppState, ModelSpec, ServeConfig, Server, Tenants, TensorModel};
use tower::ServiceExt;

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const TENANTS: usize = 1000;

fn key(i: usize) -> String {
    format!("sp-{i:04}-7f3a9c1e5b2d48f6a0c3e7b19d5f2a84")
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// 1,000 tenants, half by key and half by digest, each allowed one model; with `limits`,
/// limits high enough never to refuse (so admission does all its arithmetic).
fn tenants_text(limits: bool) -> String {
    let mut text = String::new();
    for i in 0..TENANTS {
        let key_line = if i % 2 == 0 {
            format!("key = \"{}\"", key(i))
        } else {
            format!("key_sha256 = \"{}\"", sha256_hex(&key(i)))
        };
        text += &format!("[[tenant]]\nname = \"t{i:04}\"\n{key_line}\nmodels = [\"mlp\"]\n");
        if limits {
            text +=
                "requests_per_second = 1e9\ntokens_per_second = 1e12\nmax_concurrent = 1000000\n";
        }
    }
    text
}

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// CPU nanoseconds per call of `f` over `n` calls, median of `rounds` rounds.
fn time_ns(rounds: usize, n: usize, mut f: impl FnMut(usize)) -> f64 {
    let per_round: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = thread_cpu();
            for i in 0..n {
                f(i);
            }
            (thread_cpu() - t).as_nanos() as f64 / n as f64
        })
        .collect();
    median(per_round)
}

fn lookup(quick: bool) -> Res<Value> {
    let (rounds, n) = if quick { (3, 20_000) } else { (9, 200_000) };
    let plain = Tenants::parse(&tenants_text(false))?;
    let limited = Tenants::parse(&tenants_text(true))?;
    let keys: Vec<String> = (0..TENANTS).map(key).collect();
    let unknown: Vec<String> = (0..TENANTS).map(|i| key(i + TENANTS)).collect();
    for k in &keys {
        assert!(plain.authenticate(k.as_bytes()).is_some());
    }
    let known_ns = time_ns(rounds, n, |i| {
        black_box(plain.authenticate(black_box(keys[i % TENANTS].as_bytes())));
    });
    let unknown_ns = time_ns(rounds, n, |i| {
        black_box(plain.authenticate(black_box(unknown[i % TENANTS].as_bytes())));
    });
    let admit_ns = time_ns(rounds, n, |i| {
        let tenant = limited
            .authenticate(black_box(keys[i % TENANTS].as_bytes()))
            .expect("a tenant");
        let admission = tenant.admit().expect("never refused");
        admission.finish(axum::http::StatusCode::OK);
    });
    let sha_ns = time_ns(rounds, n, |i| {
        use sha2::Digest;
        black_box(sha2::Sha256::digest(black_box(
            keys[i % TENANTS].as_bytes(),
        )));
    });
    println!(
        "lookup, {TENANTS} tenants: known key {known_ns:.0} ns, unknown key {unknown_ns:.0} ns \
         (SHA-256 of the key alone {sha_ns:.0} ns); lookup + admission under limits + outcome \
         {admit_ns:.0} ns"
    );
    Ok(json!({
        "tenants": TENANTS,
        "lookup_known_key_ns": known_ns,
        "lookup_unknown_key_ns": unknown_ns,
        "sha256_of_key_ns": sha_ns,
        "lookup_admit_finish_ns": admit_ns,
        "timing": "thread CPU time (CLOCK_THREAD_CPUTIME_ID), median of rounds",
        "rounds": rounds,
        "calls_per_round": n,
    }))
}

/// Per-request time through the router in process, with no keys, with 1,000 tenants, and
/// with 1,000 tenants under limits.
fn through_router(quick: bool) -> Res<Value> {
    let (rounds, n) = if quick { (3, 2_000) } else { (61, 4_000) };
    let dir = std::env::temp_dir().join(format!("sp-bench-tenants-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut apps = Vec::new();
    for (what, text) in [
        ("none", None),
        ("1000 tenants", Some(tenants_text(false))),
        ("1000 tenants, limits", Some(tenants_text(true))),
    ] {
        let tenants_file = match text {
            Some(t) => {
                let path = dir.join(format!("{}.toml", apps.len()));
                std::fs::write(&path, t)?;
                Some(path)
            }
            None => None,
        };
        let config = ServeConfig {
            tenants_file,
            ..ServeConfig::default()
        };
        let mlp = TensorModel::mlp(&Device::cpu(), 8, 0)?;
        let state = AppState::new(
            config,
            vec![ModelSpec::Tensor {
                name: "mlp".into(),
                model: mlp,
            }],
        )?;
        apps.push((what, router(state)));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let auth = format!("Bearer {}", key(TENANTS - 1));
    let mut per_config: Vec<Vec<f64>> = vec![Vec::new(); apps.len()];
    rt.block_on(async {
        for round in 0..rounds {
            for k in 0..apps.len() {
                let c = (round + k) % apps.len();
                let app = &apps[c].1;
                let t = thread_cpu();
                for _ in 0..n {
                    let req = Request::get("/v2/models/mlp")
                        .header("authorization", &auth)
                        .body(Body::empty())
                        .expect("a request");
                    let resp = app.clone().oneshot(req).await.expect("infallible");
                    assert_eq!(resp.status(), 200);
                    black_box(
                        axum::body::to_bytes(resp.into_body(), usize::MAX)
                            .await
                            .ok(),
                    );
                }
                per_config[c].push((thread_cpu() - t).as_nanos() as f64 / n as f64 / 1e3);
            }
        }
    });
    let medians: Vec<f64> = per_config.into_iter().map(median).collect();
    for ((what, _), us) in apps.iter().zip(&medians) {
        println!("router, GET /v2/models/mlp, keys: {what}: {us:.2} CPU us per request");
    }
    let added = medians[1] - medians[0];
    let added_limits = medians[2] - medians[0];
    println!("the key check adds {added:.2} us per request ({added_limits:.2} us with limits)");
    std::fs::remove_dir_all(&dir)?;
    Ok(json!({
        "route": "GET /v2/models/mlp (router in process, tower oneshot, current-thread runtime)",
        "timing": "thread CPU time (CLOCK_THREAD_CPUTIME_ID), median of rounds",
        "rounds": rounds,
        "requests_per_round": n,
        "us_per_request_no_keys": medians[0],
        "us_per_request_1000_tenants": medians[1],
        "us_per_request_1000_tenants_limits": medians[2],
        "added_us": added,
        "added_us_with_limits": added_limits,
    }))
}

/// A paced load: `clients` tasks, each sending its request `per_client_rate` times a second
/// for `duration`, whatever the earlier requests became.
struct Load {
    path: &'static str,
    body: Option<Value>,
    key: String,
    clients: usize,
    per_client_rate: f64,
    /// Where the first window ends and the second begins.
    split: Duration,
    duration: Duration,
}

/// What a [`Load`] got, counted by the time each request was sent: requests admitted (200)
/// and their `usage` tokens in `[0, split)` and `[split, duration)`, refusals (429), and
/// anything else.
struct Drive {
    admitted: [u64; 2],
    tokens: [u64; 2],
    refused: u64,
    other: u64,
}

async fn drive(base: &str, load: Load) -> Drive {
    let Load {
        path,
        body,
        key,
        clients,
        per_client_rate,
        split,
        duration,
    } = load;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .expect("a client");
    let counts: Arc<[AtomicU64; 6]> = Arc::new(Default::default());
    let start = Instant::now();
    let url = format!("{base}{path}");
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (client, counts, url, body, key) = (
                client.clone(),
                counts.clone(),
                url.clone(),
                body.clone(),
                key.clone(),
            );
            tokio::spawn(async move {
                let period = Duration::from_secs_f64(1.0 / per_client_rate);
                // Clients spread over one period, so the offered load is even.
                let first = start + period.mul_f64(c as f64 / clients as f64);
                let mut ticks = tokio::time::interval_at(first.into(), period);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut inflight = Vec::new();
                loop {
                    ticks.tick().await;
                    let sent = start.elapsed();
                    if sent >= duration {
                        break;
                    }
                    let half = usize::from(sent >= split);
                    let req = match &body {
                        Some(b) => client.post(&url).json(b),
                        None => client.get(&url),
                    }
                    .bearer_auth(&key);
                    let counts = counts.clone();
                    inflight.push(tokio::spawn(async move {
                        let Ok(resp) = req.send().await else {
                            counts[5].fetch_add(1, Ordering::Relaxed);
                            return;
                        };
                        match resp.status().as_u16() {
                            200 => {
                                counts[half].fetch_add(1, Ordering::Relaxed);
                                if let Ok(v) = resp.json::<Value>().await {
                                    let t = v["usage"]["total_tokens"].as_u64().unwrap_or(0);
                                    counts[2 + half].fetch_add(t, Ordering::Relaxed);
                                }
                            }
                            429 => {
                                counts[4].fetch_add(1, Ordering::Relaxed);
                            }
                            _ => {
                                counts[5].fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }));
                }
                for h in inflight {
                    let _ = h.await;
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
    let c = |i: usize| counts[i].load(Ordering::Relaxed);
    Drive {
        admitted: [c(0), c(1)],
        tokens: [c(2), c(3)],
        refused: c(4),
        other: c(5),
    }
}

/// `(admitted, allowed, error %)` of a window: `allowed` is what the limit permits.
fn accuracy(admitted: u64, allowed: f64) -> Value {
    json!({
        "admitted": admitted,
        "allowed": allowed,
        "error_percent": (admitted as f64 - allowed) / allowed * 100.0,
    })
}

fn limits(quick: bool) -> Res<Value> {
    let window = Duration::from_secs(if quick { 3 } else { 10 });
    let rps = 200.0;
    let tps = 5_000.0;
    let dir = std::env::temp_dir().join(format!("sp-bench-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let file = dir.join("tenants.toml");
    std::fs::write(
        &file,
        format!(
            "[[tenant]]\nname = \"requests\"\nkey = \"{}\"\nrequests_per_second = {rps:?}\n\
             [[tenant]]\nname = \"tokens\"\nkey = \"{}\"\ntokens_per_second = {tps:?}\n",
            key(0),
            key(1)
        ),
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = rt.block_on(async {
        let embedder = Arc::new(SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir())?);
        let mlp = TensorModel::mlp(&Device::cpu(), 8, 0)?;
        let config = ServeConfig {
            addr: "127.0.0.1:0".parse()?,
            tenants_file: Some(file.clone()),
            ..ServeConfig::default()
        };
        let server = Server::start(
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
        )
        .await?;
        let base = format!("http://{}", server.addr());
        let clients = 8;

        // Requests per second: 2x the rate on a cheap route.
        let d = drive(
            &base,
            Load {
                path: "/v2/models/mlp",
                body: None,
                key: key(0),
                clients,
                per_client_rate: 2.0 * rps / clients as f64,
                split: window,
                duration: 2 * window,
            },
        )
        .await;
        let secs = window.as_secs_f64();
        let requests = json!({
            "requests_per_second": rps,
            "offered_per_second": 2.0 * rps,
            "clients": clients,
            "window_s": secs,
            "first_window_bucket_full": accuracy(d.admitted[0], rps * secs + rps),
            "second_window_at_limit": accuracy(d.admitted[1], rps * secs),
            "refused_429": d.refused,
            "other_outcomes": d.other,
        });
        println!("requests/s limit {rps}, offered 2x for 2 x {secs} s: {requests}");

        // Tokens per second: 2x the rate in tokens on /v1/embeddings.
        let text = "hello world ".repeat(24);
        let probe = reqwest::Client::new()
            .post(format!("{base}/v1/embeddings"))
            .bearer_auth(key(1))
            .json(&json!({"input": text}))
            .send()
            .await?
            .json::<Value>()
            .await?;
        let per_request = probe["usage"]["total_tokens"].as_f64().unwrap_or(1.0);
        // Let the probe's tokens be paid back before the drive, so it starts with a full
        // bucket as the requests' did.
        tokio::time::sleep(Duration::from_secs_f64(per_request / tps + 1.0)).await;
        let d = drive(
            &base,
            Load {
                path: "/v1/embeddings",
                body: Some(json!({"input": text})),
                key: key(1),
                clients,
                per_client_rate: 2.0 * tps / per_request / clients as f64,
                split: window,
                duration: 2 * window,
            },
        )
        .await;
        let tokens = json!({
            "tokens_per_second": tps,
            "tokens_per_request": per_request,
            "offered_tokens_per_second": 2.0 * tps,
            "clients": clients,
            "window_s": secs,
            "first_window_bucket_full": accuracy(d.tokens[0], tps * secs + tps),
            "second_window_at_limit": accuracy(d.tokens[1], tps * secs),
            "requests_admitted": d.admitted,
            "refused_429": d.refused,
            "other_outcomes": d.other,
        });
        println!("tokens/s limit {tps}, offered 2x for 2 x {secs} s: {tokens}");
        let snapshot = server.state().tenants().expect("tenants");
        let counted = snapshot.get("tokens").map(|t| t.requests(Outcome::Ok));
        server.shutdown().await?;
        Ok::<_, Box<dyn std::error::Error>>(json!({
            "requests": requests,
            "tokens": tokens,
            "server_counted_ok_tokens_tenant": counted,
        }))
    });
    std::fs::remove_dir_all(&dir)?;
    result
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick") || !args.iter().any(|a| a == "--bench");
    let json_out = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1))
        .cloned();
    let report = json!({
        "lookup": lookup(quick)?,
        "router": through_router(quick)?,
        "limits": limits(quick)?,
    });
    if let Some(path) = json_out {
        std::fs::write(&path, serde_json::to_string_pretty(&report)? + "\n")?;
        println!("wrote {path}");
    }
    Ok(())
}
