//! What a node writes to etcd, and where: the key layout under a cluster's prefix and the JSON
//! values.
//!
//! ```text
//! <prefix>/nodes/<node>                          NodeRecord (address, role, replicas and load)
//! <prefix>/copies/<node>/<replica>/<model id>    CopyRecord (loading or loaded, size, load time)
//! ```
//!
//! Both are on the node's lease. A model copy is its own key, written when a load starts or
//! ends and deleted on eviction, so a load or an eviction is one small write, and no record is
//! shared between nodes (no compare-and-swap anywhere). Node ids and replica ids contain no
//! `/`; a model id may, and is the rest of its key.
//!
//! A node record lists every deployment of every application it runs (not only each
//! application's ingress: handle calls reach the others), each by application and deployment
//! name with its replicas; a copy record names its application and deployment too. Records
//! written before deployments were all published (ingress only, copies without a deployment)
//! read the same way.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use modelmux_cache::ModelId;
use modelmux_serve::{CopyReport, DeploymentState, ReplicaState};
use serde::{Deserialize, Serialize};

/// What a node runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Routes requests and runs replicas (the default).
    #[default]
    Both,
    /// Routes requests only: every request is forwarded to a node with replicas.
    Ingress,
    /// Runs replicas only: serves what it is sent, routing among its own replicas.
    Node,
}

impl Role {
    /// Whether it runs replicas.
    pub fn runs_replicas(self) -> bool {
        !matches!(self, Role::Ingress)
    }

    /// Whether it routes requests to other nodes' replicas.
    pub fn routes(self) -> bool {
        !matches!(self, Role::Node)
    }
}

/// A node's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Where other nodes reach it (`http://host:port`).
    pub address: String,
    /// What it runs.
    pub role: Role,
    /// Shutting down: it takes no new requests.
    pub draining: bool,
    /// Its applications' deployments and their replicas.
    pub deployments: Vec<DeploymentRecord>,
}

/// One deployment of an application on a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeploymentRecord {
    /// The application.
    pub app: String,
    /// The deployment.
    pub deployment: String,
    /// Its replicas on the node.
    pub replicas: Vec<ReplicaRecord>,
}

/// One replica: its limits and load (its models are [`CopyRecord`]s).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    /// Its id, unique in the cluster (`deployment#tag@node`).
    pub id: String,
    /// `max_ongoing_requests`.
    pub max_ongoing: usize,
    /// Model-count cap.
    pub max_models: Option<usize>,
    /// Byte cap.
    pub max_bytes: Option<u64>,
    /// Requests in progress when written.
    pub ongoing: usize,
    /// Taking requests.
    pub available: bool,
}

/// One model copy on one replica.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CopyRecord {
    /// The application whose deployment the replica belongs to.
    pub app: String,
    /// The deployment (empty in records of nodes that published only ingress deployments).
    #[serde(default)]
    pub deployment: String,
    /// Loaded (else loading).
    pub loaded: bool,
    /// Its size in bytes, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// How long its load took, in milliseconds, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_ms: Option<f64>,
}

/// The keys of one cluster.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// The keys under `prefix` (a trailing `/` is added if missing).
    pub fn new(prefix: &str) -> Self {
        let mut prefix = prefix.to_owned();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        Self { prefix }
    }

    /// Everything of the cluster.
    pub fn all(&self) -> &str {
        &self.prefix
    }

    /// A node's record.
    pub fn node(&self, node: &str) -> String {
        format!("{}nodes/{node}", self.prefix)
    }

    /// A model copy.
    pub fn copy(&self, node: &str, replica: &str, model: &str) -> String {
        format!("{}copies/{node}/{replica}/{model}", self.prefix)
    }

    /// `(node, replica, model)` of a copy key, if it is one.
    pub fn parse_copy<'k>(&self, key: &'k str) -> Option<(&'k str, &'k str, &'k str)> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix("copies/")?;
        let (node, rest) = rest.split_once('/')?;
        let (replica, model) = rest.split_once('/')?;
        Some((node, replica, model))
    }

    /// The node of a node key, if it is one.
    pub fn parse_node<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(&self.prefix)?.strip_prefix("nodes/")
    }
}

/// What this node publishes: its record and one value per model copy, by key.
pub fn local_records(
    keys: &Keys,
    node: &str,
    address: &str,
    role: Role,
    draining: bool,
    state: &[DeploymentState],
) -> (NodeRecord, BTreeMap<String, CopyRecord>) {
    let mut copies = BTreeMap::new();
    let deployments = state
        .iter()
        .map(|d| DeploymentRecord {
            app: d.app.clone(),
            deployment: d.deployment.clone(),
            replicas: d
                .replicas
                .iter()
                .map(|r| {
                    for c in &r.copies {
                        copies.insert(
                            keys.copy(node, &r.id, c.id.as_str()),
                            CopyRecord {
                                app: d.app.clone(),
                                deployment: d.deployment.clone(),
                                loaded: c.loaded,
                                size_bytes: c.size_bytes,
                                load_ms: c.load_time.map(|t| t.as_secs_f64() * 1e3),
                            },
                        );
                    }
                    ReplicaRecord {
                        id: r.id.clone(),
                        max_ongoing: r.max_ongoing,
                        max_models: r.max_models,
                        max_bytes: r.max_bytes,
                        ongoing: r.ongoing,
                        available: r.available,
                    }
                })
                .collect(),
        })
        .collect();
    let record = NodeRecord {
        address: address.to_owned(),
        role,
        draining,
        deployments,
    };
    (record, copies)
}

/// Another node, as read from etcd.
#[derive(Debug, Clone)]
pub struct Peer {
    /// Its id.
    pub node: Arc<str>,
    /// Its record.
    pub record: NodeRecord,
}

/// Replicas of other nodes by `(application, deployment)`: `(node, replica)` pairs.
pub type ReplicasByDeployment = HashMap<(String, String), Vec<(Arc<str>, ReplicaState)>>;

/// Every other node's replicas by application and deployment, and the nodes themselves, from
/// the records under the cluster's prefix. Records that do not parse are skipped (and
/// logged): a node of a newer version must not stop this one routing.
pub fn remote_replicas(
    keys: &Keys,
    own: &str,
    records: &BTreeMap<String, Vec<u8>>,
) -> (Vec<Peer>, ReplicasByDeployment) {
    let mut peers = Vec::new();
    let mut copies: HashMap<(&str, &str), Vec<CopyReport>> = HashMap::new();
    for (key, value) in records {
        if let Some(node) = keys.parse_node(key) {
            if node == own {
                continue;
            }
            match serde_json::from_slice::<NodeRecord>(value) {
                Ok(record) => peers.push(Peer {
                    node: node.into(),
                    record,
                }),
                Err(e) => tracing::warn!(%key, "a node record that does not parse: {e}"),
            }
        } else if let Some((node, replica, model)) = keys.parse_copy(key) {
            if node == own {
                continue;
            }
            let (Ok(id), Ok(copy)) = (
                ModelId::new(model),
                serde_json::from_slice::<CopyRecord>(value),
            ) else {
                tracing::warn!(%key, "a model copy record that does not parse");
                continue;
            };
            copies.entry((node, replica)).or_default().push(CopyReport {
                id,
                loaded: copy.loaded,
                size_bytes: copy.size_bytes,
                load_time: copy
                    .load_ms
                    .filter(|ms| ms.is_finite() && *ms >= 0.0)
                    .map(|ms| Duration::from_secs_f64(ms / 1e3)),
            });
        }
    }
    let mut by_deployment = ReplicasByDeployment::new();
    for peer in &peers {
        for d in &peer.record.deployments {
            let replicas = by_deployment
                .entry((d.app.clone(), d.deployment.clone()))
                .or_default();
            for r in &d.replicas {
                replicas.push((
                    peer.node.clone(),
                    ReplicaState {
                        id: r.id.clone(),
                        max_ongoing: r.max_ongoing,
                        max_models: r.max_models,
                        max_bytes: r.max_bytes,
                        ongoing: r.ongoing,
                        available: r.available && !peer.record.draining,
                        copies: copies
                            .remove(&(&*peer.node, r.id.as_str()))
                            .unwrap_or_default(),
                    },
                ));
            }
        }
    }
    (peers, by_deployment)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_model_ids_with_slashes() {
        let keys = Keys::new("modelmux/prod");
        let key = keys.copy("n1", "m#abc@n1", "org/model-7");
        assert_eq!(key, "modelmux/prod/copies/n1/m#abc@n1/org/model-7");
        assert_eq!(
            keys.parse_copy(&key),
            Some(("n1", "m#abc@n1", "org/model-7"))
        );
        assert_eq!(keys.parse_node("modelmux/prod/nodes/n2"), Some("n2"));
        assert_eq!(keys.parse_node("modelmux/other/nodes/n2"), None);
    }

    #[test]
    fn other_nodes_replicas_come_with_their_copies_and_drain() {
        let keys = Keys::new("p/");
        let state = vec![DeploymentState {
            app: "app".into(),
            deployment: "d".into(),
            replicas: vec![ReplicaState {
                id: "d#1@b".into(),
                max_ongoing: 5,
                max_models: Some(2),
                max_bytes: None,
                ongoing: 1,
                available: true,
                copies: vec![CopyReport {
                    id: ModelId::new("x/y").unwrap(),
                    loaded: true,
                    size_bytes: Some(10),
                    load_time: Some(Duration::from_millis(100)),
                }],
            }],
        }];
        let mut records = BTreeMap::new();
        for (node, draining) in [("a", false), ("b", true)] {
            let (record, copies) =
                local_records(&keys, node, "http://x", Role::Both, draining, &state);
            records.insert(keys.node(node), serde_json::to_vec(&record).unwrap());
            for (k, v) in copies {
                records.insert(k, serde_json::to_vec(&v).unwrap());
            }
        }
        records.insert(keys.node("broken"), b"{".to_vec());
        let (peers, by_deployment) = remote_replicas(&keys, "a", &records);
        assert_eq!(peers.len(), 1, "own node and unparsable records left out");
        let replicas = &by_deployment[&("app".to_owned(), "d".to_owned())];
        assert_eq!(replicas.len(), 1);
        let (node, r) = &replicas[0];
        assert_eq!(&**node, "b");
        assert!(!r.available, "a draining node's replicas take nothing");
        assert_eq!(r.copies, state[0].replicas[0].copies);
    }

    fn replica(id: &str, model: &str) -> ReplicaState {
        ReplicaState {
            id: id.into(),
            max_ongoing: 4,
            max_models: Some(2),
            max_bytes: None,
            ongoing: 0,
            available: true,
            copies: vec![CopyReport {
                id: ModelId::new(model).unwrap(),
                loaded: true,
                size_bytes: None,
                load_time: None,
            }],
        }
    }

    #[test]
    fn every_deployment_is_published_by_name_and_read_back_by_application_and_deployment() {
        let keys = Keys::new("p");
        let state = vec![
            DeploymentState {
                app: "app".into(),
                deployment: "Ingress".into(),
                replicas: vec![replica("Ingress#1@b", "x")],
            },
            DeploymentState {
                app: "app".into(),
                deployment: "Model".into(),
                replicas: vec![replica("Model#1@b", "m7"), replica("Model#2@b", "m8")],
            },
            DeploymentState {
                app: "other".into(),
                deployment: "Model".into(),
                replicas: vec![replica("Model#3@b", "m9")],
            },
        ];
        let (record, copies) = local_records(&keys, "b", "http://x", Role::Both, false, &state);
        // Readable by name: each deployment says its application, each copy both.
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["deployments"][1]["app"], "app");
        assert_eq!(json["deployments"][1]["deployment"], "Model");
        assert_eq!(json["deployments"][1]["replicas"][1]["id"], "Model#2@b");
        let copy = &copies[&keys.copy("b", "Model#2@b", "m8")];
        assert_eq!(
            (copy.app.as_str(), copy.deployment.as_str()),
            ("app", "Model")
        );

        let mut records = BTreeMap::new();
        records.insert(keys.node("b"), serde_json::to_vec(&record).unwrap());
        for (k, v) in copies {
            records.insert(k, serde_json::to_vec(&v).unwrap());
        }
        let (_, by_deployment) = remote_replicas(&keys, "a", &records);
        let ids = |app: &str, deployment: &str| -> Vec<(String, Vec<String>)> {
            by_deployment[&(app.to_owned(), deployment.to_owned())]
                .iter()
                .map(|(node, r)| {
                    assert_eq!(&**node, "b");
                    let models = r.copies.iter().map(|c| c.id.to_string()).collect();
                    (r.id.clone(), models)
                })
                .collect()
        };
        let pair = |id: &str, model: &str| (id.to_owned(), vec![model.to_owned()]);
        assert_eq!(ids("app", "Ingress"), [pair("Ingress#1@b", "x")]);
        assert_eq!(
            ids("app", "Model"),
            [pair("Model#1@b", "m7"), pair("Model#2@b", "m8")]
        );
        assert_eq!(ids("other", "Model"), [pair("Model#3@b", "m9")]);
        assert_eq!(by_deployment.len(), 3);
    }

    #[test]
    fn a_copy_record_without_a_deployment_still_reads() {
        let old = br#"{"app": "app", "loaded": true}"#;
        let copy: CopyRecord = serde_json::from_slice(old).unwrap();
        assert_eq!((copy.app.as_str(), copy.deployment.as_str()), ("app", ""));
    }
}
