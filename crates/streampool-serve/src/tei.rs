//! Hugging Face text-embeddings-inference (TEI) compatibility: `POST /embed`, `POST /rerank`,
//! `POST /predict`, `GET /info` and `GET /health`, with TEI's request and response shapes and
//! status codes, so a TEI client switches by changing only the base URL. `/embed` serves the
//! first embedder, `/rerank` and `/predict` the first classifier (TEI serves one model per
//! server).
//!
//! Errors are TEI's `{"error": "...", "error_type": "..."}` with TEI's statuses:
//!
//! | ours | status | `error_type` |
//! |---|---|---|
//! | more inputs than `max_inputs`, body over the limit, input too long without truncation | 413 | `validation` |
//! | malformed JSON, wrong field types, unsupported options | 422 | `validation` |
//! | tokenizer failure | 422 | `tokenizer` |
//! | empty `inputs` or `texts` | 400 | `empty` |
//! | `/rerank` on a classifier of more than one label | 422 | `validation` |
//! | queue full | 429 | `overloaded` |
//! | shutting down | 503 | `unhealthy` |
//! | model failure, no embedder served | 424 | `backend` |
//! | request timeout | 504 | `backend` |
//! | elements over `max_elements` | 413 | `validation` |
//! | non-finite embedding (e.g. a half-precision overflow) | 422 | `backend` |
//! | missing or wrong API key | 401 | `unauthorized` |
//! | body not received within `body_timeout` | 408 | `validation` |

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::body::Body;
use crate::deadline::Arrival;
use crate::metrics::{phase, Phase};
use crate::state::AppState;
use crate::Error;
use streampool_core::{ClassifierEndpoint, ServedModel};

/// The paths of TEI's routes: their errors, a missing API key's 401 included, are in TEI's
/// format.
pub(crate) const PATHS: [&str; 6] = ["/embed", "/rerank", "/predict", "/", "/info", "/health"];

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
            message: crate::error::bounded_message(message.into()),
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
            // TEI has no kind of its own for memory; 503 with Retry-After as on every route.
            Error::DeviceOutOfMemory(_) => (StatusCode::SERVICE_UNAVAILABLE, ErrorType::Backend),
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

impl From<streampool_core::Error> for TeiError {
    fn from(e: streampool_core::Error) -> Self {
        Error::from(e).into()
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
    arrival: Arrival,
    body: std::result::Result<Body, Error>,
) -> std::result::Result<Response, TeiError> {
    phase(Phase::Read);
    let deadline = arrival.deadline(state.config.request_timeout);
    let Body(body) = body?;
    let req: EmbedRequest = parse(&body, "embed")?;
    check_direction(req.truncation_direction.as_deref())?;
    let name = state.registry.first_embedder().ok_or_else(|| {
        TeiError::new(
            StatusCode::FAILED_DEPENDENCY,
            ErrorType::Backend,
            "no embedding model is served",
        )
    })?;
    let model = state.registry.get(&name)?;
    let ServedModel::Embedder(e) = &*model else {
        // `first_embedder` named an embedder.
        return Err(Error::Internal("first embedder is not an embedder".into()).into());
    };
    e.check_dimensions(req.dimensions)
        .map_err(|e| TeiError::validation(e.to_string()))?;
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
    let prompt = e
        .prompt(req.prompt_name.as_deref(), None)
        .map_err(|e| TeiError::validation(e.to_string()))?;
    let ids = match input {
        crate::openai::Input::Texts(texts) => {
            check_batch_size(texts.len(), &state)?;
            e.tokenize_texts(texts, prompt.as_deref(), truncate, deadline)
                .await
                .map_err(refused)?
        }
        crate::openai::Input::Tokens(rows) => {
            check_batch_size(rows.len(), &state)?;
            if req.prompt_name.is_some() {
                return Err(TeiError::validation(
                    "prompt_name applies to texts, not token ids",
                ));
            }
            rows.into_iter()
                .map(|r| e.check_ids_with(r, truncate))
                .collect::<Result<Vec<_>, _>>()
                .map_err(refused)?
        }
    };
    phase(Phase::Tokenize);
    let normalize = req.normalize.unwrap_or(true);
    let vectors = e.embed_with(ids, normalize, deadline).await?;
    phase(Phase::Queue);
    let resp = Json(vectors).into_response();
    phase(Phase::Encode);
    Ok(resp)
}

/// TEI's 413 for a request of more than `max_inputs` inputs.
fn check_batch_size(n: usize, state: &AppState) -> std::result::Result<(), TeiError> {
    if n > state.config.max_inputs {
        return Err(TeiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorType::Validation,
            format!(
                "batch size {n} > maximum allowed batch size {}",
                state.config.max_inputs
            ),
        ));
    }
    Ok(())
}

/// The classifier endpoint of `model` (a model found by [`classifier`]).
fn as_classifier(model: &ServedModel) -> std::result::Result<&ClassifierEndpoint, TeiError> {
    match model {
        ServedModel::Classifier(c) => Ok(c),
        _ => Err(Error::Internal("first classifier is not a classifier".into()).into()),
    }
}

/// The first classifier, or TEI's 424 when none is served.
fn classifier(state: &AppState) -> std::result::Result<Arc<ServedModel>, TeiError> {
    let name = state.registry.first_classifier().ok_or_else(|| {
        TeiError::new(
            StatusCode::FAILED_DEPENDENCY,
            ErrorType::Backend,
            "no reranker or classifier model is served",
        )
    })?;
    Ok(state.registry.get(&name)?)
}

/// Too long without truncation is TEI's 413 validation error; other refusals of an input
/// are the tokenizer's (422).
fn refused(e: impl Into<Error>) -> TeiError {
    match e.into() {
        Error::BadRequest(msg) => {
            TeiError::new(StatusCode::UNPROCESSABLE_ENTITY, ErrorType::Tokenizer, msg)
        }
        other => other.into(),
    }
}

/// TEI's `RerankRequest`.
#[derive(Deserialize)]
struct RerankRequest {
    query: String,
    texts: Vec<String>,
    #[serde(default)]
    truncate: Option<bool>,
    #[serde(default)]
    truncation_direction: Option<String>,
    #[serde(default)]
    raw_scores: bool,
    #[serde(default)]
    return_text: bool,
}

/// One answer of `/rerank`.
#[derive(Serialize)]
struct Rank {
    index: usize,
    score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<String>,
}

/// `POST /rerank`: scores each of `texts` against `query` with the served cross-encoder
/// (one label): the sigmoid of its logit, or the logit itself with `raw_scores`. The answer
/// lists `{index, score}` (and `text` with `return_text`), best first. The (query, text)
/// pairs go through the model's batch queue like any other inputs.
pub async fn rerank(
    State(state): State<Arc<AppState>>,
    arrival: Arrival,
    body: std::result::Result<Body, Error>,
) -> std::result::Result<Response, TeiError> {
    phase(Phase::Read);
    let deadline = arrival.deadline(state.config.request_timeout);
    let Body(body) = body?;
    let mut req: RerankRequest = parse(&body, "rerank")?;
    check_direction(req.truncation_direction.as_deref())?;
    let model = classifier(&state)?;
    let c = as_classifier(&model)?;
    if c.labels().len() != 1 {
        return Err(TeiError::validation(format!(
            "model is a classifier of {} labels, not a reranker: use /predict",
            c.labels().len()
        )));
    }
    if req.texts.is_empty() {
        return Err(TeiError::new(
            StatusCode::BAD_REQUEST,
            ErrorType::Empty,
            "`texts` cannot be empty",
        ));
    }
    check_batch_size(req.texts.len(), &state)?;
    phase(Phase::Parse);
    let truncate = req.truncate.unwrap_or(c.truncates());
    // The texts are needed again for `return_text` only.
    let texts = if req.return_text {
        req.texts.clone()
    } else {
        std::mem::take(&mut req.texts)
    };
    let tokens = c
        .tokenize_ranked(&req.query, texts, truncate, deadline)
        .await
        .map_err(refused)?;
    phase(Phase::Tokenize);
    let logits = c.logits(tokens, deadline).await?;
    phase(Phase::Queue);
    let mut ranks: Vec<Rank> = logits
        .iter()
        .enumerate()
        .map(|(index, l)| Rank {
            index,
            score: if req.raw_scores {
                l[0]
            } else {
                streampool_nn::tasks::sigmoid(l[0])
            },
            text: req.return_text.then(|| req.texts[index].clone()),
        })
        .collect();
    ranks.sort_by(|a, b| b.score.total_cmp(&a.score));
    let resp = Json(ranks).into_response();
    phase(Phase::Encode);
    Ok(resp)
}

/// A request body of route `what`, or TEI's validation error naming the route.
fn parse<T: serde::de::DeserializeOwned>(
    body: &[u8],
    what: &str,
) -> std::result::Result<T, TeiError> {
    serde_json::from_slice(body)
        .map_err(|e| TeiError::validation(format!("malformed {what} request: {e}")))
}

/// Only right truncation is offered; TEI's other direction is refused by name.
fn check_direction(dir: Option<&str>) -> std::result::Result<(), TeiError> {
    match dir {
        Some(d) if !d.eq_ignore_ascii_case("right") => Err(TeiError::validation(format!(
            "truncation_direction {} is not supported: only \"right\"",
            streampool_nn::Quoted(d)
        ))),
        _ => Ok(()),
    }
}

/// TEI's `PredictRequest`.
#[derive(Deserialize)]
struct PredictRequest {
    inputs: Value,
    #[serde(default)]
    truncate: Option<bool>,
    #[serde(default)]
    truncation_direction: Option<String>,
    #[serde(default)]
    raw_scores: bool,
}

/// One label's score in a `/predict` answer.
#[derive(Serialize)]
struct Prediction<'a> {
    score: f32,
    label: &'a str,
}

/// A text, or a `(text, text_pair)` pair.
type Item = (String, Option<String>);

/// `/predict`'s `inputs` as TEI reads them: a string or a `[text, text_pair]` is one input
/// (answered with one list); a list of strings and pairs is a batch (a list of lists).
fn predict_inputs(v: Value) -> std::result::Result<(Vec<Item>, bool), TeiError> {
    fn one(v: &Value) -> Option<(String, Option<String>)> {
        match v {
            Value::String(s) => Some((s.clone(), None)),
            Value::Array(p) => match &p[..] {
                [Value::String(a), Value::String(b)] => Some((a.clone(), Some(b.clone()))),
                _ => None,
            },
            _ => None,
        }
    }
    let bad = || {
        TeiError::validation(
            "inputs must be a string, a [text, text_pair] pair, or a list of strings and pairs",
        )
    };
    match &v {
        Value::String(_) => Ok((vec![one(&v).ok_or_else(bad)?], true)),
        Value::Array(items) if items.is_empty() => Err(TeiError::new(
            StatusCode::BAD_REQUEST,
            ErrorType::Empty,
            "Input cannot be empty",
        )),
        Value::Array(items) if items.len() == 2 && items.iter().all(Value::is_string) => {
            Ok((vec![one(&v).ok_or_else(bad)?], true))
        }
        Value::Array(items) => Ok((
            items
                .iter()
                .map(|i| one(i).ok_or_else(bad))
                .collect::<Result<_, _>>()?,
            false,
        )),
        _ => Err(bad()),
    }
}

/// `POST /predict`: the served classifier's scores for each label, best first: softmax over
/// the labels (the sigmoid for a one-label model), or the logits with `raw_scores`. One
/// input (a string or a pair) is answered with one list of `{score, label}`; a batch with a
/// list of such lists, in order.
pub async fn predict(
    State(state): State<Arc<AppState>>,
    arrival: Arrival,
    body: std::result::Result<Body, Error>,
) -> std::result::Result<Response, TeiError> {
    phase(Phase::Read);
    let deadline = arrival.deadline(state.config.request_timeout);
    let Body(body) = body?;
    let req: PredictRequest = parse(&body, "predict")?;
    check_direction(req.truncation_direction.as_deref())?;
    let model = classifier(&state)?;
    let c = as_classifier(&model)?;
    let (items, single) = predict_inputs(req.inputs)?;
    check_batch_size(items.len(), &state)?;
    phase(Phase::Parse);
    let truncate = req.truncate.unwrap_or(c.truncates());
    let tokens = c
        .tokenize_items(items, truncate, deadline)
        .await
        .map_err(refused)?;
    phase(Phase::Tokenize);
    let logits = c.logits(tokens, deadline).await?;
    phase(Phase::Queue);
    let labels = c.labels();
    let answers: Vec<Vec<Prediction>> = logits
        .iter()
        .map(|l| {
            let scores = if req.raw_scores {
                l.clone()
            } else {
                streampool_nn::tasks::scores(l)
            };
            let mut p: Vec<Prediction> = scores
                .into_iter()
                .zip(labels)
                .map(|(score, label)| Prediction { score, label })
                .collect();
            p.sort_by(|a, b| b.score.total_cmp(&a.score));
            p
        })
        .collect();
    let resp = if single {
        Json(&answers[0]).into_response()
    } else {
        Json(&answers).into_response()
    };
    phase(Phase::Encode);
    Ok(resp)
}

/// `POST /`: the main task of the served model, as TEI answers its root: `/embed` when an
/// embedder is served, else `/predict` (`huggingface_hub`'s `InferenceClient` posts here).
pub async fn root(
    state: State<Arc<AppState>>,
    arrival: Arrival,
    body: std::result::Result<Body, Error>,
) -> std::result::Result<Response, TeiError> {
    if state.registry.first_embedder().is_none() && state.registry.first_classifier().is_some() {
        return predict(state, arrival, body).await;
    }
    embed(state, arrival, body).await
}

/// `GET /info`: TEI's model and router facts for the first embedder (or, serving none, the
/// first classifier).
pub async fn info(State(state): State<Arc<AppState>>) -> std::result::Result<Response, TeiError> {
    if state.registry.first_embedder().is_none() {
        if let Some(name) = state.registry.first_classifier() {
            let model = state.registry.get(&name)?;
            let c = as_classifier(&model)?;
            let id2label: serde_json::Map<String, Value> = c
                .labels()
                .iter()
                .enumerate()
                .map(|(i, l)| (i.to_string(), json!(l)))
                .collect();
            let kind = if c.labels().len() == 1 {
                json!({"reranker": {"id2label": id2label}})
            } else {
                json!({"classifier": {"id2label": id2label}})
            };
            return Ok(Json(info_body(
                &state,
                &name,
                kind,
                c.max_seq_len(),
                c.truncates(),
                model.labels().len(),
            ))
            .into_response());
        }
    }
    let name = state.registry.first_embedder().ok_or_else(|| {
        TeiError::new(
            StatusCode::FAILED_DEPENDENCY,
            ErrorType::Backend,
            "no embedding model is served",
        )
    })?;
    let model = state.registry.get(&name)?;
    let ServedModel::Embedder(e) = &*model else {
        return Err(Error::Internal("first embedder is not an embedder".into()).into());
    };
    let kind = json!({"embedding": {"pooling": e.pooling_name()}});
    Ok(Json(info_body(
        &state,
        &name,
        kind,
        e.max_seq_len(),
        e.truncates(),
        model.labels().len(),
    ))
    .into_response())
}

/// TEI's `/info` body.
fn info_body(
    state: &AppState,
    name: &str,
    model_type: Value,
    max_input: usize,
    truncates: bool,
    replicas: usize,
) -> Value {
    let batch = &state.config.batch;
    json!({
        "model_id": name,
        "model_sha": null,
        "model_dtype": "float32",
        "model_type": model_type,
        "max_concurrent_requests": batch.max_queue * replicas,
        "max_input_length": max_input,
        "max_batch_tokens": batch.max_batch_size * max_input,
        "max_batch_requests": batch.max_batch_size,
        "max_client_batch_size": state.config.max_inputs,
        "auto_truncate": truncates,
        "tokenization_workers": 1,
        "version": env!("CARGO_PKG_VERSION"),
        "sha": null,
        "docker_label": null,
    })
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
