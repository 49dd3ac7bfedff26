//! KServe v2's model repository extension: list the repository, load (or replace) and
//! unload models while the server serves.
//!
//! - `POST /v2/repository/index`: every model folder of the repository and every served
//!   model, with `state` `READY` or `UNAVAILABLE` (body `{"ready": true}`: only the served
//!   ones); streampool adds each served model's device memory (`memory_bytes`) and
//!   scheduling class (`priority`, `weight`).
//! - `POST /v2/repository/models/{name}/load`: loads the repository folder `name`, or
//!   replaces the served model of that name (the old copy finishes its requests first).
//!   404 when the repository has no such folder, 507 when it would not fit the device's
//!   memory (the message says how much it needs and how much is free), 400 for a folder
//!   that cannot be read.
//! - `POST /v2/repository/models/{name}/unload`: stops serving `name`; requests in flight
//!   on it finish, then its memory is freed.
//!
//! Loads and unloads run on a blocking thread, one at a time: requests to the other models
//! never wait for them.
//!
//! With tenants, the index lists only the models the caller's tenant may call, and only a
//! tenant allowed every model may load and unload (for the others these two routes answer
//! 404, as on a server that does not manage its models): a tenant limited to some models
//! must not take a model away from the others.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use crate::body::Body;
use crate::state::AppState;
use crate::tenants::Caller;
use crate::{Error, Result};
use streampool_core::ModelLoader;

/// `POST /v2/repository/index`.
pub async fn index(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    body: std::result::Result<Body, Error>,
) -> Result<Json<Value>> {
    let body = body?.0;
    let ready_only = if body.is_empty() {
        false
    } else {
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| Error::BadRequest(format!("invalid JSON: {e}")))?;
        v.get("ready").and_then(Value::as_bool).unwrap_or(false)
    };
    let entries = match &state.loader {
        Some(loader) => loader.index(&state.registry)?,
        None => state
            .registry
            .snapshot()
            .into_iter()
            .map(|(name, _)| streampool_core::RepositoryEntry { name, ready: true })
            .collect(),
    };
    let list: Vec<Value> = entries
        .into_iter()
        .filter(|e| (e.ready || !ready_only) && caller.may_call(&e.name))
        .map(|e| {
            let mut v = json!({
                "name": e.name,
                "version": "1",
                "state": if e.ready { "READY" } else { "UNAVAILABLE" },
                "reason": "",
            });
            if let Some(info) = state.registry.info(&e.name) {
                v["memory_bytes"] = json!(info.resident_total());
                v["priority"] = json!(info.priority.as_str());
                v["weight"] = json!(info.weight);
            }
            v
        })
        .collect();
    Ok(Json(Value::Array(list)))
}

/// `POST /v2/repository/models/{name}/load`.
pub async fn load(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>> {
    let loader = loader(&state, &caller)?;
    let registry = state.registry.clone();
    let loaded = tokio::task::spawn_blocking(move || loader.load(&registry, &name))
        .await
        .map_err(|e| Error::Internal(format!("the load task failed: {e}")))?;
    match loaded {
        Ok(_) => Ok(Json(json!({}))),
        // A folder that cannot be read or served is the caller's to fix.
        Err(streampool_core::Error::Config(m)) => Err(Error::BadRequest(m)),
        Err(e) => Err(e.into()),
    }
}

/// `POST /v2/repository/models/{name}/unload`.
pub async fn unload(
    State(state): State<Arc<AppState>>,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<Value>> {
    let loader = loader(&state, &caller)?;
    let registry = state.registry.clone();
    tokio::task::spawn_blocking(move || loader.unload(&registry, &name))
        .await
        .map_err(|e| Error::Internal(format!("the unload task failed: {e}")))??;
    Ok(Json(json!({})))
}

/// The loader, for a caller that may manage models ([`Caller::may_manage`]); otherwise,
/// as without a loader, 404.
fn loader(state: &AppState, caller: &Caller) -> Result<Arc<ModelLoader>> {
    let loader = state.loader.clone().filter(|_| caller.may_manage());
    loader.ok_or_else(|| {
        Error::NotFound(
            "this server does not manage its models (start it with a model loader: \
             `streampool serve` always has one, with --model-dir for a repository)"
                .into(),
        )
    })
}
