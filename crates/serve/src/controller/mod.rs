//! The controller: the applications of one process and their deployments' replicas. It starts
//! them, checks their health and replaces those that fail, and drains and stops them in order.
//! It knows nothing of HTTP: the front (the `modelmux-front` crate) reads it and sends requests
//! to its deployments through the [`Dispatch`](crate::Dispatch) port.
//!
//! Its parts, each a type that owns its state: [`Applications`](applications) (the
//! applications, their routers and specs), [`Readiness`](readiness), [`Operations`] (what an
//! operator does to models), [`Reconfiguration`] (changing running deployments, and the
//! replicas it retires), [`NodeHandle`] (the cluster layer's port), and the reports.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::deployment_router::{CallToken, DeploymentRouter};
use crate::error::StartError;
use crate::replica::Replica;

mod applications;
mod autoscaling;
mod loss;
mod node;
mod operations;
mod readiness;
mod reconfigure;
mod report;

pub use applications::{AppState, Application};
pub use node::NodeHandle;
pub use operations::{ControlAnswer, Operations};
pub use readiness::Health;
pub use reconfigure::Reconfiguration;
pub use report::{
    AppModels, DeploymentModels, LoadedModel, MetricsReport, ModelsReport, QueueReport,
    ReplicaMetrics, ReplicaModels,
};

use applications::{Applications, SpecCell};
use readiness::Readiness;

/// The applications of a process, running: what the HTTP front serves and the cluster layer
/// publishes. Every request reaches them through [`Dispatch`](crate::Dispatch).
pub struct Controller {
    apps: Arc<Applications>,
    readiness: Arc<Readiness>,
    reconfiguration: Reconfiguration,
    node: NodeHandle,
    /// Whether this node runs replicas (a router-only node forwards everything).
    run_replicas: bool,
}

impl Controller {
    /// This node's id in a cluster.
    pub fn node_id(&self) -> Option<&str> {
        self.node.node_id()
    }

    /// Starts every replica of every application (none when `run_replicas` is false: a
    /// router that forwards everything to other nodes). Fails if any replica fails to start.
    /// [`new`](Self::new) then [`start_replicas`](Self::start_replicas).
    pub async fn start(
        apps: Vec<Application>,
        node_id: Option<String>,
        run_replicas: bool,
    ) -> Result<Self, StartError> {
        let controller = Self::new(apps, node_id, run_replicas)?;
        controller.start_replicas().await?;
        Ok(controller)
    }

    /// The applications with their routers and handles, no replica started yet: readiness
    /// reports every deployment as loading until [`start_replicas`](Self::start_replicas)
    /// has run. Lets the HTTP front listen (and answer health checks) while models load.
    pub fn new(
        apps: Vec<Application>,
        node_id: Option<String>,
        run_replicas: bool,
    ) -> Result<Self, StartError> {
        let changes = Arc::new(Notify::new());
        let call_token = Arc::new(CallToken::default());
        let (apps, starting) = Applications::build(apps, run_replicas, &changes, &call_token)?;
        let apps = Arc::new(apps);
        let readiness = Arc::new(Readiness::new(starting));
        let node = NodeHandle::new(
            apps.clone(),
            readiness.clone(),
            node_id.as_deref(),
            changes,
            call_token,
        );
        let reconfiguration = Reconfiguration::new(apps.clone(), node.clone(), run_replicas);
        Ok(Self {
            apps,
            readiness,
            reconfiguration,
            node,
            run_replicas,
        })
    }

    /// The cluster layer's port on these applications.
    pub fn node(&self) -> &NodeHandle {
        &self.node
    }

    /// What an operator can do to the applications' models.
    pub fn operations(&self) -> Operations<'_> {
        Operations::new(&self.apps)
    }

    /// Changes to running deployments: scale, roll, caps.
    pub fn reconfiguration(&self) -> &Reconfiguration {
        &self.reconfiguration
    }

    /// Starts each deployment's replicas (`num_replicas` of them, at once; none on a
    /// router-only node), one deployment after another in the order the applications
    /// declare them (a constructor may call the deployments declared before its own); a
    /// deployment leaves the loading list when all of its replicas have started. Fails with
    /// the first replica that fails to start (the others keep running until
    /// [`stop`](Self::stop)).
    pub async fn start_replicas(&self) -> Result<(), StartError> {
        if !self.run_replicas {
            return Ok(());
        }
        for app in self.apps.iter() {
            for (router, spec) in &app.deployments {
                let spec = spec.read().clone();
                let starts = (0..spec.config.num_replicas)
                    .map(|_| self.reconfiguration.start_one(&spec, app, router));
                let replicas = match futures_util::future::try_join_all(starts).await {
                    Ok(replicas) => replicas,
                    Err(source) => {
                        // Nothing more starts: whoever waits for a replica here is told so.
                        for router in self.apps.routers() {
                            router.set_starting(false);
                        }
                        return Err(StartError::Replica {
                            deployment: spec.config.name.clone(),
                            source,
                        });
                    }
                };
                router.set_replicas(replicas.into_iter().map(Arc::new).collect());
                self.readiness
                    .started(&format!("{}/{}", app.name, spec.config.name));
            }
        }
        Ok(())
    }

    /// Deployments whose first replicas are still starting (`app/deployment`).
    pub fn loading(&self) -> Vec<String> {
        self.readiness.loading()
    }

    /// Starts checking every replica's health each period, until `stopped` turns true.
    pub fn watch_health(self: &Arc<Self>, stopped: &watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
        self.apps
            .iter()
            .enumerate()
            .flat_map(|(a, app)| (0..app.deployments.len()).map(move |d| (a, d)))
            .map(|(a, d)| tokio::spawn(health_loop(self.clone(), a, d, stopped.clone())))
            .collect()
    }

    /// Starts the autoscaling loop of every deployment (those without `autoscaling_config`
    /// idle in theirs, until a reload gives them one), until `stopped` turns true. On a
    /// router-only node nothing scales: its deployments run no replica here.
    pub fn autoscale(self: &Arc<Self>, stopped: &watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
        if !self.run_replicas {
            return Vec::new();
        }
        self.apps
            .iter()
            .enumerate()
            .flat_map(|(a, app)| (0..app.deployments.len()).map(move |d| (a, d)))
            .map(|(a, d)| tokio::spawn(autoscaling::run(self.clone(), a, d, stopped.clone())))
            .collect()
    }

    /// The application whose prefix is the longest one matching `path`.
    pub fn app_for(&self, path: &str) -> Option<&AppState> {
        self.apps.for_path(path)
    }

    /// Every deployment's router, of every application.
    pub(crate) fn routers(&self) -> impl Iterator<Item = &Arc<DeploymentRouter>> {
        self.apps.routers()
    }

    /// Checks that `apps` can run together (names, route prefixes, deployments), as
    /// [`start`](Self::start) does first; a server checks this before its own settings.
    pub fn validate(apps: &[Application]) -> Result<(), StartError> {
        applications::validate(apps)
    }

    /// Each application's route prefix and name.
    pub fn routes(&self) -> Vec<(String, Arc<str>)> {
        self.apps
            .iter()
            .map(|a| (a.route_prefix.clone(), a.name.clone()))
            .collect()
    }

    /// Whether the applications can take requests (a deployment with a reachable replica on
    /// another node counts as available).
    pub fn health(&self) -> Health {
        self.readiness.health(&self.apps)
    }

    /// The models of every replica now.
    pub fn models(&self) -> ModelsReport {
        ModelsReport::of(&self.apps, self.node_id())
    }

    /// Every counter of this node's replicas now.
    pub fn metrics(&self) -> MetricsReport {
        MetricsReport::of(&self.apps)
    }

    /// Whether shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.readiness.is_draining()
    }

    /// Shutdown begins: readiness fails from now on, and in a cluster the drain is published
    /// at once (other nodes stop sending requests).
    pub fn begin_drain(&self) {
        self.readiness.begin_drain();
        self.node.changes().notify_one();
    }

    /// Stops the deployments in order and unloads every model: the ingress deployments stop
    /// taking requests and their requests in flight finish (they may still call other
    /// deployments through handles); then the deployments they call stop and drain; then every
    /// model is unloaded. Returns the latest deadline any deployment's drain had.
    pub async fn stop(&self) -> Instant {
        let ingress: Vec<Arc<DeploymentRouter>> =
            self.apps.iter().map(|a| a.ingress.clone()).collect();
        let is_ingress = |r: &Arc<DeploymentRouter>| ingress.iter().any(|i| Arc::ptr_eq(i, r));
        let mut latest = Instant::now();
        for phase in [true, false] {
            for router in self.routers().filter(|r| is_ingress(r) == phase) {
                router.stop_accepting();
            }
            for router in self.routers().filter(|r| is_ingress(r) == phase) {
                let deadline = Instant::now() + router.config.graceful_shutdown_timeout;
                latest = latest.max(deadline);
                for replica in router.replicas().iter() {
                    drain(replica, deadline).await;
                }
            }
        }
        self.reconfiguration.retired_by(latest).await;
        for router in self.routers() {
            for replica in router.replicas().iter() {
                replica
                    .shutdown(latest.saturating_duration_since(Instant::now()))
                    .await;
            }
        }
        latest
    }
}

/// Waits until `replica` has no request in progress, or `deadline`.
pub(crate) async fn drain(replica: &Replica, deadline: Instant) {
    replica.slot.set_available(false);
    while replica.slot.inside() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks the health of each replica of deployment `d` of application `a` every period;
/// replaces one that fails.
async fn health_loop(
    controller: Arc<Controller>,
    a: usize,
    d: usize,
    mut stopped: watch::Receiver<bool>,
) {
    let app = controller.apps.iter().nth(a).expect("an application");
    let (router, cell): &(Arc<DeploymentRouter>, SpecCell) = &app.deployments[d];
    loop {
        let spec = cell.read().clone();
        tokio::select! {
            _ = stopped.changed() => return,
            _ = tokio::time::sleep(spec.config.health_check_period) => {}
        }
        for replica in router.replicas().iter() {
            let Err(reason) = replica.check_health(spec.config.health_check_timeout).await else {
                continue;
            };
            tracing::warn!(replica = %replica.id, %reason, "replica failed its health check; replacing it");
            let replaced = controller
                .reconfiguration
                .replace(&spec, app, router, replica)
                .await;
            if let Err(e) = replaced {
                // Keep the old one serving and try again next period.
                tracing::error!(deployment = %spec.config.name, error = %e, "could not start a replacement replica; keeping the old one");
            }
        }
    }
}
