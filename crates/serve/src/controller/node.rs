//! What the cluster layer (`modelmux-cluster`) uses of a running server: this node's state
//! out, the other nodes' replicas in, and an extra readiness condition. The serve layer knows
//! nothing of etcd; it only routes over whatever replicas it is told about.

use std::sync::Arc;

use tokio::sync::Notify;

use super::Controller;
use crate::remote::{DeploymentState, Forwarder, ReplicaState};

/// The part of a running server the cluster layer talks to. Cheap to clone; stays usable
/// while the server shuts down (it publishes its drain through it).
#[derive(Clone)]
pub struct NodeHandle(Arc<Controller>);

impl NodeHandle {
    /// A handle on these applications.
    pub fn new(controller: Arc<Controller>) -> Self {
        Self(controller)
    }

    /// This node's id, if it is part of a cluster.
    pub fn node_id(&self) -> Option<&str> {
        self.0.node_id.as_deref()
    }

    /// Every deployment of every application and the state of its replicas on this node now.
    /// While the server drains, every replica is reported unavailable: other nodes stop
    /// sending it requests.
    pub fn local_state(&self) -> Vec<DeploymentState> {
        self.0.local_state()
    }

    /// Every deployment of every application, `(app, deployment)`: what
    /// [`set_remote_replicas`](Self::set_remote_replicas) may be told of.
    pub fn deployments(&self) -> Vec<(String, String)> {
        self.0.deployment_names()
    }

    /// Notified whenever a local replica's models (or the replica set) change.
    pub fn changes(&self) -> Arc<Notify> {
        self.0.changes()
    }

    /// Whether the server is shutting down.
    pub fn is_draining(&self) -> bool {
        self.0.is_draining()
    }

    /// Whether handle calls may go to other nodes' replicas (the server has a call token:
    /// its admin token, see [`Controller::set_call_token`](crate::Controller::set_call_token)).
    /// Without one, handle calls stay on this node.
    pub fn forwards_handle_calls(&self) -> bool {
        self.0.forwards_handle_calls()
    }

    /// Replaces what this node knows of the replicas of `app`'s deployment `deployment` on
    /// other nodes: `(node, state)` pairs, reached through `forwarder`. A replica already known
    /// keeps this node's requests in flight to it and its pending placements; one no longer
    /// listed is dropped. Requests reach them as the router chooses: an application's own
    /// requests (its ingress deployment's), and handle calls when
    /// [`forwards_handle_calls`](Self::forwards_handle_calls).
    pub fn set_remote_replicas(
        &self,
        app: &str,
        deployment: &str,
        replicas: &[(Arc<str>, ReplicaState)],
        forwarder: &Arc<dyn Forwarder>,
    ) {
        self.0
            .set_remote_replicas(app, deployment, replicas, forwarder);
    }

    /// Adds a condition to readiness (`/-/healthz`): the cluster layer's, etcd answered lately.
    pub fn set_readiness(&self, check: impl Fn() -> Result<(), String> + Send + Sync + 'static) {
        self.0.set_readiness(check);
    }
}
