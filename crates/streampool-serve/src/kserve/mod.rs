//! The KServe v2 / Triton HTTP inference protocol: health, metadata, readiness and infer.

pub mod repository;
pub mod tensors;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::body::Body;
use crate::deadline::Arrival;
use crate::state::AppState;
use crate::tenants::Caller;
use crate::{Error, Result};
use streampool_core::{ClassifierEndpoint, EmbedderEndpoint, ServedModel, TensorEndpoint};
use tensors::{Data, InferRequest, Input, Output, HEADER_LENGTH};

/// `GET /v2`: server metadata.
pub async fn server_metadata() -> Json<Value> {
    Json(json!({
        "name": "streampool",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": ["binary_tensor_data", "model_repository"],
    }))
}

/// `GET /v2/health/live`: the process is up.
pub async fn live() -> StatusCode {
    StatusCode::OK
}

/// `GET /v2/health/ready`: every model is loaded (they are before the socket opens) and the
/// server is not shutting down.
pub async fn ready(State(state): State<Arc<AppState>>) -> StatusCode {
    if state.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

/// `GET /v2/models/{name}/ready`.
pub async fn model_ready(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<StatusCode> {
    caller.model(&state.registry, &name)?;
    Ok(if state.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    })
}

/// `GET /v2/models/{name}/versions/{version}/ready`.
pub async fn model_version_ready(
    state: State<Arc<AppState>>,
    caller: Caller,
    Path((name, version)): Path<(String, String)>,
) -> Result<StatusCode> {
    check_version(&version)?;
    model_ready(state, caller, Path(name)).await
}

/// `GET /v2/models/{name}`: inputs and outputs with their datatypes and shapes (-1: any).
pub async fn model_metadata(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>> {
    let model = caller.model(&state.registry, &name)?;
    let (inputs, outputs) = match &*model {
        ServedModel::Embedder(e) => (
            json!([
                {"name": "text", "datatype": "BYTES", "shape": [-1]},
                {"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]},
                {"name": "attention_mask", "datatype": "INT64", "shape": [-1, -1]},
            ]),
            json!([{"name": "embedding", "datatype": "FP32", "shape": [-1, e.dim()]}]),
        ),
        ServedModel::Classifier(c) => (
            json!([{"name": "text", "datatype": "BYTES", "shape": [-1]}]),
            json!([{"name": "logits", "datatype": "FP32", "shape": [-1, c.labels().len()]}]),
        ),
        ServedModel::Tensor(t) => (
            json!([{"name": "input", "datatype": "FP32", "shape": [-1, t.model().in_features()]}]),
            json!([{"name": "output", "datatype": "FP32", "shape": [-1, t.model().out_features()]}]),
        ),
    };
    Ok(Json(json!({
        "name": name,
        "versions": ["1"],
        "platform": "streampool",
        "inputs": inputs,
        "outputs": outputs,
    })))
}

/// `GET /v2/models/{name}/versions/{version}`.
pub async fn model_version_metadata(
    state: State<Arc<AppState>>,
    caller: Caller,
    Path((name, version)): Path<(String, String)>,
) -> Result<Json<Value>> {
    check_version(&version)?;
    model_metadata(state, caller, Path(name)).await
}

fn check_version(version: &str) -> Result<()> {
    if version == "1" || version.is_empty() {
        Ok(())
    } else {
        Err(Error::NotFound(format!(
            "unknown model version {} (only \"1\")",
            streampool_nn::Quoted(version)
        )))
    }
}

/// `POST /v2/models/{name}/infer`: JSON tensors, or the binary-data extension.
pub async fn infer(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(name): Path<String>,
    arrival: Arrival,
    headers: HeaderMap,
    body: std::result::Result<Body, Error>,
) -> Result<Response> {
    let deadline = arrival.deadline(state.config.request_timeout);
    let Body(body) = body?;
    let model = caller.model(&state.registry, &name)?;
    let header_len = headers.get(HEADER_LENGTH).and_then(|v| v.to_str().ok());
    let (json_part, binary) = tensors::split_body(&body, header_len)?;
    let req: InferRequest = serde_json::from_slice(json_part)
        .map_err(|e| Error::BadRequest(format!("malformed inference request: {e}")))?;
    let inputs = tensors::decode_inputs(&req, binary, state.config.max_elements)?;
    let outputs = match &*model {
        ServedModel::Embedder(e) => {
            // Request parameters `prompt_name` / `prompt`, as sentence-transformers' encode.
            let text_param = |key: &str| -> Result<Option<&str>> {
                match req.parameters.get(key) {
                    None => Ok(None),
                    Some(Value::String(s)) => Ok(Some(s.as_str())),
                    Some(other) => Err(Error::BadRequest(format!(
                        "parameter {key:?} must be a string, got {}",
                        streampool_nn::Quoted(&other.to_string())
                    ))),
                }
            };
            let prompt = e.prompt(text_param("prompt_name")?, text_param("prompt")?)?;
            infer_embedder(&state, &caller, e, inputs, prompt, deadline).await?
        }
        ServedModel::Classifier(c) => {
            infer_classifier(&state, &caller, c, inputs, deadline).await?
        }
        ServedModel::Tensor(t) => infer_tensor(&state, t, inputs, deadline).await?,
    };
    let outputs = select_outputs(&req, outputs)?;
    let (body, header_len) = tensors::encode_response(&name, req.id.as_deref(), &outputs)?;
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    match header_len {
        Some(n) => {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            h.insert(HEADER_LENGTH, HeaderValue::from(n));
        }
        None => {
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
    }
    Ok(resp)
}

/// `POST /v2/models/{name}/versions/{version}/infer`.
pub async fn infer_version(
    state: State<Arc<AppState>>,
    caller: Caller,
    Path((name, version)): Path<(String, String)>,
    arrival: Arrival,
    headers: HeaderMap,
    body: std::result::Result<Body, Error>,
) -> Result<Response> {
    check_version(&version)?;
    infer(state, caller, Path(name), arrival, headers, body).await
}

/// The outputs the request asked for (all when it names none), each flagged binary or not.
fn select_outputs(req: &InferRequest, outputs: Vec<Output>) -> Result<Vec<(Output, bool)>> {
    let wants_binary = |params: &serde_json::Map<String, Value>, key: &str| {
        params.get(key).and_then(Value::as_bool).unwrap_or(false)
    };
    let Some(wanted) = &req.outputs else {
        let binary = wants_binary(&req.parameters, "binary_data_output");
        return Ok(outputs.into_iter().map(|o| (o, binary)).collect());
    };
    let mut all = outputs;
    wanted
        .iter()
        .map(|w| {
            let at = all.iter().position(|o| o.name == w.name).ok_or_else(|| {
                Error::BadRequest(format!("unknown output {}", streampool_nn::Quoted(&w.name)))
            })?;
            Ok((
                all.swap_remove(at),
                wants_binary(&w.parameters, "binary_data"),
            ))
        })
        .collect()
}

fn take_input(inputs: &mut Vec<Input>, name: &str) -> Option<Input> {
    let at = inputs.iter().position(|i| i.name == name)?;
    Some(inputs.swap_remove(at))
}

fn no_extra_inputs(inputs: &[Input], expected: &str) -> Result<()> {
    match inputs.first() {
        Some(extra) => Err(Error::BadRequest(format!(
            "unexpected input {:?}; this model takes {expected}",
            extra.name
        ))),
        None => Ok(()),
    }
}

fn check_rows(state: &AppState, rows: usize) -> Result<()> {
    if rows == 0 {
        return Err(Error::BadRequest("the request has no inputs".into()));
    }
    if rows > state.config.max_inputs {
        return Err(Error::TooLarge(format!(
            "{rows} inputs exceed the maximum of {} per request",
            state.config.max_inputs
        )));
    }
    Ok(())
}

/// The texts of a `text` input (BYTES, shape [N] or [N, 1], UTF-8, within `max_inputs`).
fn texts_of(state: &AppState, text: Input) -> Result<Vec<String>> {
    let rows = match text.shape[..] {
        [n] | [n, 1] => n,
        _ => {
            return Err(Error::BadRequest(format!(
                "input \"text\" must have shape [N] or [N, 1], got {:?}",
                text.shape
            )))
        }
    };
    check_rows(state, rows)?;
    let Data::Bytes(items) = text.data else {
        return Err(Error::BadRequest(format!(
            "input \"text\" must be BYTES, got {}",
            text.data.datatype()
        )));
    };
    items
        .into_iter()
        .map(|b| {
            String::from_utf8(b)
                .map_err(|_| Error::BadRequest("input \"text\": not valid UTF-8".into()))
        })
        .collect()
}

async fn infer_embedder(
    state: &AppState,
    caller: &Caller,
    e: &EmbedderEndpoint,
    mut inputs: Vec<Input>,
    prompt: Option<String>,
    deadline: Instant,
) -> Result<Vec<Output>> {
    const EXPECTED: &str =
        "\"text\" (BYTES [N]) or \"input_ids\" (INT64 [N, S]) with an optional \"attention_mask\"";
    let ids = if let Some(text) = take_input(&mut inputs, "text") {
        no_extra_inputs(&inputs, EXPECTED)?;
        let texts = texts_of(state, text)?;
        e.tokenize_texts(texts, prompt.as_deref(), e.truncates(), deadline)
            .await?
    } else if let Some(input_ids) = take_input(&mut inputs, "input_ids") {
        let mask = take_input(&mut inputs, "attention_mask");
        no_extra_inputs(&inputs, EXPECTED)?;
        token_rows(state, e, input_ids, mask)?
    } else {
        return Err(Error::BadRequest(format!("this model takes {EXPECTED}")));
    };
    let rows = ids.len();
    caller.charge_tokens(ids.iter().map(Vec::len).sum());
    let vectors = e.embed(ids, deadline).await?;
    Ok(vec![Output {
        name: "embedding".into(),
        shape: vec![rows, e.dim()],
        values: vectors.concat(),
    }])
}

/// A classifier's `text` (BYTES [N]) to `logits` (FP32 [N, labels]).
async fn infer_classifier(
    state: &AppState,
    caller: &Caller,
    c: &ClassifierEndpoint,
    mut inputs: Vec<Input>,
    deadline: Instant,
) -> Result<Vec<Output>> {
    const EXPECTED: &str = "\"text\" (BYTES [N])";
    let Some(text) = take_input(&mut inputs, "text") else {
        return Err(Error::BadRequest(format!("this model takes {EXPECTED}")));
    };
    no_extra_inputs(&inputs, EXPECTED)?;
    let texts = texts_of(state, text)?;
    let rows = texts.len();
    let items = texts.into_iter().map(|t| (t, None)).collect();
    let tokenized = c.tokenize_items(items, c.truncates(), deadline).await?;
    caller.charge_tokens(tokenized.iter().map(|(ids, _)| ids.len()).sum());
    let logits = c.logits(tokenized, deadline).await?;
    Ok(vec![Output {
        name: "logits".into(),
        shape: vec![rows, c.labels().len()],
        values: logits.concat(),
    }])
}

/// Rows of token ids from `input_ids [N, S]`, keeping the positions where the mask is not 0.
fn token_rows(
    state: &AppState,
    e: &EmbedderEndpoint,
    ids: Input,
    mask: Option<Input>,
) -> Result<Vec<Vec<i64>>> {
    let [rows, seq] = ids.shape[..] else {
        return Err(Error::BadRequest(format!(
            "input \"input_ids\" must have shape [N, S], got {:?}",
            ids.shape
        )));
    };
    check_rows(state, rows)?;
    let Data::I64(ids_data) = ids.data else {
        return Err(Error::BadRequest(format!(
            "input \"input_ids\" must be INT64, got {}",
            ids.data.datatype()
        )));
    };
    let mask_data = match mask {
        None => None,
        Some(m) => {
            if m.shape != ids.shape {
                return Err(Error::BadRequest(format!(
                    "attention_mask shape {:?} differs from input_ids shape {:?}",
                    m.shape, ids.shape
                )));
            }
            match m.data {
                Data::I64(v) => Some(v),
                other => {
                    return Err(Error::BadRequest(format!(
                        "input \"attention_mask\" must be INT64, got {}",
                        other.datatype()
                    )))
                }
            }
        }
    };
    (0..rows)
        .map(|r| {
            let span = r * seq..(r + 1) * seq;
            let row: Vec<i64> = match &mask_data {
                None => ids_data[span].to_vec(),
                Some(m) => ids_data[span.clone()]
                    .iter()
                    .zip(&m[span])
                    .filter(|(_, &keep)| keep != 0)
                    .map(|(&id, _)| id)
                    .collect(),
            };
            e.check_ids(row).map_err(Error::from)
        })
        .collect()
}

async fn infer_tensor(
    state: &AppState,
    t: &TensorEndpoint,
    mut inputs: Vec<Input>,
    deadline: Instant,
) -> Result<Vec<Output>> {
    let width = t.model().in_features();
    let expected = format!("\"input\" (FP32 [N, {width}])");
    let input = take_input(&mut inputs, "input")
        .ok_or_else(|| Error::BadRequest(format!("this model takes {expected}")))?;
    no_extra_inputs(&inputs, &expected)?;
    let rows = match input.shape[..] {
        [n, w] if w == width => n,
        _ => {
            return Err(Error::BadRequest(format!(
                "input \"input\" must have shape [N, {width}], got {:?}",
                input.shape
            )))
        }
    };
    check_rows(state, rows)?;
    let Data::F32(values) = input.data else {
        return Err(Error::BadRequest(format!(
            "input \"input\" must be FP32, got {}",
            input.data.datatype()
        )));
    };
    let rows_in: Vec<Vec<f32>> = values.chunks_exact(width).map(<[f32]>::to_vec).collect();
    let out = t.infer(rows_in, deadline).await?;
    Ok(vec![Output {
        name: "output".into(),
        shape: vec![rows, t.model().out_features()],
        values: out.concat(),
    }])
}

/// Answers every path the router does not know with a KServe-style 404.
pub async fn fallback() -> Response {
    Error::NotFound("no such endpoint".into()).into_response()
}
