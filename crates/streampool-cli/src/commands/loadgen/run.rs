//! One load point: N closed-loop clients, each on its own keep-alive connection sending one
//! request at a time, over a warm-up and then a measured window; and what it measured.
//!
//! A request counts when it is sent inside the window (after the warm-up, before the
//! deadline or within the `--requests` budget); one sent earlier is warm-up even if it ends
//! inside. Rates are counted requests over the span from the window's start to the last
//! counted answer. Every counted request ends as exactly one of: an answer (counted by
//! status; a 2xx answer is then checked and is either served or malformed) or a transport
//! error (connect, reset, cut-short answer, timeout).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::check::Expect;
use super::http::Conn;
use super::server::{cpu_seconds, ServerSnapshot};

/// Where the server is.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    /// The `Host` header (`host:port` as given).
    pub host: String,
}

/// The shape and bounds of one point.
#[derive(Clone)]
pub struct Load {
    pub concurrency: usize,
    pub warmup: Duration,
    /// Ends the window (with `requests`, whichever comes first).
    pub duration: Option<Duration>,
    /// Requests in the window (with `duration`, whichever comes first).
    pub requests: Option<u64>,
    /// Longest wait for one answer; past it the request is a transport error.
    pub timeout: Duration,
}

/// What one client saw in the window.
#[derive(Default)]
struct ClientStats {
    sent: u64,
    statuses: BTreeMap<u16, u64>,
    io_errors: u64,
    malformed: u64,
    /// Latency of each served (2xx, well-formed) answer, nanoseconds.
    latencies_ns: Vec<u64>,
    bytes_sent: u64,
    bytes_received: u64,
    last_end: Option<Instant>,
    first_error: Option<String>,
}

/// The window's clock and request budget, shared by the clients.
struct Window {
    start: Instant,
    deadline: Option<Instant>,
    budget: Option<u64>,
    tickets: AtomicU64,
}

impl Window {
    /// Whether a request sent now is counted (`Some(true)`), is warm-up (`Some(false)`), or
    /// the run is over (`None`). Claims one request of the budget when counted.
    fn admit(&self, now: Instant) -> Option<bool> {
        if now < self.start {
            return Some(false);
        }
        if self.deadline.is_some_and(|d| now >= d) {
            return None;
        }
        if let Some(budget) = self.budget {
            if self.tickets.fetch_add(1, Ordering::Relaxed) >= budget {
                return None;
            }
        }
        Some(true)
    }
}

/// Everything one point measured, before it is summarized.
pub struct Measured {
    pub sent: u64,
    pub statuses: BTreeMap<u16, u64>,
    pub io_errors: u64,
    pub malformed: u64,
    /// Served answers' latencies, sorted, nanoseconds.
    pub latencies_ns: Vec<u64>,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// From the window's start to the last counted answer.
    pub span: Duration,
    /// Load generator CPU (user + system) over the span, seconds.
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    pub first_error: Option<String>,
    /// Server state at the window's start and end.
    pub server_before: ServerSnapshot,
    pub server_after: ServerSnapshot,
}

/// Runs one point: connects `load.concurrency` clients, warms up, measures. `requests` are
/// complete HTTP requests; client `i` starts at request `i * 131` and takes them in turn.
pub async fn run_point(
    target: &Target,
    load: &Load,
    requests: Arc<Vec<Vec<u8>>>,
    expect: Arc<Expect>,
    server_pid: Option<u32>,
) -> Measured {
    let snapshot = || ServerSnapshot::take(target, server_pid);
    // With no warm-up the window opens at once: read the server first, so its counters see
    // exactly the counted requests. With a warm-up, read it when the window opens.
    let early = if load.warmup.is_zero() {
        Some((snapshot().await, cpu_seconds()))
    } else {
        None
    };
    let now = Instant::now();
    let start = now + load.warmup;
    let window = Arc::new(Window {
        start,
        deadline: load.duration.map(|d| start + d),
        budget: load.requests,
        tickets: AtomicU64::new(0),
    });
    let clients: Vec<_> = (0..load.concurrency)
        .map(|i| {
            let (target, requests, expect, window) = (
                target.clone(),
                requests.clone(),
                expect.clone(),
                window.clone(),
            );
            let timeout = load.timeout;
            tokio::spawn(
                async move { client(i, &target, &requests, &expect, &window, timeout).await },
            )
        })
        .collect();
    let (server_before, cpu_before) = match early {
        Some(e) => e,
        None => {
            tokio::time::sleep_until(tokio::time::Instant::from_std(start)).await;
            (snapshot().await, cpu_seconds())
        }
    };
    let mut all = ClientStats::default();
    for c in clients {
        // A client task only returns; a panic in one is a bug worth seeing.
        let s = c.await.expect("a load client panicked");
        all.sent += s.sent;
        for (k, v) in s.statuses {
            *all.statuses.entry(k).or_default() += v;
        }
        all.io_errors += s.io_errors;
        all.malformed += s.malformed;
        all.latencies_ns.extend(s.latencies_ns);
        all.bytes_sent += s.bytes_sent;
        all.bytes_received += s.bytes_received;
        all.last_end = all.last_end.max(s.last_end);
        all.first_error = all.first_error.or(s.first_error);
    }
    let cpu_after = cpu_seconds();
    let end = all.last_end.unwrap_or_else(Instant::now).max(start);
    let server_after = snapshot().await;
    all.latencies_ns.sort_unstable();
    Measured {
        sent: all.sent,
        statuses: all.statuses,
        io_errors: all.io_errors,
        malformed: all.malformed,
        latencies_ns: all.latencies_ns,
        bytes_sent: all.bytes_sent,
        bytes_received: all.bytes_received,
        span: end - start,
        cpu_user_s: cpu_after.0 - cpu_before.0,
        cpu_sys_s: cpu_after.1 - cpu_before.1,
        first_error: all.first_error,
        server_before,
        server_after,
    }
}

/// One closed-loop client.
async fn client(
    id: usize,
    target: &Target,
    requests: &[Vec<u8>],
    expect: &Expect,
    window: &Window,
    timeout: Duration,
) -> ClientStats {
    let mut s = ClientStats::default();
    let mut conn: Option<Conn> = None;
    let mut next = id * 131;
    while let Some(counted) = window.admit(Instant::now()) {
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match tokio::time::timeout(timeout, Conn::connect(target.addr)).await {
                Ok(Ok(c)) => conn.insert(c),
                failed => {
                    let msg = match failed {
                        Ok(Err(e)) => format!("connect: {e}"),
                        _ => "connect: timed out".to_string(),
                    };
                    if counted {
                        s.sent += 1;
                        s.io_errors += 1;
                        s.first_error.get_or_insert(msg);
                    }
                    // Do not spin on a server that is down.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let req = &requests[next % requests.len()];
        next += 1;
        let t0 = Instant::now();
        let res = tokio::time::timeout(timeout, c.send(req)).await;
        let t1 = Instant::now();
        let answer = match res {
            Ok(Ok(a)) => a,
            failed => {
                if counted {
                    s.sent += 1;
                    s.io_errors += 1;
                    s.last_end = Some(t1);
                    s.first_error.get_or_insert(match failed {
                        Ok(Err(e)) => format!("request: {e}"),
                        _ => format!("request: no answer in {timeout:?}"),
                    });
                }
                conn = None;
                continue;
            }
        };
        // Warm-up answers are checked too: the first well-formed one may set the width.
        let verdict = (200..300)
            .contains(&answer.status)
            .then(|| expect.check(c.body()));
        if counted {
            s.sent += 1;
            *s.statuses.entry(answer.status).or_default() += 1;
            s.bytes_sent += req.len() as u64;
            s.bytes_received += answer.bytes as u64;
            s.last_end = Some(t1);
            match verdict {
                Some(Ok(())) => s.latencies_ns.push((t1 - t0).as_nanos() as u64),
                Some(Err(why)) => {
                    s.malformed += 1;
                    s.first_error
                        .get_or_insert(format!("malformed {} answer: {why}", answer.status));
                }
                None => {
                    s.first_error.get_or_insert_with(|| {
                        let body = String::from_utf8_lossy(c.body());
                        format!(
                            "status {}: {}",
                            answer.status,
                            body.chars().take(200).collect::<String>()
                        )
                    });
                }
            }
        }
        if answer.close {
            conn = None;
        }
    }
    s
}

/// The `q` quantile (nearest rank) of sorted `v`, in milliseconds.
pub fn quantile_ms(v: &[u64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1] as f64 / 1e6
}
