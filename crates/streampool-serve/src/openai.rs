//! `POST /v1/embeddings`, compatible with the OpenAI embeddings API.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::body::Body;
use crate::deadline::Arrival;
use crate::error::bounded_message;
use crate::metrics::{phase, Phase};
use crate::state::AppState;
use crate::tenants::{Caller, Kind};
use crate::{Error, Result};
use streampool_core::ServedModel;
use streampool_nn::Quoted;

#[derive(Deserialize)]
struct EmbeddingsRequest {
    input: Value,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<usize>,
    /// Not OpenAI's: a prompt of the model's `config_sentence_transformers.json` by name
    /// (as TEI's and sentence-transformers' `prompt_name`).
    #[serde(default)]
    prompt_name: Option<String>,
    /// Not OpenAI's: a prompt to prepend to every input text (sentence-transformers'
    /// `prompt`).
    #[serde(default)]
    prompt: Option<String>,
}

/// An error in OpenAI's format: `{"error": {"message", "type", "param", "code"}}`.
pub struct OpenAiError(pub Error);

impl From<Error> for OpenAiError {
    fn from(e: Error) -> Self {
        Self(e)
    }
}

impl From<streampool_core::Error> for OpenAiError {
    fn from(e: streampool_core::Error) -> Self {
        Self(e.into())
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let kind = if self.0.status().is_client_error() {
            "invalid_request_error"
        } else {
            "server_error"
        };
        if self.0.status().is_server_error() {
            tracing::warn!(error = %bounded_message(self.0.to_string()), "embeddings request failed");
        }
        self.0.respond_with(json!({
            "error": {
                "message": bounded_message(self.0.to_string()),
                "type": kind,
                "param": null,
                "code": self.0.status().as_u16(),
            }
        }))
    }
}

/// `POST /v1/embeddings`: `input` is a string, a list of strings, a list of token ids or a
/// list of such lists; `model` names an embedder (default: the first one served);
/// `encoding_format` is `float` (default) or `base64` (little-endian f32, as the `openai`
/// Python client asks by default); `prompt_name` (one of the model's prompts) or `prompt`
/// (any text), extensions of the API, are prepended to every text (the model's default
/// prompt, if it has one, when neither is given). `usage` counts the tokens embedded,
/// special tokens and prompts included.
pub async fn embeddings(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    arrival: Arrival,
    body: std::result::Result<Body, Error>,
) -> std::result::Result<Response, OpenAiError> {
    phase(Phase::Read);
    let deadline = arrival.deadline(state.config.request_timeout);
    let Body(body) = body?;
    let req: EmbeddingsRequest = serde_json::from_slice(&body)
        .map_err(|e| Error::BadRequest(format!("malformed embeddings request: {e}")))?;
    let name = match req.model {
        Some(name) => name,
        None => caller
            .first(&state.registry, Kind::Embedder)
            .ok_or_else(|| Error::NotFound("no embedding model is served".into()))?,
    };
    let model = caller.model(&state.registry, &name)?;
    let ServedModel::Embedder(e) = &*model else {
        return Err(Error::BadRequest(format!(
            "model {} is not an embedding model",
            Quoted(&name)
        ))
        .into());
    };
    e.check_dimensions(req.dimensions)?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(Error::BadRequest(format!(
                "encoding_format {}: expected \"float\" or \"base64\"",
                Quoted(other)
            ))
            .into())
        }
    };
    let input = parse_input(req.input)?;
    let prompt = e.prompt(req.prompt_name.as_deref(), req.prompt.as_deref())?;
    phase(Phase::Parse);
    let ids = match input {
        Input::Texts(texts) => {
            check_count(&state, texts.len())?;
            e.tokenize_texts(texts, prompt.as_deref(), e.truncates(), deadline)
                .await?
        }
        Input::Tokens(rows) => {
            check_count(&state, rows.len())?;
            if req.prompt_name.is_some() || req.prompt.is_some() {
                return Err(Error::BadRequest(
                    "prompt_name and prompt apply to texts, not token ids".into(),
                )
                .into());
            }
            rows.into_iter()
                .map(|r| e.check_ids(r))
                .collect::<streampool_core::Result<Vec<_>>>()?
        }
    };
    phase(Phase::Tokenize);
    let tokens: usize = ids.iter().map(Vec::len).sum();
    caller.charge_tokens(tokens);
    let vectors = e.embed(ids, deadline).await?;
    phase(Phase::Queue);
    let data: Vec<Item> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| Item {
            object: "embedding",
            index,
            embedding: if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Embedding::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                Embedding::Float(v)
            },
        })
        .collect();
    let resp = Json(EmbeddingsResponse {
        object: "list",
        data,
        model: &name,
        usage: Usage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    })
    .into_response();
    phase(Phase::Encode);
    Ok(resp)
}

/// `GET /v1/models`: every served model the caller may call, in OpenAI's list format.
pub async fn models(State(state): State<Arc<AppState>>, caller: Caller) -> Json<Value> {
    let data: Vec<Value> = state
        .registry
        .snapshot()
        .iter()
        .filter(|(name, _)| caller.may_call(name))
        .map(|(name, _)| model_object(&state, name))
        .collect();
    Json(json!({ "object": "list", "data": data }))
}

/// `GET /v1/models/{id}`: one model, or OpenAI's 404 error.
pub async fn model(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> std::result::Result<Json<Value>, OpenAiError> {
    caller.model(&state.registry, &id)?;
    Ok(Json(model_object(&state, &id)))
}

fn model_object(state: &AppState, name: &str) -> Value {
    json!({
        "id": name,
        "object": "model",
        "created": state.started_unix(),
        "owned_by": "streampool",
    })
}

// Typed, not `serde_json::Value`: a `Value` holds every f32 as an f64 and prints ~17 digits;
// serialized as f32 each prints its shortest round-trip form (about half the bytes).
#[derive(Serialize)]
struct EmbeddingsResponse<'a> {
    object: &'static str,
    data: Vec<Item<'a>>,
    model: &'a str,
    usage: Usage,
}

#[derive(Serialize)]
struct Item<'a> {
    object: &'static str,
    index: usize,
    embedding: Embedding<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Embedding<'a> {
    Float(&'a [f32]),
    Base64(String),
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
}

/// An embeddings input: texts, or token-id rows.
pub(crate) enum Input {
    Texts(Vec<String>),
    Tokens(Vec<Vec<i64>>),
}

/// Parses OpenAI's (and TEI's) `input`: a string, a list of strings, a list of token ids or
/// a list of such lists.
pub(crate) fn parse_input(input: Value) -> Result<Input> {
    let wrong = || {
        Error::BadRequest(
            "input must be a string, a list of strings, a list of token ids or a list of lists of token ids"
                .into(),
        )
    };
    let ints = |items: &[Value]| -> Result<Vec<i64>> {
        items.iter().map(|v| v.as_i64().ok_or_else(wrong)).collect()
    };
    match input {
        Value::String(s) => Ok(Input::Texts(vec![s])),
        Value::Array(items) => match items.first() {
            None => Err(Error::BadRequest("input is an empty list".into())),
            Some(Value::String(_)) => items
                .into_iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s),
                    _ => Err(wrong()),
                })
                .collect::<Result<_>>()
                .map(Input::Texts),
            Some(Value::Number(_)) => Ok(Input::Tokens(vec![ints(&items)?])),
            Some(Value::Array(_)) => items
                .iter()
                .map(|row| row.as_array().ok_or_else(wrong).and_then(|r| ints(r)))
                .collect::<Result<_>>()
                .map(Input::Tokens),
            Some(_) => Err(wrong()),
        },
        _ => Err(wrong()),
    }
}

fn check_count(state: &AppState, n: usize) -> Result<()> {
    if n > state.config.max_inputs {
        return Err(Error::TooLarge(format!(
            "{n} inputs exceed the maximum of {} per request",
            state.config.max_inputs
        )));
    }
    Ok(())
}
