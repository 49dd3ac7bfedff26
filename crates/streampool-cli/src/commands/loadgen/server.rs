//! What the load generator reads besides answers: its own CPU time (getrusage), the server
//! process's CPU time (`/proc/PID/stat`, when `--server-pid` names it), and the server's
//! `/metrics` (batches, device busy time, queue rejections, per-phase host time), each read
//! at the window's start and end and reported as the difference.

use std::collections::BTreeMap;
use std::time::Duration;

use super::run::Target;

/// This process's CPU time so far, (user, system) seconds.
pub fn cpu_seconds() -> (f64, f64) {
    // SAFETY: `getrusage` only writes the struct it is given, which is zeroed and ours.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is valid on every Unix.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return (0.0, 0.0);
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    (secs(u.ru_utime), secs(u.ru_stime))
}

/// Process `pid`'s CPU time so far (user + system seconds), from `/proc/PID/stat`.
fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces, so split after its `)`):
    // state is field 3, utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| ticks / hz as f64)
}

/// The server at one instant.
#[derive(Debug, Clone, Default)]
pub struct ServerSnapshot {
    /// The server process's CPU seconds (with `--server-pid`).
    pub cpu_s: Option<f64>,
    /// `/metrics` series by name and label set (`name{labels}` as exposed), summed where
    /// a name repeats; `None` when `/metrics` could not be read.
    pub series: Option<BTreeMap<String, f64>>,
}

impl ServerSnapshot {
    /// Reads the server's CPU time (if `pid`) and `/metrics` (if it answers within 2 s).
    pub async fn take(target: &Target, pid: Option<u32>) -> Self {
        let cpu_s = pid.and_then(process_cpu_seconds);
        let get = super::http::get(target.addr, &target.host, "/metrics");
        let series = match tokio::time::timeout(Duration::from_secs(2), get).await {
            Ok(Ok((200, body))) => Some(parse_metrics(&String::from_utf8_lossy(&body))),
            _ => None,
        };
        Self { cpu_s, series }
    }

    /// The sum of every series whose name is `name` (any labels).
    fn total(&self, name: &str) -> Option<f64> {
        let series = self.series.as_ref()?;
        Some(
            series
                .iter()
                .filter(|(k, _)| k.split('{').next() == Some(name))
                .map(|(_, v)| v)
                .sum(),
        )
    }

    fn get(&self, key: &str) -> Option<f64> {
        self.series.as_ref()?.get(key).copied()
    }
}

/// Text exposition lines `name{labels} value` into a map (comments skipped).
pub fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        // The value follows the last space (label values here hold no spaces).
        if let Some((key, value)) = line.rsplit_once(' ') {
            if let Ok(v) = value.parse::<f64>() {
                *out.entry(key.to_string()).or_insert(0.0) += v;
            }
        }
    }
    out
}

/// What the server did over the window, from two snapshots.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerDelta {
    /// Server process CPU over the window, in cores (with `--server-pid`).
    pub cpu_cores: Option<f64>,
    /// Batches run by every model's queues.
    pub batches: Option<f64>,
    /// Requests (queue entries: one per input) per batch.
    pub mean_batch_size: Option<f64>,
    /// Seconds with a batch running on the device per second of the window, summed over
    /// replicas (1.0: one device busy all the time).
    pub device_busy_per_s: Option<f64>,
    /// Queue entries refused because the queue was full.
    pub queue_rejected: Option<f64>,
    /// Per phase of the route (`serve --phase-timing`): answers timed and mean microseconds.
    pub phases: BTreeMap<String, PhaseMean>,
}

/// One phase's figures over the window.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct PhaseMean {
    pub count: f64,
    pub mean_us: f64,
}

/// Phases in the order a request passes them (see `streampool-serve`'s `metrics/phases.rs`).
pub const PHASES: [&str; 6] = ["read", "parse", "tokenize", "queue", "encode", "total"];

impl ServerDelta {
    /// The difference `after - before` over a window of `span`, for the route `path`.
    pub fn between(
        before: &ServerSnapshot,
        after: &ServerSnapshot,
        span: Duration,
        path: &str,
    ) -> Self {
        let secs = span.as_secs_f64().max(1e-9);
        let diff = |name: &str| Some(after.total(name)? - before.total(name)?);
        let batches = diff("streampool_batches_total");
        let entries = diff("streampool_batch_size_sum");
        let mut phases = BTreeMap::new();
        for p in PHASES {
            let key = |suffix: &str| {
                format!("streampool_http_phase_seconds_{suffix}{{route=\"{path}\",phase=\"{p}\"}}")
            };
            let d = |k: &str| Some(after.get(k)? - before.get(k)?);
            if let (Some(sum), Some(count)) = (d(&key("sum")), d(&key("count"))) {
                if count > 0.0 {
                    phases.insert(
                        p.to_string(),
                        PhaseMean {
                            count,
                            mean_us: sum / count * 1e6,
                        },
                    );
                }
            }
        }
        Self {
            cpu_cores: match (before.cpu_s, after.cpu_s) {
                (Some(a), Some(b)) => Some((b - a) / secs),
                _ => None,
            },
            batches,
            mean_batch_size: match (entries, batches) {
                (Some(e), Some(b)) if b > 0.0 => Some(e / b),
                _ => None,
            },
            device_busy_per_s: diff("streampool_device_busy_seconds_total").map(|b| b / secs),
            queue_rejected: diff("streampool_queue_rejected_total"),
            phases,
        }
    }
}

/// Polls `GET /health` until it answers 200, for at most `limit`.
pub async fn wait_ready(target: &Target, limit: Duration) -> anyhow::Result<()> {
    let until = std::time::Instant::now() + limit;
    loop {
        let get = super::http::get(target.addr, &target.host, "/health");
        if let Ok(Ok((200, _))) = tokio::time::timeout(Duration::from_secs(2), get).await {
            return Ok(());
        }
        if std::time::Instant::now() >= until {
            anyhow::bail!(
                "the server at {} was not ready within {limit:?}",
                target.host
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_deltas_and_phase_means() {
        let before = ServerSnapshot {
            cpu_s: Some(1.0),
            series: Some(parse_metrics(
                "# HELP x\nstreampool_batches_total{model=\"a\",device=\"cpu\"} 10\n\
                 streampool_batches_total{model=\"b\",device=\"cpu\"} 0\n\
                 streampool_batch_size_sum{model=\"a\",device=\"cpu\"} 40\n\
                 streampool_device_busy_seconds_total{model=\"a\",device=\"cpu\"} 1.5\n\
                 streampool_http_phase_seconds_sum{route=\"/embed\",phase=\"parse\"} 0.001\n\
                 streampool_http_phase_seconds_count{route=\"/embed\",phase=\"parse\"} 10\n",
            )),
        };
        let after = ServerSnapshot {
            cpu_s: Some(3.0),
            series: Some(parse_metrics(
                "streampool_batches_total{model=\"a\",device=\"cpu\"} 30\n\
                 streampool_batches_total{model=\"b\",device=\"cpu\"} 10\n\
                 streampool_batch_size_sum{model=\"a\",device=\"cpu\"} 200\n\
                 streampool_device_busy_seconds_total{model=\"a\",device=\"cpu\"} 2.5\n\
                 streampool_http_phase_seconds_sum{route=\"/embed\",phase=\"parse\"} 0.003\n\
                 streampool_http_phase_seconds_count{route=\"/embed\",phase=\"parse\"} 30\n\
                 # EOF\n",
            )),
        };
        let d = ServerDelta::between(&before, &after, Duration::from_secs(2), "/embed");
        assert_eq!(d.cpu_cores, Some(1.0));
        assert_eq!(d.batches, Some(30.0));
        assert_eq!(d.mean_batch_size, Some(160.0 / 30.0));
        assert_eq!(d.device_busy_per_s, Some(0.5));
        let parse = d.phases["parse"];
        assert_eq!(parse.count, 20.0);
        assert!((parse.mean_us - 100.0).abs() < 1e-6);
        assert!(!d.phases.contains_key("encode"));
    }

    #[test]
    fn own_cpu_time_advances() {
        let (u0, s0) = cpu_seconds();
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(30) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let (u1, s1) = cpu_seconds();
        assert!(u1 + s1 > u0 + s0);
        assert!(process_cpu_seconds(std::process::id()).is_some());
    }
}
