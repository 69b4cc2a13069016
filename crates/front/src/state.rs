//! What the HTTP front owns of a running server: its settings, the budget of request bodies,
//! the open connections and the registry `/metrics` encodes, beside the
//! controller (the applications) it serves.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

use crate::options::ServerConfig;
use modelmux_serve::Controller;

use crate::access_log::AccessLog;

/// The front's state, shared by every connection.
pub(crate) struct FrontState {
    pub(crate) config: ServerConfig,
    /// The applications served.
    pub(crate) controller: Arc<Controller>,
    /// Request bodies held (`max_inflight_body_bytes`), and by whom.
    pub(crate) body_budget: Arc<crate::body_budget::BodyBudget>,
    /// Open connections, and a wake-up when one closes (shutdown waits for them).
    connections: AtomicUsize,
    connection_closed: Notify,
    /// What `/metrics` encodes: the controller's replicas and the process's own sources.
    pub(crate) metrics: prometheus_client::registry::Registry,
    /// Where access lines go when not through `tracing`.
    pub(crate) access_log: Option<AccessLog>,
    /// The dashboard's ring of samples (empty until the dashboard is first read).
    pub(crate) dashboard: crate::dashboard::Samples,
    /// What applies `POST /-/deploy`, when the server was started from a configuration.
    pub(crate) deployer: Option<Arc<dyn crate::Deployer>>,
    /// Traces requests and exports their spans, when `tracing.otlp_endpoint` is set.
    pub(crate) tracer: Option<crate::otlp::Tracer>,
}

/// Counts a connection as open for as long as it lives.
pub(crate) struct OpenConnection(Arc<FrontState>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::SeqCst);
        self.0.connection_closed.notify_waiters();
    }
}

impl FrontState {
    pub(crate) fn new(
        config: ServerConfig,
        controller: Arc<Controller>,
        metric_sources: Vec<Arc<dyn modelmux_serve::MetricsSource>>,
        access_log: Option<AccessLog>,
        deployer: Option<Arc<dyn crate::Deployer>>,
        tracer: Option<crate::otlp::Tracer>,
    ) -> Self {
        Self {
            body_budget: crate::body_budget::BodyBudget::new(
                config.http.max_inflight_body_bytes,
                config.http.inflight_body_bytes_per_client(),
            ),
            metrics: crate::metrics::registry(controller.clone(), metric_sources),
            config,
            controller,
            connections: AtomicUsize::new(0),
            connection_closed: Notify::new(),
            access_log,
            dashboard: crate::dashboard::Samples::default(),
            deployer,
            tracer,
        }
    }

    /// Counts a connection as open until the returned value drops.
    pub(crate) fn connection_opened(self: &Arc<Self>) -> OpenConnection {
        self.connections.fetch_add(1, Ordering::SeqCst);
        OpenConnection(self.clone())
    }

    /// Waits until every connection has closed, or `deadline`.
    pub(crate) async fn connections_closed(&self, deadline: tokio::time::Instant) {
        loop {
            let closed = self.connection_closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if self.connections.load(Ordering::SeqCst) == 0
                || tokio::time::Instant::now() >= deadline
            {
                return;
            }
            let _ = tokio::time::timeout_at(deadline, closed).await;
        }
    }
}
