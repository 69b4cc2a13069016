//! What the cluster layer (`modelmux-cluster`) uses of a running server: this node's state
//! out, the other nodes' replicas in, and an extra readiness condition. The serve layer knows
//! nothing of etcd; it only routes over whatever replicas it is told about.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::Notify;

use crate::placement::ReplicaView;
use crate::remote::{DeploymentState, Forwarder, RemoteReplica, ReplicaState};
use crate::server::{Server, ServerState};

/// An extra condition for `/-/healthz`: `Err(reason)` makes it answer 503.
pub(crate) type Readiness = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The part of a running server the cluster layer talks to. Cheap to clone; stays usable
/// while the server shuts down (it publishes its drain through it).
#[derive(Clone)]
pub struct NodeHandle(Arc<ServerState>);

impl Server {
    /// A handle for the cluster layer.
    pub fn node_handle(&self) -> NodeHandle {
        NodeHandle(self.state.clone())
    }
}

impl NodeHandle {
    /// This node's id, if it is part of a cluster.
    pub fn node_id(&self) -> Option<&str> {
        self.0.config.node_id.as_deref()
    }

    /// Each application's ingress deployment and the state of its replicas on this node now.
    /// While the server drains, every replica is reported unavailable: other nodes stop
    /// sending it requests.
    pub fn local_state(&self) -> Vec<DeploymentState> {
        let draining = self.is_draining();
        self.0
            .apps
            .iter()
            .map(|app| DeploymentState {
                app: app.name.to_string(),
                deployment: app.ingress.name().to_string(),
                replicas: app
                    .ingress
                    .replicas()
                    .iter()
                    .map(|r| {
                        let (max_models, max_bytes) = r.slot.capacity();
                        ReplicaState {
                            id: r.id.to_string(),
                            max_ongoing: r.slot.max_ongoing(),
                            max_models,
                            max_bytes,
                            ongoing: r.slot.ongoing(),
                            available: r.slot.is_available() && !draining,
                            copies: r.slot.copies(),
                        }
                    })
                    .collect(),
            })
            .collect()
    }

    /// Notified whenever a local replica's models (or the replica set) change.
    pub fn changes(&self) -> Arc<Notify> {
        self.0.changes.clone()
    }

    /// Whether the server is shutting down.
    pub fn is_draining(&self) -> bool {
        self.0.draining.load(Ordering::SeqCst)
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
        let Some(app) = self.0.apps.iter().find(|a| &*a.name == app) else {
            return;
        };
        let router = &app.ingress;
        let known: HashMap<String, Arc<RemoteReplica>> = router
            .remotes()
            .iter()
            .map(|r| (r.slot.id().to_string(), r.clone()))
            .collect();
        let next: Vec<Arc<RemoteReplica>> = replicas
            .iter()
            .map(|(node, state)| match known.get(&state.id) {
                Some(r) if r.same_shape(state) && r.node == *node => {
                    r.update(state);
                    r.clone()
                }
                _ => Arc::new(RemoteReplica::new(node.clone(), state, forwarder.clone())),
            })
            .collect();
        let same_set = next.len() == known.len()
            && next
                .iter()
                .all(|r| known.get(r.slot.id()).is_some_and(|k| Arc::ptr_eq(k, r)));
        if same_set {
            // Models changed, not the set: requests waiting may move now.
            router.grant();
        } else {
            router.set_remotes(next);
        }
    }

    /// Adds a condition to `/-/healthz` (the cluster layer's: etcd answered lately).
    pub fn set_readiness(&self, check: impl Fn() -> Result<(), String> + Send + Sync + 'static) {
        *self.0.readiness.write() = Some(Arc::new(check));
    }
}
