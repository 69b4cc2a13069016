//! What the running applications report of themselves, as plain data: the models each
//! replica holds and every counter `/metrics` shows (readiness is readiness.rs's).
//! The HTTP front renders these (JSON, Prometheus text); the dashboard and `modelmux status`
//! read the same through the admin API. Reading them takes each cache's state lock briefly
//! (as a load or an eviction does), never a router's.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use modelmux_cache::{HistogramSnapshot, MetricsSnapshot, ModelStatus};
use serde::Serialize;

use super::applications::Applications;
use crate::custom_metrics::{DashboardSeries, MetricFamily};
use crate::placement::{Holding, ReplicaView};
use crate::remote::RemoteReplica;
use crate::replica::Replica;

/// The models of every application, deployment and replica (`GET /-/models`).
#[derive(Debug, Clone, Serialize)]
pub struct ModelsReport {
    /// Per application.
    pub applications: Vec<AppModels>,
}

/// One application's deployments.
#[derive(Debug, Clone, Serialize)]
pub struct AppModels {
    /// Its name.
    pub name: String,
    /// Its route prefix.
    pub route_prefix: String,
    /// Its deployments.
    pub deployments: Vec<DeploymentModels>,
}

/// One deployment's replicas, this node's and (in a cluster) the others' it routes to.
#[derive(Debug, Clone, Serialize)]
pub struct DeploymentModels {
    /// Its name.
    pub name: String,
    /// Requests waiting for a replica.
    pub queued_requests: usize,
    /// Its replicas.
    pub replicas: Vec<ReplicaModels>,
}

/// One replica and its models.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaModels {
    /// Its id.
    pub id: String,
    /// Its node, in a cluster.
    pub node: Option<String>,
    /// On another node (as this node last heard of it).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub remote: bool,
    /// Taking requests.
    pub available: bool,
    /// Requests in progress.
    pub ongoing_requests: usize,
    /// Requests waiting for their model's load (this node's replicas only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_for_load: Option<usize>,
    /// Its `max_ongoing_requests`.
    pub max_ongoing_requests: usize,
    /// Models loaded.
    pub loaded: Vec<LoadedModel>,
    /// Models being loaded (each holds its share of the caps).
    pub loading: Vec<String>,
    /// Models whose load waits for a turn (`max_concurrent_loads`) or for room: they hold
    /// nothing yet (this node's replicas only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub queued: Vec<String>,
    /// Models evicted whose last requests (or unload) have not finished.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub draining: Vec<String>,
}

/// A loaded model; the details are known for this node's replicas only.
#[derive(Debug, Clone, Serialize)]
pub struct LoadedModel {
    /// Its id.
    pub id: String,
    /// Bytes it reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<Option<u64>>,
    /// Requests using it now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_use: Option<usize>,
    /// Pinned against eviction.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned: Option<bool>,
    /// Seconds since it was last used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_seconds: Option<f64>,
}

/// Every counter `/metrics` shows, read now.
#[derive(Debug, Clone)]
pub struct MetricsReport {
    /// This node's replicas.
    pub replicas: Vec<ReplicaMetrics>,
    /// Each deployment's queue.
    pub queues: Vec<QueueReport>,
}

/// One deployment's queue.
#[derive(Debug, Clone)]
pub struct QueueReport {
    /// Its application.
    pub app: Arc<str>,
    /// The deployment.
    pub deployment: String,
    /// Requests waiting for a replica.
    pub queued: usize,
}

/// One replica's counters.
#[derive(Debug, Clone)]
pub struct ReplicaMetrics {
    /// Its application.
    pub app: Arc<str>,
    /// Its deployment.
    pub deployment: Arc<str>,
    /// Its id.
    pub replica: Arc<str>,
    /// Its node, in a cluster.
    pub node: Option<Arc<str>>,
    /// Requests answered, by status class (1xx to 5xx).
    pub requests_by_class: [u64; 5],
    /// Time from dispatch to response headers.
    pub duration: HistogramSnapshot,
    /// Requests in progress.
    pub ongoing: usize,
    /// Its caches' counters, summed (none: it has no cache).
    pub cache: Option<MetricsSnapshot>,
    /// The models loaded now (with their pinning and size).
    pub loaded_models: Vec<modelmux_cache::ModelInfo>,
    /// The families its deployment adds (an LLM engine's token counts, say).
    pub families: Vec<MetricFamily>,
    /// Which of them the dashboard charts, as the deployment marked them.
    pub dashboard: Option<DashboardSeries>,
}

impl ModelsReport {
    /// The models of every replica of `apps` now (this node's, `node`, and those other
    /// nodes told of).
    pub(crate) fn of(apps: &Applications, node: Option<&str>) -> Self {
        let applications = apps
            .iter()
            .map(|app| AppModels {
                name: app.name.to_string(),
                route_prefix: app.route_prefix.clone(),
                deployments: app
                    .deployments
                    .iter()
                    .map(|(router, _)| DeploymentModels {
                        name: router.name().to_string(),
                        queued_requests: router.queued(),
                        replicas: router
                            .replicas()
                            .iter()
                            .map(|r| local_models(r, node))
                            .chain(router.remotes().iter().map(|r| remote_models(r)))
                            .collect(),
                    })
                    .collect(),
            })
            .collect();
        Self { applications }
    }
}

impl MetricsReport {
    /// Every counter of the replicas of `apps` on this node now.
    pub(crate) fn of(apps: &Applications) -> Self {
        let replicas = apps
            .routers()
            .flat_map(|r| r.replicas().to_vec())
            .map(|r| replica_metrics(&r))
            .collect();
        let queues = apps
            .routers()
            .map(|r| QueueReport {
                app: r.app.clone(),
                deployment: r.name().to_string(),
                queued: r.queued(),
            })
            .collect();
        Self { replicas, queues }
    }
}

fn local_models(replica: &Replica, node: Option<&str>) -> ReplicaModels {
    let mut loaded = Vec::new();
    let mut loading = Vec::new();
    let mut queued = Vec::new();
    for info in replica.caches.iter().flat_map(|c| c.models()) {
        match info.status {
            ModelStatus::Loaded => loaded.push(LoadedModel {
                id: info.id.to_string(),
                size_bytes: Some(info.size_bytes),
                in_use: Some(info.in_use),
                pinned: Some(info.pinned),
                idle_seconds: Some(info.idle_for.as_secs_f64()),
            }),
            ModelStatus::Loading => loading.push(info.id.to_string()),
            ModelStatus::Queued => queued.push(info.id.to_string()),
        }
    }
    ReplicaModels {
        id: replica.id.to_string(),
        node: node.map(str::to_string),
        remote: false,
        available: replica.is_available(),
        ongoing_requests: replica.ongoing(),
        waiting_for_load: Some(replica.slot.loading_waiters()),
        max_ongoing_requests: replica.max_ongoing(),
        loaded,
        loading,
        queued,
        draining: replica.caches.iter().flat_map(|c| c.draining()).collect(),
    }
}

/// A replica on another node, as this node last heard of it.
fn remote_models(replica: &RemoteReplica) -> ReplicaModels {
    let mut loaded = Vec::new();
    let mut loading = Vec::new();
    let mut holdings: Vec<_> = replica.slot.holdings().into_iter().collect();
    holdings.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    for (id, holding) in holdings {
        match holding {
            Holding::Loaded => loaded.push(LoadedModel {
                id: id.to_string(),
                size_bytes: None,
                in_use: None,
                pinned: None,
                idle_seconds: None,
            }),
            Holding::Loading | Holding::Pending(_) => loading.push(id.to_string()),
        }
    }
    ReplicaModels {
        id: replica.slot.id().to_string(),
        node: Some(replica.node.to_string()),
        remote: true,
        available: replica.reachable() && replica.slot.is_available(),
        ongoing_requests: replica.ongoing(),
        waiting_for_load: None,
        max_ongoing_requests: replica.slot.max_ongoing(),
        loaded,
        loading,
        queued: Vec::new(),
        draining: Vec::new(),
    }
}

fn replica_metrics(r: &Replica) -> ReplicaMetrics {
    let loaded_models = r
        .caches
        .iter()
        .flat_map(|c| c.models())
        .filter(|info| info.status == ModelStatus::Loaded)
        .collect();
    ReplicaMetrics {
        app: r.app.clone(),
        deployment: r.deployment.clone(),
        replica: r.id.clone(),
        node: r.node.clone(),
        requests_by_class: std::array::from_fn(|i| r.metrics.by_class[i].load(Ordering::Relaxed)),
        duration: r.metrics.duration.snapshot(),
        ongoing: r.ongoing(),
        cache: cache_metrics(r),
        loaded_models,
        families: r.metric_sources.iter().flat_map(|s| s.collect()).collect(),
        dashboard: r.metric_sources.iter().find_map(|s| s.dashboard()),
    }
}

/// One replica's cache metrics (summed over its caches; usually one).
fn cache_metrics(replica: &Replica) -> Option<MetricsSnapshot> {
    let mut all = replica.caches.iter().map(|c| c.metrics());
    let first = all.next()?;
    Some(all.fold(first, |mut a, b| {
        a.hits += b.hits;
        a.misses += b.misses;
        a.loads += b.loads;
        a.load_failures += b.load_failures;
        a.unloads += b.unloads;
        a.unload_failures += b.unload_failures;
        a.evictions += b.evictions;
        a.loads_abandoned += b.loads_abandoned;
        a.gauges.loaded += b.gauges.loaded;
        a.gauges.loading += b.gauges.loading;
        a.gauges.used_bytes += b.gauges.used_bytes;
        a
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON of `/-/models` that `modelmux status` and the dashboard read: a local replica
    /// has every field (`node` and an unknown size are null), a remote one says `remote` and
    /// has no per-model details and no `waiting_for_load`.
    #[test]
    fn local_and_remote_replicas_keep_their_json_shapes() {
        let local = ReplicaModels {
            id: "d#a".into(),
            node: None,
            remote: false,
            available: true,
            ongoing_requests: 1,
            waiting_for_load: Some(0),
            max_ongoing_requests: 5,
            loaded: vec![LoadedModel {
                id: "m".into(),
                size_bytes: Some(None),
                in_use: Some(1),
                pinned: Some(false),
                idle_seconds: Some(0.5),
            }],
            loading: vec!["n".into()],
            queued: vec!["q".into()],
            draining: Vec::new(),
        };
        assert_eq!(
            serde_json::to_value(&local).unwrap(),
            serde_json::json!({
                "id": "d#a", "node": null, "available": true, "ongoing_requests": 1,
                "waiting_for_load": 0, "max_ongoing_requests": 5,
                "loaded": [{"id": "m", "size_bytes": null, "in_use": 1, "pinned": false,
                            "idle_seconds": 0.5}],
                "loading": ["n"],
                "queued": ["q"],
            })
        );
        let remote = ReplicaModels {
            id: "d#b@n2".into(),
            node: Some("n2".into()),
            remote: true,
            waiting_for_load: None,
            loaded: vec![LoadedModel {
                id: "m".into(),
                size_bytes: None,
                in_use: None,
                pinned: None,
                idle_seconds: None,
            }],
            queued: Vec::new(),
            ..local
        };
        assert_eq!(
            serde_json::to_value(&remote).unwrap(),
            serde_json::json!({
                "id": "d#b@n2", "node": "n2", "remote": true, "available": true,
                "ongoing_requests": 1, "max_ongoing_requests": 5,
                "loaded": [{"id": "m"}], "loading": ["n"],
            })
        );
    }
}
