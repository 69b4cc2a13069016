//! The router behind the port: how a [`DeploymentRouter`] answers [`Dispatch`].

use std::sync::Arc;

use futures_util::future::BoxFuture;
use modelmux_cache::ModelId;
use modelmux_context::RequestContext;

use super::DeploymentRouter;
use crate::Request;
use crate::dispatch::{Dispatch, Dispatched, Route};
use crate::model_cache::ModelCache;
use crate::placement::Holding;

impl Dispatch for DeploymentRouter {
    fn deployment(&self) -> &str {
        self.name()
    }

    fn dispatch(
        self: Arc<Self>,
        request: Request,
        context: RequestContext,
        route: Route,
    ) -> BoxFuture<'static, Dispatched> {
        Box::pin(async move { self.run(request, context, route, true).await })
    }

    fn held_models(&self) -> Vec<(String, Vec<(ModelId, Holding)>)> {
        self.replicas()
            .iter()
            .map(|r| {
                let mut held: Vec<_> = r.slot.holdings().into_iter().collect();
                held.sort_by(|a, b| a.0.cmp(&b.0));
                (r.id.to_string(), held)
            })
            .collect()
    }

    fn evict_model(&self, id: &str) -> Vec<String> {
        self.on_every_cache(|c| c.evict(id))
    }

    fn starting(&self) -> bool {
        self.is_starting()
    }

    fn capacity_changed(self: Arc<Self>) {
        self.grant();
        self.changes.notify_one();
    }
}

impl DeploymentRouter {
    /// Runs `f` on every cache of every replica of this node; returns the replicas where it
    /// returned true (every cache is visited: a model may be in more than one).
    pub(crate) fn on_every_cache(&self, f: impl Fn(&dyn ModelCache) -> bool) -> Vec<String> {
        self.replicas()
            .iter()
            .filter(|r| r.caches.iter().fold(false, |any, c| f(&**c) | any))
            .map(|r| r.id.to_string())
            .collect()
    }
}
