//! A tenant's limits, and what is counted per tenant.
//!
//! **Requests per second and tokens per second** are token buckets. Each holds at most one
//! second's worth (the burst: `requests_per_second` requests, at least one, and
//! `tokens_per_second` tokens) and refills continuously at its rate. A tenant idle for a
//! second may therefore send one second's worth at once; one that keeps sending gets its
//! rate on average, so over a window of `T` seconds at most `rate x T + burst` are
//! admitted.
//!
//! A request takes one request token when it is admitted. Its text tokens are known only
//! once it is tokenized, so they are charged then ([`Caller::charge_tokens`]): a request is
//! admitted while the token bucket is not negative, and its tokens are then taken even if
//! that drives the bucket below zero. Later requests are refused until the rate has paid
//! the debt back, so the average over a window stays within one request's tokens of the
//! rate, however large single requests are.
//!
//! **Concurrent requests** are a counter taken at admission and given back when the
//! request's [`Admission`] is dropped: when its response has been produced, or when the
//! request is abandoned (the client went away, the handler panicked), since the server
//! then drops the request's future with the admission in it. Responses are produced whole
//! before they are sent, so the slot is free while the last bytes are still on the wire.
//!
//! A refused request takes nothing from any limit and is answered 429 with `Retry-After`:
//! the seconds until the bucket that refused it has room again (rounded up, at least 1),
//! or 1 for the concurrency limit (a slot frees whenever a request ends).
//!
//! [`Caller::charge_tokens`]: super::Caller::charge_tokens

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use parking_lot::Mutex;

use super::Tenant;

/// A tenant's optional limits; `None` is no limit. As written in the tenants file.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    /// Requests admitted per second, on average (a token bucket of one second's worth).
    pub requests_per_second: Option<f64>,
    /// Text tokens per second (special tokens and prompts included, as `usage` counts them),
    /// on average (a token bucket of one second's worth; see the module docs for when
    /// tokens are charged).
    pub tokens_per_second: Option<f64>,
    /// Requests in flight at once.
    pub max_concurrent: Option<u32>,
}

impl Limits {
    /// Why these limits are unusable, if they are: a rate that is not a positive finite
    /// number, or a concurrency of 0.
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        for (what, rate) in [
            ("requests_per_second", self.requests_per_second),
            ("tokens_per_second", self.tokens_per_second),
        ] {
            if let Some(r) = rate {
                if !(r.is_finite() && r > 0.0) {
                    return Err(format!("{what} must be a positive number, not {r}"));
                }
            }
        }
        if self.max_concurrent == Some(0) {
            return Err("max_concurrent must be at least 1".into());
        }
        Ok(())
    }
}

/// The limit that refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `requests_per_second`.
    Requests,
    /// `tokens_per_second`: earlier requests' tokens are not yet paid back.
    Tokens,
    /// `max_concurrent`.
    Concurrency,
}

/// A request refused for its tenant's limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// Which limit.
    pub limit: Limit,
    /// When a retry would find room (for a bucket: when it has refilled enough; for
    /// concurrency: a second, as no one knows when a request ends).
    pub retry_after: Duration,
}

impl Refusal {
    /// What the client is told: the tenant, the limit and its value (never the key).
    pub(crate) fn message(&self, tenant: &Tenant) -> String {
        let l = tenant.limits();
        let what = match self.limit {
            Limit::Requests => format!(
                "{} requests per second",
                l.requests_per_second.unwrap_or_default()
            ),
            Limit::Tokens => format!(
                "{} tokens per second",
                l.tokens_per_second.unwrap_or_default()
            ),
            Limit::Concurrency => format!(
                "{} concurrent requests",
                l.max_concurrent.unwrap_or_default()
            ),
        };
        format!(
            "tenant {} is over its limit of {what}",
            streampool_nn::Quoted(tenant.name())
        )
    }
}

/// How a tenant's request ended, as `streampool_tenant_requests_total` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered with a 2xx (or 3xx).
    Ok,
    /// Refused by the tenant's limits (429 before the handler ran).
    Limited,
    /// 404: an unknown model or one the tenant may not call (the two look the same), or an
    /// unknown route.
    NotFound,
    /// Any other 4xx: the request was malformed or too large.
    Invalid,
    /// The server was overloaded or unavailable: 503, or TEI's 429 for a full queue.
    Overloaded,
    /// Any other 5xx: a timeout, a model failure.
    Failed,
    /// Abandoned before its answer: the client went away.
    Cancelled,
}

impl Outcome {
    /// Every outcome (the order of the counters kept per tenant).
    pub const ALL: [Outcome; 7] = [
        Outcome::Ok,
        Outcome::Limited,
        Outcome::NotFound,
        Outcome::Invalid,
        Outcome::Overloaded,
        Outcome::Failed,
        Outcome::Cancelled,
    ];

    /// The `outcome` label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Limited => "limited",
            Outcome::NotFound => "not_found",
            Outcome::Invalid => "invalid",
            Outcome::Overloaded => "overloaded",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The outcome of a request the handler answered with `status`.
    pub fn of(status: StatusCode) -> Self {
        match status.as_u16() {
            ..=399 => Outcome::Ok,
            404 => Outcome::NotFound,
            429 | 503 => Outcome::Overloaded,
            400..=499 => Outcome::Invalid,
            _ => Outcome::Failed,
        }
    }
}

/// A token bucket's level as it was at `at`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    level: f64,
    at: Instant,
}

impl Bucket {
    /// A bucket that is full at its first refill, whatever its burst.
    fn full(now: Instant) -> Self {
        Self {
            level: f64::INFINITY,
            at: now,
        }
    }

    /// Adds what `rate` earned since the last refill, up to `burst`. Clamping here also
    /// applies a burst that a reload lowered.
    fn refill(&mut self, rate: f64, burst: f64, now: Instant) {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * rate;
        self.level = (self.level + earned).min(burst);
        self.at = self.at.max(now);
    }

    /// How long until the level reaches `needed` at `rate`.
    fn wait_for(&self, needed: f64, rate: f64) -> Duration {
        Duration::try_from_secs_f64((needed - self.level) / rate).unwrap_or(Duration::ZERO)
    }
}

/// The burst of a request bucket: one second's worth, and at least one request, or a rate
/// below one per second would never admit anything.
fn request_burst(rate: f64) -> f64 {
    rate.max(1.0)
}

/// The two buckets of a tenant. Both are refilled lazily, when a request looks at them.
#[derive(Debug)]
struct Buckets {
    requests: Bucket,
    tokens: Bucket,
}

/// What a tenant's limits and counters hold between requests. Shared by every version of
/// the tenant across reloads of the tenants file (matched by name), so a reload neither
/// refills a drained bucket nor forgets the requests in flight.
#[derive(Debug)]
pub(crate) struct TenantState {
    /// Both buckets under one lock, so that admission checks and takes from them as one
    /// step (a refused request takes from neither). Held only for that arithmetic, never
    /// across an await.
    buckets: Mutex<Buckets>,
    /// Requests admitted and not yet finished, counted whether or not a concurrency limit is
    /// set, so a limit added by a reload counts the requests already running. Relaxed
    /// suffices throughout: the count guards no other memory, and the modification order
    /// of this one atomic is all that check-and-increment needs.
    in_flight: AtomicU32,
    /// Requests by [`Outcome`]; relaxed counters, read only for the metrics.
    outcomes: [AtomicU64; Outcome::ALL.len()],
    /// Text tokens charged; a relaxed counter, read only for the metrics.
    tokens: AtomicU64,
}

impl TenantState {
    pub(crate) fn new() -> Self {
        let now = Instant::now();
        Self {
            buckets: Mutex::new(Buckets {
                requests: Bucket::full(now),
                tokens: Bucket::full(now),
            }),
            in_flight: AtomicU32::new(0),
            outcomes: Default::default(),
            tokens: AtomicU64::new(0),
        }
    }

    /// Counts one request that ended with `outcome`.
    pub(crate) fn record(&self, outcome: Outcome) {
        self.outcomes[outcome.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests that ended with `outcome` so far.
    pub(crate) fn count(&self, outcome: Outcome) -> u64 {
        self.outcomes[outcome.index()].load(Ordering::Relaxed)
    }

    /// Text tokens charged so far.
    pub(crate) fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }

    /// Requests in flight now.
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Admits one request under `limits` at `now`, taking a concurrency slot and a request
    /// token, or refuses it having taken neither.
    fn admit(&self, limits: &Limits, now: Instant) -> std::result::Result<(), Refusal> {
        let slot = self
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                let room = match limits.max_concurrent {
                    Some(max) => n < max,
                    None => true,
                };
                room.then(|| n.saturating_add(1))
            });
        if slot.is_err() {
            return Err(Refusal {
                limit: Limit::Concurrency,
                retry_after: Duration::from_secs(1),
            });
        }
        let refused = {
            let mut b = self.buckets.lock();
            let tokens = limits.tokens_per_second.and_then(|rate| {
                b.tokens.refill(rate, rate, now);
                (b.tokens.level < 0.0).then(|| Refusal {
                    limit: Limit::Tokens,
                    retry_after: b.tokens.wait_for(0.0, rate),
                })
            });
            tokens.or_else(|| {
                let rate = limits.requests_per_second?;
                b.requests.refill(rate, request_burst(rate), now);
                if b.requests.level >= 1.0 {
                    b.requests.level -= 1.0;
                    None
                } else {
                    Some(Refusal {
                        limit: Limit::Requests,
                        retry_after: b.requests.wait_for(1.0, rate),
                    })
                }
            })
        };
        match refused {
            None => Ok(()),
            Some(refusal) => {
                self.in_flight.fetch_sub(1, Ordering::Relaxed);
                Err(refusal)
            }
        }
    }

    /// Takes `tokens` from the token bucket (it may go negative: see the module docs) and
    /// counts them.
    fn charge(&self, limits: &Limits, tokens: u64, now: Instant) {
        self.tokens.fetch_add(tokens, Ordering::Relaxed);
        if let Some(rate) = limits.tokens_per_second {
            let mut b = self.buckets.lock();
            b.tokens.refill(rate, rate, now);
            b.tokens.level -= tokens as f64;
        }
    }
}

impl Tenant {
    /// Admits a request of this tenant now, or refuses it (see the module docs). The
    /// request's concurrency slot is held by the returned [`Admission`] until it is dropped.
    pub fn admit(self: &Arc<Self>) -> std::result::Result<Admission, Refusal> {
        self.admit_at(Instant::now())
    }

    pub(crate) fn admit_at(
        self: &Arc<Self>,
        now: Instant,
    ) -> std::result::Result<Admission, Refusal> {
        self.state.admit(&self.limits, now)?;
        Ok(Admission {
            tenant: self.clone(),
            answered: false,
        })
    }

    /// Charges `tokens` text tokens of an admitted request.
    pub fn charge_tokens(&self, tokens: usize) {
        self.charge_tokens_at(tokens, Instant::now());
    }

    pub(crate) fn charge_tokens_at(&self, tokens: usize, now: Instant) {
        self.state
            .charge(&self.limits, u64::try_from(tokens).unwrap_or(u64::MAX), now);
    }
}

/// An admitted request of a tenant: holds one of its concurrent-request slots until
/// dropped. [`finish`](Self::finish) counts the request's outcome; one dropped unfinished
/// counts as [`Outcome::Cancelled`].
#[derive(Debug)]
pub struct Admission {
    tenant: Arc<Tenant>,
    answered: bool,
}

impl Admission {
    /// The request was answered with `status`.
    pub fn finish(mut self, status: StatusCode) {
        self.tenant.state.record(Outcome::of(status));
        self.answered = true;
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.tenant.state.in_flight.fetch_sub(1, Ordering::Relaxed);
        if !self.answered {
            self.tenant.state.record(Outcome::Cancelled);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenants::Tenants;

    fn tenant(limits: &str) -> Arc<Tenant> {
        let text = format!("[[tenant]]\nname = \"t\"\nkey = \"k-0123456789\"\n{limits}\n");
        let table = Tenants::parse(&text).unwrap();
        table.authenticate(b"k-0123456789").unwrap().clone()
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn requests_get_the_burst_then_the_rate() {
        let t = tenant("requests_per_second = 10.0");
        let t0 = Instant::now();
        // One second's worth at once, then refused until a token has refilled.
        let admitted: Vec<_> = (0..10).map(|_| t.admit_at(t0).unwrap()).collect();
        let refusal = t.admit_at(t0).unwrap_err();
        assert_eq!(refusal.limit, Limit::Requests);
        assert!((refusal.retry_after.as_secs_f64() - 0.1).abs() < 1e-9);
        drop(admitted);
        assert!(t.admit_at(t0 + secs(0.1)).is_ok());
        assert!(t.admit_at(t0 + secs(0.1)).is_err());
        // Over 10 s of constant demand: the burst plus the rate times the window.
        let mut ok = 0;
        for ms in 0..10_000u64 {
            if t.admit_at(t0 + secs(0.1) + Duration::from_millis(ms))
                .is_ok()
            {
                ok += 1;
            }
        }
        assert_eq!(ok, 100 - 1);
        // An idle tenant refills to the burst, no more.
        let later = t0 + secs(100.0);
        assert_eq!((0..20).filter(|_| t.admit_at(later).is_ok()).count(), 10);
    }

    #[test]
    fn a_rate_below_one_per_second_still_admits_one() {
        let t = tenant("requests_per_second = 0.5");
        let t0 = Instant::now();
        assert!(t.admit_at(t0).is_ok());
        let refusal = t.admit_at(t0).unwrap_err();
        assert_eq!(refusal.retry_after, secs(2.0));
        assert!(t.admit_at(t0 + secs(2.0)).is_ok());
    }

    #[test]
    fn tokens_are_charged_after_admission_and_the_debt_is_paid_back() {
        let t = tenant("tokens_per_second = 100.0");
        let t0 = Instant::now();
        // Admitted with a full bucket; its 250 tokens leave a debt of 150.
        let a = t.admit_at(t0).unwrap();
        t.charge_tokens_at(250, t0);
        drop(a);
        let refusal = t.admit_at(t0).unwrap_err();
        assert_eq!(refusal.limit, Limit::Tokens);
        assert!((refusal.retry_after.as_secs_f64() - 1.5).abs() < 1e-9);
        assert!(t.admit_at(t0 + secs(1.4)).is_err());
        assert!(t.admit_at(t0 + secs(1.5)).is_ok());
        assert_eq!(t.state.tokens(), 250);
    }

    #[test]
    fn concurrency_slots_come_back_when_admissions_drop() {
        let t = tenant("max_concurrent = 2");
        let a = t.admit().unwrap();
        let b = t.admit().unwrap();
        let refusal = t.admit().unwrap_err();
        assert_eq!(refusal.limit, Limit::Concurrency);
        assert_eq!(refusal.retry_after, secs(1.0));
        assert_eq!(t.state.in_flight(), 2);
        a.finish(StatusCode::OK);
        let c = t.admit().unwrap();
        // Dropped unanswered: the client went away.
        drop(b);
        drop(c);
        assert_eq!(t.state.in_flight(), 0);
        assert_eq!(t.state.count(Outcome::Ok), 1);
        assert_eq!(t.state.count(Outcome::Cancelled), 2);
    }

    #[test]
    fn a_refusal_takes_nothing() {
        let t = tenant("requests_per_second = 1.0\nmax_concurrent = 1");
        let t0 = Instant::now();
        let a = t.admit_at(t0).unwrap();
        // Refused for concurrency: the request token is still there once the slot frees.
        assert_eq!(t.admit_at(t0).unwrap_err().limit, Limit::Concurrency);
        drop(a);
        assert_eq!(t.admit_at(t0).unwrap_err().limit, Limit::Requests);
        assert_eq!(t.state.in_flight(), 0);
    }

    #[test]
    fn outcomes_follow_the_status() {
        let of = |s: u16| Outcome::of(StatusCode::from_u16(s).unwrap());
        assert_eq!(of(200), Outcome::Ok);
        assert_eq!(of(404), Outcome::NotFound);
        assert_eq!(of(400), Outcome::Invalid);
        assert_eq!(of(413), Outcome::Invalid);
        assert_eq!(of(429), Outcome::Overloaded);
        assert_eq!(of(503), Outcome::Overloaded);
        assert_eq!(of(504), Outcome::Failed);
        assert_eq!(of(500), Outcome::Failed);
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(o.index(), i);
        }
    }

    #[test]
    fn limits_must_be_positive() {
        for bad in [
            "requests_per_second = 0.0",
            "tokens_per_second = -1.0",
            "requests_per_second = nan",
            "tokens_per_second = inf",
            "max_concurrent = 0",
        ] {
            let text = format!("[[tenant]]\nname = \"t\"\nkey = \"k-0123456789\"\n{bad}\n");
            assert!(Tenants::parse(&text).is_err(), "{bad}");
        }
    }
}
