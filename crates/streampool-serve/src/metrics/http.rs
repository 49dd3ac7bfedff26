//! The HTTP side of the metrics: the middleware that records every request, and
//! `GET /metrics`.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderName};
use axum::middleware::Next;
use axum::response::Response;

use crate::state::AppState;

/// The content type of the OpenMetrics text exposition (Prometheus scrapes it natively).
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The middleware that records every request's route, status and duration, and logs it.
pub async fn track(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().to_string();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let resp = match state.metrics.phase_timer(&route, start) {
        None => next.run(req).await,
        // The handler runs inside this future, on this task, so its marks find the timer.
        Some(timer) => {
            super::phases::TIMER
                .scope(timer, async {
                    let resp = next.run(req).await;
                    super::phases::finish();
                    resp
                })
                .await
        }
    };
    let seconds = start.elapsed().as_secs_f64();
    let status = resp.status().as_u16();
    state.metrics.record(&method, &route, status, seconds);
    tracing::debug!(%method, %route, status, micros = (seconds * 1e6) as u64, "request");
    resp
}

/// `GET /metrics`.
pub async fn scrape(
    State(state): State<Arc<AppState>>,
) -> ([(HeaderName, &'static str); 1], String) {
    state.metrics.ready.set(i64::from(state.is_ready()));
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        state.metrics.render(),
    )
}
