//! Per-tenant series, read from the tenants in force at each scrape: requests by outcome,
//! text tokens charged, requests in flight. Labels are tenant names, never keys.
//!
//! A tenant's counters live with its limit state, so they go on across reloads while the
//! tenant keeps its name; a tenant removed from the file leaves the exposition (its series
//! end), and one renamed starts again from zero under its new name. Outcomes that never
//! happened are left out, except `ok`, so every tenant shows once it is in the file.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use crate::tenants::{Outcome, TenantTable};

/// Reads the tenants in force at scrape time.
pub(crate) struct TenantCollector(pub(crate) Arc<TenantTable>);

impl std::fmt::Debug for TenantCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantCollector").finish_non_exhaustive()
    }
}

impl Collector for TenantCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
        let tenants = self.0.snapshot();
        let mut family = enc.encode_descriptor(
            "streampool_tenant_requests",
            "Requests of each tenant by outcome: ok, limited (refused by its limits: 429), \
             not_found, invalid (other 4xx), overloaded (503, TEI's 429), failed (other 5xx), \
             cancelled (the client went away)",
            None,
            MetricType::Counter,
        )?;
        for t in tenants.iter() {
            for outcome in Outcome::ALL {
                let n = t.requests(outcome);
                if n > 0 || outcome == Outcome::Ok {
                    let labels = [("tenant", t.name()), ("outcome", outcome.as_str())];
                    ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        let mut family = enc.encode_descriptor(
            "streampool_tenant_tokens",
            "Text tokens each tenant's requests were charged (special tokens and prompts included)",
            None,
            MetricType::Counter,
        )?;
        for t in tenants.iter() {
            ConstCounter::new(t.tokens()).encode(family.encode_family(&[("tenant", t.name())])?)?;
        }
        let mut family = enc.encode_descriptor(
            "streampool_tenant_in_flight",
            "Requests of each tenant admitted and not yet answered",
            None,
            MetricType::Gauge,
        )?;
        for t in tenants.iter() {
            ConstGauge::new(i64::from(t.in_flight()))
                .encode(family.encode_family(&[("tenant", t.name())])?)?;
        }
        Ok(())
    }
}
