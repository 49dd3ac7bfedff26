//! Prometheus metrics: HTTP requests, errors and latency per route (recorded by a
//! middleware), and each model's queue depth, batch sizes and latencies (read from its
//! batch queue's statistics at scrape time).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use parking_lot::Mutex;

use crate::models::Registry;
use crate::server::AppState;

/// Upper bounds (seconds) of the request-duration histogram buckets.
const DURATION_BOUNDS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Upper bounds of the batch-size histogram buckets.
const BATCH_BOUNDS: [usize; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

#[derive(Default, Clone)]
struct Histogram {
    /// `counts[i]`: observations in `(bound[i-1], bound[i]]`; the last one is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, bounds: &[f64], v: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; bounds.len() + 1];
        }
        let at = bounds.iter().position(|&b| v <= b).unwrap_or(bounds.len());
        self.counts[at] += 1;
        self.sum += v;
        self.count += 1;
    }
}

#[derive(Default)]
struct Series {
    /// `(method, route, status) -> count`.
    requests: BTreeMap<(String, String, u16), u64>,
    /// `route -> duration histogram`.
    durations: BTreeMap<String, Histogram>,
}

/// The server's HTTP counters. Routes are the router's patterns (`/v2/models/{name}/infer`),
/// never raw paths, so the number of series stays bounded whatever clients send.
#[derive(Default)]
pub struct Metrics {
    /// Protects the series; held only to bump a counter or copy them out for a scrape.
    series: Mutex<Series>,
}

impl Metrics {
    /// Records one answered request.
    pub fn record(&self, method: &str, route: &str, status: u16, seconds: f64) {
        let mut s = self.series.lock();
        *s.requests
            .entry((method.to_string(), route.to_string(), status))
            .or_default() += 1;
        s.durations
            .entry(route.to_string())
            .or_default()
            .observe(&DURATION_BOUNDS, seconds);
    }

    /// The Prometheus text exposition of every series.
    pub fn render(&self, registry: &Registry) -> String {
        let (requests, durations) = {
            let s = self.series.lock();
            (s.requests.clone(), s.durations.clone())
        };
        let mut out = String::new();
        // `write!` to a String cannot fail.
        let w = &mut out;
        let _ = writeln!(
            w,
            "# HELP streampool_http_requests_total HTTP requests answered, by route and status."
        );
        let _ = writeln!(w, "# TYPE streampool_http_requests_total counter");
        for ((method, route, code), n) in &requests {
            let _ = writeln!(w, "streampool_http_requests_total{{method=\"{method}\",route=\"{route}\",code=\"{code}\"}} {n}");
        }
        let _ = writeln!(
            w,
            "# HELP streampool_http_errors_total HTTP requests answered with a 4xx or 5xx status."
        );
        let _ = writeln!(w, "# TYPE streampool_http_errors_total counter");
        let mut errors: BTreeMap<(&str, u16), u64> = BTreeMap::new();
        for ((_, route, code), n) in &requests {
            if *code >= 400 {
                *errors.entry((route, *code)).or_default() += n;
            }
        }
        for ((route, code), n) in errors {
            let _ = writeln!(
                w,
                "streampool_http_errors_total{{route=\"{route}\",code=\"{code}\"}} {n}"
            );
        }
        let _ = writeln!(
            w,
            "# HELP streampool_http_request_duration_seconds Time to answer a request."
        );
        let _ = writeln!(
            w,
            "# TYPE streampool_http_request_duration_seconds histogram"
        );
        for (route, h) in &durations {
            let labels = format!("route=\"{route}\"");
            let bounds: Vec<String> = DURATION_BOUNDS.iter().map(f64::to_string).collect();
            write_histogram(
                w,
                "streampool_http_request_duration_seconds",
                &labels,
                &bounds,
                h,
            );
        }
        render_queues(w, registry);
        out
    }
}

fn write_histogram(w: &mut String, name: &str, labels: &str, bounds: &[String], h: &Histogram) {
    let mut cumulative = 0;
    for (bound, n) in bounds.iter().zip(&h.counts) {
        cumulative += n;
        let _ = writeln!(w, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
    }
    let _ = writeln!(w, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
    let _ = writeln!(w, "{name}_sum{{{labels}}} {}", h.sum);
    let _ = writeln!(w, "{name}_count{{{labels}}} {}", h.count);
}

fn render_queues(w: &mut String, registry: &Registry) {
    let stats: Vec<_> = registry.iter().map(|(name, m)| (name, m.stats())).collect();
    let counters = [
        (
            "streampool_queue_submitted_total",
            "Requests accepted into the model's batch queue.",
        ),
        (
            "streampool_queue_completed_total",
            "Requests answered with a model output.",
        ),
        (
            "streampool_queue_rejected_total",
            "Requests refused because the queue was full.",
        ),
        (
            "streampool_queue_expired_total",
            "Requests dropped at their deadline before running.",
        ),
        (
            "streampool_queue_failed_total",
            "Requests whose batch failed in the model.",
        ),
        ("streampool_batches_total", "Batches run."),
    ];
    for (i, (name, help)) in counters.iter().enumerate() {
        let _ = writeln!(w, "# HELP {name} {help}");
        let _ = writeln!(w, "# TYPE {name} counter");
        for (model, s) in &stats {
            let v = [
                s.submitted,
                s.completed,
                s.rejected,
                s.expired,
                s.failed,
                s.batches,
            ][i];
            let _ = writeln!(w, "{name}{{model=\"{model}\"}} {v}");
        }
    }
    let _ = writeln!(
        w,
        "# HELP streampool_queue_depth Requests waiting in the model's batch queue."
    );
    let _ = writeln!(w, "# TYPE streampool_queue_depth gauge");
    for (model, s) in &stats {
        let _ = writeln!(
            w,
            "streampool_queue_depth{{model=\"{model}\"}} {}",
            s.queue_len
        );
    }
    let _ = writeln!(w, "# HELP streampool_batch_size Requests per batch run.");
    let _ = writeln!(w, "# TYPE streampool_batch_size histogram");
    for (model, s) in &stats {
        let mut h = Histogram {
            counts: vec![0; BATCH_BOUNDS.len() + 1],
            ..Default::default()
        };
        for (size, &n) in s.batch_sizes.iter().enumerate().skip(1) {
            let at = BATCH_BOUNDS
                .iter()
                .position(|&b| size <= b)
                .unwrap_or(BATCH_BOUNDS.len());
            h.counts[at] += n;
            h.count += n;
            h.sum += (size as u64 * n) as f64;
        }
        let bounds: Vec<String> = BATCH_BOUNDS.iter().map(usize::to_string).collect();
        write_histogram(
            w,
            "streampool_batch_size",
            &format!("model=\"{model}\""),
            &bounds,
            &h,
        );
    }
    for (name, help, pick) in [
        (
            "streampool_queue_latency_seconds",
            "Submit-to-answer time in the batch queue (recent window).",
            (|s: &streampool_batch::StatsSnapshot| s.latency) as fn(&_) -> _,
        ),
        (
            "streampool_queue_wait_seconds",
            "Submit-to-batch-start time in the batch queue (recent window).",
            |s: &streampool_batch::StatsSnapshot| s.queue_wait,
        ),
    ] {
        let _ = writeln!(w, "# HELP {name} {help}");
        let _ = writeln!(w, "# TYPE {name} summary");
        for (model, s) in &stats {
            let p = pick(s);
            for (q, us) in [("0.5", p.p50_us), ("0.9", p.p90_us), ("0.99", p.p99_us)] {
                let _ = writeln!(
                    w,
                    "{name}{{model=\"{model}\",quantile=\"{q}\"}} {}",
                    us / 1e6
                );
            }
            let _ = writeln!(w, "{name}_count{{model=\"{model}\"}} {}", p.samples);
        }
    }
}

/// The middleware that records every request's route, status and duration, and logs it.
pub async fn track(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().to_string();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let resp = next.run(req).await;
    let seconds = start.elapsed().as_secs_f64();
    let status = resp.status().as_u16();
    state.metrics.record(&method, &route, status, seconds);
    tracing::debug!(%method, %route, status, micros = (seconds * 1e6) as u64, "request");
    resp
}

/// `GET /metrics`.
pub async fn scrape(
    State(state): State<Arc<AppState>>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        state.metrics.render(&state.registry),
    )
}
