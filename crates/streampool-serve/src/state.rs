//! The state every handler shares: the models, the settings, the metrics and whether the
//! server is shutting down. Handlers depend on this module; the router depends on handlers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::metrics::Metrics;
use crate::tenants::{TenantTable, Tenants};
use crate::{Result, ServeConfig};
use streampool_core::{ModelLoader, ModelSpec, Registry};

/// What every handler shares: the models, the settings, the tenants and the metrics.
pub struct AppState {
    pub(crate) registry: Arc<Registry>,
    pub(crate) config: ServeConfig,
    pub(crate) metrics: Metrics,
    /// Loads and unloads models at run time (the repository routes); `None`: the set is
    /// fixed at start-up and the repository routes answer 404.
    pub(crate) loader: Option<Arc<ModelLoader>>,
    /// The API keys (the tenants file, or the single key as one tenant); `None`: no key
    /// needed.
    pub(crate) tenants: Option<Arc<TenantTable>>,
    /// Set once shutdown begins: readiness then answers 503 so balancers stop sending.
    shutting_down: AtomicBool,
    /// When the models were loaded (OpenAI's `created` of `/v1/models`), Unix seconds.
    started_unix: u64,
}

impl AppState {
    /// Validates `config`, reads its tenants file if it has one, and starts one batch queue
    /// per model.
    pub fn new(config: ServeConfig, models: Vec<ModelSpec>) -> Result<Arc<Self>> {
        Self::with_loader(config, models, None)
    }

    /// Like [`new`](Self::new), plus a model loader, which serves the model repository
    /// routes (`/v2/repository/...`: load, replace and unload while serving). With a
    /// loader the server may start with no model (load them through it, before or after
    /// the socket opens).
    pub fn with_loader(
        config: ServeConfig,
        models: Vec<ModelSpec>,
        loader: Option<Arc<ModelLoader>>,
    ) -> Result<Arc<Self>> {
        config.validate()?;
        let tenants = match (&config.tenants_file, &config.api_key) {
            (Some(path), _) => Some(Arc::new(TenantTable::from_file(path)?)),
            (None, Some(key)) => Some(Arc::new(TenantTable::new(Tenants::single(key)))),
            (None, None) => None,
        };
        let registry = Arc::new(Registry::new(models, &config.model_config())?);
        if registry.is_empty() && loader.is_none() {
            return Err(crate::Error::Config("no models to serve".into()));
        }
        let mut metrics = Metrics::new(registry.clone());
        if let Some(table) = &tenants {
            metrics.register_tenants(table.clone());
        }
        Ok(Arc::new(Self {
            metrics,
            tenants,
            loader,
            registry,
            config,
            shutting_down: AtomicBool::new(false),
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }))
    }

    /// The served models.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The tenants in force now (`None`: the server needs no key).
    pub fn tenants(&self) -> Option<Arc<Tenants>> {
        self.tenants.as_ref().map(|t| t.snapshot())
    }

    /// The server's metrics (e.g. to turn on [`Metrics::set_phase_timing`]).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Ready to serve: not shutting down, and every replica of every model loaded and
    /// accepting (start-up models are loaded before the socket opens; a replica whose queue
    /// was shut down makes the server unready).
    pub(crate) fn is_ready(&self) -> bool {
        !self.shutting_down.load(Ordering::Acquire)
            && self
                .registry
                .snapshot()
                .iter()
                .all(|(_, m)| m.is_accepting())
    }

    /// The model loader, when the server manages a repository.
    pub fn loader(&self) -> Option<&Arc<ModelLoader>> {
        self.loader.as_ref()
    }

    /// When the models were loaded, in Unix seconds.
    pub(crate) fn started_unix(&self) -> u64 {
        self.started_unix
    }

    /// Readiness turns 503 from now on, so balancers stop sending.
    pub(crate) fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }
}
