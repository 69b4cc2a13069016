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

    /// Each application's ingress deployment and the state of its replicas on this node now.
    /// While the server drains, every replica is reported unavailable: other nodes stop
    /// sending it requests.
    pub fn local_state(&self) -> Vec<DeploymentState> {
        self.0.local_state()
    }

    /// Notified whenever a local replica's models (or the replica set) change.
    pub fn changes(&self) -> Arc<Notify> {
        self.0.changes()
    }

    /// Whether the server is shutting down.
    pub fn is_draining(&self) -> bool {
        self.0.is_draining()
    }

    /// Replaces what this node knows of `app`'s ingress replicas on other nodes: `(node,
    /// state)` pairs, reached through `forwarder`. A replica already known keeps this node's
    /// requests in flight to it and its pending placements; one no longer listed is dropped.
    pub fn set_remote_replicas(
        &self,
        app: &str,
        replicas: &[(Arc<str>, ReplicaState)],
        forwarder: &Arc<dyn Forwarder>,
    ) {
        self.0.set_remote_replicas(app, replicas, forwarder);
    }

    /// Adds a condition to readiness (`/-/healthz`): the cluster layer's, etcd answered lately.
    pub fn set_readiness(&self, check: impl Fn() -> Result<(), String> + Send + Sync + 'static) {
        self.0.set_readiness(check);
    }
}
