//! The front door's limits: timeouts, caps and budgets, with defaults that hold up against
//! slow or hostile clients.

use std::net::SocketAddr;
use std::time::Duration;

use modelmux_serve::AdminAccess;

/// How the HTTP front door treats clients (YAML `http_options`).
///
/// Every limit has a default; together they bound the memory the front door can be made to
/// hold, whatever clients do: at most `max_connections` connections, each with a read buffer of
/// at most [`MAX_BUF_BYTES`], and at most `max_inflight_body_bytes` of request bodies.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HttpOptions {
    /// Largest request body accepted; larger ones get 413 (default 16 MiB).
    pub max_body_bytes: usize,
    /// Time a client has to send a request's head (line and headers) over HTTP/1 (default
    /// 10 s): the first from when the connection opens, later ones from their first byte (an
    /// idle keep-alive connection is `keep_alive_timeout`'s). Slow-header clients are cut off
    /// after it, within a quarter of the shorter of the two timeouts more.
    pub header_read_timeout: Duration,
    /// Time a client has to send a request's whole body once its head arrived (default 30 s);
    /// after it the request gets 408 and the connection is closed.
    pub body_read_timeout: Duration,
    /// An idle connection (no request in progress, no bytes either way) is closed after this
    /// (Ray's `keep_alive_timeout_s`; default 5 s).
    pub keep_alive_timeout: Duration,
    /// Longest a request may take until its response starts (Ray's `request_timeout_s`);
    /// `None` (the default, as in Ray) waits as long as the deployment takes. A request that
    /// runs out gets 504 and its work is cancelled.
    pub request_timeout: Option<Duration>,
    /// Most connections open at once (default 4096); further clients wait in the listen
    /// backlog until one closes.
    pub max_connections: usize,
    /// Most application requests in progress at once; the next is refused at once with 503
    /// and `Retry-After` instead of queueing (default 2048). The admin API is not counted.
    pub max_inflight_requests: usize,
    /// Most bytes of request bodies held at once across all requests (default 256 MiB); a
    /// body that would pass it is refused with 503.
    pub max_inflight_body_bytes: usize,
    /// Most bytes of request bodies one client address holds at once; `None` (the default)
    /// is half of `max_inflight_body_bytes`, but at least `max_body_bytes`. Behind a load
    /// balancer every client has its address: raise it to the whole budget there.
    pub max_inflight_body_bytes_per_client: Option<usize>,
    /// After a shutdown signal, how long the server keeps accepting connections and requests
    /// while `/-/healthz` already answers 503 (default 0 s), so load balancers notice before
    /// the listener closes.
    pub drain_grace_period: Duration,
}

/// Largest read buffer a connection may grow (request heads larger than it get 431).
pub const MAX_BUF_BYTES: usize = 64 << 10;

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            max_body_bytes: 16 << 20,
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            keep_alive_timeout: Duration::from_secs(5),
            request_timeout: None,
            max_connections: 4096,
            max_inflight_requests: 2048,
            max_inflight_body_bytes: 256 << 20,
            max_inflight_body_bytes_per_client: None,
            drain_grace_period: Duration::ZERO,
        }
    }
}

impl HttpOptions {
    /// What one client address may hold of the body budget.
    pub fn inflight_body_bytes_per_client(&self) -> usize {
        self.max_inflight_body_bytes_per_client.unwrap_or_else(|| {
            (self.max_inflight_body_bytes / 2)
                .max(self.max_body_bytes)
                .min(self.max_inflight_body_bytes)
        })
    }

    /// Checks the limits make sense together; says which one does not.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("header_read_timeout", self.header_read_timeout),
            ("body_read_timeout", self.body_read_timeout),
            ("keep_alive_timeout", self.keep_alive_timeout),
        ];
        for (name, value) in positive {
            if value.is_zero() {
                return Err(format!("{name} must be more than 0"));
            }
        }
        if self.request_timeout.is_some_and(|t| t.is_zero()) {
            return Err("request_timeout must be more than 0 (leave it out for none)".into());
        }
        for (name, value) in [
            ("max_connections", self.max_connections),
            ("max_inflight_requests", self.max_inflight_requests),
            ("max_body_bytes", self.max_body_bytes),
        ] {
            if value == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        if self.max_inflight_body_bytes < self.max_body_bytes {
            return Err(format!(
                "max_inflight_body_bytes ({}) must be at least max_body_bytes ({}), or no \
                 largest body could ever be accepted",
                self.max_inflight_body_bytes, self.max_body_bytes
            ));
        }
        if let Some(share) = self.max_inflight_body_bytes_per_client
            && !(self.max_body_bytes..=self.max_inflight_body_bytes).contains(&share)
        {
            return Err(format!(
                "max_inflight_body_bytes_per_client ({share}) must be between max_body_bytes \
                 ({}) and max_inflight_body_bytes ({})",
                self.max_body_bytes, self.max_inflight_body_bytes
            ));
        }
        Ok(())
    }
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
