//! Replicas on other nodes of a cluster, as this node routes to them.
//!
//! The cluster layer (etcd, in `modelmux-cluster`) tells the server what the other nodes'
//! replicas hold ([`NodeHandle::set_remote_replicas`](crate::NodeHandle::set_remote_replicas)) and
//! how to reach them (a [`Forwarder`]); it reads this node's own state with
//! [`NodeHandle::local_state`](crate::NodeHandle::local_state). The router sees a remote replica
//! through the same [`ReplicaView`](crate::ReplicaView) as a local one: a [`ReplicaLedger`] fed
//! from published reports instead of cache events, with this node's own pending placements
//! and requests in flight to it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::placement::{CopyReport, ReplicaLedger};
use crate::{Request, Response};
use futures_util::future::BoxFuture;

/// The header a forwarded request carries: the replica the forwarding node chose. A request
/// with it is served by this node's own replicas only, never forwarded again.
pub const FORWARDED_HEADER: &str = "x-modelmux-forwarded";
/// The header that shows a forwarded request comes from a node of the cluster: the cluster's
/// token, which the forwarding node adds and the receiving node checks and removes before
/// anything else sees the request. Without it, a client's [`FORWARDED_HEADER`] is ignored.
pub const PEER_TOKEN_HEADER: &str = "x-modelmux-peer-token";

/// Whether a request's [`FORWARDED_HEADER`] is honoured: only in a cluster (`in_cluster`),
/// and there only from a node that holds the cluster's `token` (the request's
/// [`PEER_TOKEN_HEADER`] matches it); in a cluster without a token, whose admin API is open
/// to all, from anyone. A client that could name a replica would force loads where it likes.
pub fn forwarded_by_peer(headers: &http::HeaderMap, in_cluster: bool, token: Option<&str>) -> bool {
    if !in_cluster {
        return false;
    }
    match token.filter(|t| !t.is_empty()) {
        None => true,
        Some(token) => headers
            .get(PEER_TOKEN_HEADER)
            .is_some_and(|given| crate::body::same_secret(given.as_bytes(), token.as_bytes())),
    }
}

/// The header on a `503` saying the request was refused before it ran (the node has no replica
/// of the deployment, or is shutting down): the forwarding node tries another.
pub const NOT_HERE_HEADER: &str = "x-modelmux-not-here";

/// How long a replica whose request failed or was turned away is passed over. (A node that does
/// not answer at all is passed over until its [`Forwarder`] reaches it again.)
const UNREACHABLE_FOR: Duration = Duration::from_secs(1);

/// One replica's state as its node publishes it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaState {
    /// The replica's id, unique in the cluster.
    pub id: String,
    /// Its `max_ongoing_requests`.
    pub max_ongoing: usize,
    /// Its model-count cap, if any.
    pub max_models: Option<usize>,
    /// Its byte cap, if any.
    pub max_bytes: Option<u64>,
    /// Requests in progress on it.
    pub ongoing: usize,
    /// Whether it takes requests (not draining).
    pub available: bool,
    /// The models it holds.
    pub copies: Vec<CopyReport>,
}

/// One deployment of an application on this node, as published to the cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentState {
    /// The application.
    pub app: String,
    /// The deployment.
    pub deployment: String,
    /// The deployment's local replicas.
    pub replicas: Vec<ReplicaState>,
}

/// Why a forwarded request got no answer from its node.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ForwardError {
    /// It never reached the node (no connection): always safe to send elsewhere.
    #[error("not sent to node {node}: {reason}")]
    NotSent {
        /// The node.
        node: String,
        /// Why.
        reason: String,
    },
    /// The node refused it without running it (no replica of the deployment, shutting down).
    #[error("node {node} did not take it: {reason}")]
    NotHere {
        /// The node.
        node: String,
        /// Why.
        reason: String,
    },
    /// It failed after it was sent: it may have run.
    #[error("forwarding to node {node} failed: {reason}")]
    Failed {
        /// The node.
        node: String,
        /// Why.
        reason: String,
    },
}

/// Sends a request to another node (in `modelmux-cluster`: HTTP/2 over one connection per
/// peer). The request carries [`FORWARDED_HEADER`] naming `replica`. A handle call comes
/// already rewritten by the router as a call of the other node's call endpoint, with the
/// admin token: send it as it is.
pub trait Forwarder: Send + Sync + 'static {
    /// Whether `node` is worth sending to: `false` while it is known not to answer (its
    /// replicas are then passed over, whatever its records say).
    fn reachable(&self, _node: &str) -> bool {
        true
    }

    /// Forwards `request` to `node`'s replica `replica`.
    fn forward(
        &self,
        node: &str,
        replica: &str,
        request: Request,
    ) -> BoxFuture<'static, Result<Response, ForwardError>>;
}

/// A replica on another node.
pub(crate) struct RemoteReplica {
    pub(crate) node: Arc<str>,
    pub(crate) slot: Arc<ReplicaLedger>,
    /// Requests in progress there that other nodes sent, as of its node's last report: what
    /// it reported less what this node had in flight to it when the report came.
    others_ongoing: AtomicUsize,
    /// Whether its node said it takes requests.
    reported_available: AtomicBool,
    /// Until when (ms on [`clock`]) it is passed over after a failed connection.
    unreachable_until: AtomicU64,
    forwarder: Arc<dyn Forwarder>,
}

fn clock() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl RemoteReplica {
    pub(crate) fn new(node: Arc<str>, state: &ReplicaState, forwarder: Arc<dyn Forwarder>) -> Self {
        let slot = ReplicaLedger::new(
            state.id.as_str().into(),
            state.max_ongoing,
            1,
            state.max_models,
        )
        .with_byte_capacity(state.max_bytes);
        let replica = Self {
            node,
            slot: Arc::new(slot),
            others_ongoing: AtomicUsize::new(0),
            reported_available: AtomicBool::new(true),
            unreachable_until: AtomicU64::new(0),
            forwarder,
        };
        replica.update(state);
        replica
    }

    /// Whether `state` can update this replica in place (same limits).
    pub(crate) fn same_shape(&self, state: &ReplicaState) -> bool {
        use crate::ReplicaView;
        self.slot.max_ongoing() == state.max_ongoing
            && self.slot.capacity() == (state.max_models, state.max_bytes)
    }

    /// Takes in what its node published.
    pub(crate) fn update(&self, state: &ReplicaState) {
        use crate::ReplicaView;
        let own = self.slot.ongoing();
        self.others_ongoing
            .store(state.ongoing.saturating_sub(own), Ordering::Relaxed);
        self.reported_available
            .store(state.available, Ordering::SeqCst);
        self.slot.replace_copies(&state.copies);
    }

    /// Whether the router may send it requests: its node takes them, did not turn one away
    /// a moment ago, and answers.
    pub(crate) fn reachable(&self) -> bool {
        self.reported_available.load(Ordering::SeqCst)
            && self.unreachable_until.load(Ordering::Relaxed) <= clock()
            && self.forwarder.reachable(&self.node)
    }

    /// Passes it over for a moment (its node could not be reached, or turned a request away).
    pub(crate) fn set_unreachable(&self) {
        let until = clock() + u64::try_from(UNREACHABLE_FOR.as_millis()).unwrap_or(1000);
        self.unreachable_until.store(until, Ordering::Relaxed);
    }

    /// Requests in progress there: this node's, counted live, plus the other nodes' as last
    /// reported. (Reports come at most once a second; taking the larger of the report and
    /// this node's count instead made a replica this node had just drained look saturated
    /// until the next report, and requests queued for up to a second.)
    pub(crate) fn ongoing(&self) -> usize {
        use crate::ReplicaView;
        self.slot.ongoing() + self.others_ongoing.load(Ordering::Relaxed)
    }

    pub(crate) fn forward(
        &self,
        request: Request,
    ) -> BoxFuture<'static, Result<Response, ForwardError>> {
        use crate::ReplicaView;
        self.forwarder.forward(&self.node, self.slot.id(), request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nowhere;

    impl Forwarder for Nowhere {
        fn forward(
            &self,
            node: &str,
            _replica: &str,
            _request: Request,
        ) -> BoxFuture<'static, Result<Response, ForwardError>> {
            let node = node.to_owned();
            Box::pin(async move {
                Err(ForwardError::NotSent {
                    node,
                    reason: "test".into(),
                })
            })
        }
    }

    fn state(ongoing: usize) -> ReplicaState {
        ReplicaState {
            id: "d#1@n2".into(),
            max_ongoing: 4,
            max_models: Some(2),
            max_bytes: None,
            ongoing,
            available: true,
            copies: Vec::new(),
        }
    }

    #[test]
    fn a_remote_replica_counts_this_nodes_requests_live_and_the_others_as_reported() {
        let replica = RemoteReplica::new("n2".into(), &state(0), Arc::new(Nowhere));
        // This node fills it; its node reports the same four.
        for _ in 0..4 {
            assert!(replica.slot.try_begin());
        }
        replica.update(&state(4));
        assert_eq!(replica.ongoing(), 4);
        // They finish: free at once, without waiting for the next report.
        for _ in 0..4 {
            replica.slot.finish();
        }
        assert_eq!(replica.ongoing(), 0);
        // Another node's three, as reported, count until a report says otherwise.
        replica.update(&state(3));
        assert_eq!(replica.ongoing(), 3);
        assert!(replica.slot.try_begin());
        assert_eq!(replica.ongoing(), 4);
        replica.slot.finish();
        replica.update(&state(0));
        assert_eq!(replica.ongoing(), 0);
    }
}
