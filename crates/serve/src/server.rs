//! Applications, and the server that runs them: starts replicas, accepts HTTP connections,
//! checks health, and shuts down gracefully.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use modelmux_cache::BoxError;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tokio::net::TcpListener;

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::admin::AdminAccess;
use crate::deployment::DeploymentSpec;
use crate::dispatch::DeploymentRouter;
use crate::front::HttpOptions;
use crate::handle::HandleDirectory;
use crate::replica::Replica;

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

    /// Adds the deployment that receives the application's HTTP requests. Without one, the
    /// first deployment added is the ingress.
    pub fn ingress(mut self, spec: DeploymentSpec) -> Self {
        self.ingress = Some(spec.config.name.clone());
        self.deployments.push(spec);
        self
    }
}

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The applications are not consistent (a name or prefix twice, no deployment, ...).
    #[error("invalid application '{app}': {message}")]
    InvalidApplication {
        /// The application.
        app: String,
        /// What is wrong.
        message: String,
    },
    /// A replica's constructor failed.
    #[error("replica of deployment '{deployment}' failed to start: {source}")]
    Replica {
        /// The deployment.
        deployment: String,
        /// The constructor's error.
        source: BoxError,
    },
    /// A server setting is out of range.
    #[error("invalid http options: {message}")]
    InvalidConfig {
        /// What is wrong.
        message: String,
    },
    /// The server would listen beyond this machine with an admin API anyone could use.
    #[error(
        "refusing to listen on {addr} without an admin token: anyone who can reach it could \
         load, pin and evict models. Set an admin token, or allow an open admin API explicitly \
         (http_options.allow_open_admin: true) if every client is trusted"
    )]
    OpenAdmin {
        /// The address.
        addr: SocketAddr,
    },
    /// The listening socket could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Server-wide settings.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServerConfig {
    /// Where to listen (default `127.0.0.1:8000`).
    pub bind: SocketAddr,
    /// The front door's timeouts, caps and budgets.
    pub http: HttpOptions,
    /// When set, `/-/models`, `/-/deployments` and everything under them need
    /// `Authorization: Bearer <token>`.
    pub admin: AdminAccess,
    /// This node's id in a cluster: it is part of every replica id (`deployment#tag@node`)
    /// and a label on every metric. `None` outside a cluster.
    pub node_id: Option<String>,
    /// Whether this process runs replicas (`false`: a router that forwards every request to
    /// other nodes of its cluster).
    pub run_replicas: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 8000)),
            http: HttpOptions::default(),
            admin: AdminAccess::default(),
            node_id: None,
            run_replicas: true,
        }
    }
}

/// Builds a [`Server`].
#[derive(Default)]
#[must_use]
pub struct ServerBuilder {
    config: ServerConfig,
    apps: Vec<Application>,
    metric_sources: Vec<Arc<dyn crate::MetricsSource>>,
}

impl ServerBuilder {
    /// Where to listen; port 0 picks a free one (see [`Server::local_addr`]).
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.config.bind = addr;
        self
    }

    /// Largest request body accepted.
    pub fn max_body_bytes(mut self, n: usize) -> Self {
        self.config.http.max_body_bytes = n;
        self
    }

    /// The front door's timeouts, caps and budgets (replacing `max_body_bytes` too).
    pub fn http_options(mut self, options: HttpOptions) -> Self {
        self.config.http = options;
        self
    }

    /// Lets the server start on a non-loopback address without an admin token, leaving its
    /// state-changing admin API open to whoever can reach it. Only for networks where every
    /// client is trusted.
    pub fn allow_open_admin(mut self) -> Self {
        self.config.admin.allow_open = true;
        self
    }

    /// Host names (with or without a port) the admin API answers to, besides loopback names
    /// and the address it listens on. Guards a tokenless admin API against DNS rebinding.
    pub fn allowed_hosts(mut self, hosts: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.config
            .admin
            .allowed_hosts
            .extend(hosts.into_iter().map(Into::into));
        self
    }

    /// Requires this bearer token on the admin API.
    pub fn admin_token(mut self, token: impl Into<String>) -> Self {
        self.config.admin.token = Some(token.into());
        self
    }

    /// The admin API's access settings, as a whole.
    pub fn admin_access(mut self, access: AdminAccess) -> Self {
        self.config.admin = access;
        self
    }

    /// This node's id in a cluster (in replica ids and metric labels).
    pub fn node_id(mut self, node: impl Into<String>) -> Self {
        self.config.node_id = Some(node.into());
        self
    }

    /// Runs no replicas: every request is forwarded to other nodes of the cluster (set with
    /// [`Server::set_remote_replicas`]).
    pub fn router_only(mut self) -> Self {
        self.config.run_replicas = false;
        self
    }

    /// Adds metrics of the process rather than of a replica (the log writer's dropped lines,
    /// say) to `/metrics`: its families are rendered as they are, with no replica labels.
    pub fn metrics_source(mut self, source: Arc<dyn crate::MetricsSource>) -> Self {
        self.metric_sources.push(source);
        self
    }

    /// Adds an application.
    pub fn application(mut self, app: Application) -> Self {
        self.apps.push(app);
        self
    }

    /// Starts every replica, then listens. Fails if any replica fails to start.
    pub async fn start(self) -> Result<Server, StartError> {
        Server::start(self.config, self.apps, self.metric_sources).await
    }
}

pub(crate) struct AppState {
    pub(crate) name: Arc<str>,
    pub(crate) route_prefix: String,
    pub(crate) ingress: Arc<DeploymentRouter>,
    pub(crate) deployments: Vec<(Arc<DeploymentRouter>, DeploymentSpec)>,
    handles: HandleDirectory,
}

pub(crate) struct ServerState {
    pub(crate) config: ServerConfig,
    pub(crate) apps: Vec<AppState>,
    /// Request bodies held, in KiB (`max_inflight_body_bytes`).
    pub(crate) body_budget: Arc<tokio::sync::Semaphore>,
    /// Set when shutdown begins: readiness fails from then on.
    pub(crate) draining: AtomicBool,
    /// Open connections, and a wake-up when one closes (shutdown waits for them).
    connections: AtomicUsize,
    connection_closed: Notify,
    /// Replicas replaced after failing a health check, still draining (shutdown awaits them).
    retiring: parking_lot::Mutex<Vec<JoinHandle<()>>>,
    /// Notified whenever a local replica's models or the replica set change.
    pub(crate) changes: Arc<Notify>,
    /// An extra readiness condition (the cluster layer's: etcd reachable lately).
    pub(crate) readiness: parking_lot::RwLock<Option<crate::cluster_api::Readiness>>,
    /// The process's own metrics (not a replica's).
    pub(crate) metric_sources: Vec<Arc<dyn crate::MetricsSource>>,
}

/// Counts a connection as open for as long as it lives.
pub(crate) struct OpenConnection(Arc<ServerState>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
        self.0.connection_closed.notify_waiters();
    }
}

impl ServerState {
    /// Counts a connection as open until the returned value drops.
    pub(crate) fn connection_opened(self: &Arc<Self>) -> OpenConnection {
        self.connections.fetch_add(1, Ordering::SeqCst);
        OpenConnection(self.clone())
    }

    /// The application whose prefix is the longest one matching `path`.
    pub(crate) fn app_for(&self, path: &str) -> Option<&AppState> {
        self.apps
            .iter()
            .filter(|a| prefix_matches(&a.route_prefix, path))
            .max_by_key(|a| a.route_prefix.len())
    }

    /// Every deployment router, with its application.
    pub(crate) fn routers(&self) -> impl Iterator<Item = &Arc<DeploymentRouter>> {
        self.apps
            .iter()
            .flat_map(|a| a.deployments.iter().map(|(r, _)| r))
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
        if crate::admin::is_reserved_route_prefix(p) {
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

/// A running server. Call [`shutdown`](Self::shutdown) to stop it gracefully; dropping it
/// stops accepting connections and closes idle ones, but neither drains replicas nor unloads
/// models.
pub struct Server {
    local_addr: SocketAddr,
    pub(crate) state: Arc<ServerState>,
    stop: watch::Sender<bool>,
    accept: JoinHandle<()>,
    health: Vec<JoinHandle<()>>,
}

impl Server {
    /// Starts building a server.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    async fn start(
        config: ServerConfig,
        apps: Vec<Application>,
        metric_sources: Vec<Arc<dyn crate::MetricsSource>>,
    ) -> Result<Server, StartError> {
        validate(&apps)?;
        config
            .http
            .validate()
            .map_err(|message| StartError::InvalidConfig { message })?;
        config.admin.check_exposure(config.bind)?;
        let changes = Arc::new(Notify::new());
        let node = config.node_id.clone();
        let mut states = Vec::new();
        for app in apps {
            let name: Arc<str> = app.name.as_str().into();
            let routers: HashMap<String, Arc<DeploymentRouter>> = app
                .deployments
                .iter()
                .map(|d| {
                    (
                        d.config.name.clone(),
                        Arc::new(DeploymentRouter::new(
                            name.clone(),
                            d.config.clone(),
                            changes.clone(),
                        )),
                    )
                })
                .collect();
            let handles = HandleDirectory::new(routers.clone());
            let ingress_name = app
                .ingress
                .clone()
                .unwrap_or_else(|| app.deployments[0].config.name.clone());
            let mut deployments = Vec::new();
            for spec in app.deployments {
                let router = routers[&spec.config.name].clone();
                let replicas = if config.run_replicas {
                    spec.config.num_replicas
                } else {
                    0
                };
                let starts = (0..replicas).map(|_| {
                    Replica::start(
                        &spec,
                        &name,
                        node.as_deref(),
                        handles.clone(),
                        router.waker(),
                    )
                });
                let replicas =
                    futures_util::future::try_join_all(starts)
                        .await
                        .map_err(|source| StartError::Replica {
                            deployment: spec.config.name.clone(),
                            source,
                        })?;
                router.set_replicas(replicas.into_iter().map(Arc::new).collect());
                deployments.push((router, spec));
            }
            states.push(AppState {
                ingress: routers[&ingress_name].clone(),
                name,
                route_prefix: app.route_prefix,
                deployments,
                handles,
            });
        }
        let listener = TcpListener::bind(config.bind)
            .await
            .map_err(|source| StartError::Bind {
                addr: config.bind,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| StartError::Bind {
            addr: config.bind,
            source,
        })?;
        let body_kib = config.http.max_inflight_body_bytes.div_ceil(1024);
        let state = Arc::new(ServerState {
            body_budget: Arc::new(tokio::sync::Semaphore::new(
                body_kib.min(tokio::sync::Semaphore::MAX_PERMITS),
            )),
            draining: AtomicBool::new(false),
            config,
            apps: states,
            connections: AtomicUsize::new(0),
            connection_closed: Notify::new(),
            retiring: parking_lot::Mutex::default(),
            changes,
            readiness: parking_lot::RwLock::default(),
            metric_sources,
        });
        let (stop, stopped) = watch::channel(false);
        let accept = tokio::spawn(crate::front::accept_loop(
            listener,
            state.clone(),
            stopped.clone(),
        ));
        let health = state
            .apps
            .iter()
            .flat_map(|app| {
                app.deployments
                    .iter()
                    .map(move |(router, spec)| (app, router, spec))
            })
            .map(|(app, router, spec)| {
                tokio::spawn(health_loop(
                    state.clone(),
                    app.name.clone(),
                    router.clone(),
                    spec.clone(),
                    app.handles.clone(),
                    stopped.clone(),
                ))
            })
            .collect();
        tracing::info!(%local_addr, "modelmux listening");
        Ok(Server {
            local_addr,
            state,
            stop,
            accept,
            health,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops taking connections and requests, lets in-flight requests finish (up to each
    /// deployment's `graceful_shutdown_timeout`), then unloads every model.
    ///
    /// In order: the ingress deployments stop taking requests and their requests in flight
    /// finish (they may still call other deployments through handles); then the deployments
    /// they call stop and drain; then every model is unloaded; then the server waits for its
    /// connections to finish writing their last responses.
    pub async fn shutdown(self) {
        // Readiness fails first; connections and requests are still taken for the grace
        // period, so a load balancer stops sending before anything is refused.
        self.state.draining.store(true, Ordering::SeqCst);
        // In a cluster, the drain is published at once: other nodes stop sending requests.
        self.state.changes.notify_one();
        let grace = self.state.config.http.drain_grace_period;
        if !grace.is_zero() {
            tracing::info!(
                ?grace,
                "draining: readiness fails, still serving for the grace period"
            );
            tokio::time::sleep(grace).await;
        }
        let _ = self.stop.send(true);
        self.accept.abort();
        for task in &self.health {
            task.abort();
        }
        let ingress: Vec<Arc<DeploymentRouter>> =
            self.state.apps.iter().map(|a| a.ingress.clone()).collect();
        let is_ingress = |r: &Arc<DeploymentRouter>| ingress.iter().any(|i| Arc::ptr_eq(i, r));
        let mut latest = Instant::now();
        for phase in [true, false] {
            for router in self.state.routers().filter(|r| is_ingress(r) == phase) {
                router.stop_accepting();
            }
            for router in self.state.routers().filter(|r| is_ingress(r) == phase) {
                let deadline = Instant::now() + router.config.graceful_shutdown_timeout;
                latest = latest.max(deadline);
                for replica in router.replicas().iter() {
                    drain(replica, deadline).await;
                }
            }
        }
        let retiring: Vec<_> = self.state.retiring.lock().drain(..).collect();
        for task in retiring {
            let _ = tokio::time::timeout_at(latest, task).await;
        }
        for router in self.state.routers() {
            for replica in router.replicas().iter() {
                replica
                    .shutdown(latest.saturating_duration_since(Instant::now()))
                    .await;
            }
        }
        loop {
            let closed = self.state.connection_closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if self.state.connections.load(Ordering::SeqCst) == 0 || Instant::now() >= latest {
                break;
            }
            let _ = tokio::time::timeout_at(latest, closed).await;
        }
        tracing::info!("modelmux stopped");
    }
}

/// Waits until `replica` has no request in progress, or `deadline`.
async fn drain(replica: &Replica, deadline: Instant) {
    replica.slot.set_available(false);
    while replica.slot.inside() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Checks each replica's health every period; replaces one that fails.
async fn health_loop(
    state: Arc<ServerState>,
    app: Arc<str>,
    router: Arc<DeploymentRouter>,
    spec: DeploymentSpec,
    handles: HandleDirectory,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
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
            let node = state.config.node_id.as_deref();
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
                    let mut retiring = state.retiring.lock();
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
