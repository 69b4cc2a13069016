//! The one port into a deployment: what everything that sends it requests needs from its
//! router, as a trait. The HTTP front, a [`DeploymentHandle`](crate::DeploymentHandle) (one
//! deployment calling another) and a replica telling its router that capacity freed all reach
//! a deployment through [`Dispatch`], never through the router's type, so none of them depends
//! on how routing is done (and the router depends on none of them).
//!
//! Also what a dispatch leaves on its response for the front's access line ([`ServedModel`],
//! kept only while [`access_log_on`]).
//!
//! This module must stay at the bottom of the serve layer: it names requests, responses,
//! errors and the router's view of held models, and nothing that sends or runs requests.

use std::sync::{Arc, Weak};

use futures_util::future::BoxFuture;
use modelmux_cache::ModelId;
use modelmux_context::RequestContext;

use crate::placement::Holding;
use crate::{Request, Response, ServeError};

/// Which replicas a request may go to.
#[derive(Debug, Clone, Default)]
pub enum Route {
    /// Any, on any node.
    #[default]
    Anywhere,
    /// This node's own (another node forwarded it here, or a handle calls from a replica of
    /// this node), preferring the one named.
    Local {
        /// The replica the forwarding node chose.
        preferred: Option<Arc<str>>,
    },
    /// Those of one node of the cluster (this one's, or another's, forwarded there): for a
    /// request whose state lives on that node only (a stored conversation). Refused at once
    /// when that node runs none.
    Node(Arc<str>),
}

/// Marks a request as a call of one of the deployment's methods through a handle, made by code
/// in this process (a Python deployment's `handle.method.remote(...)`, relayed by modelmux):
/// `method` names the method and the body holds the caller's encoded arguments. It is a
/// request extension, never a header, so no HTTP client can make a request look like one: a
/// runtime may trust the body's encoding (a pickle) only when this is present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandleCall {
    /// The method to call (`__call__` for the handle itself).
    pub method: String,
    /// The caller reads the method's results one by one as they are made (Ray's
    /// `handle.options(stream=True)`); how they are framed is the runtime's business.
    pub stream: bool,
}

/// The header a handle call carries between nodes (to the call endpoint) when it is
/// [`HandleCall::stream`].
pub const STREAM_HEADER: &str = "x-modelmux-stream";

/// What a dispatch ends with: the response (or the error) and the replica that served it, if
/// one was reached.
pub type Dispatched = (Result<Response, ServeError>, Option<Arc<str>>);

/// A deployment as its callers see it: send it a request, see and drop the models its replicas
/// hold, tell it capacity may have freed.
pub trait Dispatch: Send + Sync + 'static {
    /// The deployment's name.
    fn deployment(&self) -> &str;

    /// Routes `request` to a replica and runs it there (or forwards it to the node that has
    /// it), within `context` (its request id and model id).
    fn dispatch(
        self: Arc<Self>,
        request: Request,
        context: RequestContext,
        route: Route,
    ) -> BoxFuture<'static, Dispatched>;

    /// The models this node's replicas hold (loaded, loading, or just placed), by replica id,
    /// as the router sees them: from the caches' events, no call to a replica.
    fn held_models(&self) -> Vec<(String, Vec<(ModelId, Holding)>)>;

    /// Evicts model `id` from every replica of this node; returns the replicas that held it.
    fn evict_model(&self, id: &str) -> Vec<String>;

    /// Whether this node is still starting the deployment's first replicas (requests for
    /// them wait meanwhile).
    fn starting(&self) -> bool;

    /// Capacity may have freed (a load ended, a model was evicted): requests waiting for a
    /// replica may move now.
    fn capacity_changed(self: Arc<Self>);
}

/// What a replica holds of its deployment's router: a weak reference through the port, so a
/// replica never keeps its router alive and never knows its type.
#[derive(Clone)]
pub(crate) struct Waker(Weak<dyn Dispatch>);

impl Waker {
    pub(crate) fn new(deployment: &Arc<dyn Dispatch>) -> Self {
        Self(Arc::downgrade(deployment))
    }

    /// Tells the router that capacity may have freed, if it still exists.
    pub(crate) fn wake(&self) {
        if let Some(deployment) = self.0.upgrade() {
            deployment.capacity_changed();
        }
    }
}

/// The model a deployment's call named, put on its response by the dispatcher unless an inner
/// call already did.
#[derive(Clone)]
pub struct ServedModel(pub ModelId);

/// Whether access lines are written (`modelmux::access` at INFO): what they need is kept only
/// then.
pub fn access_log_on() -> bool {
    tracing::enabled!(target: "modelmux::access", tracing::Level::INFO)
}
