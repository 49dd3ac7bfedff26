//! The router over the handlers, and starting and stopping a server.

use std::any::Any;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tower_http::catch_panic::CatchPanicLayer;

use crate::state::AppState;
use crate::{
    auth, connections, kserve, metrics, openai, rerank, tei, tenants, Error, Result, ServeConfig,
};
use streampool_core::ModelSpec;

/// Every route of the server on `state`: KServe v2 under `/v2`, OpenAI's `/v1/embeddings`
/// and `/v1/models`, text-embeddings-inference's `/embed`, `/rerank`, `/predict`, `/info`
/// and `/health`, and
/// `/metrics` ([`routes`]), behind the layers of [`harden`].
pub fn router(state: Arc<AppState>) -> Router {
    harden(routes(&state), state)
}

/// The server's routes and handlers without the protective layers of [`harden`] (each
/// request still recorded in the metrics): to add routes of your own before hardening all.
pub fn routes(state: &Arc<AppState>) -> Router<Arc<AppState>> {
    Router::new()
        .route("/v2", get(kserve::server_metadata))
        .route("/v2/health/live", get(kserve::live))
        .route("/v2/health/ready", get(kserve::ready))
        .route("/v2/models/{name}", get(kserve::model_metadata))
        .route("/v2/models/{name}/ready", get(kserve::model_ready))
        .route("/v2/models/{name}/infer", post(kserve::infer))
        .route(
            "/v2/models/{name}/versions/{version}",
            get(kserve::model_version_metadata),
        )
        .route(
            "/v2/models/{name}/versions/{version}/ready",
            get(kserve::model_version_ready),
        )
        .route(
            "/v2/models/{name}/versions/{version}/infer",
            post(kserve::infer_version),
        )
        .route("/v2/repository/index", post(kserve::repository::index))
        .route(
            "/v2/repository/models/{name}/load",
            post(kserve::repository::load),
        )
        .route(
            "/v2/repository/models/{name}/unload",
            post(kserve::repository::unload),
        )
        .route("/v1/embeddings", post(openai::embeddings))
        .route("/v1/rerank", post(rerank::rerank))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{id}", get(openai::model))
        .route("/embed", post(tei::embed))
        .route("/rerank", post(tei::rerank))
        .route("/predict", post(tei::predict))
        // TEI answers its model's main task on `/` too; `huggingface_hub` posts there.
        .route("/", post(tei::root))
        .route("/info", get(tei::info))
        .route("/health", get(tei::health))
        .route("/metrics", get(metrics::scrape))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            metrics::track,
        ))
        .fallback(kserve::fallback)
}

/// The layers every route of the server runs behind, outermost first:
/// - each request is stamped with its arrival ([`Arrival`](crate::Arrival)): its
///   [`ServeConfig::request_timeout`] counts from then;
/// - a handler that panics answers 500 for its own request only (counted in
///   `streampool_http_panics_total`); the connection, the other requests and the server
///   go on;
/// - the API key check, when [`ServeConfig::api_key`] or [`ServeConfig::tenants_file`] is
///   set (see the `auth` module: probes open, `/metrics` as
///   [`ServeConfig::protect_metrics`] says), with the key's tenant's limits;
/// - the body size limit for any extractor (the handlers' own reader also enforces it, and
///   [`ServeConfig::body_timeout`]).
///
/// Public so that routes added next to the server's get the same protection.
///
/// ```
/// use std::sync::Arc;
/// use axum::routing::get;
/// use streampool::Device;
/// use streampool_serve::{harden, routes, AppState, ModelSpec, ServeConfig, TensorModel};
/// let mlp = TensorModel::mlp(&Device::cpu(), 8, 1).unwrap();
/// let state = AppState::new(ServeConfig::default(), vec![ModelSpec::Tensor { name: "mlp".into(), model: mlp }]).unwrap();
/// let app: axum::Router = harden(routes(&state).route("/extra", get(|| async { "hi" })), state);
/// ```
pub fn harden(routes: Router<Arc<AppState>>, state: Arc<AppState>) -> Router {
    let for_panics = state.clone();
    routes
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_key,
        ))
        .layer(CatchPanicLayer::custom(
            move |payload: Box<dyn Any + Send + 'static>| {
                for_panics.metrics.record_panic();
                let what = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "no message".into());
                let what: String = what.chars().take(200).collect();
                tracing::error!(panic = %what, "a request handler panicked; answered 500");
                Error::Panicked(what).into_response()
            },
        ))
        // Outermost: the request's deadline counts from here.
        .layer(axum::middleware::from_fn(crate::deadline::stamp))
        .with_state(state)
}

/// Starts servers.
pub struct Server;

impl Server {
    /// Loads the models' queues, binds `config.addr` and serves on the current tokio runtime
    /// until [`ServerHandle::shutdown`]. Port 0 binds a free port; [`ServerHandle::addr`]
    /// says which. With [`ServeConfig::tenants_file`], a task re-reads the file every
    /// [`ServeConfig::tenants_poll_interval`] until shutdown.
    ///
    /// Connections are HTTP/1 with keep-alive. One that has not sent its request headers
    /// within [`ServeConfig::header_read_timeout`] (from its accept, or from the first byte
    /// of a later request), or that stays idle between requests past
    /// [`ServeConfig::keep_alive_timeout`], is closed. Past
    /// [`ServeConfig::max_connections`] open at once, a new connection gets
    /// `503 Service Unavailable` with `Retry-After: 1` and `Connection: close` (a few dozen
    /// such answers at once; past those it is closed unanswered), and the connections
    /// already open are served as before. A failed `accept` (e.g. out of file descriptors)
    /// is logged, paused on briefly and retried; it never stops the server.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// use std::sync::Arc;
    /// use streampool::Device;
    /// use streampool_serve::{ModelSpec, ServeConfig, Server, TensorModel};
    /// let config = ServeConfig { addr: "127.0.0.1:0".parse().unwrap(), ..Default::default() };
    /// let mlp = TensorModel::mlp(&Device::cpu(), 8, 1).unwrap();
    /// let server = Server::start(config, vec![ModelSpec::Tensor { name: "mlp".into(), model: mlp }])
    ///     .await
    ///     .unwrap();
    /// assert_ne!(server.addr().port(), 0);
    /// server.shutdown().await.unwrap();
    /// # }
    /// ```
    pub async fn start(config: ServeConfig, models: Vec<ModelSpec>) -> Result<ServerHandle> {
        Self::serve_state(AppState::new(config, models)?).await
    }

    /// [`start`](Self::start) on a state built beforehand (e.g. by
    /// [`AppState::with_loader`], with models loaded through its loader).
    pub async fn serve_state(state: Arc<AppState>) -> Result<ServerHandle> {
        let addr = state.config.addr;
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let (tx, rx) = oneshot::channel::<()>();
        let app = router(state.clone());
        // A dropped sender (the handle went away) shuts down too.
        let task = tokio::spawn(connections::serve(
            listener,
            app,
            connections::Limits::new(&state.config),
            rx,
        ));
        let reload = match (&state.tenants, &state.config.tenants_file) {
            (Some(table), Some(path)) => Some(tenants::watch(
                table,
                path.clone(),
                state.config.tenants_poll_interval,
            )),
            _ => None,
        };
        let names: Vec<String> = state
            .registry()
            .snapshot()
            .iter()
            .map(|(n, m)| format!("{n} on {}", m.labels().join(",")))
            .collect();
        tracing::info!(%addr, models = ?names, "serving");
        Ok(ServerHandle {
            addr,
            state,
            stop: tx,
            task,
            reload,
        })
    }
}

/// A running server: its address, and how to stop it.
pub struct ServerHandle {
    addr: SocketAddr,
    state: Arc<AppState>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
    /// The task that re-reads the tenants file, if there is one.
    reload: Option<JoinHandle<()>>,
}

impl ServerHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The shared state (models, metrics).
    pub fn state(&self) -> &Arc<AppState> {
        &self.state
    }

    /// Graceful shutdown (drain): readiness turns 503, the listener closes (new connections
    /// are refused), idle keep-alive connections close, every request already accepted is
    /// answered, then the models' queues drain and their workers stop.
    ///
    /// Bounded by [`ServeConfig::drain_timeout`]: past it, this returns
    /// [`Error::DrainTimeout`] and the requests still open are abandoned (they end when the
    /// runtime stops). The server keeps no state between requests, so a replica that drains
    /// loses nothing a client would have to re-send.
    pub async fn shutdown(self) -> Result<()> {
        let limit = self.state.config.drain_timeout;
        tracing::info!(?limit, "shutting down: answering the requests in flight");
        self.state.begin_shutdown();
        if let Some(reload) = &self.reload {
            reload.abort();
        }
        // The server may have ended on its own (an I/O error); its result says so below.
        let _ = self.stop.send(());
        let (task, state) = (self.task, self.state);
        let drain = async move {
            let served = task
                .await
                .map_err(|e| Error::Internal(format!("server task failed: {e}")))?;
            // Joining the queues' worker threads blocks: do it off the async workers.
            tokio::task::spawn_blocking(move || drop(state))
                .await
                .map_err(|e| Error::Internal(format!("stopping the queues failed: {e}")))?;
            Ok::<_, Error>(served?)
        };
        match tokio::time::timeout(limit, drain).await {
            Ok(result) => {
                tracing::info!("stopped");
                result
            }
            Err(_) => {
                tracing::warn!(?limit, "drain timeout: abandoning the requests still open");
                Err(Error::DrainTimeout(limit))
            }
        }
    }

    /// Serves until SIGINT (Ctrl-C) or SIGTERM, then shuts down gracefully
    /// ([`shutdown`](Self::shutdown), bounded by [`ServeConfig::drain_timeout`]).
    pub async fn run_until_signal(self) -> Result<()> {
        wait_for_signal().await?;
        self.shutdown().await
    }
}

#[cfg(unix)]
async fn wait_for_signal() -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
    Ok(())
}

#[cfg(not(unix))]
async fn wait_for_signal() -> Result<()> {
    tokio::signal::ctrl_c().await?;
    Ok(())
}
