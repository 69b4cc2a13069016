//! A modelmux server as a member of a cluster: it publishes its replicas and their models, and
//! routes over every other node's, as etcd has them.

use std::collections::{BTreeMap, HashMap};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use modelmux_etcd::{Client, ConnectOptions, Credentials, TlsOptions};
use modelmux_serve::{Forwarder, NodeHandle};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::forward::H2Forwarder;
use crate::records::{CopyRecord, Keys, NodeRecord, Role, local_records, remote_replicas};
use crate::{ClusterError, Registry, RegistryOptions, View};

/// How often a node's record is written again when only its load figures changed.
const LOAD_REPORT_PERIOD: Duration = Duration::from_secs(1);
/// How soon a publication that failed (etcd unreachable) is tried again.
const RETRY: Duration = Duration::from_millis(200);

/// How a node reaches etcd besides its endpoints: TLS (the CA, and the client certificate etcd
/// asks for with `--client-cert-auth`) and the user it authenticates as. Whoever can write the
/// cluster's keys in etcd steers its traffic (see the trust model in ARCHITECTURE.md), so a
/// cluster's etcd should take only clients that present both.
#[derive(Debug, Clone, Default)]
pub struct EtcdSecurity {
    /// TLS to etcd; `None`: plaintext.
    pub tls: Option<TlsOptions>,
    /// The user and password; `None`: etcd's auth is off.
    pub credentials: Option<Credentials>,
}

/// How a node joins its cluster.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClusterOptions {
    /// etcd's client URLs (`http://host:port`, `https://host:port`, or a bare `host:port`:
    /// https with [`etcd_security`](Self::etcd_security)'s TLS, else http).
    pub endpoints: Vec<String>,
    /// TLS and the user to reach etcd with.
    pub etcd_security: EtcdSecurity,
    /// The key prefix of this cluster in etcd.
    pub prefix: String,
    /// This node's id, unique in the cluster (letters, digits, `.`, `_`, `-`).
    pub node_id: String,
    /// Where other nodes reach this one (`http://host:port`).
    pub advertise: String,
    /// What it runs.
    pub role: Role,
    /// Its lease's TTL: how long after it dies (or loses etcd) its records disappear.
    pub lease_ttl: Duration,
    /// After how long without an answer from etcd `/-/healthz` reports not ready (it keeps
    /// serving on its last view meanwhile).
    pub unready_after: Duration,
    /// How long a ping to a peer may go unanswered before its connection is dropped and the
    /// peer passed over until it answers again.
    pub peer_timeout: Duration,
}

impl ClusterOptions {
    /// Options for node `node_id` reachable at `advertise`, with etcd at `cluster` (an
    /// `etcd://h1:2379,h2:2379` URL, or `http://` URLs separated by commas).
    pub fn new(cluster: &str, node_id: &str, advertise: &str) -> Result<Self, String> {
        let endpoints = parse_endpoints(cluster)?;
        if node_id.is_empty()
            || !node_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(format!(
                "node id {node_id:?}: use letters, digits, '.', '_' and '-'"
            ));
        }
        let authority = advertise
            .strip_prefix("http://")
            .ok_or_else(|| format!("advertise address {advertise:?}: must be http://host:port"))?;
        if authority
            .trim_end_matches('/')
            .parse::<http::uri::Authority>()
            .is_err()
            || !authority.contains(':')
        {
            return Err(format!(
                "advertise address {advertise:?}: must be http://host:port"
            ));
        }
        Ok(Self {
            endpoints,
            etcd_security: EtcdSecurity::default(),
            prefix: "modelmux/default".into(),
            node_id: node_id.to_owned(),
            advertise: advertise.trim_end_matches('/').to_owned(),
            role: Role::Both,
            lease_ttl: Duration::from_secs(3),
            unready_after: Duration::from_secs(10),
            peer_timeout: crate::forward::DEFAULT_PING_TIMEOUT,
        })
    }
}

/// etcd's endpoints from `etcd://h1:2379,h2:2379` (or `http://h1:2379,https://h2:2379`). A
/// bare `host:port` stays bare: the client speaks https to it when given TLS options, else
/// http.
pub fn parse_endpoints(cluster: &str) -> Result<Vec<String>, String> {
    let list = cluster.strip_prefix("etcd://").unwrap_or(cluster);
    let endpoints: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
        .collect();
    if endpoints.is_empty() {
        return Err(format!(
            "cluster {cluster:?}: expected etcd://host:port[,host:port...]"
        ));
    }
    for e in &endpoints {
        let rest = match e.split_once("://") {
            Some(("http" | "https", rest)) => rest,
            Some(_) => "",
            None => e.as_str(),
        };
        if rest.parse::<http::uri::Authority>().is_err() || !rest.contains(':') {
            return Err(format!("cluster {cluster:?}: {e:?} is not host:port"));
        }
    }
    Ok(endpoints)
}

/// Connects to etcd with the settings a cluster member needs: quick timeouts, HTTP/2 pings to
/// notice a dead member, and only answers from a member that has a leader. Plaintext, no user:
/// see [`connect_with`].
pub async fn connect(endpoints: &[String]) -> Result<Client, ClusterError> {
    connect_with(endpoints, &EtcdSecurity::default()).await
}

/// [`connect`] over TLS and as a user, as `security` says.
pub async fn connect_with(
    endpoints: &[String],
    security: &EtcdSecurity,
) -> Result<Client, ClusterError> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(2))
        .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
        .with_keep_alive_while_idle(true)
        .with_require_leader(true);
    if let Some(tls) = &security.tls {
        options = options.with_tls(tls.clone());
    }
    if let Some(credentials) = &security.credentials {
        options = options.with_credentials(credentials.clone());
    }
    Ok(Client::connect(endpoints, options).await?)
}

/// This process as a member of its cluster. [`leave`](Self::leave) it after the server has
/// shut down: that takes its records out at once.
pub struct ClusterNode {
    registry: Arc<Registry>,
    tasks: Vec<JoinHandle<()>>,
}

impl ClusterNode {
    /// Joins: takes a lease, publishes this node and its replicas' models (and keeps them up to
    /// date), and, unless the role is `node`, follows the other nodes' replicas and routes to
    /// them. `/-/healthz` then also fails when etcd has not answered for `unready_after`.
    pub async fn join(options: ClusterOptions, server: NodeHandle) -> Result<Self, ClusterError> {
        let security = &options.etcd_security;
        if security.credentials.is_some() && security.tls.is_none() {
            tracing::warn!(
                "etcd's password and token cross the network in clear: give cluster.etcd_tls too"
            );
        }
        let client = connect_with(&options.endpoints, security).await?;
        let registry = Arc::new(
            Registry::start(client.clone(), RegistryOptions::with_ttl(options.lease_ttl)).await?,
        );
        let keys = Keys::new(&options.prefix);
        let mut publisher = Publisher {
            keys: keys.clone(),
            options: options.clone(),
            server: server.clone(),
            registry: registry.clone(),
            record: None,
            record_written: Instant::now(),
            copies: BTreeMap::new(),
            loading_since: HashMap::new(),
            due: None,
        };
        // Published once before anyone is told this node is up.
        publisher.publish().await?;
        let mut tasks = vec![tokio::spawn(publisher.run())];
        if options.role == Role::Both && !server.forwards_handle_calls() {
            // A handle call's arguments are a pickle: another node takes one only with the
            // admin token, so without one this node's handle calls stay on it.
            tracing::warn!(
                "handle calls stay on this node: calls to other nodes' replicas need an admin \
                 token that every node of the cluster shares (http_options.admin_token or \
                 MODELMUX_ADMIN_TOKEN)"
            );
        }
        if options.role.routes() {
            let view = View::start(client, keys.all()).await?;
            let forwarder = Arc::new(H2Forwarder::with_ping_timeout(options.peer_timeout));
            tasks.push(tokio::spawn(follow(
                view,
                keys,
                options.node_id.clone(),
                server.clone(),
                forwarder,
            )));
        }
        let watched = registry.clone();
        let unready_after = options.unready_after;
        server.set_readiness(move || {
            let since = watched.since_contact();
            if since > unready_after {
                Err(format!(
                    "etcd has not answered for {:.1} s",
                    since.as_secs_f64()
                ))
            } else {
                Ok(())
            }
        });
        Ok(Self { registry, tasks })
    }

    /// The lease this node's records are on.
    pub fn lease_id(&self) -> i64 {
        self.registry.lease_id()
    }

    /// Stops publishing and revokes the lease: every record of this node disappears at once.
    pub async fn leave(self) -> Result<(), ClusterError> {
        for task in &self.tasks {
            task.abort();
        }
        self.registry.close().await
    }
}

/// Keeps this node's records in etcd equal to its state.
struct Publisher {
    keys: Keys,
    options: ClusterOptions,
    server: NodeHandle,
    registry: Arc<Registry>,
    /// The node record last written.
    record: Option<NodeRecord>,
    record_written: Instant,
    /// The copy records last written.
    copies: BTreeMap<String, CopyRecord>,
    /// Since when each copy that is loading and not yet written has been seen loading: only
    /// keys loading now (bounded by the loads in progress).
    loading_since: HashMap<String, Instant>,
    /// When the next held-back loading copy is due.
    due: Option<Instant>,
}

/// How long a copy must have been loading before it is written to etcd. A load that fails at
/// once (an unknown model id, which clients choose freely) never is, so that a flood of such
/// ids causes no etcd write and no watch fan-out; a real load soon is, so that other nodes
/// send its requests here rather than load it too.
const LOADING_PUBLISH_DELAY: Duration = Duration::from_millis(500);

impl Publisher {
    async fn run(mut self) {
        let changes = self.server.changes();
        let mut failed = false;
        loop {
            let wait = if failed {
                RETRY
            } else {
                self.due.map_or(LOAD_REPORT_PERIOD, |due| {
                    due.saturating_duration_since(Instant::now())
                        .min(LOAD_REPORT_PERIOD)
                })
            };
            tokio::select! {
                _ = changes.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
            // A panic must not end publication: the node would keep its lease and look
            // healthy while its records went stale.
            failed = match AssertUnwindSafe(self.publish()).catch_unwind().await {
                Ok(Ok(())) => false,
                Ok(Err(e)) => {
                    tracing::warn!("publishing this node's state to etcd: {e}");
                    true
                }
                Err(_) => {
                    tracing::error!("publishing this node's state panicked; trying again");
                    self.record = None;
                    true
                }
            };
        }
    }

    /// Writes what changed since the last publication: the node record when its replicas or
    /// drain changed (or, at most once per period, its load figures), a key per model copy
    /// that appeared or changed, a delete per copy that went.
    async fn publish(&mut self) -> Result<(), ClusterError> {
        let state = self.server.local_state();
        let draining = self.server.is_draining();
        let (record, mut copies) = local_records(
            &self.keys,
            &self.options.node_id,
            &self.options.advertise,
            self.options.role,
            draining,
            &state,
        );
        self.hold_back_new_loads(&mut copies);
        let o = &self.options;
        // Copies first: a node record saying "draining" must not overtake them.
        for (key, copy) in &copies {
            if self.copies.get(key) != Some(copy) {
                let value = serde_json::to_vec(copy).unwrap_or_default();
                self.registry.put(key, value).await?;
                self.copies.insert(key.clone(), copy.clone());
            }
        }
        let gone: Vec<String> = self
            .copies
            .keys()
            .filter(|k| !copies.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            self.registry.delete(&key).await?;
            self.copies.remove(&key);
        }
        let write = match &self.record {
            None => true,
            Some(last) if *last == record => false,
            Some(last) => {
                !same_but_load(last, &record) || self.record_written.elapsed() >= LOAD_REPORT_PERIOD
            }
        };
        if write {
            let value = serde_json::to_vec(&record).unwrap_or_default();
            self.registry
                .put(&self.keys.node(&o.node_id), value)
                .await?;
            self.record = Some(record);
            self.record_written = Instant::now();
        }
        Ok(())
    }
}

impl Publisher {
    /// Leaves out of `copies` those loading for less than [`LOADING_PUBLISH_DELAY`] that are
    /// not written yet, and notes when the first of them is due.
    fn hold_back_new_loads(&mut self, copies: &mut BTreeMap<String, CopyRecord>) {
        let now = Instant::now();
        self.loading_since
            .retain(|key, _| copies.get(key).is_some_and(|c| !c.loaded));
        self.due = None;
        copies.retain(|key, copy| {
            if copy.loaded || self.copies.contains_key(key) {
                return true;
            }
            let since = *self.loading_since.entry(key.clone()).or_insert(now);
            let due = since + LOADING_PUBLISH_DELAY;
            if due <= now {
                return true;
            }
            self.due = Some(self.due.map_or(due, |d| d.min(due)));
            false
        });
    }
}

/// Whether two records differ only in their replicas' requests in progress.
fn same_but_load(a: &NodeRecord, b: &NodeRecord) -> bool {
    let strip = |r: &NodeRecord| {
        let mut r = r.clone();
        for d in &mut r.deployments {
            for replica in &mut d.replicas {
                replica.ongoing = 0;
            }
        }
        r
    };
    strip(a) == strip(b)
}

/// Feeds every other node's replicas into the server's routers as etcd changes.
async fn follow(
    mut view: View,
    keys: Keys,
    own: String,
    server: NodeHandle,
    forwarder: Arc<H2Forwarder>,
) {
    let as_dyn: Arc<dyn Forwarder> = forwarder.clone();
    let deployments = server.deployments();
    loop {
        let records = view.records();
        // A panic applying one view must not freeze routing on the last one.
        let applied = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let (peers, mut by_deployment) = remote_replicas(&keys, &own, &records);
            forwarder.set_peers(
                peers
                    .iter()
                    .map(|p| (p.node.to_string(), p.record.address.clone())),
            );
            // Every deployment, not only each application's ingress: handle calls reach the
            // others' replicas on any node.
            for key in &deployments {
                let replicas = by_deployment.remove(key).unwrap_or_default();
                server.set_remote_replicas(&key.0, &key.1, &replicas, &as_dyn);
            }
        }));
        if applied.is_err() {
            tracing::error!("applying the cluster's records panicked; waiting for the next change");
        }
        view.changed().await;
    }
}
