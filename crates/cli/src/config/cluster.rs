//! `cluster`: how `modelmux serve` joins a cluster (also set by `--cluster`, `--node-id`,
//! `--advertise` and `--role`, which win over the file), and how it reaches etcd (`etcd_tls`,
//! `etcd_auth`: only in the file, so no secret is ever on a command line); then joining it,
//! following the configuration `modelmux deploy --cluster` writes, and writing it. The CLI's
//! `cluster` feature (without it, `no_cluster.rs` stands in).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use modelmux_cluster::{ClusterNode, ClusterOptions, Role};
use modelmux_cluster::{Credentials, EtcdSecurity, TlsOptions};
use modelmux_front::{Server, ServerBuilder};
use serde::Deserialize;

use super::{ClusterFlags, Config, ConfigError, Reloader, Seconds};

/// The `cluster` section.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// etcd's client URLs: `etcd://h1:2379,h2:2379`.
    #[serde(default)]
    pub etcd: Option<String>,
    /// TLS to etcd: the CA that signed its members' certificates, and this node's client
    /// certificate and key (etcd's `--client-cert-auth`). The endpoints are then `https`.
    #[serde(default)]
    pub etcd_tls: Option<EtcdTlsConfig>,
    /// The etcd user this node authenticates as (etcd's `auth enable`).
    #[serde(default)]
    pub etcd_auth: Option<EtcdAuthConfig>,
    /// The cluster's name: its keys live under `modelmux/<name>/` (default `default`), so one
    /// etcd can hold several clusters.
    #[serde(default)]
    pub name: Option<String>,
    /// This node's id, unique in the cluster.
    #[serde(default)]
    pub node_id: Option<String>,
    /// Where other nodes reach this one: `http://host:port`.
    #[serde(default)]
    pub advertise: Option<String>,
    /// `both` (route and run replicas, the default), `ingress` (route only) or `node`
    /// (replicas only).
    #[serde(default)]
    pub role: Option<Role>,
    /// The node's etcd lease TTL, in seconds (default 3): a node that dies leaves the routing
    /// of every other node within it.
    #[serde(default)]
    pub lease_ttl_s: Option<Seconds>,
    /// After how long without an answer from etcd the node reports not ready (default 10).
    #[serde(default)]
    pub unready_after_s: Option<Seconds>,
    /// How long a ping to another node may go unanswered before that node is passed over
    /// until it answers again (default 1). Raise it on machines that stall for longer, where
    /// a dropped connection would fail the requests in flight on it.
    #[serde(default)]
    pub peer_timeout_s: Option<Seconds>,
}

/// `cluster.etcd_tls`. Relative paths are read from the configuration file's directory.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdTlsConfig {
    /// The CA certificate(s) etcd's members' certificates are verified with (PEM).
    pub ca_file: PathBuf,
    /// This node's client certificate (PEM), for an etcd started with `--client-cert-auth`.
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// Its private key (PEM).
    #[serde(default)]
    pub key_file: Option<PathBuf>,
}

/// `cluster.etcd_auth`: a user, and where its password is (never the password itself, so it
/// is in no file that is passed around and on no command line).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdAuthConfig {
    /// The etcd user.
    pub username: String,
    /// A file holding the password (a trailing newline is dropped); relative paths are read
    /// from the configuration file's directory.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// The name of an environment variable holding the password.
    #[serde(default)]
    pub password_env: Option<String>,
}

impl ClusterConfig {
    /// The files it names (`etcd_tls`'s, `etcd_auth.password_file`), which may be relative
    /// to the configuration file.
    pub(super) fn files(&mut self) -> impl Iterator<Item = &mut PathBuf> {
        let tls = self.etcd_tls.as_mut();
        let auth = self.etcd_auth.as_mut();
        tls.into_iter()
            .flat_map(|t| {
                [
                    Some(&mut t.ca_file),
                    t.cert_file.as_mut(),
                    t.key_file.as_mut(),
                ]
            })
            .chain(auth.map(|a| a.password_file.as_mut()))
            .flatten()
    }

    /// How to reach etcd besides its endpoints: TLS and the user, with every file read and
    /// checked now (a missing or unreadable one is an error naming its key).
    pub fn etcd_security(&self) -> Result<EtcdSecurity, ConfigError> {
        let invalid = |key: &str, m: String| ConfigError::Invalid(format!("cluster.{key}: {m}"));
        let tls = match &self.etcd_tls {
            None => None,
            Some(t) => {
                let ca = TlsOptions::from_ca_file(&t.ca_file)
                    .map_err(|e| invalid("etcd_tls.ca_file", e.to_string()))?;
                Some(match (&t.cert_file, &t.key_file) {
                    (None, None) => ca,
                    (Some(cert), Some(key)) => {
                        for (name, file) in [("cert_file", cert), ("key_file", key)] {
                            std::fs::metadata(file).map_err(|e| {
                                invalid(
                                    &format!("etcd_tls.{name}"),
                                    format!("cannot read {}: {e}", file.display()),
                                )
                            })?;
                        }
                        ca.with_identity_files(cert, key)
                            .map_err(|e| invalid("etcd_tls", e.to_string()))?
                    }
                    (Some(_), None) | (None, Some(_)) => {
                        return Err(invalid(
                            "etcd_tls",
                            "cert_file and key_file go together: give both, or neither".into(),
                        ));
                    }
                })
            }
        };
        let credentials = match &self.etcd_auth {
            None => None,
            Some(a) => {
                if a.username.is_empty() {
                    return Err(invalid("etcd_auth.username", "may not be empty".into()));
                }
                let password = match (&a.password_file, &a.password_env) {
                    (Some(file), None) => {
                        let text = std::fs::read_to_string(file).map_err(|e| {
                            invalid(
                                "etcd_auth.password_file",
                                format!("cannot read {}: {e}", file.display()),
                            )
                        })?;
                        text.strip_suffix('\n')
                            .map(|t| t.strip_suffix('\r').unwrap_or(t))
                            .unwrap_or(&text)
                            .to_owned()
                    }
                    (None, Some(name)) => std::env::var(name).map_err(|_| {
                        invalid(
                            "etcd_auth.password_env",
                            format!("the environment variable {name:?} is not set"),
                        )
                    })?,
                    _ => {
                        return Err(invalid(
                            "etcd_auth",
                            "give the password's place: password_file or password_env (one)".into(),
                        ));
                    }
                };
                if password.is_empty() {
                    return Err(invalid("etcd_auth", "the password is empty".into()));
                }
                Some(Credentials::new(a.username.clone(), password))
            }
        };
        Ok(EtcdSecurity { tls, credentials })
    }

    /// The options to join with, if this server is part of a cluster (flags win over the
    /// file); `listen` is the address the server listens on, advertised when nothing else is
    /// and it is a specific address.
    pub fn options(
        &self,
        flags: &ClusterFlags,
        listen: std::net::SocketAddr,
    ) -> Result<Option<ClusterOptions>, ConfigError> {
        let Some(etcd) = flags.etcd.as_deref().or(self.etcd.as_deref()) else {
            if flags.node_id.is_some() || flags.advertise.is_some() || flags.role.is_some() {
                return Err(ConfigError::Invalid(
                    "--node-id, --advertise and --role need --cluster (or cluster.etcd)".into(),
                ));
            }
            return Ok(None);
        };
        let invalid = |m: String| ConfigError::Invalid(format!("cluster: {m}"));
        let node_id = flags
            .node_id
            .as_deref()
            .or(self.node_id.as_deref())
            .ok_or_else(|| invalid("a node id is needed (--node-id or cluster.node_id)".into()))?;
        let advertise = match flags.advertise.as_deref().or(self.advertise.as_deref()) {
            Some(a) => a.to_owned(),
            // The address it listens on (with port 0, the port it gets).
            None if !listen.ip().is_unspecified() => {
                format!("http://{listen}")
            }
            None => {
                return Err(invalid(format!(
                    "listening on {listen}, other nodes need an address to reach this one \
                     (--advertise http://host:port or cluster.advertise)"
                )));
            }
        };
        let mut options = ClusterOptions::new(etcd, node_id, &advertise).map_err(invalid)?;
        options.etcd_security = self.etcd_security()?;
        let name = self.name.as_deref().unwrap_or("default");
        if name.is_empty() || name.contains('/') {
            return Err(invalid(format!(
                "name {name:?} may not be empty or contain '/'"
            )));
        }
        options.prefix = format!("modelmux/{name}");
        options.role = flags.role.or(self.role).unwrap_or_default();
        options.lease_ttl = self
            .lease_ttl_s
            .map_or(Duration::from_secs(3), |s| s.0)
            .max(Duration::from_secs(1));
        options.unready_after = self
            .unready_after_s
            .map_or(Duration::from_secs(10), |s| s.0);
        if let Some(timeout) = self.peer_timeout_s {
            if timeout.0 < Duration::from_millis(100) {
                return Err(invalid(format!(
                    "peer_timeout_s {:?} is too short (at least 0.1)",
                    timeout.0.as_secs_f64()
                )));
            }
            options.peer_timeout = timeout.0;
        }
        Ok(Some(options))
    }
}

/// `--role`'s value.
pub fn parse_role(value: &str) -> Result<Role, String> {
    match value {
        "both" => Ok(Role::Both),
        "ingress" => Ok(Role::Ingress),
        "node" => Ok(Role::Node),
        other => Err(format!("{other:?}: expected both, ingress or node")),
    }
}

/// `builder` as this node of the cluster: its id, and routing only when it runs no replicas.
pub fn node_settings(options: &ClusterOptions, builder: ServerBuilder) -> ServerBuilder {
    let builder = builder.node_id(&options.node_id);
    if options.role.runs_replicas() {
        builder
    } else {
        builder.router_only()
    }
}

/// Joins the cluster with `server`, started listening on `listen`: this node then applies
/// what `modelmux deploy --cluster` writes to etcd (through `reloader`), and its records are
/// published.
pub async fn join(
    mut options: ClusterOptions,
    server: &Server,
    reloader: Arc<Reloader>,
    listen: std::net::SocketAddr,
) -> Result<ClusterNode, String> {
    let (endpoints, prefix) = (options.endpoints.clone(), options.prefix.clone());
    let security = options.etcd_security.clone();
    tokio::spawn(async move {
        let client = match modelmux_cluster::connect_with(&endpoints, &security).await {
            Ok(client) => client,
            Err(e) => return tracing::error!("following the cluster's configuration: {e}"),
        };
        let applied = modelmux_cluster::follow_config(client, &prefix, |text| {
            let reloader = reloader.clone();
            async move {
                match reloader.apply_applications(&text).await {
                    Ok(answer) => tracing::info!(%answer, "applied the cluster's configuration"),
                    Err(e) => tracing::error!("the cluster's configuration: {e}"),
                }
            }
        })
        .await;
        if let Err(e) = applied {
            tracing::error!("following the cluster's configuration: {e}");
        }
    });
    // Advertised as the address it listens on: now with the port it really got.
    if options.advertise == format!("http://{listen}") {
        options.advertise = format!("http://{}", server.local_addr());
    }
    let (node, role) = (options.node_id.clone(), options.role);
    let member = ClusterNode::join(options, server.node_handle())
        .await
        .map_err(|e| format!("joining the cluster: {e}"))?;
    tracing::info!(%node, ?role, "joined the cluster");
    Ok(member)
}

/// Takes this node's records out of etcd.
pub async fn leave(member: ClusterNode) {
    if let Err(e) = member.leave().await {
        tracing::warn!("leaving the cluster: {e}");
    }
}

/// `modelmux deploy FILE --cluster ETCD`: writes the configuration where every node of the
/// cluster follows it.
pub async fn deploy(
    path: &std::path::Path,
    etcd: &str,
    name: Option<String>,
) -> Result<(), crate::CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut config = Config::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let name = name
        .or(config.cluster.name.clone())
        .unwrap_or_else(|| "default".into());
    let endpoints = modelmux_cluster::parse_endpoints(etcd)?;
    let prefix = format!("modelmux/{name}");
    // etcd is reached as the file's `cluster.etcd_tls` and `etcd_auth` say.
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    config.resolve_paths(dir.unwrap_or(std::path::Path::new(".")));
    let security = config
        .cluster
        .etcd_security()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    modelmux_cluster::publish_config(&endpoints, &security, &prefix, &text)
        .await
        .map_err(|e| format!("writing to etcd at {etcd}: {e}"))?;
    crate::say(format_args!(
        "deployed {} to cluster '{name}': every node applies it\n",
        path.display()
    ));
    Ok(())
}
