//! The state every handler shares: the models, the settings, the metrics and whether the
//! server is shutting down. Handlers depend on this module; the router depends on handlers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::metrics::Metrics;
use crate::tenants::{TenantTable, Tenants};
use crate::{Result, ServeConfig};
use streampool_core::{ModelSpec, Registry};

/// What every handler shares: the models, the settings, the tenants and the metrics.
pub struct AppState {
    pub(crate) registry: Arc<Registry>,
    pub(crate) config: ServeConfig,
    pub(crate) metrics: Metrics,
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
        config.validate()?;
        let tenants = match (&config.tenants_file, &config.api_key) {
            (Some(path), _) => Some(Arc::new(TenantTable::from_file(path)?)),
            (None, Some(key)) => Some(Arc::new(TenantTable::new(Tenants::single(key)))),
            (None, None) => None,
        };
        let registry = Arc::new(Registry::new(models, &config.model_config())?);
        let mut metrics = Metrics::new(registry.clone());
        if let Some(table) = &tenants {
            metrics.register_tenants(table.clone());
        }
        Ok(Arc::new(Self {
            metrics,
            tenants,
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
    /// accepting (models are loaded before the socket opens; a replica whose queue was shut
    /// down makes the server unready).
    pub(crate) fn is_ready(&self) -> bool {
        !self.shutting_down.load(Ordering::Acquire)
            && self.registry.iter().all(|(_, m)| m.is_accepting())
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
