//! Connections against a live server: the header and keep-alive timeouts, the connection
//! cap, `Expect: 100-continue` over the body limit, finely chunked bodies and what they cost,
//! and more idle connections than the server has file descriptors.

use super::*;

/// A test that neither finishes nor fails within this has hung.
const HANG: Duration = Duration::from_secs(30);

/// One HTTP/1.1 response read off a raw connection: its head (status line and headers,
/// lowercased) and its body (by `content-length`).
struct RawResponse {
    head: String,
    body: Vec<u8>,
}

impl RawResponse {
    fn status(&self) -> u16 {
        self.head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no status in {:?}", self.head))
    }
}

/// Reads one response off `stream` (its bytes before the response, such as an interim
/// `100 Continue`, are part of the head), within [`HANG`].
async fn read_response(stream: &mut tokio::net::TcpStream) -> RawResponse {
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    let read = async {
        loop {
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map(|v| v.trim().parse().expect("content-length"))
                    .unwrap_or(0);
                if got.len() >= end + 4 + len {
                    return RawResponse {
                        head,
                        body: got[end + 4..end + 4 + len].to_vec(),
                    };
                }
            }
            let n = stream.read(&mut buf).await.expect("read");
            assert!(
                n > 0,
                "closed before a whole response: {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
    };
    tokio::time::timeout(HANG, read).await.expect("a response")
}

/// Waits until the server closes `stream` (EOF or reset); returns how long that took.
/// Anything it sends first is ignored.
async fn closed_after(stream: &mut tokio::net::TcpStream) -> Duration {
    let began = std::time::Instant::now();
    let mut buf = [0u8; 1024];
    tokio::time::timeout(HANG, async {
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await
    .expect("the server closes the connection");
    began.elapsed()
}

const LIVE: &[u8] = b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_and_idle_connections_are_closed_after_their_timeouts() {
    let header = Duration::from_millis(400);
    let idle = Duration::from_millis(1500);
    let config = ServeConfig {
        header_read_timeout: header,
        keep_alive_timeout: idle,
        ..test_config()
    };
    let s = start(config, vec![]).await;
    let addr = s.handle.addr();
    let connect = || async move { tokio::net::TcpStream::connect(addr).await.expect("connect") };

    // Headers trickled one byte every 50 ms: the timeout counts from the accept, not from
    // the last byte.
    let mut trickle = connect().await;
    let (mut rd, mut wr) = trickle.split();
    let head = format!("POST {INFER} HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n");
    let writer = async {
        for b in head.bytes().cycle().take(200) {
            if wr.write_all(&[b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let reader = async {
        let began = std::time::Instant::now();
        let mut buf = [0u8; 64];
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
        began.elapsed()
    };
    let (_, trickled) = tokio::join!(writer, reader);
    // A connection opened and never used.
    let mut silent = connect().await;
    let silent = closed_after(&mut silent).await;
    for (what, took) in [
        ("trickled headers", trickled),
        ("a silent connection", silent),
    ] {
        assert!(
            took >= header.mul_f32(0.8) && took < Duration::from_secs(5),
            "{what} closed after {took:?} (header timeout {header:?})"
        );
    }

    // Keep-alive: a second request after longer than the header timeout but shorter than
    // the idle timeout is served on the same connection; then, idle, it closes after the
    // idle timeout (not the header timeout).
    let mut kept = connect().await;
    kept.write_all(LIVE).await.expect("write");
    assert_eq!(read_response(&mut kept).await.status(), 200);
    tokio::time::sleep(header * 2).await;
    kept.write_all(LIVE).await.expect("write");
    assert_eq!(read_response(&mut kept).await.status(), 200);
    let took = closed_after(&mut kept).await;
    assert!(
        took >= idle.mul_f32(0.8) && took < idle + Duration::from_secs(5),
        "an idle keep-alive connection closed after {took:?} (idle timeout {idle:?})"
    );
    println!("closed after: trickled headers {trickled:?}, silent {silent:?}, idle {took:?}");
    still_serves(&s).await;
    s.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_get_503_while_open_ones_are_served() {
    let cap = 8;
    let config = ServeConfig {
        max_connections: cap,
        header_read_timeout: Duration::from_secs(20),
        ..test_config()
    };
    let s = start(config, vec![]).await;
    let addr = s.handle.addr();
    // A client with a keep-alive connection, then connections that fill the cap.
    let mut kept = tokio::net::TcpStream::connect(addr).await.expect("connect");
    kept.write_all(LIVE).await.expect("write");
    assert_eq!(read_response(&mut kept).await.status(), 200);
    let mut idle = Vec::new();
    for _ in 1..cap {
        idle.push(tokio::net::TcpStream::connect(addr).await.expect("connect"));
    }
    // Past the cap: a clear 503 (for a raw client and for reqwest), never a hang or reset.
    let mut over = tokio::net::TcpStream::connect(addr).await.expect("connect");
    over.write_all(LIVE).await.expect("write");
    let refused = read_response(&mut over).await;
    assert_eq!(refused.status(), 503, "{}", refused.head);
    assert!(refused.head.contains("retry-after: 1"), "{}", refused.head);
    assert!(
        refused.head.contains("connection: close"),
        "{}",
        refused.head
    );
    assert!(
        String::from_utf8_lossy(&refused.body).contains("retry later"),
        "{:?}",
        refused.body
    );
    let fresh = reqwest::Client::new();
    let resp = fresh
        .get(s.url("/v2/health/live"))
        .send()
        .await
        .expect("reqwest gets the refusal as a response");
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    // The open client is still served.
    for _ in 0..3 {
        kept.write_all(LIVE).await.expect("write");
        assert_eq!(read_response(&mut kept).await.status(), 200);
    }
    // Closing connections frees room for new clients.
    idle.truncate(2);
    let mut served = false;
    for _ in 0..100 {
        let resp = fresh
            .get(s.url("/v2/health/live"))
            .send()
            .await
            .expect("an answer");
        if resp.status() == 200 {
            served = true;
            break;
        }
        assert_eq!(resp.status(), 503);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served, "a new client is served once connections closed");
    drop(idle);
    s.handle.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_continue_over_the_body_limit_is_413_without_100_continue() {
    let s = start(test_config(), vec![]).await;
    let addr = s.handle.addr();
    for path in [INFER, "/v1/embeddings", "/embed"] {
        let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        c.write_all(
            format!(
                "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                 content-length: 104857600\r\nexpect: 100-continue\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .expect("write");
        let began = std::time::Instant::now();
        let resp = read_response(&mut c).await;
        assert_eq!(resp.status(), 413, "{path}: {}", resp.head);
        assert!(!resp.head.contains("100 continue"), "{path}: {}", resp.head);
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "{path}: answered after {:?}",
            began.elapsed()
        );
    }
    // Within the limit, `Expect: 100-continue` still gets its `100 Continue`, then the answer.
    let row: Vec<f32> = vec![0.25; MLP_WIDTH];
    let body = json!({"inputs": [{"name": "input", "shape": [1, MLP_WIDTH], "datatype": "FP32", "data": row}]})
        .to_string();
    let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
    c.write_all(
        format!(
            "POST {INFER} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nexpect: 100-continue\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    let mut interim = [0u8; 25];
    tokio::time::timeout(HANG, c.read_exact(&mut interim))
        .await
        .expect("an interim answer")
        .expect("read");
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    c.write_all(body.as_bytes()).await.expect("write");
    let resp = read_response(&mut c).await;
    assert_eq!(resp.status(), 200, "{}", resp.head);
    let got: Value = serde_json::from_slice(&resp.body).expect("JSON");
    let want = mlp_rows(&s.mlp, &[row]).concat();
    assert_close(&floats(&got["outputs"][0]["data"]), &want, 1e-4, "output");
    still_serves(&s).await;
    s.handle.shutdown().await.expect("shutdown");
}

/// `body` in HTTP/1.1 chunked framing, `size` bytes a chunk.
fn chunked(body: &[u8], size: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() * 3 + 5);
    for c in body.chunks(size) {
        out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

/// A valid MLP request of `row`, padded with JSON whitespace to at least `size` bytes.
fn padded_request(row: &[f32], size: usize) -> Vec<u8> {
    let mut body = json!({"inputs": [{"name": "input", "shape": [1, MLP_WIDTH], "datatype": "FP32", "data": row}]})
        .to_string()
        .into_bytes();
    if body.len() < size {
        body.resize(size, b' ');
    }
    body
}

/// Sends `body` to `addr` with `Transfer-Encoding: chunked` in chunks of `size` bytes, the
/// whole framing written at once (the client's own cost stays small), and reads the
/// answer while writing: the server may answer and close before the body is all sent.
async fn post_chunked(addr: std::net::SocketAddr, body: &[u8], size: usize) -> RawResponse {
    let mut c = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut wire = format!(
        "POST {INFER} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         transfer-encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    wire.extend_from_slice(&chunked(body, size));
    let (mut rd, mut wr) = c.split();
    let writer = async {
        // A refused body is closed on mid-way: the write may fail.
        let _ = wr.write_all(&wire).await;
    };
    let reader = async {
        let mut got = Vec::new();
        let mut buf = [0u8; 8192];
        while let Ok(n) = rd.read(&mut buf).await {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map(|v| v.trim().parse().expect("content-length"))
                    .unwrap_or(0);
                if got.len() >= end + 4 + len {
                    return RawResponse {
                        head,
                        body: got[end + 4..end + 4 + len].to_vec(),
                    };
                }
            }
        }
        panic!(
            "closed before a whole response: {:?}",
            String::from_utf8_lossy(&got)
        );
    };
    let (_, resp) = tokio::time::timeout(HANG, async { tokio::join!(writer, reader) })
        .await
        .expect("an answer");
    resp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finely_chunked_bodies_are_served_or_refused_by_their_chunking() {
    let config = ServeConfig {
        max_body_bytes: 1 << 20,
        ..test_config()
    };
    let s = start(config, vec![]).await;
    let addr = s.handle.addr();
    let row: Vec<f32> = (0..MLP_WIDTH).map(|i| (i % 4) as f32 / 4.0).collect();
    let want = mlp_rows(&s.mlp, std::slice::from_ref(&row)).concat();
    let check = |resp: RawResponse, what: &str| {
        assert_eq!(resp.status(), 200, "{what}: {}", resp.head);
        let got: Value = serde_json::from_slice(&resp.body).expect("JSON");
        assert_close(&floats(&got["outputs"][0]["data"]), &want, 1e-4, what);
    };
    // A small request, one byte a chunk: served.
    let small = padded_request(&row, 0);
    assert!(small.len() < 4096);
    check(post_chunked(addr, &small, 1).await, "1-byte chunks");
    // Just under the body limit, 64 bytes a chunk (the finest chunking allowed on average
    // for a large body): served.
    let large = padded_request(&row, (1 << 20) - 64);
    check(post_chunked(addr, &large, 64).await, "64-byte chunks");
    // The same in 16-byte and 1-byte chunks, and a body over the limit in 1-byte chunks:
    // refused.
    for (what, body, size) in [
        ("under the limit", large.clone(), 16),
        ("under the limit", large.clone(), 1),
        ("over the limit", padded_request(&row, 2 << 20), 1),
    ] {
        let resp = post_chunked(addr, &body, size).await;
        assert_eq!(
            resp.status(),
            413,
            "{size}-byte chunks {what}: {}",
            resp.head
        );
        assert!(
            String::from_utf8_lossy(&resp.body).contains("chunks"),
            "{size}-byte chunks {what}: {:?}",
            String::from_utf8_lossy(&resp.body)
        );
    }
    still_serves(&s).await;
    s.handle.shutdown().await.expect("shutdown");
}

/// A server in a child process of this test binary (running [`child_server`]), so that its
/// CPU time and open-file limit are its own: the tests of this binary run in parallel in
/// one process.
struct ChildServer {
    child: std::process::Child,
    addr: std::net::SocketAddr,
    stdin: Option<std::process::ChildStdin>,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl ChildServer {
    /// Starts the server `kind` of [`child_server`] and waits for its address.
    fn start(kind: &str) -> Self {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let mut child = Command::new(std::env::current_exe().expect("this test binary"))
            .args([
                "--ignored",
                "--exact",
                "hostile::connections::child_server",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_VAR, kind)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the child server");
        let stdin = child.stdin.take();
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
        let mut line = String::new();
        let addr = loop {
            line.clear();
            let n = stdout.read_line(&mut line).expect("read the child");
            assert!(n > 0, "the child server ended before serving");
            // libtest may print its own words before ours on the same line.
            if let Some((_, addr)) = line.trim().split_once("addr ") {
                break addr.parse().expect("an address");
            }
        };
        Self {
            child,
            addr,
            stdin,
            stdout,
        }
    }

    /// The child's CPU time so far (user + system, `getrusage(RUSAGE_SELF)`), in seconds.
    fn cpu(&mut self) -> f64 {
        use std::io::{BufRead, Write};
        let stdin = self.stdin.as_mut().expect("open");
        stdin.write_all(b"cpu\n").expect("ask the child");
        stdin.flush().expect("flush");
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.stdout.read_line(&mut line).expect("read the child");
            assert!(n > 0, "the child server ended");
            if let Some((_, secs)) = line.trim().split_once("cpu ") {
                return secs.parse().expect("seconds");
            }
        }
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        // A closed stdin stops the child; kill it if it has not stopped within a while.
        drop(self.stdin.take());
        for _ in 0..200 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Names the server [`child_server`] runs.
const CHILD_VAR: &str = "STREAMPOOL_HOSTILE_CHILD";

/// CPU time of this process (user + system), in seconds.
fn cpu_seconds() -> f64 {
    // SAFETY: an all-zero `rusage` is valid (integers and timevals); getrusage overwrites it.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one `rusage` through a pointer to a live local.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) }, 0);
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Not a test: the server of [`ChildServer`], run in a child process with [`CHILD_VAR`]
/// naming its settings. It prints its address, answers each `cpu` line on stdin with its
/// CPU time, and stops when stdin closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the server of other tests, run by them in a child process"]
async fn child_server() {
    let Ok(kind) = std::env::var(CHILD_VAR) else {
        return;
    };
    let config = match kind.as_str() {
        "chunks" => ServeConfig {
            max_body_bytes: 1 << 20,
            ..test_config()
        },
        "nofile" => {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit and setrlimit read or write one `rlimit` through a pointer
            // to a live local.
            unsafe {
                assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
                lim.rlim_cur = NOFILE.min(lim.rlim_max);
                assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
            }
            ServeConfig {
                max_connections: NOFILE as usize / 2,
                header_read_timeout: Duration::from_secs(1),
                // Longer than the flood takes on a loaded machine: the kept client is idle
                // while it connects; the silent connections close by the header timeout.
                keep_alive_timeout: Duration::from_secs(5),
                ..test_config()
            }
        }
        other => panic!("no child server {other:?}"),
    };
    let s = start(config, vec![]).await;
    println!("addr {}", s.handle.addr());
    let (closed, stdin_closed) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::stdin().lock().lines() {
            match line.as_deref() {
                Ok("cpu") => println!("cpu {}", cpu_seconds()),
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let _ = closed.send(());
    });
    let _ = stdin_closed.await;
    s.handle.shutdown().await.expect("shutdown");
}

/// The soft open-file limit of the `nofile` child server.
const NOFILE: libc::rlim_t = 256;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_bodies_cost_about_what_their_bytes_cost() {
    let mut child = tokio::task::block_in_place(|| ChildServer::start("chunks"));
    let addr = child.addr;
    let row: Vec<f32> = (0..MLP_WIDTH).map(|i| (i % 4) as f32 / 4.0).collect();
    let body = padded_request(&row, (1 << 20) - 64);
    let mb = body.len() as f64 / 1e6;
    const ROUNDS: usize = 3;
    // CPU seconds per MB of body: sent whole, in 64-byte chunks (served), in 1-byte chunks
    // (refused early).
    let mut per_mb = Vec::new();
    for (what, size, status) in [
        ("whole", body.len(), 200),
        ("64-byte chunks", 64, 200),
        ("1-byte chunks", 1, 413),
    ] {
        let before = tokio::task::block_in_place(|| child.cpu());
        for _ in 0..ROUNDS {
            let resp = post_chunked(addr, &body, size).await;
            assert_eq!(resp.status(), status, "{what}: {}", resp.head);
        }
        let after = tokio::task::block_in_place(|| child.cpu());
        per_mb.push((what, (after - before) / ROUNDS as f64 / mb));
    }
    println!("server CPU per MB of body: {per_mb:?}");
    for (what, secs) in per_mb {
        // The target is 0.5 s per MB, on a loaded 2-core machine too; with no bound on
        // chunks, a 4 MB body in 1-byte chunks cost 2-3 s.
        assert!(secs < 0.5, "{what}: {secs:.3} s of server CPU per MB");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_idle_connections_than_the_open_file_limit_leave_valid_requests_served() {
    let mut child = tokio::task::block_in_place(|| ChildServer::start("nofile"));
    let addr = child.addr;
    // A client with a keep-alive connection from before the flood.
    let mut kept = tokio::net::TcpStream::connect(addr).await.expect("connect");
    kept.write_all(LIVE).await.expect("write");
    assert_eq!(read_response(&mut kept).await.status(), 200);
    // More silent connections than the server has descriptors; each of ours stays open on
    // this side until the end of the flood.
    let flood = 2 * NOFILE as usize;
    let mut silent = Vec::with_capacity(flood);
    for _ in 0..flood {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(c) => silent.push(c),
            Err(e) => panic!("connect {}: {e}", silent.len()),
        }
    }
    // Meanwhile the kept client is served, request after request, for longer than the
    // server's header timeout (each request resets its idle time).
    let mut worst = Duration::ZERO;
    for _ in 0..25 {
        let began = std::time::Instant::now();
        kept.write_all(LIVE).await.expect("write");
        assert_eq!(read_response(&mut kept).await.status(), 200);
        worst = worst.max(began.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The silent connections are closed by the server within its timeouts.
    let began = std::time::Instant::now();
    for c in &mut silent {
        closed_after(c).await;
    }
    let cleared = began.elapsed();
    drop(silent);
    // New clients are served again, and the server still runs (accept never failed for
    // good).
    let fresh = reqwest::Client::new();
    let mut served = 0;
    for _ in 0..20 {
        let resp = fresh
            .post(format!("http://{addr}{INFER}"))
            .json(&json!({"inputs": [{"name": "input", "shape": [1, MLP_WIDTH], "datatype": "FP32", "data": vec![0.5; MLP_WIDTH]}]}))
            .send()
            .await
            .expect("an answer");
        assert_eq!(resp.status(), 200);
        served += 1;
    }
    println!(
        "{flood} silent connections against a {NOFILE}-descriptor server: kept client's worst \
         latency {worst:?}, all closed {cleared:?} after the flood, {served} new requests served"
    );
    assert!(cleared < Duration::from_secs(10), "{cleared:?}");
    let _ = child.cpu(); // the child still answers
}
