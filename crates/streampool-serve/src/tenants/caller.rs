//! Which models a request may see: every route resolves model names through its
//! [`Caller`], so a model its tenant may not call answers exactly as an absent one.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::Tenant;
use streampool_core::{Registry, ServedModel};

/// Who sent a request: the tenant its key belongs to, put in the request's extensions by
/// the key check, or nobody when the server has no keys (then every model is visible).
///
/// Handlers look models up through it ([`Caller::model`], [`Caller::first`]) rather than
/// through the [`Registry`] directly: that is the one place a tenant's model list applies.
///
/// ```
/// use streampool_serve::Caller;
/// // No key configured: every model is visible.
/// assert!(Caller::default().may_call("any"));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Caller(Option<Arc<Tenant>>);

impl Caller {
    /// A request of `tenant`.
    pub fn of(tenant: Arc<Tenant>) -> Self {
        Self(Some(tenant))
    }

    /// The caller's tenant, if the server has keys.
    pub fn as_tenant(&self) -> Option<&Arc<Tenant>> {
        self.0.as_ref()
    }

    /// Whether the caller may call (and see) the model named `name`.
    pub fn may_call(&self, name: &str) -> bool {
        match &self.0 {
            Some(tenant) => tenant.may_call(name),
            None => true,
        }
    }

    /// The model named `name` if the caller may call it; otherwise the registry's own
    /// answer for an unknown model ([`streampool_core::Error::NotFound`], same message).
    pub fn model(
        &self,
        registry: &Registry,
        name: &str,
    ) -> streampool_core::Result<Arc<ServedModel>> {
        if !self.may_call(name) {
            return Err(unknown_model(name));
        }
        registry.get(name)
    }

    /// The name of the first model (by name) of `kind` that the caller may call: the
    /// default model of the routes that have one.
    pub fn first(&self, registry: &Registry, kind: Kind) -> Option<String> {
        registry
            .snapshot()
            .into_iter()
            .find(|(name, m)| kind.matches(m) && self.may_call(name))
            .map(|(name, _)| name)
    }

    /// Whether the caller may load, replace and unload models (the repository routes):
    /// without keys, or as a tenant allowed every model. A tenant limited to some models
    /// must not take a model from the others, so for it the server does not manage models.
    pub fn may_manage(&self) -> bool {
        match &self.0 {
            Some(tenant) => tenant.models() == &super::Models::All,
            None => true,
        }
    }

    /// Charges `tokens` text tokens to the caller's tenant (once the request is tokenized:
    /// see the limits' docs); nothing without a tenant.
    pub fn charge_tokens(&self, tokens: usize) {
        if let Some(tenant) = &self.0 {
            tenant.charge_tokens(tokens);
        }
    }
}

/// The registry's error for an absent model, word for word.
fn unknown_model(name: &str) -> streampool_core::Error {
    streampool_core::Error::NotFound(format!("unknown model {}", streampool_nn::Quoted(name)))
}

/// The tenant the key check put in the request, or none (no keys configured, or a handler
/// driven without the check, as the fuzzing harness does).
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Infallible> {
        Ok(Self(parts.extensions.get::<Arc<Tenant>>().cloned()))
    }
}

/// What a route's default model must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An embedder: the default of `/v1/embeddings` and TEI's `/embed`.
    Embedder,
    /// A classifier: TEI's `/rerank` and `/predict`.
    Classifier,
    /// A classifier of one label: the default of `/v1/rerank`.
    Reranker,
}

impl Kind {
    /// Whether `model` is of this kind.
    pub fn matches(self, model: &ServedModel) -> bool {
        match (self, model) {
            (Kind::Embedder, ServedModel::Embedder(_)) => true,
            (Kind::Classifier, ServedModel::Classifier(_)) => true,
            (Kind::Reranker, ServedModel::Classifier(c)) => c.labels().len() == 1,
            _ => false,
        }
    }
}
