//! What the cluster layer (`modelmux-cluster`) uses of a running server: this node's state
//! out (every deployment's replicas, their load and models), the other nodes' replicas in
//! (routed over beside this node's own), a wake-up when anything local changes, the token
//! handle calls carry to other nodes, and an extra readiness condition. The serve layer knows
//! nothing of etcd; it only routes over whatever replicas it is told about.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::Notify;

use super::applications::Applications;
use super::readiness::Readiness;
use crate::deployment_router::CallToken;
use crate::placement::ReplicaView;
use crate::remote::{DeploymentState, Forwarder, RemoteReplica, ReplicaState};

/// The part of a running server the cluster layer talks to
/// ([`Controller::node`](crate::Controller::node)). Cheap to clone; stays usable while the
/// server shuts down (it publishes its drain through it).
#[derive(Clone)]
pub struct NodeHandle {
    apps: Arc<Applications>,
    readiness: Arc<Readiness>,
    /// This node's id in a cluster.
    node_id: Option<Arc<str>>,
    /// Notified whenever a local replica's models or the replica set change.
    changes: Arc<Notify>,
    /// The token handle calls carry to other nodes (every router shares it).
    call_token: Arc<CallToken>,
}

impl NodeHandle {
    pub(crate) fn new(
        apps: Arc<Applications>,
        readiness: Arc<Readiness>,
        node_id: Option<&str>,
        changes: Arc<Notify>,
        call_token: Arc<CallToken>,
    ) -> Self {
        Self {
            apps,
            readiness,
            node_id: node_id.map(Into::into),
            changes,
            call_token,
        }
    }

    /// This node's id, if it is part of a cluster.
    pub fn node_id(&self) -> Option<&str> {
        self.node_id.as_deref()
    }

    /// Every deployment of every application and the state of its replicas on this node now.
    /// While the server drains, every replica is reported unavailable: other nodes stop
    /// sending it requests.
    pub fn local_state(&self) -> Vec<DeploymentState> {
        let draining = self.readiness.is_draining();
        self.apps
            .routers()
            .map(|router| DeploymentState {
                app: router.app.to_string(),
                deployment: router.name().to_string(),
                replicas: router
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

    /// Every deployment of every application, `(app, deployment)`: what
    /// [`set_remote_replicas`](Self::set_remote_replicas) may be told of.
    pub fn deployments(&self) -> Vec<(String, String)> {
        self.apps.names()
    }

    /// Notified whenever a local replica's models (or the replica set) change.
    pub fn changes(&self) -> Arc<Notify> {
        self.changes.clone()
    }

    /// Whether the server is shutting down.
    pub fn is_draining(&self) -> bool {
        self.readiness.is_draining()
    }

    /// Lets handle calls go to replicas on other nodes of the cluster, carrying `token` (this
    /// node's admin token, which the other nodes' call endpoints check: every node of a
    /// cluster must have the same one). Without a token (the default, or `None`, or an empty
    /// one), handle calls stay on this node. The server sets it from its admin token when it
    /// starts.
    pub fn set_call_token(&self, token: Option<&str>) {
        self.call_token.set(token);
    }

    /// Whether handle calls may go to other nodes' replicas: a member of a cluster with a
    /// call token (see [`set_call_token`](Self::set_call_token)). Without one, handle calls
    /// stay on this node.
    pub fn forwards_handle_calls(&self) -> bool {
        self.node_id.is_some() && self.call_token.is_set()
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
        let Ok((router, _)) = self.apps.deployment_of(app, deployment) else {
            return;
        };
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

    /// Adds a condition to readiness (`/-/healthz`): the cluster layer's, etcd answered lately.
    pub fn set_readiness(&self, check: impl Fn() -> Result<(), String> + Send + Sync + 'static) {
        self.readiness.set_check(check);
    }
}
