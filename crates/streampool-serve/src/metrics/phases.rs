//! Where a served request's host time goes: per-phase timing of the embedding routes
//! (`/v1/embeddings`, TEI's `/embed`), off by default and switched on with
//! [`Metrics::set_phase_timing`](super::Metrics::set_phase_timing) (`streampool serve
//! --phase-timing`). Exposed in `/metrics` as the histogram `streampool_http_phase_seconds`
//! with labels `route` and `phase`; `streampool loadgen` reads its sums and counts before and
//! after a run and prints the mean per request of each phase.
//!
//! A phase is the time since the previous mark, so the phases of a request add up to the
//! time the middleware saw it (`total`), less what follows the handler's last mark:
//!
//! | phase | from | to |
//! |---|---|---|
//! | `read` | the middleware sees the request (headers parsed by hyper) | the handler starts: routing and reading the body |
//! | `parse` | the handler starts | the JSON body is parsed into inputs |
//! | `tokenize` | inputs parsed | every input tokenized |
//! | `queue` | tokenized | every embedding back from the batch queue: submit, queue wait, the batched forward, hand-back |
//! | `encode` | embeddings back | the response body serialized |
//! | `total` | the middleware sees the request | the middleware has the response |
//!
//! What happens outside the middleware (hyper parsing the request head, writing the response
//! to the socket) is not in any phase: compare `total` with the client's latency for it.
//!
//! Cost when on: six marks per request, each one `Instant::now()` (a vDSO clock read, some
//! 25 ns) and three relaxed atomic adds: a fraction of a microsecond against the 30+ us of host
//! work a request takes (an estimate, not measured apart); when off, a handler's mark is one
//! failed task-local lookup, and the middleware does not set the task-local at all.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;

/// A phase of a served request (see the module table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Routing and reading the body, up to the handler's start.
    Read,
    /// Parsing the JSON body into inputs.
    Parse,
    /// Tokenizing every input.
    Tokenize,
    /// Submitting to the batch queue and awaiting every embedding.
    Queue,
    /// Serializing the response body.
    Encode,
    /// The whole request as the middleware saw it.
    Total,
}

const PHASES: [Phase; 6] = [
    Phase::Read,
    Phase::Parse,
    Phase::Tokenize,
    Phase::Queue,
    Phase::Encode,
    Phase::Total,
];

impl Phase {
    /// The `phase` label.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Read => "read",
            Phase::Parse => "parse",
            Phase::Tokenize => "tokenize",
            Phase::Queue => "queue",
            Phase::Encode => "encode",
            Phase::Total => "total",
        }
    }
}

/// The routes timed, by the router pattern the middleware sees.
const ROUTES: [(&str, &[&str]); 2] = [
    ("/v1/embeddings", &["/v1/embeddings"]),
    ("/embed", &["/embed", "/"]),
];

/// Upper bounds (seconds) of the phase histogram's buckets: 1 us to 1 s.
const BOUNDS: [f64; 16] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
    0.1, 1.0,
];

/// One histogram of relaxed atomics: each observation adds to one bucket, the sum and the
/// count independently, so a scrape racing an observation may see one of the three ahead of
/// the others by that one observation; nothing else reads them.
#[derive(Default)]
struct AtomicHistogram {
    buckets: [AtomicU64; BOUNDS.len() + 1],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl AtomicHistogram {
    fn observe(&self, ns: u64) {
        let secs = ns as f64 * 1e-9;
        let i = BOUNDS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(BOUNDS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }
}

/// Per route and phase histograms, and the switch.
#[derive(Default)]
pub(crate) struct PhaseStats {
    enabled: AtomicBool,
    cells: [[AtomicHistogram; PHASES.len()]; ROUTES.len()],
}

impl PhaseStats {
    pub(crate) fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// A timer for a request on the router pattern `route`, if timing is on and the route
    /// is one of those timed.
    pub(crate) fn timer(self: &Arc<Self>, route: &str, start: Instant) -> Option<PhaseTimer> {
        if !self.enabled() {
            return None;
        }
        let route = ROUTES.iter().position(|(_, pats)| pats.contains(&route))?;
        Some(PhaseTimer {
            stats: self.clone(),
            route,
            start,
            last: Cell::new(start),
        })
    }

    fn observe(&self, route: usize, phase: Phase, ns: u64) {
        let p = PHASES.iter().position(|&q| q == phase).unwrap_or(0);
        self.cells[route][p].observe(ns);
    }
}

/// The marks of one request.
pub(crate) struct PhaseTimer {
    stats: Arc<PhaseStats>,
    route: usize,
    start: Instant,
    last: Cell<Instant>,
}

impl PhaseTimer {
    fn mark(&self, phase: Phase) {
        let now = Instant::now();
        let ns = now.duration_since(self.last.replace(now)).as_nanos();
        self.stats
            .observe(self.route, phase, u64::try_from(ns).unwrap_or(u64::MAX));
    }

    /// Records the whole request.
    fn finish(&self) {
        let ns = self.start.elapsed().as_nanos();
        self.stats.observe(
            self.route,
            Phase::Total,
            u64::try_from(ns).unwrap_or(u64::MAX),
        );
    }
}

tokio::task_local! {
    /// The timer of the request this task is answering, set by the middleware while it runs
    /// the handler (a handler runs inside the middleware's future, on its task).
    pub(crate) static TIMER: PhaseTimer;
}

/// Marks the end of `phase` of the current request: the time since the previous mark (or
/// since the middleware saw the request) goes to `phase`'s histogram. A no-op when timing is
/// off or the route is not timed.
pub fn phase(phase: Phase) {
    let _ = TIMER.try_with(|t| t.mark(phase));
}

/// Records the whole of the current request (the middleware, after the handler).
pub(crate) fn finish() {
    let _ = TIMER.try_with(PhaseTimer::finish);
}

/// Exposes the histograms (only while timing is on, so `/metrics` is unchanged by default).
pub(crate) struct PhaseCollector(pub(crate) Arc<PhaseStats>);

impl std::fmt::Debug for PhaseCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhaseCollector").finish_non_exhaustive()
    }
}

impl Collector for PhaseCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        if !self.0.enabled() {
            return Ok(());
        }
        let mut family = enc.encode_descriptor(
            "streampool_http_phase",
            "Host time of a served embedding request by phase (serve --phase-timing)",
            Some(&Unit::Seconds),
            MetricType::Histogram,
        )?;
        for (r, (route, _)) in ROUTES.iter().enumerate() {
            for (p, phase) in PHASES.iter().enumerate() {
                let cell = &self.0.cells[r][p];
                let buckets: Vec<(f64, u64)> = BOUNDS
                    .iter()
                    .copied()
                    .chain([f64::INFINITY])
                    .zip(&cell.buckets)
                    .map(|(b, n)| (b, n.load(Ordering::Relaxed)))
                    .collect();
                let sum = cell.sum_ns.load(Ordering::Relaxed) as f64 * 1e-9;
                let count = cell.count.load(Ordering::Relaxed);
                let labels = [("route", *route), ("phase", phase.name())];
                family
                    .encode_family(&labels)?
                    .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_go_to_their_phase_and_route_and_show_only_when_on() {
        let stats = Arc::new(PhaseStats::default());
        assert!(
            stats.timer("/v1/embeddings", Instant::now()).is_none(),
            "off"
        );
        stats.set_enabled(true);
        assert!(stats
            .timer("/v2/models/{name}/infer", Instant::now())
            .is_none());
        let t = stats.timer("/", Instant::now()).expect("TEI root is timed");
        t.mark(Phase::Parse);
        t.mark(Phase::Encode);
        t.finish();
        let tei = &stats.cells[1];
        let count = |p: Phase| {
            tei[PHASES.iter().position(|&q| q == p).unwrap()]
                .count
                .load(Ordering::Relaxed)
        };
        assert_eq!(
            PHASES.map(count),
            [0, 1, 0, 0, 1, 1],
            "read parse tokenize queue encode total"
        );
        assert!(stats.cells[0]
            .iter()
            .all(|c| c.count.load(Ordering::Relaxed) == 0));

        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(PhaseCollector(stats.clone())));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"streampool_http_phase_seconds_count{route="/embed",phase="parse"} 1"#),
            "{text}"
        );
        stats.set_enabled(false);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(!text.contains("streampool_http_phase"), "{text}");
    }
}
