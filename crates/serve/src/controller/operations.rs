//! What an operator can do to the running applications' models: load (and pin) one where
//! placement would put a first request for it, unpin or evict one on every replica, and run a
//! deployment's own control on each replica. The admin API calls these; so can a program that
//! embeds a server. Deployments are named without their application here, so a name used in
//! two applications is refused with a message that says so.

use std::sync::Arc;

use modelmux_cache::{ErrorKind, Failure, ModelId};
use tokio::time::Instant;

use super::applications::Applications;
use crate::ServeError;

/// One replica's answer to a deployment control.
pub type ControlAnswer = (String, Result<serde_json::Value, ServeError>);

/// What an operator can do to the models of running applications
/// ([`Controller::operations`](crate::Controller::operations)).
pub struct Operations<'a> {
    apps: &'a Applications,
}

impl<'a> Operations<'a> {
    /// The operations on `apps`.
    pub(crate) fn new(apps: &'a Applications) -> Self {
        Self { apps }
    }

    /// Loads model `id` on the replica of `deployment` a first request for it would go to
    /// (and pins it there against eviction when `pin`); returns that replica's id.
    pub async fn load_model(
        &self,
        deployment: &str,
        id: &ModelId,
        pin: bool,
    ) -> Result<String, ServeError> {
        let router = self.apps.deployment_named(deployment)?;
        let replicas = router.replicas();
        let index = crate::router::place(&replicas, id, Instant::now()).ok_or_else(|| {
            ServeError::Failed(Failure::new(
                ErrorKind::Unavailable,
                format!("no replica of '{deployment}' is available to load into"),
            ))
        })?;
        let replica = &replicas[index];
        let cache = replica
            .caches
            .first()
            .ok_or_else(|| ServeError::BadRequest {
                message: format!("deployment '{deployment}' has no model cache to load into"),
            })?;
        cache.load(id.as_str(), pin).await?;
        Ok(replica.id.to_string())
    }

    /// Evicts model `id` from every replica of `deployment` (each copy is unloaded when its
    /// last request is done); returns the replicas that held it, and is an error when none did.
    pub fn evict_model(&self, deployment: &str, id: &ModelId) -> Result<Vec<String>, ServeError> {
        let evicted = self
            .apps
            .deployment_named(deployment)?
            .on_every_cache(|c| c.evict(id.as_str()));
        if evicted.is_empty() {
            return Err(ServeError::NotFound {
                what: format!("model '{id}' is not loaded by any replica of '{deployment}'"),
            });
        }
        Ok(evicted)
    }

    /// Unpins model `id` on every replica of `deployment`; returns those where it was pinned.
    pub fn unpin_model(&self, deployment: &str, id: &ModelId) -> Result<Vec<String>, ServeError> {
        Ok(self
            .apps
            .deployment_named(deployment)?
            .on_every_cache(|c| c.unpin(id.as_str())))
    }

    /// Runs `deployment`'s control `name` (an LLM's `pause`, say) with `body` on every replica
    /// at once; returns each replica's answer.
    pub async fn control(
        &self,
        deployment: &str,
        name: &str,
        body: bytes::Bytes,
    ) -> Result<Vec<ControlAnswer>, ServeError> {
        let replicas = self.apps.deployment_named(deployment)?.replicas();
        let results =
            futures_util::future::join_all(replicas.iter().map(|r| r.control(name, body.clone())))
                .await;
        Ok(replicas
            .iter()
            .map(|r| r.id.to_string())
            .zip(results)
            .collect())
    }

    /// Makes `call` (a method, streamed or not) of deployment `deployment` (of application
    /// `app`, when several applications have one so named) through the router, as a handle
    /// would: `body` holds the caller's encoded arguments, and the request carries the
    /// [`HandleCall`](crate::HandleCall) so the deployment may trust that encoding. `context` gives its request id and model id
    /// (with one, it goes to a replica holding that model, like any request for it); `route`
    /// is [`Route::Anywhere`](crate::Route::Anywhere) for a caller's call, or this node's
    /// replicas for one another node forwarded here.
    pub async fn call(
        &self,
        app: Option<&str>,
        deployment: &str,
        call: crate::HandleCall,
        context: modelmux_context::RequestContext,
        route: crate::Route,
        body: bytes::Bytes,
    ) -> Result<crate::Response, ServeError> {
        let router = match app {
            Some(app) => &self.apps.deployment_of(app, deployment)?.0,
            None => self.apps.deployment_named(deployment)?,
        };
        let mut request = http::Request::new(crate::Body::from(body));
        *request.method_mut() = http::Method::POST;
        request.extensions_mut().insert(call);
        let dispatch: Arc<dyn crate::Dispatch> = router.clone();
        dispatch.dispatch(request, context, route).await.0
    }

    /// Whether a deployment named `name` can be managed here (see
    /// [`load_model`](Self::load_model)): an error says why not.
    pub fn check_deployment(&self, name: &str) -> Result<(), ServeError> {
        self.apps.deployment_named(name).map(drop)
    }
}
