//! Prometheus metrics through the official `prometheus-client` crate (OpenMetrics text):
//! HTTP requests, errors and durations per route (recorded live by a middleware), and per
//! model and device replica the queue's counters, depth, outstanding work, batch sizes,
//! busy time and latency quantiles (read from the batch queues' statistics at scrape time by
//! a collector, so the queues keep their own counters and nothing is counted twice). The
//! middleware and the `/metrics` handler are in `http.rs`: they depend on the server state,
//! which holds these metrics.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `streampool_http_requests_total` | counter | `method`, `route`, `code` |
//! | `streampool_http_errors_total` | counter | `route`, `code` (4xx and 5xx) |
//! | `streampool_http_request_duration_seconds` | histogram | `route` |
//! | `streampool_http_panics_total` | counter | none (handlers that panicked; each answered 500) |
//! | `streampool_http_unauthorized_total` | counter | none (answered 401: no or wrong API key) |
//! | `streampool_queue_{submitted,completed,rejected,expired,failed}_total` | counter | `model`, `device` |
//! | `streampool_batches_total` | counter | `model`, `device` |
//! | `streampool_replica_routed_total` | counter | `model`, `device` |
//! | `streampool_device_busy_seconds_total` | counter | `model`, `device` |
//! | `streampool_queue_depth` | gauge | `model`, `device` (inputs waiting) |
//! | `streampool_queue_tokens` | gauge | `model`, `device` (tokens waiting) |
//! | `streampool_queue_outstanding` | gauge | `model`, `device` (rows, or tokens for embedders) |
//! | `streampool_batch_size` | histogram | `model`, `device` |
//! | `streampool_queue_latency_seconds`, `streampool_queue_wait_seconds` | gauge | `model`, `device`, `quantile` |
//! | `streampool_replicas`, `streampool_ready` | gauge | `model` / none |
//! | `streampool_http_phase_seconds` (only with [`Metrics::set_phase_timing`]) | histogram | `route`, `phase` (see `phases.rs`) |
//! | `streampool_tenant_requests_total` (with keys) | counter | `tenant`, `outcome` (see `tenants.rs`) |
//! | `streampool_tenant_tokens_total` (with keys) | counter | `tenant` |
//! | `streampool_tenant_in_flight` (with keys) | gauge | `tenant` |

mod http;
mod phases;
mod tenants;

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeLabelSet, EncodeMetric, NoLabelSet,
};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry as PromRegistry, Unit};
use streampool_batch::{Percentiles, ReplicaStats};

use streampool_core::Registry;

pub use http::{scrape, track};
pub(crate) use phases::{phase, Phase};
use phases::{PhaseCollector, PhaseStats};

/// Upper bounds (seconds) of the request-duration histogram buckets.
const DURATION_BOUNDS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Upper bounds of the batch-size histogram buckets.
const BATCH_BOUNDS: [usize; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    route: String,
    code: u16,
}

type DurationFamily = Family<RouteLabels, Histogram, fn() -> Histogram>;

/// The server's metrics: a `prometheus-client` registry holding the live HTTP series and
/// the collector that reads the models' queues at scrape time. Routes are the router's
/// patterns (`/v2/models/{name}/infer`), never raw paths, so the number of series stays
/// bounded whatever clients send.
pub struct Metrics {
    registry: PromRegistry,
    requests: Family<RequestLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    durations: DurationFamily,
    /// Set from the server's readiness at each scrape.
    pub(crate) ready: Gauge,
    panics: Counter,
    unauthorized: Counter,
    phases: Arc<PhaseStats>,
}

impl Metrics {
    /// Metrics over the models of `models`.
    pub fn new(models: Arc<Registry>) -> Self {
        let mut registry = PromRegistry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let durations: DurationFamily =
            Family::new_with_constructor(|| Histogram::new(DURATION_BOUNDS));
        registry.register(
            "streampool_http_requests",
            "HTTP requests answered, by route and status",
            requests.clone(),
        );
        registry.register(
            "streampool_http_errors",
            "HTTP requests answered with a 4xx or 5xx status",
            errors.clone(),
        );
        registry.register_with_unit(
            "streampool_http_request_duration",
            "Time to answer a request",
            Unit::Seconds,
            durations.clone(),
        );
        let ready = Gauge::default();
        registry.register(
            "streampool_ready",
            "Whether the server is ready: every replica loaded and accepting, not shutting down",
            ready.clone(),
        );
        let panics = Counter::default();
        registry.register(
            "streampool_http_panics",
            "Requests whose handler panicked (a bug): each was answered 500 and the server went on",
            panics.clone(),
        );
        let unauthorized = Counter::default();
        registry.register(
            "streampool_http_unauthorized",
            "Requests answered 401 for a missing or wrong API key",
            unauthorized.clone(),
        );
        registry.register_collector(Box::new(QueueCollector { models }));
        let phases = Arc::new(PhaseStats::default());
        registry.register_collector(Box::new(PhaseCollector(phases.clone())));
        Self {
            registry,
            requests,
            errors,
            durations,
            ready,
            panics,
            unauthorized,
            phases,
        }
    }

    /// Adds the per-tenant series of the tenants in `table` (read at each scrape).
    pub(crate) fn register_tenants(&mut self, table: Arc<crate::tenants::TenantTable>) {
        self.registry
            .register_collector(Box::new(tenants::TenantCollector(table)));
    }

    /// Counts a request whose handler panicked.
    pub(crate) fn record_panic(&self) {
        self.panics.inc();
    }

    /// Counts a request refused for its API key.
    pub(crate) fn record_unauthorized(&self) {
        self.unauthorized.inc();
    }

    /// Turns per-phase timing of the embedding routes on or off (off by default): where a
    /// request's host time goes (reading, JSON parsing, tokenization, the batch queue,
    /// response encoding), as the histogram `streampool_http_phase_seconds` (see
    /// [`Phase`]). Takes effect for requests that arrive afterwards.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::sync::Arc;
    /// use streampool::Device;
    /// use streampool_nn::{tiny_bert_dir, SentenceEmbedder};
    /// use streampool_serve::{ModelSpec, ServeConfig, Server};
    /// let embedder = Arc::new(SentenceEmbedder::load(&Device::cpu(), tiny_bert_dir()).unwrap());
    /// let config = ServeConfig { addr: "127.0.0.1:0".parse().unwrap(), ..Default::default() };
    /// let server = Server::start(config, vec![ModelSpec::Embedder { name: "tiny-bert".into(), embedder }])
    ///     .await
    ///     .unwrap();
    /// server.state().metrics().set_phase_timing(true);
    /// assert!(server.state().metrics().render().contains("streampool_http_phase_seconds"));
    /// server.shutdown().await.unwrap();
    /// # }
    /// ```
    pub fn set_phase_timing(&self, on: bool) {
        self.phases.set_enabled(on);
    }

    /// The phase timer of a request on the router pattern `route` starting at `start`, when
    /// phase timing is on and the route is timed.
    pub(crate) fn phase_timer(
        &self,
        route: &str,
        start: std::time::Instant,
    ) -> Option<phases::PhaseTimer> {
        self.phases.timer(route, start)
    }

    /// Records one answered request.
    pub fn record(&self, method: &str, route: &str, status: u16, seconds: f64) {
        let route = route.to_string();
        self.requests
            .get_or_create(&RequestLabels {
                method: method.to_string(),
                route: route.clone(),
                code: status,
            })
            .inc();
        if status >= 400 {
            self.errors
                .get_or_create(&ErrorLabels {
                    route: route.clone(),
                    code: status,
                })
                .inc();
        }
        self.durations
            .get_or_create(&RouteLabels { route })
            .observe(seconds);
    }

    /// The OpenMetrics text exposition of every series.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail, and every collector here only writes.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Reads every model's replicas at scrape time.
struct QueueCollector {
    models: Arc<Registry>,
}

impl std::fmt::Debug for QueueCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueCollector").finish_non_exhaustive()
    }
}

/// `(model, replica)` pairs of one scrape.
type Snapshot = Vec<(String, ReplicaStats)>;

fn labels<'a>(model: &'a str, r: &'a ReplicaStats) -> [(&'static str, &'a str); 2] {
    [("model", model), ("device", r.label.as_str())]
}

fn counter<V: EncodeCounterValue + std::fmt::Debug + Send + Sync>(
    enc: &mut DescriptorEncoder,
    snap: &Snapshot,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    value: impl Fn(&ReplicaStats) -> V,
) -> std::fmt::Result {
    let mut family = enc.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for (model, r) in snap {
        ConstCounter::new(value(r)).encode(family.encode_family(&labels(model, r))?)?;
    }
    Ok(())
}

fn gauge(
    enc: &mut DescriptorEncoder,
    snap: &Snapshot,
    name: &str,
    help: &str,
    value: impl Fn(&ReplicaStats) -> i64,
) -> std::fmt::Result {
    let mut family = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (model, r) in snap {
        ConstGauge::new(value(r)).encode(family.encode_family(&labels(model, r))?)?;
    }
    Ok(())
}

fn quantiles(
    enc: &mut DescriptorEncoder,
    snap: &Snapshot,
    name: &str,
    help: &str,
    pick: impl Fn(&ReplicaStats) -> Percentiles,
) -> std::fmt::Result {
    let mut family = enc.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Gauge)?;
    for (model, r) in snap {
        let p = pick(r);
        for (q, us) in [("0.5", p.p50_us), ("0.9", p.p90_us), ("0.99", p.p99_us)] {
            let set = [
                ("model", model.as_str()),
                ("device", &r.label),
                ("quantile", q),
            ];
            ConstGauge::new(us / 1e6).encode(family.encode_family(&set)?)?;
        }
    }
    Ok(())
}

impl Collector for QueueCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let snap: Snapshot = self
            .models
            .snapshot()
            .into_iter()
            .flat_map(|(name, m)| {
                m.replica_stats()
                    .into_iter()
                    .map(move |r| (name.clone(), r))
            })
            .collect();
        let e = &mut enc;
        type Count = fn(&ReplicaStats) -> u64;
        let counters: [(&str, &str, Count); 7] = [
            (
                "streampool_queue_submitted",
                "Requests accepted into the replica's batch queue",
                |r| r.queue.submitted,
            ),
            (
                "streampool_queue_completed",
                "Requests answered with a model output",
                |r| r.queue.completed,
            ),
            (
                "streampool_queue_rejected",
                "Inputs refused at admission (estimated queue wait over the deadline or bound, or a memory cap)",
                |r| r.queue.rejected,
            ),
            (
                "streampool_queue_expired",
                "Requests dropped at their deadline before running",
                |r| r.queue.expired,
            ),
            (
                "streampool_queue_failed",
                "Requests whose batch failed in the model",
                |r| r.queue.failed,
            ),
            ("streampool_batches", "Batches run", |r| r.queue.batches),
            (
                "streampool_replica_routed",
                "Requests the router sent to this replica",
                |r| r.routed,
            ),
        ];
        for (name, help, value) in counters {
            counter(e, &snap, name, help, None, value)?;
        }
        counter(
            e,
            &snap,
            "streampool_device_busy",
            "Wall time with at least one of this model's batches running on the device",
            Some(&Unit::Seconds),
            |r| r.queue.busy.as_secs_f64(),
        )?;
        gauge(
            e,
            &snap,
            "streampool_queue_depth",
            "Inputs waiting in the replica's batch queue",
            |r| i64::try_from(r.queue.queue_len).unwrap_or(i64::MAX),
        )?;
        gauge(
            e,
            &snap,
            "streampool_queue_tokens",
            "Tokens waiting in the replica's batch queue (rows count 1)",
            |r| i64::try_from(r.queue.queued_tokens).unwrap_or(i64::MAX),
        )?;
        gauge(
            e,
            &snap,
            "streampool_queue_outstanding",
            "Work accepted and not yet answered: rows, or tokens for embedders (what the router balances)",
            |r| i64::try_from(r.outstanding).unwrap_or(i64::MAX),
        )?;
        let mut family = e.encode_descriptor(
            "streampool_batch_size",
            "Requests per batch run",
            None,
            MetricType::Histogram,
        )?;
        for (model, r) in &snap {
            let (buckets, sum, count) = batch_buckets(&r.queue.batch_sizes);
            family
                .encode_family(&labels(model, r))?
                .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
        }
        quantiles(
            e,
            &snap,
            "streampool_queue_latency",
            "Submit-to-answer time in the batch queue, recent samples",
            |r| r.queue.latency,
        )?;
        quantiles(
            e,
            &snap,
            "streampool_queue_wait",
            "Submit-to-batch-start time in the batch queue, recent samples",
            |r| r.queue.queue_wait,
        )?;
        let mut family = e.encode_descriptor(
            "streampool_replicas",
            "Replicas (devices) serving the model",
            None,
            MetricType::Gauge,
        )?;
        for (name, m) in self.models.snapshot() {
            ConstGauge::new(m.labels().len() as i64)
                .encode(family.encode_family(&[("model", name.as_str())])?)?;
        }
        let infos = self.models.snapshot_info();
        let mut family = e.encode_descriptor(
            "streampool_model_memory",
            "Device memory a model's replica holds (weights and captured graph pools: what its \
             loading thread left allocated)",
            Some(&Unit::Bytes),
            MetricType::Gauge,
        )?;
        for (name, _, info) in &infos {
            for (device, bytes) in &info.resident_bytes {
                ConstGauge::new(*bytes as i64).encode(
                    family.encode_family(&[("model", name.as_str()), ("device", device)])?,
                )?;
            }
        }
        let mut family = e.encode_descriptor(
            "streampool_model_weight",
            "A model's weight within its scheduling class (label priority: high, normal, low)",
            None,
            MetricType::Gauge,
        )?;
        for (name, _, info) in &infos {
            ConstGauge::new(i64::from(info.weight)).encode(family.encode_family(&[
                ("model", name.as_str()),
                ("priority", info.priority.as_str()),
            ])?)?;
        }
        Ok(())
    }
}

/// Per-bucket `(upper bound, count)` pairs (not cumulative: the encoder sums them), the
/// last one `+Inf`, with sum and count, of a batch-size histogram given as
/// `batch_sizes[n]` = batches of `n` requests.
fn batch_buckets(batch_sizes: &[u64]) -> (Vec<(f64, u64)>, f64, u64) {
    let mut buckets: Vec<(f64, u64)> = BATCH_BOUNDS.iter().map(|&b| (b as f64, 0)).collect();
    buckets.push((f64::INFINITY, 0));
    let (mut sum, mut count) = (0.0, 0);
    for (size, &n) in batch_sizes.iter().enumerate().skip(1) {
        // The +Inf bound fits every size, so a bucket is always found.
        if let Some((_, c)) = buckets.iter_mut().find(|(bound, _)| size as f64 <= *bound) {
            *c += n;
        }
        sum += (size as u64 * n) as f64;
        count += n;
    }
    (buckets, sum, count)
}
