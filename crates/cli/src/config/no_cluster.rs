//! `cluster.rs`'s stand-in in a modelmux built without the `cluster` feature (no etcd client,
//! no tonic): the section, the flags and `deploy --cluster` are still known, so that naming
//! them is an error that says which feature they need, never an unknown field or a panic.
//! The node's types have no values: a single process never has a cluster to join.

use std::sync::Arc;

use modelmux_front::{Server, ServerBuilder};
use serde::{Deserialize, Deserializer};

use super::{ClusterFlags, ConfigError, Reloader, not_built};

/// What a node of a cluster runs (none here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {}

/// How to join a cluster (none here).
#[derive(Debug)]
pub enum ClusterOptions {}

/// This node in a cluster (none here).
#[derive(Debug)]
pub enum ClusterNode {}

/// The `cluster` section, which this build refuses.
#[derive(Debug, Default)]
pub struct ClusterConfig {
    /// This node's id in a cluster: none.
    pub node_id: Option<String>,
}

impl<'de> Deserialize<'de> for ClusterConfig {
    fn deserialize<D: Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
        Err(serde::de::Error::custom(not_built(
            "cluster",
            "the `cluster` section",
        )))
    }
}

impl ClusterConfig {
    /// The files it names: none.
    pub(super) fn files(&mut self) -> impl Iterator<Item = &mut std::path::PathBuf> {
        std::iter::empty()
    }

    /// No cluster; a cluster flag (or its environment variable) is an error.
    pub fn options(
        &self,
        flags: &ClusterFlags,
        _listen: std::net::SocketAddr,
    ) -> Result<Option<ClusterOptions>, ConfigError> {
        if flags.etcd.is_some() || flags.node_id.is_some() || flags.advertise.is_some() {
            return Err(ConfigError::Invalid(not_built(
                "cluster",
                "--cluster, --node-id and --advertise (or MODELMUX_CLUSTER, MODELMUX_NODE_ID, MODELMUX_ADVERTISE)",
            )));
        }
        Ok(None)
    }
}

/// `--role`'s value: refused.
pub fn parse_role(_: &str) -> Result<Role, String> {
    Err(not_built("cluster", "--role"))
}

/// Never called: there are no options.
pub fn node_settings(options: &ClusterOptions, _: ServerBuilder) -> ServerBuilder {
    match *options {}
}

/// Never called: there are no options.
pub async fn join(
    options: ClusterOptions,
    _: &Server,
    _: Arc<Reloader>,
    _: std::net::SocketAddr,
) -> Result<ClusterNode, String> {
    match options {}
}

/// Never called: there is no node.
pub async fn leave(member: ClusterNode) {
    match member {}
}

/// `modelmux deploy FILE --cluster ETCD`: refused.
pub async fn deploy(
    _: &std::path::Path,
    _: &str,
    _: Option<String>,
) -> Result<(), crate::CliError> {
    Err(not_built("cluster", "`deploy --cluster`").into())
}
