//! The error type of the server: startup failures and every way a request can fail, each
//! with the HTTP status it is answered with.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::time::Duration;
use streampool_batch::BatchError;

/// What starting the server or serving a request can fail with.
///
/// As a response ([`IntoResponse`]) it is the KServe v2 error format, `{"error": "..."}`,
/// with the status of [`Error::status`]; the OpenAI route wraps it in OpenAI's format instead.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed: bad JSON, a wrong shape or datatype, too many inputs, an
    /// input too long (when not truncating). Answered 400.
    #[error("{0}")]
    BadRequest(String),
    /// An input is longer than the limit and the server does not truncate. Answered 400
    /// (413 on TEI's `/embed`, as TEI does).
    #[error("{0}")]
    InputTooLong(String),
    /// The request is larger than a configured limit other than the body size (e.g. the
    /// elements of its tensors); the message names the limit. Answered 413.
    #[error("{0}")]
    TooLarge(String),
    /// The model's answer for this request is not finite (NaN or infinity: e.g. inputs that
    /// overflow the model's arithmetic, or a half-precision overflow). Never answered as
    /// `null` or a number under 200: answered 422, for this request only.
    #[error("{0}")]
    NonFinite(String),
    /// The request has no valid API key (see `ServeConfig::api_key`). Answered 401 with
    /// `WWW-Authenticate: Bearer`.
    #[error("{0}")]
    Unauthorized(String),
    /// Reading the request body took longer than `ServeConfig::body_timeout`. Answered 408.
    #[error("request body not received within {0:?}")]
    BodyTimeout(std::time::Duration),
    /// A handler panicked (a bug): this request is answered 500 and counted in
    /// `streampool_http_panics_total`; the server goes on serving.
    #[error("internal error: the request handler panicked ({0})")]
    Panicked(String),
    /// No model, input or output of that name. Answered 404.
    #[error("{0}")]
    NotFound(String),
    /// The request body is larger than the configured limit. Answered 413.
    #[error("request body larger than the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The configured `max_body_bytes`.
        limit: usize,
    },
    /// No replica's batch queue admits the request now (its estimated wait exceeds the
    /// request timeout or the configured bound, or a memory cap is reached): retry later.
    /// Answered 503 with `Retry-After` from the queue's estimate (429 on TEI's `/embed`, as
    /// TEI does).
    #[error("{0}")]
    Overloaded(Shed),
    /// The device ran out of memory on the batch that held this request: answered 503 with
    /// `Retry-After` (the memory is free again once the batch is gone), and the server goes
    /// on serving.
    #[error("{0}")]
    DeviceOutOfMemory(Shed),
    /// The caller's tenant is over one of its limits (requests or tokens per second,
    /// concurrent requests; see `ServeConfig::tenants_file`): answered 429 with `Retry-After`
    /// for when the limit has room again.
    #[error("{0}")]
    RateLimited(Shed),
    /// The model's batch queue is shutting down: retry elsewhere. Answered 503 with
    /// `Retry-After`.
    #[error("{0}")]
    Unavailable(String),
    /// A model load would not fit its device's memory (budget or free memory); the message
    /// says how much it needs and how much is free. Answered 507; nothing was loaded.
    #[error("{0}")]
    InsufficientStorage(String),
    /// The request was not answered within the configured timeout. Answered 504.
    #[error("request timed out: {0}")]
    Timeout(String),
    /// Nobody waits for the answer any more (the client went away): the work stopped early.
    /// Never sent to a client; counted as a 500 if it were.
    #[error("the request was cancelled: its client went away")]
    Cancelled,
    /// The model failed on the batch that held this request. Answered 500.
    #[error("{0}")]
    Internal(String),
    /// Loading a model failed (at startup).
    #[error("loading a model: {0}")]
    Model(#[from] streampool_nn::Error),
    /// The runtime failed (at startup).
    #[error("runtime: {0}")]
    Runtime(#[from] streampool::Error),
    /// A batch queue could not be created (at startup).
    #[error("batch queue: {0}")]
    Batch(BatchError),
    /// The server configuration is invalid (at startup).
    #[error("configuration: {0}")]
    Config(String),
    /// The tenants file cannot be read, is not TOML of its format, or breaks one of its
    /// rules (a duplicate name or key, a limit that is not positive); the message says
    /// where. At startup the server does not start; on a reload the tenants in force stay.
    #[error("tenants file: {0}")]
    Tenants(String),
    /// A graceful shutdown did not finish within the configured `drain_timeout`: requests
    /// were still open (a stuck model, a client that never finished its request). They are
    /// abandoned when the runtime stops; stop it with a bound too
    /// (`tokio::runtime::Runtime::shutdown_timeout`), since a queue worker may still be busy.
    #[error("shutdown did not finish within the drain timeout of {0:?}")]
    DrainTimeout(std::time::Duration),
    /// Binding or serving the socket failed.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// A request shed for load: the message, and when the queue estimates a retry would be
/// admitted (sent as `Retry-After`, in whole seconds, at least 1).
#[derive(Debug, Clone, PartialEq)]
pub struct Shed {
    /// What the client is told.
    pub message: String,
    /// The estimated time until a retry would be admitted.
    pub retry_after: Duration,
}

impl std::fmt::Display for Shed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A shed with no estimate: retry in a second.
impl From<&str> for Shed {
    fn from(message: &str) -> Self {
        Self {
            message: message.into(),
            retry_after: Duration::from_secs(1),
        }
    }
}

/// `Retry-After` for a wait of `d`: whole seconds, rounded up, at least 1 (the header has no
/// finer unit, and 0 would invite an immediate retry).
pub(crate) fn retry_after_header(d: Duration) -> HeaderValue {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    HeaderValue::from(secs.max(1))
}

/// The most bytes of an error message sent to a client. Messages quote client-supplied
/// values (names, shapes, prompts) through [`streampool_nn::Quoted`]; this bounds whatever
/// else a message might carry (a decoder's error about a huge value), so a request never
/// gets its own megabyte echoed back, or written to a log.
const MAX_MESSAGE_BYTES: usize = 512;

/// `message` cut to [`MAX_MESSAGE_BYTES`] (at a character boundary), saying how long it was.
pub(crate) fn bounded_message(message: String) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message;
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &message[..end], message.len())
}

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The HTTP status a request failing with this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            Error::BadRequest(_) | Error::InputTooLong(_) => StatusCode::BAD_REQUEST,
            Error::NotFound(_) => StatusCode::NOT_FOUND,
            Error::PayloadTooLarge { .. } | Error::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Error::NonFinite(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Error::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Error::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Error::Overloaded(_) | Error::DeviceOutOfMemory(_) | Error::Unavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Error::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Error::InsufficientStorage(_) => StatusCode::INSUFFICIENT_STORAGE,
            Error::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// Maps a batch-queue answer to the error a client sees (through the core's kinds: see
    /// `From<streampool_core::Error>`).
    pub fn from_batch(e: BatchError) -> Self {
        streampool_core::Error::from_batch(e).into()
    }

    /// When a client should retry: the queue's estimate for a load refusal, when the
    /// tenant's limit has room, a second while shutting down; `None` for errors a retry
    /// would not cure.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Overloaded(shed) | Error::DeviceOutOfMemory(shed) | Error::RateLimited(shed) => {
                Some(shed.retry_after)
            }
            Error::Unavailable(_) => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    /// The response with `body` as JSON, this error's status, and `Retry-After` on 503 and
    /// 429.
    pub(crate) fn respond_with(&self, body: serde_json::Value) -> Response {
        let mut resp = (self.status(), axum::Json(body)).into_response();
        if let Some(d) = self.retry_after() {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, retry_after_header(d));
        }
        if self.status() == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        resp
    }
}

/// Each kind of the core's errors as the status it is answered with: invalid input 400, an
/// input too long 400 (413 on TEI), too large to read 413, unknown model 404, a non-finite
/// answer 422, a load refusal or a device out of memory 503 with `Retry-After`, a model
/// shutting down 503, a passed deadline 504, any other model failure 500.
impl From<streampool_core::Error> for Error {
    fn from(e: streampool_core::Error) -> Self {
        use streampool_core::Error as Core;
        match e {
            Core::InvalidInput(m) => Error::BadRequest(m),
            Core::InputTooLong(m) => Error::InputTooLong(m),
            Core::InputTooLarge(m) => Error::TooLarge(m),
            Core::NotFound(m) => Error::NotFound(m),
            e @ Core::NonFinite { .. } => Error::NonFinite(e.to_string()),
            Core::Overloaded {
                message,
                retry_after,
            } => Error::Overloaded(Shed {
                message,
                retry_after,
            }),
            Core::DeviceOutOfMemory {
                message,
                retry_after,
            } => Error::DeviceOutOfMemory(Shed {
                message,
                retry_after,
            }),
            Core::Unavailable(m) => Error::Unavailable(m),
            Core::DeadlineExceeded(m) => Error::Timeout(m),
            Core::Cancelled => Error::Cancelled,
            Core::Config(m) => Error::Config(m),
            e @ Core::InsufficientMemory { .. } => Error::InsufficientStorage(e.to_string()),
            // `Model` and any kind added later: the model failed.
            other => Error::Internal(other.to_string()),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        if self.status().is_server_error() {
            tracing::warn!(error = %bounded_message(self.to_string()), "request failed");
        }
        self.respond_with(serde_json::json!({ "error": bounded_message(self.to_string()) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_the_estimate_in_whole_seconds_rounded_up() {
        let ms = Duration::from_millis;
        assert_eq!(retry_after_header(ms(0)), "1");
        assert_eq!(retry_after_header(ms(300)), "1");
        assert_eq!(retry_after_header(ms(1000)), "1");
        assert_eq!(retry_after_header(ms(1001)), "2");
        assert_eq!(retry_after_header(ms(2500)), "3");
        let shed = BatchError::QueueFull {
            reason: streampool_batch::Overload::Requests { capacity: 4 },
            retry_after: ms(2500),
        };
        let e = Error::from_batch(shed);
        assert_eq!(e.retry_after(), Some(ms(2500)));
        assert_eq!(e.into_response().headers()[header::RETRY_AFTER], "3");
        // TEI's 429 carries the same estimate.
        let e = Error::from_batch(BatchError::QueueFull {
            reason: streampool_batch::Overload::Requests { capacity: 4 },
            retry_after: ms(2500),
        });
        let tei = crate::tei::TeiError::from(e).into_response();
        assert_eq!(tei.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(tei.headers()[header::RETRY_AFTER], "3");
    }
}
