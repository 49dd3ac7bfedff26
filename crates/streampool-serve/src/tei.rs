//! Hugging Face text-embeddings-inference (TEI) compatibility: `POST /embed`, `GET /info`
//! and `GET /health`, with TEI's request and response shapes and status codes, so a TEI
//! client switches by changing only the base URL. They serve the first embedder (TEI serves
//! one model per server).
//!
//! Errors are TEI's `{"error": "...", "error_type": "..."}` with TEI's statuses:
//!
//! | ours | status | `error_type` |
//! |---|---|---|
//! | more inputs than `max_inputs`, body over the limit, input too long without truncation | 413 | `validation` |
//! | malformed JSON, wrong field types, unsupported options | 422 | `validation` |
//! | tokenizer failure | 422 | `tokenizer` |
//! | empty `inputs` | 400 | `empty` |
//! | queue full | 429 | `overloaded` |
//! | shutting down | 503 | `unhealthy` |
//! | model failure, no embedder served | 424 | `backend` |
//! | request timeout | 504 | `backend` |
//! | elements over `max_elements` | 413 | `validation` |
//! | non-finite embedding (e.g. a half-precision overflow) | 422 | `backend` |
//! | missing or wrong API key | 401 | `unauthorized` |
//! | body not received within `body_timeout` | 408 | `validation` |

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::body::Body;
use crate::metrics::{phase, Phase};
use crate::models::ServedModel;
use crate::state::AppState;
use crate::Error;

/// TEI's error kinds, as its OpenAPI examples spell them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum ErrorType {
    Unhealthy,
    Backend,
    Overloaded,
    Validation,
    Tokenizer,
    Empty,
    /// Not one of TEI's own kinds: TEI answers a missing or wrong API key 401 with no body.
    Unauthorized,
}

/// An error answered in TEI's format.
pub struct TeiError {
    status: StatusCode,
    error_type: ErrorType,
    message: String,
    /// `Retry-After` for a 429 or 503 (see [`Error::retry_after`]); a second if unset.
    retry_after: Option<std::time::Duration>,
}

impl TeiError {
    fn new(status: StatusCode, error_type: ErrorType, message: impl Into<String>) -> Self {
        Self {
            status,
            error_type,
            message: message.into(),
            retry_after: None,
        }
    }

    fn validation(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            ErrorType::Validation,
            message,
        )
    }
}

/// Our errors on TEI's statuses (see the module table).
impl From<Error> for TeiError {
    fn from(e: Error) -> Self {
        let (status, kind) = match &e {
            Error::PayloadTooLarge { .. } | Error::TooLarge(_) => {
                (StatusCode::PAYLOAD_TOO_LARGE, ErrorType::Validation)
            }
            Error::NonFinite(_) => (StatusCode::UNPROCESSABLE_ENTITY, ErrorType::Backend),
            Error::Unauthorized(_) => (StatusCode::UNAUTHORIZED, ErrorType::Unauthorized),
            Error::BodyTimeout(_) => (StatusCode::REQUEST_TIMEOUT, ErrorType::Validation),
            Error::InputTooLong(_) => (StatusCode::PAYLOAD_TOO_LARGE, ErrorType::Validation),
            Error::BadRequest(_) | Error::NotFound(_) => {
                (StatusCode::UNPROCESSABLE_ENTITY, ErrorType::Validation)
            }
            Error::Overloaded(_) => (StatusCode::TOO_MANY_REQUESTS, ErrorType::Overloaded),
            Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, ErrorType::Unhealthy),
            Error::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, ErrorType::Backend),
            _ => (StatusCode::FAILED_DEPENDENCY, ErrorType::Backend),
        };
        Self {
            retry_after: e.retry_after(),
            ..Self::new(status, kind, e.to_string())
        }
    }
}

impl IntoResponse for TeiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(error = %self.message, "TEI request failed");
        }
        let body = json!({ "error": self.message, "error_type": self.error_type });
        let mut resp = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if matches!(
            self.status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) {
            let wait = self
                .retry_after
                .unwrap_or(std::time::Duration::from_secs(1));
            resp.headers_mut()
                .insert(header::RETRY_AFTER, crate::error::retry_after_header(wait));
        }
        resp
    }
}

/// TEI's `EmbedRequest`. Fields TEI clients may add that do not change the result here
/// (e.g. `huggingface_hub`'s `encoding_format`) are ignored, as TEI ignores them.
#[derive(Deserialize)]
struct EmbedRequest {
    inputs: Value,
    #[serde(default)]
    normalize: Option<bool>,
    #[serde(default)]
    truncate: Option<bool>,
    #[serde(default)]
    truncation_direction: Option<String>,
    #[serde(default)]
    prompt_name: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
}

/// `POST /embed`: `inputs` is a string, a list of token ids, or a list of either; `normalize`
/// (default true) scales each embedding to unit length; `truncate` (default: the server's
/// `--truncate`) cuts inputs longer than the limit instead of refusing them. The answer is a
/// JSON list with one list of floats per input, in order.
pub async fn embed(
    State(state): State<Arc<AppState>>,
    body: std::result::Result<Body, Error>,
) -> std::result::Result<Response, TeiError> {
    phase(Phase::Read);
    let Body(body) = body?;
    let req: EmbedRequest = serde_json::from_slice(&body)
        .map_err(|e| TeiError::validation(format!("malformed embed request: {e}")))?;
    if let Some(dir) = req.truncation_direction.as_deref() {
        if !dir.eq_ignore_ascii_case("right") {
            return Err(TeiError::validation(format!(
                "truncation_direction {dir:?} is not supported: only \"right\""
            )));
        }
    }
    if let Some(p) = &req.prompt_name {
        return Err(TeiError::validation(format!(
            "prompt_name {p:?}: this server has no prompts configured"
        )));
    }
    let name = state.registry.first_embedder().ok_or_else(|| {
        TeiError::new(
            StatusCode::FAILED_DEPENDENCY,
            ErrorType::Backend,
            "no embedding model is served",
        )
    })?;
    let model = state.registry.get(name)?;
    let ServedModel::Embedder(e) = &*model else {
        // `first_embedder` named an embedder.
        return Err(Error::Internal("first embedder is not an embedder".into()).into());
    };
    if let Some(d) = req.dimensions {
        if d != e.dim() {
            return Err(TeiError::validation(format!(
                "dimensions {d} not supported: the model gives {}",
                e.dim()
            )));
        }
    }
    let input = match &req.inputs {
        Value::Array(items) if items.is_empty() => {
            return Err(TeiError::new(
                StatusCode::BAD_REQUEST,
                ErrorType::Empty,
                "Input cannot be empty",
            ))
        }
        _ => crate::openai::parse_input(req.inputs)
            .map_err(|e| TeiError::validation(e.to_string()))?,
    };
    phase(Phase::Parse);
    let truncate = req.truncate.unwrap_or(e.truncates());
    let too_many = |n: usize| {
        TeiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorType::Validation,
            format!(
                "batch size {n} > maximum allowed batch size {}",
                state.config.max_inputs
            ),
        )
    };
    // Too long without truncation is TEI's 413 validation error (the `From` above); other
    // refusals of an input are the tokenizer's (422).
    let refused = |e: Error| match e {
        Error::BadRequest(msg) => {
            TeiError::new(StatusCode::UNPROCESSABLE_ENTITY, ErrorType::Tokenizer, msg)
        }
        other => other.into(),
    };
    let ids = match input {
        crate::openai::Input::Texts(texts) => {
            if texts.len() > state.config.max_inputs {
                return Err(too_many(texts.len()));
            }
            crate::openai::tokenize_all(&model, texts, Some(truncate))
                .await
                .map_err(refused)?
        }
        crate::openai::Input::Tokens(rows) => {
            if rows.len() > state.config.max_inputs {
                return Err(too_many(rows.len()));
            }
            rows.into_iter()
                .map(|r| e.check_ids_with(r, truncate))
                .collect::<Result<Vec<_>, _>>()
                .map_err(refused)?
        }
    };
    phase(Phase::Tokenize);
    let deadline = Instant::now() + state.config.request_timeout;
    let normalize = req.normalize.unwrap_or(true);
    let vectors = e.embed_with(ids, normalize, deadline).await?;
    phase(Phase::Queue);
    let resp = Json(vectors).into_response();
    phase(Phase::Encode);
    Ok(resp)
}

/// `GET /info`: TEI's model and router facts for the first embedder.
pub async fn info(State(state): State<Arc<AppState>>) -> std::result::Result<Response, TeiError> {
    let name = state.registry.first_embedder().ok_or_else(|| {
        TeiError::new(
            StatusCode::FAILED_DEPENDENCY,
            ErrorType::Backend,
            "no embedding model is served",
        )
    })?;
    let model = state.registry.get(name)?;
    let ServedModel::Embedder(e) = &*model else {
        return Err(Error::Internal("first embedder is not an embedder".into()).into());
    };
    let batch = &state.config.batch;
    let replicas = model.labels().len();
    Ok(Json(json!({
        "model_id": name,
        "model_sha": null,
        "model_dtype": "float32",
        "model_type": {"embedding": {"pooling": "mean"}},
        "max_concurrent_requests": batch.max_queue * replicas,
        "max_input_length": e.max_seq_len(),
        "max_batch_tokens": batch.max_batch_size * e.max_seq_len(),
        "max_batch_requests": batch.max_batch_size,
        "max_client_batch_size": state.config.max_inputs,
        "auto_truncate": e.truncates(),
        "tokenization_workers": 1,
        "version": env!("CARGO_PKG_VERSION"),
        "sha": null,
        "docker_label": null,
    }))
    .into_response())
}

/// `GET /health`: 200 while ready (every replica loaded and accepting, not shutting down),
/// else 503 with TEI's `unhealthy` error.
pub async fn health(
    State(state): State<Arc<AppState>>,
) -> std::result::Result<StatusCode, TeiError> {
    if state.is_ready() {
        Ok(StatusCode::OK)
    } else {
        Err(TeiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorType::Unhealthy,
            "unhealthy",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rows of the module table that a test over HTTP cannot reach cheaply (a full
    /// queue of an embedder, shutdown, a failing batch, a timeout).
    #[test]
    fn our_errors_map_to_tei_statuses() {
        let cases = [
            (Error::Overloaded("full".into()), 429, ErrorType::Overloaded),
            (
                Error::Unavailable("shut down".into()),
                503,
                ErrorType::Unhealthy,
            ),
            (
                Error::Internal("model failed".into()),
                424,
                ErrorType::Backend,
            ),
            (Error::Timeout("late".into()), 504, ErrorType::Backend),
            (
                Error::InputTooLong("long".into()),
                413,
                ErrorType::Validation,
            ),
            (
                Error::PayloadTooLarge { limit: 1 },
                413,
                ErrorType::Validation,
            ),
            (Error::BadRequest("bad".into()), 422, ErrorType::Validation),
        ];
        for (error, status, kind) in cases {
            let what = error.to_string();
            let e = TeiError::from(error);
            assert_eq!((e.status.as_u16(), e.error_type), (status, kind), "{what}");
        }
        let resp = TeiError::from(Error::Overloaded("full".into())).into_response();
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
    }
}
