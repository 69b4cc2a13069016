//! The controller: the applications of one process and their deployments' replicas. It starts
//! them, checks their health and replaces those that fail, and drains and stops them in order.
//! It knows nothing of HTTP: the front (the `modelmux-front` crate) reads it and sends requests
//! to its deployments through the [`Dispatch`](crate::Dispatch) port.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::deployment::DeploymentSpec;
use crate::deployment_router::{CallToken, DeploymentRouter};
use crate::error::StartError;
use crate::handle::{AppDirectory, HandleDirectory};
use crate::replica::Replica;

mod cluster;
mod node;
mod operate;
mod reconfigure;
mod report;

pub use node::NodeHandle;
pub use operate::ControlAnswer;
pub use report::{
    AppModels, DeploymentModels, Health, LoadedModel, MetricsReport, ModelsReport, QueueReport,
    ReplicaMetrics, ReplicaModels,
};

/// A set of deployments served under one route prefix; requests under the prefix go to its
/// ingress deployment, which may call the others through handles.
#[derive(Clone)]
pub struct Application {
    pub(crate) name: String,
    pub(crate) route_prefix: String,
    pub(crate) deployments: Vec<DeploymentSpec>,
    pub(crate) ingress: Option<String>,
}

impl Application {
    /// An application named `name`, served at `/` until [`route_prefix`](Self::route_prefix)
    /// says otherwise.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            route_prefix: "/".to_string(),
            deployments: Vec::new(),
            ingress: None,
        }
    }

    /// The path prefix it serves (`/` by default). Requests go to the application with the
    /// longest matching prefix.
    pub fn route_prefix(mut self, prefix: &str) -> Self {
        self.route_prefix = prefix.to_string();
        self
    }

    /// Adds a deployment that other deployments call through handles.
    pub fn deployment(mut self, spec: DeploymentSpec) -> Self {
        self.deployments.push(spec);
        self
    }

    /// The application's deployments, in the order they were added (to roll them one by one
    /// into a running application of the same name).
    pub fn into_deployments(self) -> Vec<DeploymentSpec> {
        self.deployments
    }

    /// Adds the deployment that receives the application's HTTP requests. Without one, the
    /// first deployment added is the ingress.
    pub fn ingress(mut self, spec: DeploymentSpec) -> Self {
        self.ingress = Some(spec.config.name.clone());
        self.deployments.push(spec);
        self
    }
}

/// One running application.
pub struct AppState {
    pub(crate) name: Arc<str>,
    pub(crate) route_prefix: String,
    pub(crate) ingress: Arc<DeploymentRouter>,
    /// Each deployment's router and spec (swapped when a reconfiguration rolls it).
    pub(crate) deployments: Vec<(Arc<DeploymentRouter>, SpecCell)>,
    handles: HandleDirectory,
}

/// A deployment's current spec: what new replicas (scaling up, replacing a sick one) are
/// built from.
pub(crate) type SpecCell = Arc<parking_lot::RwLock<DeploymentSpec>>;

/// The applications of a process, running: what the HTTP front serves and the cluster layer
/// publishes. Every request reaches them through [`Dispatch`](crate::Dispatch).
pub struct Controller {
    pub(crate) apps: Vec<AppState>,
    /// This node's id in a cluster (part of every replica id).
    pub(crate) node_id: Option<String>,
    /// Set when shutdown begins: readiness fails from then on.
    draining: AtomicBool,
    /// Replicas replaced after failing a health check, still draining (shutdown awaits them).
    retiring: parking_lot::Mutex<Vec<JoinHandle<()>>>,
    /// Notified whenever a local replica's models or the replica set change.
    pub(crate) changes: Arc<Notify>,
    /// An extra readiness condition (the cluster layer's: etcd reachable lately).
    readiness: parking_lot::RwLock<Option<Readiness>>,
    /// Whether this node runs replicas (a router-only node forwards everything).
    run_replicas: bool,
    /// Deployments (`app/deployment`) whose first replicas are still starting: readiness
    /// fails, naming them, until [`start_replicas`](Controller::start_replicas) ends.
    starting: parking_lot::Mutex<Vec<String>>,
    /// The token handle calls carry to other nodes (every router shares it).
    call_token: Arc<CallToken>,
}

/// An extra condition for readiness: `Err(reason)` makes the applications not ready.
pub(crate) type Readiness = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

impl AppState {
    /// Its name.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Sends `request` to its ingress deployment: what [`Dispatch::dispatch`](crate::Dispatch)
    /// on that deployment does, without boxing the call's future or cloning the
    /// port (the HTTP front's path, once per request). The response does not carry the
    /// request's model as a [`ServedModel`](crate::ServedModel): the caller named it.
    pub fn dispatch(
        &self,
        request: crate::Request,
        context: modelmux_context::RequestContext,
        route: crate::Route,
    ) -> impl Future<Output = crate::Dispatched> + Send + '_ {
        self.ingress.run(request, context, route, false)
    }
}

impl Controller {
    /// This node's id in a cluster.
    pub fn node_id(&self) -> Option<&str> {
        self.node_id.as_deref()
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
        validate(&apps)?;
        let changes = Arc::new(Notify::new());
        let call_token = Arc::new(CallToken::default());
        let mut states = Vec::new();
        // Every application's routers first: a replica may hold handles to any of them.
        let routers: Vec<HashMap<String, Arc<DeploymentRouter>>> = apps
            .iter()
            .map(|app| {
                let name: Arc<str> = app.name.as_str().into();
                app.deployments
                    .iter()
                    .map(|d| {
                        let router = DeploymentRouter::new(
                            name.clone(),
                            d.config.clone(),
                            changes.clone(),
                            call_token.clone(),
                        );
                        (d.config.name.clone(), Arc::new(router))
                    })
                    .collect()
            })
            .collect();
        let directory: Arc<HashMap<String, AppDirectory>> = Arc::new(
            apps.iter()
                .zip(&routers)
                .map(|(app, routers)| {
                    let deployments = routers
                        .iter()
                        .map(|(name, r)| (name.clone(), r.clone() as Arc<dyn crate::Dispatch>))
                        .collect();
                    let ingress = app
                        .ingress
                        .clone()
                        .unwrap_or_else(|| app.deployments[0].config.name.clone());
                    let app_directory = AppDirectory {
                        ingress,
                        deployments: Arc::new(deployments),
                    };
                    (app.name.clone(), app_directory)
                })
                .collect(),
        );
        let mut starting = Vec::new();
        for (app, routers) in apps.into_iter().zip(routers) {
            let name: Arc<str> = app.name.as_str().into();
            let handles = HandleDirectory::new(&app.name, directory.clone());
            let ingress_name = app
                .ingress
                .clone()
                .unwrap_or_else(|| app.deployments[0].config.name.clone());
            let mut deployments = Vec::new();
            for spec in app.deployments {
                let router = routers[&spec.config.name].clone();
                if run_replicas && spec.config.num_replicas > 0 {
                    starting.push(format!("{name}/{}", spec.config.name));
                    router.set_starting(true);
                }
                deployments.push((router, Arc::new(parking_lot::RwLock::new(spec))));
            }
            states.push(AppState {
                ingress: routers[&ingress_name].clone(),
                name,
                route_prefix: app.route_prefix,
                deployments,
                handles,
            });
        }
        Ok(Self {
            apps: states,
            node_id,
            draining: AtomicBool::new(false),
            retiring: parking_lot::Mutex::default(),
            changes,
            readiness: parking_lot::RwLock::default(),
            run_replicas,
            starting: parking_lot::Mutex::new(starting),
            call_token,
        })
    }

    /// Lets handle calls go to replicas on other nodes of the cluster, carrying `token` (this
    /// node's admin token, which the other nodes' call endpoints check: every node of a
    /// cluster must have the same one). Without a token (the default, or `None`, or an empty
    /// one), handle calls stay on this node. The server sets it from its admin token when it
    /// starts.
    pub fn set_call_token(&self, token: Option<&str>) {
        self.call_token.set(token);
    }

    /// Whether handle calls may go to other nodes: a member of a cluster with a call token.
    pub fn forwards_handle_calls(&self) -> bool {
        self.node_id.is_some() && self.call_token.is_set()
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
        let node_id = self.node_id.as_deref();
        for app in &self.apps {
            for (router, spec) in &app.deployments {
                let spec = spec.read().clone();
                let starts = (0..spec.config.num_replicas).map(|_| {
                    Replica::start(
                        &spec,
                        &app.name,
                        node_id,
                        app.handles.clone(),
                        router.waker(),
                    )
                });
                let replicas = match futures_util::future::try_join_all(starts).await {
                    Ok(replicas) => replicas,
                    Err(source) => {
                        // Nothing more starts: whoever waits for a replica here is told so.
                        for (router, _) in self.apps.iter().flat_map(|a| &a.deployments) {
                            router.set_starting(false);
                        }
                        return Err(StartError::Replica {
                            deployment: spec.config.name.clone(),
                            source,
                        });
                    }
                };
                router.set_replicas(replicas.into_iter().map(Arc::new).collect());
                let name = format!("{}/{}", app.name, spec.config.name);
                self.starting.lock().retain(|d| *d != name);
            }
        }
        Ok(())
    }

    /// Deployments whose first replicas are still starting (`app/deployment`).
    pub fn loading(&self) -> Vec<String> {
        self.starting.lock().clone()
    }

    /// Starts checking every replica's health each period, until `stopped` turns true.
    pub fn watch_health(self: &Arc<Self>, stopped: &watch::Receiver<bool>) -> Vec<JoinHandle<()>> {
        self.apps
            .iter()
            .flat_map(|app| {
                app.deployments
                    .iter()
                    .map(move |(router, spec)| (app, router, spec))
            })
            .map(|(app, router, spec)| {
                tokio::spawn(health_loop(
                    self.clone(),
                    app.name.clone(),
                    router.clone(),
                    spec.clone(),
                    app.handles.clone(),
                    stopped.clone(),
                ))
            })
            .collect()
    }

    /// The application whose prefix is the longest one matching `path`.
    pub fn app_for(&self, path: &str) -> Option<&AppState> {
        self.apps
            .iter()
            .filter(|a| prefix_matches(&a.route_prefix, path))
            .max_by_key(|a| a.route_prefix.len())
    }

    /// Every deployment's router, of every application.
    pub(crate) fn routers(&self) -> impl Iterator<Item = &Arc<DeploymentRouter>> {
        self.apps
            .iter()
            .flat_map(|a| a.deployments.iter().map(|(r, _)| r))
    }

    /// Checks that `apps` can run together (names, route prefixes, deployments), as
    /// [`start`](Self::start) does first; a server checks this before its own settings.
    pub fn validate(apps: &[Application]) -> Result<(), StartError> {
        validate(apps)
    }

    /// Adds a condition to readiness (the cluster layer's: etcd answered lately).
    pub(crate) fn set_readiness(
        &self,
        check: impl Fn() -> Result<(), String> + Send + Sync + 'static,
    ) {
        *self.readiness.write() = Some(Arc::new(check));
    }

    /// Whether shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Shutdown begins: readiness fails from now on, and in a cluster the drain is published
    /// at once (other nodes stop sending requests).
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.changes.notify_one();
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
        let retiring: Vec<_> = self.retiring.lock().drain(..).collect();
        for task in retiring {
            let _ = tokio::time::timeout_at(latest, task).await;
        }
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

fn prefix_matches(prefix: &str, path: &str) -> bool {
    prefix == "/"
        || path == prefix
        || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

fn validate(apps: &[Application]) -> Result<(), StartError> {
    let invalid = |app: &Application, message: String| StartError::InvalidApplication {
        app: app.name.clone(),
        message,
    };
    let mut names = std::collections::HashSet::new();
    let mut prefixes = std::collections::HashSet::new();
    for app in apps {
        if !names.insert(&app.name) {
            return Err(invalid(app, "two applications have this name".into()));
        }
        let p = &app.route_prefix;
        if !p.starts_with('/') || (p.len() > 1 && p.ends_with('/')) {
            return Err(invalid(
                app,
                format!("route_prefix '{p}' must start with '/' and not end with one"),
            ));
        }
        if crate::access::is_reserved_route_prefix(p) {
            return Err(invalid(
                app,
                format!(
                    "route_prefix '{p}' is reserved for the admin API (/-/..., /metrics, /health)"
                ),
            ));
        }
        if !prefixes.insert(p) {
            return Err(invalid(
                app,
                format!("route_prefix '{p}' is used by another application"),
            ));
        }
        if app.deployments.is_empty() {
            return Err(invalid(app, "it has no deployments".into()));
        }
        let mut deployment_names = std::collections::HashSet::new();
        for d in &app.deployments {
            if !deployment_names.insert(&d.config.name) {
                return Err(invalid(
                    app,
                    format!("two deployments are named '{}'", d.config.name),
                ));
            }
        }
    }
    Ok(())
}

/// Waits until `replica` has no request in progress, or `deadline`.
pub(crate) async fn drain(replica: &Replica, deadline: Instant) {
    replica.slot.set_available(false);
    while replica.slot.inside() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks each replica's health every period; replaces one that fails.
async fn health_loop(
    controller: Arc<Controller>,
    app: Arc<str>,
    router: Arc<DeploymentRouter>,
    cell: SpecCell,
    handles: HandleDirectory,
    mut stopped: watch::Receiver<bool>,
) {
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
            // The old replica keeps serving while its replacement starts: a deployment of one
            // replica is never left with none.
            let node = controller.node_id.as_deref();
            match Replica::start(&spec, &app, node, handles.clone(), router.waker()).await {
                Ok(fresh) => {
                    let fresh = Arc::new(fresh);
                    let next = router
                        .replicas()
                        .iter()
                        .map(|r| {
                            if Arc::ptr_eq(r, replica) {
                                fresh.clone()
                            } else {
                                r.clone()
                            }
                        })
                        .collect();
                    router.set_replicas(next);
                    let (old, deadline) = (
                        replica.clone(),
                        Instant::now() + spec.config.graceful_shutdown_timeout,
                    );
                    let retire = tokio::spawn(async move {
                        drain(&old, deadline).await;
                        old.shutdown(deadline.saturating_duration_since(Instant::now()))
                            .await;
                    });
                    let mut retiring = controller.retiring.lock();
                    retiring.retain(|t| !t.is_finished());
                    retiring.push(retire);
                }
                Err(e) => {
                    // Keep the old one serving and try again next period.
                    tracing::error!(deployment = %spec.config.name, error = %e, "could not start a replacement replica; keeping the old one");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_whole_segments() {
        assert!(prefix_matches("/", "/anything"));
        assert!(prefix_matches("/api", "/api"));
        assert!(prefix_matches("/api", "/api/v1"));
        assert!(!prefix_matches("/api", "/apis"));
    }
}
