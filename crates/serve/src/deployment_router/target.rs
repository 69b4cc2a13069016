//! Where the router can send a request: one of this node's replicas, or (in a cluster) one on
//! another node. Both are seen through [`ReplicaView`], so the routing rules treat them alike.

use std::sync::Arc;
use std::time::Duration;

use modelmux_cache::ModelId;
use tokio::time::Instant;

use crate::placement::{ReplicaLedger, ReplicaView};
use crate::remote::RemoteReplica;
use crate::replica::Replica;

/// A replica the router may choose.
#[derive(Clone)]
pub(crate) enum Target {
    /// Runs here.
    Local(Arc<Replica>),
    /// Runs on another node; requests are forwarded to it.
    Remote(Arc<RemoteReplica>),
}

impl Target {
    pub(crate) fn slot(&self) -> &ReplicaLedger {
        match self {
            Self::Local(r) => &r.slot,
            Self::Remote(r) => &r.slot,
        }
    }

    /// The cluster node it runs on (none for a local replica outside a cluster).
    pub(crate) fn node(&self) -> Option<&str> {
        match self {
            Self::Local(r) => r.node.as_deref(),
            Self::Remote(r) => Some(&r.node),
        }
    }
}

/// The replicas a deployment's router chooses among: all of them, and this node's own (for
/// requests another node forwarded here, which are never forwarded again).
#[derive(Default)]
pub(crate) struct Targets {
    pub(crate) all: Vec<Target>,
    pub(crate) local: Vec<Target>,
}

impl Targets {
    pub(crate) fn new(local: &[Arc<Replica>], remote: &[Arc<RemoteReplica>]) -> Self {
        let local: Vec<Target> = local.iter().cloned().map(Target::Local).collect();
        let all = local
            .iter()
            .cloned()
            .chain(remote.iter().cloned().map(Target::Remote))
            .collect();
        Self { all, local }
    }
}

impl ReplicaView for Target {
    fn id(&self) -> &str {
        self.slot().id()
    }
    fn ongoing(&self) -> usize {
        match self {
            Self::Local(r) => r.slot.ongoing(),
            Self::Remote(r) => r.ongoing(),
        }
    }
    fn max_ongoing(&self) -> usize {
        self.slot().max_ongoing()
    }
    fn is_available(&self) -> bool {
        match self {
            Self::Local(r) => r.slot.is_available(),
            Self::Remote(r) => r.slot.is_available() && r.reachable(),
        }
    }
    fn holds(&self, id: &ModelId, now: Instant) -> bool {
        self.slot().holds(id, now)
    }
    fn holds_loaded(&self, id: &ModelId) -> bool {
        self.slot().holds_loaded(id)
    }
    fn holds_loading(&self, id: &ModelId, now: Instant) -> bool {
        self.slot().holds_loading(id, now)
    }
    fn model_count(&self, now: Instant) -> usize {
        self.slot().model_count(now)
    }
    fn has_free_slot(&self, now: Instant) -> bool {
        self.slot().has_free_slot(now)
    }
    fn oldest_use(&self) -> u64 {
        self.slot().oldest_use()
    }
    fn service_time(&self) -> Option<Duration> {
        self.slot().service_time()
    }
    fn load_time(&self, id: &ModelId) -> Option<Duration> {
        self.slot().load_time(id)
    }
    fn backing_off(&self, id: &ModelId, now: Instant) -> bool {
        self.slot().backing_off(id, now)
    }
    fn full_for(&self, now: Instant) -> Option<Duration> {
        self.slot().full_for(now)
    }
    fn waiting_for_load(&self, model: &ModelId) -> usize {
        self.slot().waiting_for_load(model)
    }
    fn loaded_for(&self, id: &ModelId, now: Instant) -> Option<Duration> {
        self.slot().loaded_for(id, now)
    }
}

impl ReplicaView for Replica {
    fn id(&self) -> &str {
        self.slot.id()
    }
    fn ongoing(&self) -> usize {
        self.slot.ongoing()
    }
    fn max_ongoing(&self) -> usize {
        self.slot.max_ongoing()
    }
    fn is_available(&self) -> bool {
        self.slot.is_available()
    }
    fn holds(&self, id: &ModelId, now: Instant) -> bool {
        self.slot.holds(id, now)
    }
    fn holds_loaded(&self, id: &ModelId) -> bool {
        self.slot.holds_loaded(id)
    }
    fn holds_loading(&self, id: &ModelId, now: Instant) -> bool {
        self.slot.holds_loading(id, now)
    }
    fn model_count(&self, now: Instant) -> usize {
        self.slot.model_count(now)
    }
    fn has_free_slot(&self, now: Instant) -> bool {
        self.slot.has_free_slot(now)
    }
    fn oldest_use(&self) -> u64 {
        self.slot.oldest_use()
    }
    fn service_time(&self) -> Option<Duration> {
        self.slot.service_time()
    }
    fn load_time(&self, id: &ModelId) -> Option<Duration> {
        self.slot.load_time(id)
    }
    fn backing_off(&self, id: &ModelId, now: Instant) -> bool {
        self.slot.backing_off(id, now)
    }
    fn full_for(&self, now: Instant) -> Option<Duration> {
        self.slot.full_for(now)
    }
    fn waiting_for_load(&self, model: &ModelId) -> usize {
        self.slot.waiting_for_load(model)
    }
    fn loaded_for(&self, id: &ModelId, now: Instant) -> Option<Duration> {
        self.slot.loaded_for(id, now)
    }
}
