//! `modelmux-cluster`: many modelmux processes as one model-aware pool, coordinated through
//! etcd.
//!
//! Every process holds one etcd lease (a short TTL, kept alive) and writes its records on it:
//! its node record and one key per model copy it holds. When the process dies its lease
//! expires and etcd deletes its keys, so nothing needs reaping and no shared record is ever
//! compare-and-swapped. A [`Registry`] owns one process's lease and records and puts them back
//! if the lease is lost; a [`View`] follows every record under the cluster's prefix (one read,
//! then a watch from the next revision, a full read again after a compaction). A
//! [`ClusterNode`] ties them to a running server: it publishes the server's replicas and their
//! models, and feeds every other node's into the server's routers, which forward requests to
//! them over HTTP/2 ([`H2Forwarder`]).

mod config_sync;
mod forward;
mod local_etcd;
#[cfg(feature = "local-etcd-tls")]
pub mod local_etcd_tls;
mod membership;
mod node;
mod records;
mod registry;
mod supervise;
mod view;

pub use config_sync::{config_key, follow_config, publish_config};
pub use forward::H2Forwarder;
pub use local_etcd::LocalEtcd;
pub use membership::NotAMember;
pub use modelmux_etcd::{Client as EtcdClient, Credentials, TlsOptions};
pub use node::{ClusterNode, ClusterOptions, EtcdSecurity, connect, connect_with, parse_endpoints};
pub use records::{
    CopyRecord, DeploymentRecord, Keys, NodeRecord, Peer, ReplicaRecord, ReplicasByDeployment,
    Role, local_records, remote_replicas,
};
pub use registry::{Registry, RegistryOptions};
pub use view::{Records, View};

/// What can go wrong talking to etcd.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// etcd refused or failed a call, or could not be reached.
    #[error("etcd: {0}")]
    Etcd(#[from] modelmux_etcd::Error),
    /// etcd gave up the lease (it expired before it was kept alive).
    #[error("the lease {0:x} expired")]
    LeaseLost(i64),
}
