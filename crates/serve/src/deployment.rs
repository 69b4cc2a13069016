//! What users write: a [`Deployment`] (a type with an async `call`), and the
//! [`DeploymentSpec`] saying how to build it and how many replicas to run.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use modelmux_cache::{BoxError, Loader, Model, Multiplexer, MultiplexerBuilder};

use crate::autoscale::AutoscalingConfig;
use crate::custom_metrics::MetricsSource;
use crate::handle::{DeploymentHandle, HandleDirectory};
use crate::model_cache::ModelCache;
use crate::{Request, Response, ServeError};

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A deployment: one instance runs in each replica and handles that replica's requests.
///
/// ```
/// use modelmux_serve::{Body, BoxError, Deployment, Request, Response};
///
/// struct Echo;
///
/// impl Deployment for Echo {
///     async fn call(&self, request: Request) -> Result<Response, BoxError> {
///         let model = modelmux_context::multiplexed_model_id();
///         Ok(Response::new(Body::from(format!("model: {model:?}, path: {}", request.uri().path()))))
///     }
/// }
/// ```
pub trait Deployment: Send + Sync + 'static {
    /// Handles one request. It runs inside the request's context, so
    /// `modelmux_context::multiplexed_model_id()` tells which model it asked for. An error is
    /// answered as JSON: a [`ServeError`] or a `modelmux_cache::Error` with its own status, any
    /// other error with a 500. A panic is caught, answered with a 500, and the replica carries on.
    fn call(&self, request: Request) -> impl Future<Output = Result<Response, BoxError>> + Send;

    /// Called periodically; an error (or a timeout) marks the replica unhealthy, and it is
    /// replaced. The default is always healthy.
    fn check_health(&self) -> impl Future<Output = Result<(), BoxError>> + Send {
        async { Ok(()) }
    }

    /// An operator's command to this replica, from the admin API
    /// (`POST /-/deployments/{deployment}/controls/{name}`, sent to every replica, behind the
    /// admin token): pause generation, say. `body` is the request's body. The answer is the
    /// replica's part of the response. The default knows no control (a 404).
    fn control(
        &self,
        name: &str,
        body: bytes::Bytes,
    ) -> impl Future<Output = Result<serde_json::Value, BoxError>> + Send {
        let _ = body;
        let what = format!("this deployment has no control '{name}'");
        async move { Err(ServeError::NotFound { what }.into()) }
    }
}

/// The object-safe form of [`Deployment`].
pub(crate) trait DynDeployment: Send + Sync + 'static {
    fn call_boxed(&self, request: Request) -> BoxFuture<'_, Result<Response, BoxError>>;
    fn check_health_boxed(&self) -> BoxFuture<'_, Result<(), BoxError>>;
    fn control_boxed<'a>(
        &'a self,
        name: &'a str,
        body: bytes::Bytes,
    ) -> BoxFuture<'a, Result<serde_json::Value, BoxError>>;
}

impl<D: Deployment> DynDeployment for D {
    fn call_boxed(&self, request: Request) -> BoxFuture<'_, Result<Response, BoxError>> {
        Box::pin(self.call(request))
    }

    fn check_health_boxed(&self) -> BoxFuture<'_, Result<(), BoxError>> {
        Box::pin(self.check_health())
    }

    fn control_boxed<'a>(
        &'a self,
        name: &'a str,
        body: bytes::Bytes,
    ) -> BoxFuture<'a, Result<serde_json::Value, BoxError>> {
        Box::pin(self.control(name, body))
    }
}

type Factory = Arc<
    dyn Fn(ReplicaContext) -> BoxFuture<'static, Result<Arc<dyn DynDeployment>, BoxError>>
        + Send
        + Sync,
>;

/// How a deployment runs: its settings, with Ray Serve's names and defaults where it has them.
#[derive(Debug, Clone)]
pub struct DeploymentConfig {
    /// Its name, unique within its application.
    pub name: String,
    /// Replicas to run.
    pub num_replicas: usize,
    /// Requests one replica handles at once (Ray's default, 5).
    pub max_ongoing_requests: usize,
    /// Requests that may wait for a replica; past that, `503` with `Retry-After`.
    pub max_queued_requests: usize,
    /// Longest a request waits in the queue before a `503`.
    pub queue_timeout: Duration,
    /// How often replicas' health is checked.
    pub health_check_period: Duration,
    /// How long a health check may take.
    pub health_check_timeout: Duration,
    /// On shutdown, how long in-flight requests get to finish before models are unloaded.
    pub graceful_shutdown_timeout: Duration,
    /// Whether its calls may be run twice: a request forwarded to another node that fails in
    /// flight is sent to another replica only if so (otherwise the client gets a 502), and so
    /// is a request whose local replica stopped under it, answering `Unavailable` (otherwise
    /// a 503). (One that never reached its node is always sent elsewhere.)
    pub idempotent: bool,
    /// How its replica count follows its load; `None`: `num_replicas`, fixed.
    pub autoscaling: Option<AutoscalingConfig>,
}

impl DeploymentConfig {
    pub(crate) fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            num_replicas: 1,
            max_ongoing_requests: 5,
            max_queued_requests: 1024,
            queue_timeout: Duration::from_secs(30),
            health_check_period: Duration::from_secs(10),
            health_check_timeout: Duration::from_secs(30),
            graceful_shutdown_timeout: Duration::from_secs(20),
            idempotent: false,
            autoscaling: None,
        }
    }
}

/// A deployment's settings and how to build one instance per replica.
#[derive(Clone)]
pub struct DeploymentSpec {
    pub(crate) config: DeploymentConfig,
    pub(crate) factory: Factory,
}

impl DeploymentSpec {
    /// A deployment named `name` whose replicas are built by `factory` (called once per replica,
    /// with that replica's context).
    ///
    /// # Panics
    /// If `name` is empty or contains `/` (names appear in admin paths).
    pub fn new<D, F, Fut>(name: &str, factory: F) -> Self
    where
        D: Deployment,
        F: Fn(ReplicaContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<D, BoxError>> + Send + 'static,
    {
        assert!(
            !name.is_empty() && !name.contains('/'),
            "deployment names are non-empty and have no '/': {name:?}"
        );
        let factory: Factory = Arc::new(move |ctx| {
            let fut = factory(ctx);
            Box::pin(async move { fut.await.map(|d| Arc::new(d) as Arc<dyn DynDeployment>) })
        });
        Self {
            config: DeploymentConfig::new(name),
            factory,
        }
    }

    /// Replicas to run (default 1).
    ///
    /// # Panics
    /// If `n` is 0.
    pub fn num_replicas(mut self, n: usize) -> Self {
        assert!(n > 0, "num_replicas must be at least 1");
        self.config.num_replicas = n;
        self
    }

    /// Scales its replica count with its load under `config` (Ray's `autoscaling_config`),
    /// starting with `config`'s initial replicas (which may be none).
    ///
    /// # Panics
    /// If `config` is inconsistent ([`AutoscalingConfig::validate`]).
    pub fn autoscaling(mut self, config: AutoscalingConfig) -> Self {
        if let Err(e) = config.validate() {
            panic!("autoscaling_config: {e}");
        }
        self.config.num_replicas = config.start_replicas();
        self.config.autoscaling = Some(config);
        self
    }

    /// Requests one replica handles at once (default 5).
    ///
    /// # Panics
    /// If `n` is 0.
    pub fn max_ongoing_requests(mut self, n: usize) -> Self {
        assert!(n > 0, "max_ongoing_requests must be at least 1");
        self.config.max_ongoing_requests = n;
        self
    }

    /// Requests that may wait for a free replica (default 1024); past that, 503.
    pub fn max_queued_requests(mut self, n: usize) -> Self {
        self.config.max_queued_requests = n;
        self
    }

    /// Longest a request waits for a free replica (default 30 s).
    pub fn queue_timeout(mut self, timeout: Duration) -> Self {
        self.config.queue_timeout = timeout;
        self
    }

    /// How often, and with what timeout, replica health is checked (default 10 s, 30 s).
    pub fn health_check(mut self, period: Duration, timeout: Duration) -> Self {
        self.config.health_check_period = period;
        self.config.health_check_timeout = timeout;
        self
    }

    /// How long in-flight requests get to finish on shutdown (default 20 s).
    pub fn graceful_shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.config.graceful_shutdown_timeout = timeout;
        self
    }

    /// Whether its calls may be run twice: a forwarded request that fails in flight, or a
    /// local one whose replica stopped under it, is then run again (default false: a 502 or
    /// a 503).
    pub fn idempotent(mut self, idempotent: bool) -> Self {
        self.config.idempotent = idempotent;
        self
    }

    /// Its settings.
    pub fn config(&self) -> &DeploymentConfig {
        &self.config
    }
}

/// What a deployment's constructor gets: who it is, how to build its model cache, and handles
/// to the other deployments of its application.
#[derive(Clone)]
pub struct ReplicaContext {
    pub(crate) app: Arc<str>,
    pub(crate) deployment: Arc<str>,
    pub(crate) replica_id: Arc<str>,
    pub(crate) node: Option<Arc<str>>,
    pub(crate) caches: Arc<parking_lot::Mutex<Vec<Arc<dyn ModelCache>>>>,
    pub(crate) metrics: Arc<parking_lot::Mutex<Vec<Arc<dyn MetricsSource>>>>,
    pub(crate) handles: HandleDirectory,
}

impl ReplicaContext {
    /// The application's name.
    pub fn app(&self) -> &str {
        &self.app
    }

    /// The deployment's name.
    pub fn deployment(&self) -> &str {
        &self.deployment
    }

    /// This replica's id, `<deployment>#<suffix>`.
    pub fn replica_id(&self) -> &str {
        &self.replica_id
    }

    /// The id of the cluster node this replica runs on; `None` outside a cluster.
    pub fn node_id(&self) -> Option<&str> {
        self.node.as_deref()
    }

    /// Builds this replica's model cache and registers it: the router then sends each model's
    /// requests to the replicas holding it, `/-/models` lists its models, `/metrics` exports
    /// its counters, and shutdown unloads it.
    pub fn multiplexer<M: Model, L: Loader<M>>(
        &self,
        builder: MultiplexerBuilder,
        loader: L,
    ) -> Multiplexer<M> {
        let mux = builder.build(loader);
        self.register_multiplexer(&mux);
        mux
    }

    /// Registers a multiplexer built elsewhere (see [`multiplexer`](Self::multiplexer)).
    pub fn register_multiplexer<M: Model>(&self, mux: &Multiplexer<M>) {
        self.caches.lock().push(Arc::new(mux.clone()));
    }

    /// Adds `source`'s families to `/metrics`, with this replica's labels, for as long as the
    /// replica runs.
    pub fn register_metrics(&self, source: Arc<dyn MetricsSource>) {
        self.metrics.lock().push(source);
    }

    /// A handle to another deployment of this application.
    pub fn handle(&self, deployment: &str) -> Result<DeploymentHandle, ServeError> {
        self.handles.get(deployment)
    }

    /// A handle to deployment `deployment` of application `app` (Ray's
    /// `get_deployment_handle(name, app_name)`), or to its ingress when `deployment` is `None`
    /// (Ray's `get_app_handle`).
    pub fn handle_in(
        &self,
        app: &str,
        deployment: Option<&str>,
    ) -> Result<DeploymentHandle, ServeError> {
        self.handles.get_in(app, deployment)
    }
}
