//! The server: the controller's applications behind the HTTP front. Listens (the front, with
//! readiness failing while models load), starts the replicas (the controller), and shuts
//! down gracefully: replicas drain, then connections close.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::access_log::{AccessFormat, AccessLog, AccessSink};
use crate::options::{HttpOptions, ServerConfig};
use crate::state::FrontState;
use modelmux_serve::AdminAccess;
use modelmux_serve::StartError;
use modelmux_serve::{Application, Controller};

/// Builds a [`Server`].
#[derive(Default)]
#[must_use]
pub struct ServerBuilder {
    config: ServerConfig,
    apps: Vec<Application>,
    metric_sources: Vec<Arc<dyn modelmux_serve::MetricsSource>>,
    access_log: Option<AccessLog>,
    on_listening: Option<Box<dyn FnOnce(SocketAddr) + Send>>,
    deployer: Option<Arc<dyn Deployer>>,
    tracing: Option<crate::TracingOptions>,
}

/// Applies a new configuration to a running server (`POST /-/deploy`, and the CLI's
/// `SIGHUP`): whoever knows the configuration's format (the CLI) implements it.
pub trait Deployer: Send + Sync + 'static {
    /// Applies `config`, the whole new configuration's text, to the server whose controller
    /// [`Server::controller`] gives: answers what changed, or refuses the whole of it (then
    /// nothing changed).
    fn deploy(
        self: Arc<Self>,
        config: String,
    ) -> std::pin::Pin<
        Box<dyn Future<Output = Result<serde_json::Value, modelmux_serve::ServeError>> + Send>,
    >;
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

    /// Requires this bearer token on the admin API. In a cluster it is also what handle calls
    /// carry to other nodes, whose call endpoints check it: every node of a cluster needs the
    /// same token for handle calls to reach replicas on other nodes (without one they stay on
    /// their node).
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
    /// `NodeHandle::set_remote_replicas`, from [`Server::node_handle`]).
    pub fn router_only(mut self) -> Self {
        self.config.run_replicas = false;
        self
    }

    /// Adds metrics of the process rather than of a replica (the log writer's dropped lines,
    /// say) to `/metrics`: its families are rendered as they are, with no replica labels.
    pub fn metrics_source(mut self, source: Arc<dyn modelmux_serve::MetricsSource>) -> Self {
        self.metric_sources.push(source);
        self
    }

    /// Formats access lines here, in `format`, and hands them to `sink`, instead of emitting
    /// a `tracing` event per request (which the process's subscriber formats: a few
    /// microseconds a line). Lines are still written only while `modelmux::access` is enabled
    /// at INFO.
    pub fn access_log(mut self, format: AccessFormat, sink: Arc<dyn AccessSink>) -> Self {
        self.access_log = Some(AccessLog { sink, format });
        self
    }

    /// Adds an application.
    pub fn application(mut self, app: Application) -> Self {
        self.apps.push(app);
        self
    }

    /// Listens, then starts every replica, and returns when they have all started. Fails
    /// (having stopped listening) if any replica fails to start.
    pub async fn start(self) -> Result<Server, StartError> {
        Server::start(self).await
    }

    /// Traces requests (W3C `traceparent` in and out, spans exported over OTLP/HTTP). Off
    /// without it, and then free.
    pub fn tracing(mut self, options: crate::TracingOptions) -> Self {
        self.tracing = Some(options);
        self
    }

    /// Lets `POST /-/deploy` change the running server through `deployer`.
    pub fn deployer(mut self, deployer: Arc<dyn Deployer>) -> Self {
        self.deployer = Some(deployer);
        self
    }

    /// Calls `f` with the address as soon as the server listens: before the replicas have
    /// started (which [`start`](Self::start) waits for), while `/-/healthz` answers 503
    /// `loading`.
    pub fn on_listening(mut self, f: impl FnOnce(SocketAddr) + Send + 'static) -> Self {
        self.on_listening = Some(Box::new(f));
        self
    }
}

/// A running server. Call [`shutdown`](Self::shutdown) to stop it gracefully; dropping it
/// stops accepting connections and closes idle ones, but neither drains replicas nor unloads
/// models.
pub struct Server {
    local_addr: SocketAddr,
    pub(crate) state: Arc<FrontState>,
    stop: watch::Sender<bool>,
    accept: JoinHandle<()>,
    health: Vec<JoinHandle<()>>,
}

impl Server {
    /// Starts building a server.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    async fn start(builder: ServerBuilder) -> Result<Server, StartError> {
        let ServerBuilder {
            config,
            apps,
            metric_sources,
            access_log,
            on_listening,
            deployer,
            tracing,
        } = builder;
        let tracer = tracing
            .map(|options| crate::otlp::Tracer::start(&options))
            .transpose()
            .map_err(|message| StartError::InvalidConfig { message })?;
        Controller::validate(&apps)?;
        config
            .http
            .validate()
            .map_err(|message| StartError::InvalidConfig { message })?;
        config.admin.check_exposure(config.bind)?;
        let controller = Arc::new(Controller::new(
            apps,
            config.node_id.clone(),
            config.run_replicas,
        )?);
        // In a cluster, handle calls go to other nodes with this node's admin token (which
        // every node shares, and their call endpoints check); without one (or with one made
        // for this node's local users alone) they stay here.
        controller
            .node()
            .set_call_token(config.admin.shared_token());
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
        let state = Arc::new(FrontState::new(
            config,
            controller.clone(),
            metric_sources,
            access_log,
            deployer,
            tracer,
        ));
        let (stop, stopped) = watch::channel(false);
        let accept = tokio::spawn(crate::connection::accept_loop(
            listener,
            state.clone(),
            stopped.clone(),
        ));
        // Listening while the replicas start: `/-/healthz` says which deployments are still
        // loading (a GGUF download can take minutes), and requests wait for their replicas
        // or are refused as unavailable.
        let loading = controller.loading();
        tracing::info!(%local_addr, ?loading, "modelmux listening; starting replicas");
        if let Some(listening) = on_listening {
            listening(local_addr);
        }
        if let Err(e) = controller.start_replicas().await {
            let _ = stop.send(true);
            accept.abort();
            controller.begin_drain();
            controller.stop().await;
            return Err(e);
        }
        let mut health = controller.watch_health(&stopped);
        health.extend(controller.autoscale(&stopped));
        tracing::info!(%local_addr, "modelmux ready");
        Ok(Server {
            local_addr,
            state,
            stop,
            accept,
            health,
        })
    }

    /// The controller of its applications (to change them while they run).
    pub fn controller(&self) -> Arc<Controller> {
        self.state.controller.clone()
    }

    /// A handle for the cluster layer.
    pub fn node_handle(&self) -> modelmux_serve::NodeHandle {
        self.state.controller.node().clone()
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
        let controller = &self.state.controller;
        controller.begin_drain();
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
        // The listener closes when the accept task is dropped: once this returns, nothing
        // connects any more.
        let _ = self.accept.await;
        for task in &self.health {
            task.abort();
        }
        let latest = controller.stop().await;
        self.state.connections_closed(latest).await;
        tracing::info!("modelmux stopped");
    }
}
