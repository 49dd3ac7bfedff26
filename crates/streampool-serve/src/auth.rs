//! Who may call: API keys, checked on every inference and model route as
//! `Authorization: Bearer <key>` (what the OpenAI, TEI and Triton clients send).
//!
//! The keys are a table of tenants ([`Tenants`](crate::Tenants): a tenants file, or the
//! single [`ApiKey`] as the tenant `default`). The check finds the key's tenant, admits the
//! request under the tenant's limits (429 with `Retry-After` past them), puts the tenant
//! in the request's extensions for the handlers ([`Caller`](crate::Caller): which models
//! it sees, whom its tokens are charged to) and counts the request's outcome for the
//! tenant once it is answered.
//!
//! The probes stay open (`/v2/health/live`, `/v2/health/ready`, `/health`: an orchestrator
//! has no key), and `/metrics` too unless [`ServeConfig::protect_metrics`](crate::ServeConfig::protect_metrics).
//! Every other path, unknown ones included, needs a key, so a caller without one learns
//! nothing about what is served. TLS is not this server's job: terminate it at the ingress
//! or balancer in front (`deploy/README.md`), or the key crosses the network in clear.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use crate::state::AppState;
use crate::tenants::{sha256, Sha256Digest};
use crate::{Error, Result, Shed};

/// Paths answered without a key whatever the settings: the liveness and readiness probes.
const OPEN_PATHS: [&str; 3] = ["/v2/health/live", "/v2/health/ready", "/health"];

/// An API key. Its `Debug` form never shows the key, so it stays out of logs.
///
/// ```
/// use streampool_serve::ServeConfig;
/// use streampool_serve::ApiKey;
/// let key = ApiKey::new("s3cret-0123456789").unwrap();
/// assert!(key.matches(b"s3cret-0123456789"));
/// assert!(!key.matches(b"s3cret-012345678"));
/// assert_eq!(format!("{key:?}"), "ApiKey(..)");
/// let config = ServeConfig { api_key: Some(key), ..ServeConfig::default() };
/// assert!(config.validate().is_ok());
/// assert!(ApiKey::new("  ").is_err());
/// ```
#[derive(Clone)]
pub struct ApiKey(Arc<[u8]>);

impl ApiKey {
    /// A key from its text; surrounding whitespace (a file's trailing newline) is dropped.
    /// An empty key, or one with inner whitespace or control characters (which no
    /// `Authorization` header can carry), is a configuration error.
    pub fn new(key: &str) -> Result<Self> {
        let key = key.trim();
        if key.is_empty() {
            return Err(Error::Config("the API key is empty".into()));
        }
        if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(Error::Config(
                "the API key has whitespace or control characters".into(),
            ));
        }
        Ok(Self(key.as_bytes().into()))
    }

    /// The key in the first line of the file at `path` (e.g. a mounted Kubernetes Secret).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Config(format!("reading the API key file {}: {e}", path.display()))
        })?;
        Self::new(text.lines().next().unwrap_or(""))
    }

    /// Whether `presented` is this key. The comparison takes the same time wherever the
    /// first difference is (`subtle`), so timing does not reveal the key byte by byte; only
    /// its length can be inferred, so use a long random key (32 bytes or more).
    pub fn matches(&self, presented: &[u8]) -> bool {
        bool::from(self.0.as_ref().ct_eq(presented))
    }

    /// The SHA-256 digest of the key (what the tenant table looks keys up by).
    pub(crate) fn digest(&self) -> Sha256Digest {
        sha256(&self.0)
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

/// The middleware: answers 401 (with `WWW-Authenticate: Bearer`) when keys are configured
/// and the request carries none of them, and 429 (with `Retry-After`) when the key's tenant
/// is over a limit, each in the format of the route's protocol.
pub(crate) async fn require_key(
    State(state): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let Some(tenants) = &state.tenants else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    let open = OPEN_PATHS.contains(&path) || (path == "/metrics" && !state.config.protect_metrics);
    if open {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| bearer_token(v.as_bytes()));
    let Some(tenant) = presented.and_then(|token| tenants.authenticate(token)) else {
        state.metrics.record_unauthorized();
        let e = Error::Unauthorized(
            if presented.is_some() {
                "invalid API key"
            } else {
                "missing API key: send `Authorization: Bearer <key>`"
            }
            .into(),
        );
        return protocol_error(path, e);
    };
    let admission = match tenant.admit() {
        Ok(admission) => admission,
        Err(refusal) => {
            tenant.record_limited();
            return protocol_error(
                path,
                Error::RateLimited(Shed {
                    message: refusal.message(&tenant),
                    retry_after: refusal.retry_after,
                }),
            );
        }
    };
    req.extensions_mut().insert(tenant);
    // Dropped with this future if the client goes away: the slot comes back either way.
    let resp = next.run(req).await;
    admission.finish(resp.status());
    resp
}

/// `e` as the response of a route at `path`: each protocol's clients read errors in their
/// own format.
fn protocol_error(path: &str, e: Error) -> Response {
    if path.starts_with("/v1/") {
        crate::openai::OpenAiError(e).into_response()
    } else if crate::tei::PATHS.contains(&path) {
        crate::tei::TeiError::from(e).into_response()
    } else {
        e.into_response()
    }
}

/// The token of an `Authorization: Bearer <token>` header (the scheme is case-insensitive,
/// RFC 9110), or `None` for any other form.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_parsed_as_rfc_9110_says() {
        assert_eq!(bearer_token(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"BEARER abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bearer "), None);
        assert_eq!(bearer_token(b"Bearer"), None);
        assert_eq!(bearer_token(b""), None);
    }

    #[test]
    fn keys_come_from_text_and_files() {
        let dir = std::env::temp_dir().join(format!("sp-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("key");
        std::fs::write(&file, "abc123\n").unwrap();
        assert!(ApiKey::from_file(&file).unwrap().matches(b"abc123"));
        std::fs::write(&file, "\n").unwrap();
        assert!(ApiKey::from_file(&file).is_err());
        assert!(ApiKey::from_file(dir.join("missing")).is_err());
        assert!(ApiKey::new("a b").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
