//! Changing a running deployment without a restart: its replica count (up: new replicas take
//! traffic once started; down: the models only the replicas cheapest to lose hold that were
//! used in the last minute are loaded on the survivors while the leavers still serve, then the
//! leavers leave routing and drain), its caches' caps (in place) and its spec (a roll: new replicas start and take
//! traffic before the old ones drain), and its sick replicas (replaced, the old one serving until
//! its replacement has started). Other deployments are not touched: their replicas and warm
//! models stay. [`Reconfiguration`] owns the replicas it has taken out of routing while they
//! drain: shutdown waits for them.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use modelmux_cache::{ModelId, ModelStatus};
use tokio::time::Instant;

use tokio::task::JoinHandle;

use super::applications::{AppState, Applications};
use super::drain;
use super::loss::{self, Copy};
use super::node::NodeHandle;
use crate::deployment::{DeploymentConfig, DeploymentSpec};
use crate::deployment_router::DeploymentRouter;
use crate::error::{ServeError, StartError};
use crate::replica::Replica;

/// A model used this recently on a replica that leaves is loaded on a survivor first.
const RECENT: Duration = Duration::from_secs(60);

/// Changes to running deployments ([`Controller::reconfiguration`](crate::Controller::reconfiguration)).
pub struct Reconfiguration {
    apps: Arc<Applications>,
    /// This node: its id (part of every replica id) and the notifier of replica set changes.
    node: NodeHandle,
    /// Whether this node runs replicas (on a router-only node only the specs change).
    run_replicas: bool,
    /// Replicas out of routing, draining and shutting down.
    retiring: parking_lot::Mutex<Vec<JoinHandle<()>>>,
}

impl Reconfiguration {
    pub(crate) fn new(apps: Arc<Applications>, node: NodeHandle, run_replicas: bool) -> Self {
        Self {
            apps,
            node,
            run_replicas,
            retiring: parking_lot::Mutex::default(),
        }
    }

    /// The settings deployment `deployment` of application `app` runs with.
    pub fn deployment_config(&self, app: &str, deployment: &str) -> Option<DeploymentConfig> {
        let (_, cell) = self.apps.deployment_of(app, deployment).ok()?;
        Some(cell.read().config.clone())
    }

    /// Runs `replicas` replicas of `deployment` (at least one, unless it autoscales with
    /// `min_replicas: 0`: then none is a deployment whose next request starts one). Returns once the new ones
    /// have started (scaling up) or the leaving ones, their recent models loaded on the
    /// survivors, have left routing (scaling down: their
    /// draining goes on in the background, and shutdown waits for it).
    pub async fn scale(
        &self,
        app: &str,
        deployment: &str,
        replicas: usize,
    ) -> Result<(), ServeError> {
        let (router, cell) = self.apps.deployment_of(app, deployment)?;
        // None only where autoscaling may go to zero.
        let floor = usize::from(
            (cell.read().config.autoscaling.as_ref()).is_none_or(|a| a.min_replicas > 0),
        );
        let replicas = replicas.max(floor);
        cell.write().config.num_replicas = replicas;
        if !self.run_replicas {
            return Ok(());
        }
        let spec = cell.read().clone();
        let running = router.replicas().to_vec();
        if replicas > running.len() {
            let fresh = self
                .start_many(&spec, app, router, replicas - running.len())
                .await?;
            let mut next = router.replicas().to_vec();
            next.extend(fresh);
            router.set_replicas(next);
            tracing::info!(app, deployment, replicas, "scaled up");
        } else if replicas < running.len() {
            let leaving = cheapest_to_lose(&running, running.len() - replicas);
            let staying: Vec<Arc<Replica>> = running
                .iter()
                .filter(|r| !leaving.iter().any(|l| Arc::ptr_eq(l, r)))
                .cloned()
                .collect();
            // Warm the survivors with what only the leavers held and was used lately, while
            // the leavers still serve: no request pays a load for the scale-down.
            let held: HashSet<String> = staying
                .iter()
                .flat_map(|r| loaded(r).into_iter().map(|(id, _)| id))
                .collect();
            let hot: HashSet<String> = leaving
                .iter()
                .flat_map(|r| loaded(r))
                .filter(|(id, idle)| *idle < RECENT && !held.contains(id))
                .map(|(id, _)| id)
                .collect();
            for id in hot {
                if let Ok(id) = ModelId::new(id)
                    && let Err(e) = load_into(&staying, &id).await
                {
                    tracing::warn!(app, deployment, model = %id, error = %e, "could not move a model off a replica scaled away");
                }
            }
            let none_left = staying.is_empty();
            router.set_replicas(staying);
            if none_left {
                router.set_wakes_from_zero(true);
            }
            for old in leaving {
                self.retire(old, spec.config.graceful_shutdown_timeout);
            }
            tracing::info!(app, deployment, replicas, "scaled down");
        }
        Ok(())
    }

    /// Replaces `spec`'s deployment (same name) with `spec`: its replicas start, take traffic
    /// once all have started, and the old replicas drain. If one fails to start, the old ones
    /// keep serving and the error is returned.
    pub async fn roll(&self, app: &str, spec: DeploymentSpec) -> Result<(), ServeError> {
        self.roll_with(app, spec, false).await
    }

    /// As [`roll`](Self::roll), and returns only once the old replicas have drained and shut
    /// down (their models unloaded, their unload hooks run): what Ray's `serve.run` of a
    /// running application waits for.
    pub async fn roll_and_retire(&self, app: &str, spec: DeploymentSpec) -> Result<(), ServeError> {
        self.roll_with(app, spec, true).await
    }

    async fn roll_with(
        &self,
        app: &str,
        spec: DeploymentSpec,
        wait: bool,
    ) -> Result<(), ServeError> {
        let deployment = spec.config.name.clone();
        let (router, cell) = self.apps.deployment_of(app, &deployment)?;
        if self.run_replicas {
            let fresh = self
                .start_many(&spec, app, router, spec.config.num_replicas)
                .await?;
            let old = router.replicas().to_vec();
            router.set_replicas(fresh);
            let grace = cell.read().config.graceful_shutdown_timeout;
            if wait {
                let deadline = Instant::now() + grace;
                futures_util::future::join_all(old.iter().map(|r| wind_down(r, deadline))).await;
            } else {
                for replica in old {
                    self.retire(replica, grace);
                }
            }
        }
        *cell.write() = spec;
        tracing::info!(app, deployment, "rolled");
        Ok(())
    }

    /// Changes `spec`'s deployment in place: its replicas' model caches get the caps
    /// `max_models` / `max_bytes` (a lower cap evicts idle models first, in policy order;
    /// models in use finish first), and replicas started from now on (scaling up, replacing a
    /// sick one) are built from `spec`. Its replicas and their other models stay.
    pub fn set_caps(
        &self,
        app: &str,
        spec: DeploymentSpec,
        max_models: Option<usize>,
        max_bytes: Option<u64>,
    ) -> Result<(), ServeError> {
        let deployment = spec.config.name.clone();
        let (router, cell) = self.apps.deployment_of(app, &deployment)?;
        for replica in router.replicas().iter() {
            replica.set_caps(max_models, max_bytes);
        }
        *cell.write() = spec;
        self.node.changes().notify_one();
        tracing::info!(
            app,
            deployment,
            ?max_models,
            ?max_bytes,
            "caps changed in place"
        );
        Ok(())
    }

    async fn start_many(
        &self,
        spec: &DeploymentSpec,
        app: &str,
        router: &Arc<DeploymentRouter>,
        n: usize,
    ) -> Result<Vec<Arc<Replica>>, ServeError> {
        let state = self.apps.get(app).ok_or_else(|| ServeError::NotFound {
            what: format!("no application '{app}'"),
        })?;
        let starts = (0..n).map(|_| self.start_one(spec, state, router));
        let started = futures_util::future::try_join_all(starts)
            .await
            .map_err(|source| {
                let e = StartError::Replica {
                    deployment: spec.config.name.clone(),
                    source,
                };
                ServeError::BadRequest {
                    message: e.to_string(),
                }
            })?;
        self.node.changes().notify_one();
        Ok(started.into_iter().map(Arc::new).collect())
    }

    /// Starts one replica of `state`'s deployment `spec`, routed by `router`.
    pub(crate) async fn start_one(
        &self,
        spec: &DeploymentSpec,
        state: &AppState,
        router: &Arc<DeploymentRouter>,
    ) -> Result<Replica, modelmux_cache::BoxError> {
        let node = self.node.node_id();
        Replica::start(
            spec,
            &state.name,
            node,
            state.handles.clone(),
            router.waker(),
        )
        .await
    }

    /// Replaces `sick`, a replica of `state`'s deployment `spec` that failed its health
    /// check: the old one keeps serving while its replacement starts (a deployment of one
    /// replica is never left with none), then retires. If the replacement cannot start, the
    /// old one stays.
    pub(crate) async fn replace(
        &self,
        spec: &DeploymentSpec,
        state: &AppState,
        router: &Arc<DeploymentRouter>,
        sick: &Arc<Replica>,
    ) -> Result<(), modelmux_cache::BoxError> {
        let fresh = Arc::new(self.start_one(spec, state, router).await?);
        let next = router
            .replicas()
            .iter()
            .map(|r| {
                if Arc::ptr_eq(r, sick) {
                    fresh.clone()
                } else {
                    r.clone()
                }
            })
            .collect();
        router.set_replicas(next);
        self.retire(sick.clone(), spec.config.graceful_shutdown_timeout);
        Ok(())
    }

    /// Drains `replica` (out of routing already) and unloads its models, in the background;
    /// shutdown waits for it.
    fn retire(&self, replica: Arc<Replica>, grace: Duration) {
        let deadline = Instant::now() + grace;
        let task = tokio::spawn(async move { wind_down(&replica, deadline).await });
        let mut retiring = self.retiring.lock();
        retiring.retain(|t| !t.is_finished());
        retiring.push(task);
        self.node.changes().notify_one();
    }

    /// Waits until every replica retired so far has shut down, or `deadline`.
    pub(crate) async fn retired_by(&self, deadline: Instant) {
        let retiring: Vec<_> = self.retiring.lock().drain(..).collect();
        for task in retiring {
            let _ = tokio::time::timeout_at(deadline, task).await;
        }
    }
}

/// Loads `id` on the one of `replicas` a first request for it would go to.
async fn load_into(replicas: &[Arc<Replica>], id: &ModelId) -> Result<(), ServeError> {
    let Some(index) = crate::router::place(replicas, id, Instant::now()) else {
        return Ok(());
    };
    if let Some(cache) = replicas[index].caches.first() {
        cache.load(id.as_str(), false).await?;
    }
    Ok(())
}

/// Waits for `replica`'s requests to finish (until `deadline`), then shuts it down: its
/// models unloaded, with what is left of the deadline for their unload hooks.
async fn wind_down(replica: &Replica, deadline: Instant) {
    drain(replica, deadline).await;
    replica
        .shutdown(deadline.saturating_duration_since(Instant::now()))
        .await;
}

/// Each loaded model of `replica` and how long it has been idle.
fn loaded(replica: &Replica) -> Vec<(String, Duration)> {
    replica
        .caches
        .iter()
        .flat_map(|c| c.models())
        .filter(|m| m.status == ModelStatus::Loaded)
        .map(|m| (m.id.to_string(), m.idle_for))
        .collect()
}

/// The `n` replicas whose leaving loses least ([`loss::cheapest`]): by the reload time the
/// models only they hold would cost their next requests.
fn cheapest_to_lose(replicas: &[Arc<Replica>], n: usize) -> Vec<Arc<Replica>> {
    use crate::placement::ReplicaView;
    let models: Vec<Vec<Copy>> = replicas
        .iter()
        .map(|r| {
            (r.caches.iter().flat_map(|c| c.models()))
                .filter(|m| m.status == ModelStatus::Loaded)
                .map(|m| Copy {
                    load_time: r.slot.load_time(&m.id),
                    id: m.id.to_string(),
                    idle: m.idle_for,
                })
                .collect()
        })
        .collect();
    let inside: Vec<usize> = replicas.iter().map(|r| r.slot.inside()).collect();
    loss::cheapest(&models, &inside, n, RECENT)
        .into_iter()
        .map(|i| replicas[i].clone())
        .collect()
}
