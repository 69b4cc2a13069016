//! `cluster`: how `modelmux serve` joins a cluster (also set by `--cluster`, `--node-id`,
//! `--advertise` and `--role`, which win over the file), and how it reaches etcd (`etcd_tls`,
//! `etcd_auth`: only in the file, so no secret is ever on a command line).

use std::path::PathBuf;
use std::time::Duration;

use modelmux_cluster::{ClusterOptions, Credentials, EtcdSecurity, Role, TlsOptions};
use serde::Deserialize;

use super::{ConfigError, Seconds};

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

/// What the command line says about the cluster.
#[derive(Debug, Default, Clone)]
pub struct ClusterFlags {
    /// `--cluster`.
    pub etcd: Option<String>,
    /// `--node-id`.
    pub node_id: Option<String>,
    /// `--advertise`.
    pub advertise: Option<String>,
    /// `--role`.
    pub role: Option<Role>,
}

impl ClusterConfig {
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
