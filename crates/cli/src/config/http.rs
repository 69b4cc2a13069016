//! `http_options`: where the server listens, who may use the admin API, and the front
//! door's limits, as the YAML spells them, turned into the front's and the admin API's
//! settings.

use serde::Deserialize;

use super::Seconds;

/// `http_options`: where to listen, who may use the admin API, and the front door's limits.
/// Durations are in seconds; every limit has a default that holds up against hostile
/// clients (see `modelmux_front::HttpOptions`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpOptions {
    /// Address to listen on.
    #[serde(default = "default_host")]
    pub host: String,
    /// Port to listen on (0 picks a free one).
    #[serde(default = "default_port")]
    pub port: u16,
    /// Largest request body accepted (bytes).
    #[serde(default)]
    pub max_body_bytes: Option<usize>,
    /// Bearer token required by the admin API. Without one (and without
    /// `trust_local_users`), `modelmux serve` on loopback makes one and writes it to a file
    /// only its user can read (`crate::local_admin`).
    #[serde(default)]
    pub admin_token: Option<String>,
    /// Lets a server listening beyond loopback run its admin API without a token.
    #[serde(default)]
    pub allow_open_admin: bool,
    /// Lets every local account use the admin API of a server on loopback without a token
    /// (a single-user machine): no token is made, and a call that changes state needs only
    /// `Content-Type: application/json` and a local `Host`.
    #[serde(default)]
    pub trust_local_users: bool,
    /// Whether `admin_token` was made at start for local users (not read from the file or
    /// the environment).
    #[serde(skip)]
    pub admin_token_is_local: bool,
    /// Host names the admin API answers to besides IP addresses and `localhost`.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Time to send a request's head.
    #[serde(default)]
    pub header_read_timeout_s: Option<Seconds>,
    /// Time to send a request's body.
    #[serde(default)]
    pub body_read_timeout_s: Option<Seconds>,
    /// Idle keep-alive connections are closed after this (Ray's `keep_alive_timeout_s`).
    #[serde(default)]
    pub keep_alive_timeout_s: Option<Seconds>,
    /// Longest a request may take until its response starts (Ray's `request_timeout_s`).
    #[serde(default)]
    pub request_timeout_s: Option<Seconds>,
    /// Most connections open at once.
    #[serde(default)]
    pub max_connections: Option<usize>,
    /// Most application requests in progress at once; more are refused with 503.
    #[serde(default)]
    pub max_inflight_requests: Option<usize>,
    /// Most bytes of request bodies held at once.
    #[serde(default)]
    pub max_inflight_body_bytes: Option<usize>,
    /// Most bytes of request bodies one client address holds at once (default: half of
    /// `max_inflight_body_bytes`).
    #[serde(default)]
    pub max_inflight_body_bytes_per_client: Option<usize>,
    /// After SIGTERM, how long to keep serving while `/-/healthz` answers 503.
    #[serde(default)]
    pub drain_grace_period_s: Option<Seconds>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            host: default_host(),
            port: default_port(),
            max_body_bytes: None,
            admin_token: None,
            allow_open_admin: false,
            trust_local_users: false,
            admin_token_is_local: false,
            allowed_hosts: Vec::new(),
            header_read_timeout_s: None,
            body_read_timeout_s: None,
            keep_alive_timeout_s: None,
            request_timeout_s: None,
            max_connections: None,
            max_inflight_requests: None,
            max_inflight_body_bytes: None,
            max_inflight_body_bytes_per_client: None,
            drain_grace_period_s: None,
        }
    }
}

impl HttpOptions {
    /// The serve layer's limits: these settings over its defaults.
    pub fn limits(&self) -> modelmux_front::HttpOptions {
        let mut o = modelmux_front::HttpOptions::default();
        let secs = |v: &Option<Seconds>| v.as_ref().map(|s| s.0);
        o.max_body_bytes = self.max_body_bytes.unwrap_or(o.max_body_bytes);
        o.header_read_timeout = secs(&self.header_read_timeout_s).unwrap_or(o.header_read_timeout);
        o.body_read_timeout = secs(&self.body_read_timeout_s).unwrap_or(o.body_read_timeout);
        o.keep_alive_timeout = secs(&self.keep_alive_timeout_s).unwrap_or(o.keep_alive_timeout);
        o.request_timeout = secs(&self.request_timeout_s).or(o.request_timeout);
        o.max_connections = self.max_connections.unwrap_or(o.max_connections);
        o.max_inflight_requests = self
            .max_inflight_requests
            .unwrap_or(o.max_inflight_requests);
        o.max_inflight_body_bytes = self
            .max_inflight_body_bytes
            .unwrap_or(o.max_inflight_body_bytes.max(o.max_body_bytes));
        o.max_inflight_body_bytes_per_client = self.max_inflight_body_bytes_per_client;
        o.drain_grace_period = secs(&self.drain_grace_period_s).unwrap_or(o.drain_grace_period);
        o
    }

    /// Who may use the admin API.
    pub fn admin(&self) -> modelmux_serve::AdminAccess {
        let mut access = modelmux_serve::AdminAccess::default();
        access.token = self.admin_token.clone();
        access.allow_open = self.allow_open_admin;
        access.token_is_local = self.admin_token_is_local;
        access.allowed_hosts = self.allowed_hosts.clone();
        access
    }
}

fn default_host() -> String {
    "127.0.0.1".into()
}
fn default_port() -> u16 {
    8000
}
