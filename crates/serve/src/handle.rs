//! Handles: how one deployment calls another (model composition).

use std::collections::HashMap;
use std::sync::Arc;

use modelmux_cache::ModelId;
use modelmux_context::{RequestContext, RequestId};

use crate::dispatch::{Dispatch, Route};
use crate::placement::Holding;
use crate::{HandleCall, Request, Response, ServeError};

/// The deployments of one application, by name, for [`ReplicaContext::handle`](crate::ReplicaContext::handle).
#[derive(Clone, Default)]
pub(crate) struct HandleDirectory {
    deployments: Arc<HashMap<String, Arc<dyn Dispatch>>>,
    /// Every application of the process: its ingress's name and its deployments.
    apps: Arc<HashMap<String, AppDirectory>>,
}

/// One application's deployments, for handles from other applications.
#[derive(Clone, Default)]
pub(crate) struct AppDirectory {
    pub(crate) ingress: String,
    pub(crate) deployments: Arc<HashMap<String, Arc<dyn Dispatch>>>,
}

impl HandleDirectory {
    /// The directory of an application whose deployments are `app`'s in `apps`.
    pub(crate) fn new(app: &str, apps: Arc<HashMap<String, AppDirectory>>) -> Self {
        Self {
            deployments: apps
                .get(app)
                .map(|a| a.deployments.clone())
                .unwrap_or_default(),
            apps,
        }
    }

    pub(crate) fn get(&self, name: &str) -> Result<DeploymentHandle, ServeError> {
        handle_of(&self.deployments, name)
    }

    /// A handle to deployment `name` of application `app` (its ingress when `name` is
    /// `None`).
    pub(crate) fn get_in(
        &self,
        app: &str,
        name: Option<&str>,
    ) -> Result<DeploymentHandle, ServeError> {
        let found = self.apps.get(app).ok_or_else(|| ServeError::NotFound {
            what: format!("no application named '{app}'"),
        })?;
        handle_of(&found.deployments, name.unwrap_or(&found.ingress))
    }
}

fn handle_of(
    deployments: &HashMap<String, Arc<dyn Dispatch>>,
    name: &str,
) -> Result<DeploymentHandle, ServeError> {
    let deployment = deployments
        .get(name)
        .ok_or_else(|| ServeError::UnknownDeployment {
            name: name.to_string(),
        })?;
    Ok(DeploymentHandle {
        deployment: deployment.clone(),
        model_id: None,
        node: None,
    })
}

/// Calls a deployment's replicas through its router, as the HTTP ingress does.
///
/// A call does not inherit the caller's model id: set it with
/// [`options`](Self::options)`().multiplexed_model_id(..)`, as in Ray Serve. The request id is
/// carried over, so logs of nested calls can be joined.
///
/// ```no_run
/// # use modelmux_serve::{Body, DeploymentHandle, Request};
/// # async fn f(downstream: DeploymentHandle) -> Result<(), modelmux_serve::ServeError> {
/// let response = downstream
///     .options()
///     .multiplexed_model_id("bar")?
///     .call(Request::new(Body::empty()))
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DeploymentHandle {
    deployment: Arc<dyn Dispatch>,
    model_id: Option<ModelId>,
    /// The cluster node whose replicas its calls go to, if one is named.
    node: Option<Arc<str>>,
}

/// Options for the calls made through a handle (see [`DeploymentHandle::options`]).
#[must_use]
pub struct HandleOptions {
    handle: DeploymentHandle,
}

impl HandleOptions {
    /// The model the callee should serve (it reads it with `multiplexed_model_id()`), and the
    /// router uses to pick a replica holding it.
    pub fn multiplexed_model_id(mut self, id: &str) -> Result<DeploymentHandle, ServeError> {
        self.handle.model_id = Some(ModelId::new(id)?);
        Ok(self.handle)
    }

    /// No model id (the default).
    pub fn no_model_id(mut self) -> DeploymentHandle {
        self.handle.model_id = None;
        self.handle
    }

    /// Calls go to the deployment's replicas on cluster node `node` only (this node's when it
    /// is this one; another's forwarded there as they are), for a request whose state lives
    /// there. A call fails at once, as unavailable, when that node runs no replica this node
    /// can reach.
    pub fn on_node(mut self, node: &str) -> DeploymentHandle {
        self.handle.node = Some(node.into());
        self.handle
    }
}

impl DeploymentHandle {
    /// The deployment this handle calls.
    pub fn deployment(&self) -> &str {
        self.deployment.deployment()
    }

    /// The models the deployment's replicas hold now (loaded, loading, or just placed), by
    /// replica id, as the router sees them: from the caches' events, no call to a replica.
    pub fn held_models(&self) -> Vec<(String, Vec<(ModelId, Holding)>)> {
        self.deployment.held_models()
    }

    /// Evicts model `id` from every replica of the deployment (as `DELETE /-/models/...` does):
    /// new requests no longer find it, and each copy is unloaded when its last user is done.
    /// Returns the replicas that held it.
    pub fn evict_model(&self, id: &str) -> Vec<String> {
        self.deployment.evict_model(id)
    }

    /// Whether this node is still starting the deployment's first replicas: a call made now
    /// waits for them (under the deployment's queue timeout).
    pub fn starting(&self) -> bool {
        self.deployment.starting()
    }

    /// Starts setting options; the handle itself is not changed.
    pub fn options(&self) -> HandleOptions {
        HandleOptions {
            handle: self.clone(),
        }
    }

    /// Calls the deployment and waits for its response.
    pub async fn call(&self, request: Request) -> Result<Response, ServeError> {
        let request_id = modelmux_context::request_id().unwrap_or_else(RequestId::generate);
        let mut context = RequestContext::new().with_request_id(request_id);
        // The call belongs to the caller's trace.
        if let Some(trace) = modelmux_context::current_trace() {
            context = context.with_trace(trace);
        }
        if let Some(id) = &self.model_id {
            context = context.with_multiplexed_model_id(id.clone());
        }
        // A handle call (a method called with encoded arguments) goes to the deployment's
        // replicas on any node, as the router places it: to another node as a call of its
        // call endpoint, with the token that endpoint checks (without one, the router keeps
        // it here). Any other request is an HTTP request for this node's replicas: only an
        // application's own requests go to other nodes as they are.
        let route = if let Some(node) = &self.node {
            Route::Node(node.clone())
        } else if request.extensions().get::<HandleCall>().is_some() {
            Route::Anywhere
        } else {
            Route::Local { preferred: None }
        };
        self.deployment
            .clone()
            .dispatch(request, context, route)
            .await
            .0
    }
}
