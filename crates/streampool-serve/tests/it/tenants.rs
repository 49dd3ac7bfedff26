//! Tenants (`ServeConfig::tenants_file`): each key sees only its models on every route, its
//! limits hold (requests and tokens per second, concurrent requests: 429 with
//! `Retry-After`), the file is re-read while serving, and a bad file keeps the tenants in
//! force.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::util::*;
use serde_json::{json, Value};
use streampool::Device;
use streampool_core::{LoaderConfig, ModelLoader};
use streampool_nn::{tiny_bert_dir, tiny_model_dir, Classifier};
use streampool_serve::tenants::Outcome;
use streampool_serve::{ApiKey, AppState, Error, ModelSpec, ServeConfig, Server};

const KEY_ALPHA: &str = "sp-alpha-0123456789abcdef";
const KEY_BETA: &str = "sp-beta-0123456789abcdef";
const KEY_ALL: &str = "sp-all-0123456789abcdef";
const RERANKER: &str = "reranker";

/// A tenants file in a folder of the test's own, removed with it.
struct TenantsFile {
    dir: PathBuf,
}

impl TenantsFile {
    fn path(&self) -> PathBuf {
        self.dir.join("tenants.toml")
    }
}

impl Drop for TenantsFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A tenants file holding `text`, for the test named `test`.
fn tenants_file(test: &str, text: &str) -> TenantsFile {
    let dir = std::env::temp_dir().join(format!("sp-tenants-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = TenantsFile { dir };
    std::fs::write(file.path(), text).expect("write tenants file");
    file
}

fn config_with(path: PathBuf) -> ServeConfig {
    ServeConfig {
        tenants_file: Some(path),
        tenants_poll_interval: Duration::from_millis(100),
        ..test_config()
    }
}

fn reranker() -> ModelSpec {
    ModelSpec::Classifier {
        name: RERANKER.into(),
        classifier: Arc::new(
            Classifier::load(&Device::cpu(), tiny_model_dir("tiny-xlmr-reranker"))
                .expect("tiny reranker"),
        ),
    }
}

fn mlp_request() -> Value {
    json!({"inputs": [{"name": "input", "shape": [1, MLP_WIDTH], "datatype": "FP32",
            "data": vec![0.25; MLP_WIDTH]}]})
}

/// `(status, JSON body)` of a request with `key`.
async fn call(s: &TestServer, key: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let req = match body {
        Some(b) => s.client.post(s.url(path)).json(b),
        None => s.client.get(s.url(path)),
    };
    let resp = req.bearer_auth(key).send().await.expect("request sent");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn model_ids(list: &Value) -> Vec<&str> {
    list["data"]
        .as_array()
        .expect("a model list")
        .iter()
        .map(|m| m["id"].as_str().expect("an id"))
        .collect()
}

/// The line of `metric` with `labels` in a scrape, e.g. `tenant="a",outcome="ok"`.
fn metric_value(scrape: &str, metric: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{metric}{{{labels}}} ");
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.parse().expect("a number"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sees_only_its_models_on_every_route() {
    let file = tenants_file(
        "isolation",
        &format!(
            "[[tenant]]\nname = \"alpha\"\nkey = \"{KEY_ALPHA}\"\nmodels = [\"{EMBEDDER}\"]\n\
             [[tenant]]\nname = \"beta\"\nkey = \"{KEY_BETA}\"\nmodels = [\"{MLP}\", \"{RERANKER}\"]\n\
             [[tenant]]\nname = \"all\"\nkey = \"{KEY_ALL}\"\nmodels = [\"*\"]\n"
        ),
    );
    let s = start(config_with(file.path()), vec![reranker()]).await;
    let text = json!({"input": "hello world"});

    // KServe: another tenant's model answers exactly as a model that does not exist.
    for (path, body) in [
        ("/v2/models/{}/infer", Some(mlp_request())),
        ("/v2/models/{}", None),
        ("/v2/models/{}/ready", None),
        ("/v2/models/{}/versions/1", None),
    ] {
        let absent = call(&s, KEY_ALPHA, &path.replace("{}", "nope"), body.as_ref()).await;
        let hidden = call(&s, KEY_ALPHA, &path.replace("{}", MLP), body.as_ref()).await;
        assert_eq!(absent.0, 404, "{path}");
        let expected = absent.1.to_string().replace("nope", MLP);
        assert_eq!((hidden.0, hidden.1.to_string()), (404, expected), "{path}");
        let allowed = call(&s, KEY_BETA, &path.replace("{}", MLP), body.as_ref()).await;
        assert_eq!(allowed.0, 200, "{path}: {}", allowed.1);
    }
    let (status, _) = call(&s, KEY_BETA, "/v2/models/tiny-bert", None).await;
    assert_eq!(status, 404);

    // OpenAI: `model` names another tenant's model; the default is the tenant's own.
    let absent = call(
        &s,
        KEY_ALPHA,
        "/v1/embeddings",
        Some(&json!({"input": "hi", "model": "nope"})),
    )
    .await;
    let hidden = call(
        &s,
        KEY_BETA,
        "/v1/embeddings",
        Some(&json!({"input": "hi", "model": EMBEDDER})),
    )
    .await;
    assert_eq!(
        (hidden.0, hidden.1.to_string()),
        (404, absent.1.to_string().replace("nope", EMBEDDER))
    );
    let (status, body) = call(&s, KEY_ALPHA, "/v1/embeddings", Some(&text)).await;
    assert_eq!((status, body["model"].as_str()), (200, Some(EMBEDDER)));
    let (status, body) = call(&s, KEY_BETA, "/v1/embeddings", Some(&text)).await;
    assert_eq!(status, 404, "beta has no embedder: {body}");
    assert_eq!(body["error"]["message"], "no embedding model is served");
    let rerank = json!({"query": "q", "documents": ["a", "b"]});
    let (status, body) = call(&s, KEY_ALPHA, "/v1/rerank", Some(&rerank)).await;
    assert_eq!(
        (status, body["error"]["message"].as_str()),
        (404, Some("no reranker model is served"))
    );
    let named = json!({"query": "q", "documents": ["a"], "model": RERANKER});
    let (status, _) = call(&s, KEY_ALPHA, "/v1/rerank", Some(&named)).await;
    assert_eq!(status, 404);
    let (status, body) = call(&s, KEY_BETA, "/v1/rerank", Some(&rerank)).await;
    assert_eq!((status, body["model"].as_str()), (200, Some(RERANKER)));

    // The model lists show only the tenant's own.
    let (_, list) = call(&s, KEY_ALPHA, "/v1/models", None).await;
    assert_eq!(model_ids(&list), [EMBEDDER]);
    let (_, list) = call(&s, KEY_BETA, "/v1/models", None).await;
    assert_eq!(model_ids(&list), [MLP, RERANKER]);
    let (_, list) = call(&s, KEY_ALL, "/v1/models", None).await;
    assert_eq!(model_ids(&list), [MLP, RERANKER, EMBEDDER]);
    assert_eq!(call(&s, KEY_ALPHA, "/v1/models/mlp", None).await.0, 404);
    assert_eq!(call(&s, KEY_BETA, "/v1/models/mlp", None).await.0, 200);

    // TEI serves each tenant its first model of the route's kind; none is answered as on
    // a server without one (424).
    let inputs = json!({"inputs": "hello"});
    assert_eq!(call(&s, KEY_ALPHA, "/embed", Some(&inputs)).await.0, 200);
    let (status, body) = call(&s, KEY_BETA, "/embed", Some(&inputs)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (424, Some("no embedding model is served"))
    );
    let tei_rerank = json!({"query": "q", "texts": ["a", "b"]});
    assert_eq!(
        call(&s, KEY_BETA, "/rerank", Some(&tei_rerank)).await.0,
        200
    );
    let (status, body) = call(&s, KEY_ALPHA, "/rerank", Some(&tei_rerank)).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (424, Some("no reranker or classifier model is served"))
    );
    assert_eq!(call(&s, KEY_ALPHA, "/predict", Some(&inputs)).await.0, 424);
    // TEI's root: an embedding for alpha, beta's reranker scores (its only text model).
    let (status, body) = call(&s, KEY_ALPHA, "/", Some(&inputs)).await;
    assert!(status == 200 && body[0][0].is_number(), "{body}");
    let (status, body) = call(&s, KEY_BETA, "/", Some(&inputs)).await;
    assert!(status == 200 && body[0]["score"].is_number(), "{body}");
    let (_, info) = call(&s, KEY_ALPHA, "/info", None).await;
    assert_eq!(info["model_id"], EMBEDDER);
    let (_, info) = call(&s, KEY_BETA, "/info", None).await;
    assert_eq!(info["model_id"], RERANKER);

    // Per-tenant counters, by name only.
    let scrape = s.get("/metrics").await.text().await.expect("metrics");
    let requests = "streampool_tenant_requests_total";
    let not_found = metric_value(&scrape, requests, "tenant=\"alpha\",outcome=\"not_found\"");
    assert!(not_found.is_some_and(|n| n >= 6.0), "{scrape}");
    let ok = metric_value(&scrape, requests, "tenant=\"beta\",outcome=\"ok\"");
    assert!(ok.is_some_and(|n| n >= 8.0), "{scrape}");
    let tokens = metric_value(
        &scrape,
        "streampool_tenant_tokens_total",
        "tenant=\"alpha\"",
    );
    assert!(tokens.is_some_and(|n| n > 0.0), "{scrape}");
    for key in [KEY_ALPHA, KEY_BETA, KEY_ALL] {
        assert!(!scrape.contains(key));
    }
    // A key of no tenant is refused as before.
    let (status, _) = call(&s, "sp-nobody-0123456789", "/v1/models", None).await;
    assert_eq!(status, 401);
    s.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_second_admit_the_rate_and_one_burst() {
    let rate = 20.0;
    let file = tenants_file(
        "rate",
        &format!("[[tenant]]\nname = \"r\"\nkey = \"{KEY_ALPHA}\"\nrequests_per_second = {rate}\n"),
    );
    let s = Arc::new(start(config_with(file.path()), vec![]).await);
    // Four clients as fast as they can for about two seconds: demand far over the rate.
    let began = Instant::now();
    let window = Duration::from_secs(2);
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move {
                let (mut ok, mut limited) = (0u32, 0u32);
                while began.elapsed() < window {
                    let resp = s
                        .client
                        .get(s.url("/v2/models/mlp"))
                        .bearer_auth(KEY_ALPHA)
                        .send()
                        .await
                        .expect("GET");
                    match resp.status().as_u16() {
                        200 => ok += 1,
                        429 => {
                            let wait = resp.headers()["retry-after"].to_str().expect("ascii");
                            assert_eq!(wait, "1", "a request token refills in 50 ms");
                            let body: Value = resp.json().await.expect("KServe's error");
                            let message = body["error"].as_str().expect("a message");
                            assert!(message.contains("20 requests per second"), "{message}");
                            limited += 1;
                        }
                        other => panic!("status {other}"),
                    }
                }
                (ok, limited)
            })
        })
        .collect();
    let (mut ok, mut limited) = (0, 0);
    for c in clients {
        let (o, l) = c.await.expect("client");
        ok += o;
        limited += l;
    }
    let elapsed = began.elapsed().as_secs_f64();
    let most = rate * elapsed + rate;
    assert!(
        f64::from(ok) <= most,
        "{ok} admitted in {elapsed:.2} s (at most {most})"
    );
    assert!(
        f64::from(ok) >= rate * elapsed * 0.9,
        "{ok} admitted in {elapsed:.2} s"
    );
    assert!(limited > 0);
    let tenant = s
        .handle
        .state()
        .tenants()
        .expect("tenants")
        .get("r")
        .cloned()
        .expect("r");
    assert_eq!(tenant.requests(Outcome::Limited), u64::from(limited));
    assert_eq!(tenant.requests(Outcome::Ok), u64::from(ok));

    // Every protocol answers the refusal in its own format, with Retry-After. The bucket
    // is empty: the clients just drained it.
    type Check = (&'static str, Option<Value>, fn(&Value) -> bool);
    let checks: [Check; 3] = [
        ("/v1/models", None, |b| {
            b["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("limit"))
                && b["error"]["code"] == 429
        }),
        ("/embed", Some(json!({"inputs": "hi"})), |b| {
            b["error_type"] == "overloaded"
        }),
        ("/v2/models/mlp/infer", Some(mlp_request()), |b| {
            b["error"].as_str().is_some_and(|m| m.contains("limit"))
        }),
    ];
    for (path, body, right_format) in checks {
        // A burst of three so at least one is refused whatever refilled meanwhile.
        let mut refused = None;
        for _ in 0..3 {
            let req = match &body {
                Some(b) => s.client.post(s.url(path)).json(b),
                None => s.client.get(s.url(path)),
            };
            let resp = req.bearer_auth(KEY_ALPHA).send().await.expect("request");
            if resp.status() == 429 {
                assert!(resp.headers().contains_key("retry-after"), "{path}");
                refused = Some(resp.json::<Value>().await.expect("JSON"));
                break;
            }
        }
        let refused = refused.unwrap_or_else(|| panic!("{path}: never refused"));
        assert!(right_format(&refused), "{path}: {refused}");
    }
    Arc::into_inner(s)
        .expect("the clients are done")
        .handle
        .shutdown()
        .await
        .expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_past_max_concurrent_is_refused_and_slots_come_back() {
    let file = tenants_file(
        "concurrency",
        &format!(
            "[[tenant]]\nname = \"c\"\nkey = \"{KEY_ALPHA}\"\nmax_concurrent = 2\n\
             [[tenant]]\nname = \"other\"\nkey = \"{KEY_BETA}\"\n"
        ),
    );
    let gate = Gate::default();
    let gated = ModelSpec::Tensor {
        name: "gated".into(),
        model: gated_model(gate.clone()),
    };
    let s = Arc::new(start(config_with(file.path()), vec![gated]).await);
    let tenant = || {
        s.handle
            .state()
            .tenants()
            .expect("tenants")
            .get("c")
            .cloned()
            .expect("c")
    };
    let body = json!({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32",
                                  "data": [1.0, 2.0, 3.0, 4.0]}]});
    let send = |key: &'static str| {
        let (s, body) = (s.clone(), body.clone());
        tokio::spawn(async move {
            let resp = s
                .client
                .post(s.url("/v2/models/gated/infer"))
                .bearer_auth(key)
                .json(&body)
                .send()
                .await
                .expect("POST");
            resp.status().as_u16()
        })
    };
    let first = [send(KEY_ALPHA), send(KEY_ALPHA)];
    wait_until(|| tenant().in_flight() == 2, "two requests in flight").await;
    // The third waits for nothing: 429 at once, Retry-After 1.
    let resp = s
        .client
        .post(s.url("/v2/models/gated/infer"))
        .bearer_auth(KEY_ALPHA)
        .json(&body)
        .send()
        .await
        .expect("POST");
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    let message = resp.json::<Value>().await.expect("JSON")["error"].to_string();
    assert!(message.contains("2 concurrent requests"), "{message}");
    // Another tenant is not held back by this one's limit.
    let other = send(KEY_BETA);
    wait_until(
        || {
            s.handle
                .state()
                .tenants()
                .and_then(|t| t.get("other").map(|t| t.in_flight()))
                == Some(1)
        },
        "the other tenant's request in flight",
    )
    .await;
    gate.open();
    for h in first {
        assert_eq!(h.await.expect("request"), 200);
    }
    assert_eq!(other.await.expect("request"), 200);
    assert_eq!(tenant().in_flight(), 0);
    assert_eq!(tenant().requests(Outcome::Ok), 2);
    assert_eq!(tenant().requests(Outcome::Limited), 1);
    Arc::into_inner(s)
        .expect("the requests are done")
        .handle
        .shutdown()
        .await
        .expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_gives_its_slot_back() {
    use tokio::io::AsyncWriteExt;
    let file = tenants_file(
        "disconnect",
        &format!("[[tenant]]\nname = \"c\"\nkey = \"{KEY_ALPHA}\"\nmax_concurrent = 1\n"),
    );
    let gate = Gate::default();
    let gated = ModelSpec::Tensor {
        name: "gated".into(),
        model: gated_model(gate.clone()),
    };
    let s = start(config_with(file.path()), vec![gated]).await;
    let tenant = || {
        s.handle
            .state()
            .tenants()
            .expect("tenants")
            .get("c")
            .cloned()
            .expect("c")
    };
    let body = r#"{"inputs":[{"name":"input","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#;
    let mut conn = tokio::net::TcpStream::connect(s.handle.addr())
        .await
        .expect("connect");
    let request = format!(
        "POST /v2/models/gated/infer HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {KEY_ALPHA}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(request.as_bytes()).await.expect("write");
    wait_until(|| tenant().in_flight() == 1, "the request in flight").await;
    drop(conn);
    // The server drops the abandoned request, and its slot with it, before the model
    // answers.
    wait_until(|| tenant().in_flight() == 0, "the slot given back").await;
    assert_eq!(tenant().requests(Outcome::Cancelled), 1);
    gate.open();
    let (status, _) = call(
        &s,
        KEY_ALPHA,
        "/v2/models/gated/infer",
        Some(&serde_json::from_str(body).expect("json")),
    )
    .await;
    assert_eq!(status, 200);
    s.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_per_second_are_charged_once_tokenized() {
    let rate = 50.0;
    let file = tenants_file(
        "tokens",
        &format!("[[tenant]]\nname = \"t\"\nkey = \"{KEY_ALPHA}\"\ntokens_per_second = {rate}\n"),
    );
    let s = start(config_with(file.path()), vec![]).await;
    // Longer than the burst: admitted on a full bucket, then the debt holds the next back.
    let long = "hello world ".repeat(40);
    let req = json!({"input": long});
    let (status, body) = call(&s, KEY_ALPHA, "/v1/embeddings", Some(&req)).await;
    assert_eq!(status, 200, "{body}");
    let used = body["usage"]["total_tokens"].as_f64().expect("usage");
    assert!(used > rate, "{used} tokens: more than one second's worth");
    let refused_at = Instant::now();
    let resp = s
        .client
        .post(s.url("/v1/embeddings"))
        .bearer_auth(KEY_ALPHA)
        .json(&json!({"input": "hi"}))
        .send()
        .await
        .expect("POST");
    assert_eq!(resp.status(), 429);
    let wait: u64 = resp.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    // The debt is `used - rate` tokens: paid back in that over the rate seconds.
    let debt_secs = (used - rate) / rate;
    assert_eq!(wait, debt_secs.ceil().max(1.0) as u64);
    let body: Value = resp.json().await.expect("JSON");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("50 tokens per second")),
        "{body}"
    );
    // Once paid back, admitted again.
    tokio::time::sleep(
        Duration::from_secs_f64(debt_secs + 0.05).saturating_sub(refused_at.elapsed()),
    )
    .await;
    let (status, body) = call(
        &s,
        KEY_ALPHA,
        "/v1/embeddings",
        Some(&json!({"input": "hi"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let small = body["usage"]["total_tokens"].as_f64().expect("usage");
    // The counter holds what `usage` reported.
    let tenant = s
        .handle
        .state()
        .tenants()
        .expect("tenants")
        .get("t")
        .cloned()
        .expect("t");
    assert_eq!(tenant.tokens() as f64, used + small);
    s.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_is_reloaded_and_a_bad_one_keeps_the_tenants_in_force() {
    let file = tenants_file(
        "reload",
        &format!("[[tenant]]\nname = \"a\"\nkey = \"{KEY_ALPHA}\"\n"),
    );
    let s = start(config_with(file.path()), vec![]).await;
    let status = |key: &'static str| {
        let req = s.client.get(s.url("/v1/models")).bearer_auth(key);
        async move { req.send().await.expect("GET").status().as_u16() }
    };
    assert_eq!(status(KEY_ALPHA).await, 200);
    assert_eq!(status(KEY_BETA).await, 401);
    // a's key goes, b's comes: within a few poll intervals (100 ms here).
    std::fs::write(
        file.path(),
        format!("[[tenant]]\nname = \"b\"\nkey = \"{KEY_BETA}\"\n"),
    )
    .expect("rewrite");
    let changed = Instant::now();
    loop {
        if status(KEY_BETA).await == 200 && status(KEY_ALPHA).await == 401 {
            break;
        }
        assert!(changed.elapsed() < Duration::from_secs(5), "not reloaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        changed.elapsed() < Duration::from_secs(1),
        "{:?}",
        changed.elapsed()
    );
    // A file that does not parse: b stays, a stays out.
    std::fs::write(
        file.path(),
        "[[tenant]]\nname = \"b\"\nkey = \"unterminated\n",
    )
    .expect("rewrite");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(status(KEY_BETA).await, 200);
    assert_eq!(status(KEY_ALPHA).await, 401);
    // A file that parses but breaks a rule, and a missing file: the same.
    std::fs::write(
        file.path(),
        format!("[[tenant]]\nname = \"b\"\nkey = \"{KEY_BETA}\"\nmax_concurrent = 0\n"),
    )
    .expect("rewrite");
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::remove_file(file.path()).expect("remove");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(status(KEY_BETA).await, 200);
    // Fixed again: in force again.
    std::fs::write(
        file.path(),
        format!("[[tenant]]\nname = \"a\"\nkey = \"{KEY_ALPHA}\"\n"),
    )
    .expect("rewrite");
    wait_until(
        || {
            s.handle
                .state()
                .tenants()
                .is_some_and(|t| t.get("a").is_some())
        },
        "the fixed file in force",
    )
    .await;
    assert_eq!(status(KEY_ALPHA).await, 200);
    assert_eq!(status(KEY_BETA).await, 401);
    s.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_file_or_two_kinds_of_keys_stop_the_start() {
    let bad = tenants_file("bad", "[[tenant]]\nname = \"a\"\n");
    let err = Server::start(config_with(bad.path()), vec![])
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(&err, Error::Tenants(m) if m.contains("exactly one of")),
        "{err}"
    );
    // The path once, the kind once: "tenants file: /tmp/.../bad.toml: tenant \"a\": ...".
    let said = err.to_string();
    assert_eq!(said.matches("tenants file").count(), 1, "{said}");
    assert!(said.contains("tenants.toml: tenant"), "{said}");
    let missing = std::env::temp_dir().join("sp-tenants-no-such-file.toml");
    let err = Server::start(config_with(missing), vec![])
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, Error::Tenants(_)), "{err}");
    let good = tenants_file(
        "good",
        &format!("[[tenant]]\nname = \"a\"\nkey = \"{KEY_ALPHA}\"\n"),
    );
    let both = ServeConfig {
        api_key: Some(ApiKey::new(KEY_BETA).expect("key")),
        ..config_with(good.path())
    };
    assert!(matches!(both.validate(), Err(Error::Config(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_tenants_are_served_and_counted() {
    let key = |i: usize| format!("sp-tenant-{i:04}-0123456789abcdef");
    let mut text = String::new();
    for i in 0..1000 {
        let models = if i % 2 == 0 { EMBEDDER } else { MLP };
        text += &format!(
            "[[tenant]]\nname = \"t{i:04}\"\nkey = \"{}\"\nmodels = [\"{models}\"]\n\
             requests_per_second = 100.0\n",
            key(i)
        );
    }
    let file = tenants_file("thousand", &text);
    let s = start(config_with(file.path()), vec![]).await;
    assert_eq!(s.handle.state().tenants().expect("tenants").len(), 1000);
    for i in [0, 1, 499, 998, 999] {
        let (status, list) = call(&s, &key(i), "/v1/models", None).await;
        assert_eq!(status, 200);
        let own = if i % 2 == 0 { EMBEDDER } else { MLP };
        assert_eq!(model_ids(&list), [own], "tenant {i}");
    }
    let scrape = s.get("/metrics").await.text().await.expect("metrics");
    let series = scrape
        .lines()
        .filter(|l| l.starts_with("streampool_tenant_requests_total{"))
        .count();
    assert_eq!(series, 1000, "one `ok` series per tenant");
    let ok = metric_value(
        &scrape,
        "streampool_tenant_requests_total",
        "tenant=\"t0999\",outcome=\"ok\"",
    );
    assert_eq!(ok, Some(1.0));
    s.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_single_key_is_the_tenant_default() {
    let config = ServeConfig {
        api_key: Some(ApiKey::new(KEY_ALPHA).expect("key")),
        ..test_config()
    };
    let s = start(config, vec![]).await;
    let (_, list) = call(&s, KEY_ALPHA, "/v1/models", None).await;
    assert_eq!(model_ids(&list), [MLP, EMBEDDER]);
    let scrape = s.get("/metrics").await.text().await.expect("metrics");
    let ok = metric_value(
        &scrape,
        "streampool_tenant_requests_total",
        "tenant=\"default\",outcome=\"ok\"",
    );
    assert_eq!(ok, Some(1.0), "{scrape}");
    s.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_repository_lists_a_tenants_models_and_only_a_tenant_of_all_manages_them() {
    // A repository of two copies of the tiny embedder, both loaded.
    let root = std::env::temp_dir().join(format!("sp-tenants-repo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for name in ["alpha", "beta"] {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).expect("model folder");
        for f in std::fs::read_dir(tiny_bert_dir())
            .expect("tiny-bert")
            .flatten()
        {
            if f.path().is_file() {
                std::fs::copy(f.path(), dir.join(f.file_name())).expect("copy");
            }
        }
    }
    let file = tenants_file(
        "repository",
        &format!(
            "[[tenant]]\nname = \"limited\"\nkey = \"{KEY_ALPHA}\"\nmodels = [\"alpha\"]\n\
             [[tenant]]\nname = \"all\"\nkey = \"{KEY_ALL}\"\n"
        ),
    );
    let config = config_with(file.path());
    let loader = Arc::new(ModelLoader::new(
        vec![Device::cpu()],
        LoaderConfig {
            model: config.model_config(),
            ..LoaderConfig::default()
        },
        Some(root.clone()),
    ));
    let state = AppState::with_loader(config, vec![], Some(loader.clone())).expect("state");
    for name in ["alpha", "beta"] {
        loader.load(state.registry(), name).expect("load");
    }
    let handle = Server::serve_state(state).await.expect("serve");
    let base = format!("http://{}", handle.addr());
    let client = reqwest::Client::new();
    let post = |key: &'static str, path: &'static str| {
        let req = client.post(format!("{base}{path}")).bearer_auth(key);
        async move {
            let resp = req.send().await.expect("POST");
            let status = resp.status().as_u16();
            (status, resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let names = |index: &Value| -> Vec<String> {
        index
            .as_array()
            .expect("an index")
            .iter()
            .map(|e| e["name"].as_str().expect("a name").to_string())
            .collect()
    };
    let (status, index) = post(KEY_ALPHA, "/v2/repository/index").await;
    assert_eq!((status, names(&index)), (200, vec!["alpha".to_string()]));
    let (_, index) = post(KEY_ALL, "/v2/repository/index").await;
    assert_eq!(names(&index), ["alpha", "beta"]);
    // The limited tenant cannot unload or load, even its own model: 404 as on a server
    // that does not manage its models.
    let (_, unmanaged) = post(KEY_ALPHA, "/v2/repository/models/alpha/unload").await;
    for path in [
        "/v2/repository/models/alpha/unload",
        "/v2/repository/models/beta/unload",
        "/v2/repository/models/beta/load",
    ] {
        let (status, body) = post(KEY_ALPHA, path).await;
        assert_eq!((status, &body), (404, &unmanaged), "{path}");
    }
    assert!(unmanaged["error"]
        .as_str()
        .is_some_and(|m| m.contains("does not manage")));
    // The tenant of every model can; the limited one keeps seeing alpha alone.
    assert_eq!(
        post(KEY_ALL, "/v2/repository/models/beta/unload").await.0,
        200
    );
    let (_, index) = post(KEY_ALL, "/v2/repository/index").await;
    assert_eq!(index[1]["state"], "UNAVAILABLE", "{index}");
    let (_, index) = post(KEY_ALPHA, "/v2/repository/index").await;
    assert_eq!(names(&index), ["alpha"]);
    handle.shutdown().await.expect("shutdown");
    let _ = std::fs::remove_dir_all(&root);
}
