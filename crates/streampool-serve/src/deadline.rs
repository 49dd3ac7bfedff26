//! A request's deadline counts from its arrival: the outermost layer stamps each request
//! with the time it arrived ([`stamp`]), and handlers take [`Arrival`] to bound all of a
//! request's work (reading its body, tokenizing, queueing, running) by
//! [`ServeConfig::request_timeout`](crate::ServeConfig::request_timeout) from then.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::extract::{FromRequestParts, Request};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::Response;

/// When a request arrived (its headers were read).
#[derive(Debug, Clone, Copy)]
pub struct Arrival(pub Instant);

impl Arrival {
    /// The request's deadline under a timeout of `timeout`.
    pub fn deadline(self, timeout: Duration) -> Instant {
        self.0 + timeout
    }
}

/// The stamp of [`stamp`], or now for a request that did not pass through it (a handler
/// driven directly, as the fuzzing harness does).
impl<S: Send + Sync> FromRequestParts<S> for Arrival {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(parts
            .extensions
            .get::<Arrival>()
            .copied()
            .unwrap_or(Arrival(Instant::now())))
    }
}

/// Stamps the request with its [`Arrival`].
pub(crate) async fn stamp(mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(Arrival(Instant::now()));
    next.run(req).await
}
