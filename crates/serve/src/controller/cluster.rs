//! What the cluster layer needs of the running applications: this node's state out (every
//! deployment's replicas, their load and models), the other nodes' replicas in (routed over
//! beside this node's own), and a wake-up when anything local changes. Nothing here knows of
//! etcd.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::Notify;

use super::Controller;
use crate::placement::ReplicaView;
use crate::remote::{DeploymentState, Forwarder, RemoteReplica, ReplicaState};

impl Controller {
    /// Every deployment of every application and the state of its replicas on this node now.
    /// While the server drains, every replica is reported unavailable: other nodes stop
    /// sending it requests.
    pub(crate) fn local_state(&self) -> Vec<DeploymentState> {
        let draining = self.is_draining();
        self.apps
            .iter()
            .flat_map(|app| app.deployments.iter().map(move |(router, _)| (app, router)))
            .map(|(app, router)| DeploymentState {
                app: app.name.to_string(),
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

    /// Every deployment of every application: `(app, deployment)`.
    pub fn deployment_names(&self) -> Vec<(String, String)> {
        self.apps
            .iter()
            .flat_map(|app| {
                app.deployments
                    .iter()
                    .map(|(router, _)| (app.name.to_string(), router.name().to_string()))
            })
            .collect()
    }

    /// Notified whenever a local replica's models (or the replica set) change.
    pub(crate) fn changes(&self) -> Arc<Notify> {
        self.changes.clone()
    }

    /// Replaces what this node knows of the replicas of `app`'s deployment `deployment` on
    /// other nodes: `(node, state)` pairs, reached through `forwarder`. A replica already known
    /// keeps this node's requests in flight to it and its pending placements; one no longer
    /// listed is dropped.
    pub(crate) fn set_remote_replicas(
        &self,
        app: &str,
        deployment: &str,
        replicas: &[(Arc<str>, ReplicaState)],
        forwarder: &Arc<dyn Forwarder>,
    ) {
        let Some(app) = self.apps.iter().find(|a| &*a.name == app) else {
            return;
        };
        let Some((router, _)) = app.deployments.iter().find(|(r, _)| r.name() == deployment) else {
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
}
