//! Whether the applications can take requests (`/-/healthz`, `/health`, `/v1/models`): not
//! while shutdown drains them, nor while a deployment's first replicas start, nor while an
//! extra condition (the cluster layer's: etcd answered lately) fails; and then only where
//! each deployment has a replica taking requests, here or on another node.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::applications::Applications;
use crate::placement::ReplicaView;

/// Whether the applications can take requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Every deployment has a replica taking requests.
    Ready,
    /// Shutdown has begun.
    Draining,
    /// These deployments (`app/deployment`) are still starting their first replicas
    /// (loading their models); the port is open meanwhile.
    Loading(Vec<String>),
    /// An extra condition failed (the cluster layer's: etcd has not answered lately).
    NotReady(String),
    /// These deployments (`app/deployment`) have no replica taking requests.
    Unavailable(Vec<String>),
}

/// An extra condition for readiness: `Err(reason)` makes the applications not ready.
type Check = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// What readiness depends on besides the replicas themselves.
pub(crate) struct Readiness {
    /// Set when shutdown begins: readiness fails from then on.
    draining: AtomicBool,
    /// Deployments (`app/deployment`) whose first replicas are still starting.
    starting: parking_lot::Mutex<Vec<String>>,
    /// The extra condition, if any.
    check: parking_lot::RwLock<Option<Check>>,
}

impl Readiness {
    /// Not ready until each of `starting` (`app/deployment`) has [`started`](Self::started).
    pub(crate) fn new(starting: Vec<String>) -> Self {
        Self {
            draining: AtomicBool::new(false),
            starting: parking_lot::Mutex::new(starting),
            check: parking_lot::RwLock::default(),
        }
    }

    /// Deployment `name` (`app/deployment`) has started its first replicas.
    pub(crate) fn started(&self, name: &str) {
        self.starting.lock().retain(|d| d != name);
    }

    /// Deployments whose first replicas are still starting (`app/deployment`).
    pub(crate) fn loading(&self) -> Vec<String> {
        self.starting.lock().clone()
    }

    /// Shutdown has begun.
    pub(crate) fn begin_drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether shutdown has begun.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Adds a condition (replacing the one set before).
    pub(crate) fn set_check(&self, check: impl Fn() -> Result<(), String> + Send + Sync + 'static) {
        *self.check.write() = Some(Arc::new(check));
    }

    /// Whether `apps` can take requests (a deployment with a reachable replica on another
    /// node counts as available).
    pub(crate) fn health(&self, apps: &Applications) -> Health {
        if self.is_draining() {
            return Health::Draining;
        }
        let loading = self.loading();
        if !loading.is_empty() {
            return Health::Loading(loading);
        }
        if let Some(check) = self.check.read().clone()
            && let Err(reason) = check()
        {
            return Health::NotReady(reason);
        }
        let unavailable: Vec<String> = apps
            .routers()
            .filter(|r| {
                !r.replicas().iter().any(|rep| rep.is_available())
                    && !r.remotes().iter().any(|rep| rep.reachable())
            })
            .map(|r| format!("{}/{}", r.app, r.name()))
            .collect();
        if unavailable.is_empty() {
            Health::Ready
        } else {
            Health::Unavailable(unavailable)
        }
    }
}
