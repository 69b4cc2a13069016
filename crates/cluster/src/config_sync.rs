//! The cluster's applications, deployed once for every node: `modelmux deploy --cluster` writes
//! the configuration to `<prefix>/config` (no lease: it outlives the nodes), and every node
//! follows that key and applies each new value (its `applications`; each node keeps its own
//! listener, cluster and cache settings) through the server's `Deployer`.

use std::future::Future;

use modelmux_etcd::Client;

use crate::view::View;
use crate::{ClusterError, EtcdSecurity};

/// The key of the cluster's deployed configuration under `prefix`.
pub fn config_key(prefix: &str) -> String {
    format!("{prefix}/config")
}

/// Writes `text` as the configuration of the cluster at `prefix` on etcd at `endpoints`
/// (reached as `security` says).
pub async fn publish_config(
    endpoints: &[String],
    security: &EtcdSecurity,
    prefix: &str,
    text: &str,
) -> Result<(), ClusterError> {
    let client = crate::connect_with(endpoints, security).await?;
    client.put(config_key(prefix), text, None).await?;
    Ok(())
}

/// Calls `apply` with the cluster's configuration at `prefix` now (if one was deployed) and
/// every time it changes; returns only if etcd cannot be read at the start.
pub async fn follow_config<F, Fut>(
    client: Client,
    prefix: &str,
    mut apply: F,
) -> Result<(), ClusterError>
where
    F: FnMut(String) -> Fut,
    Fut: Future<Output = ()>,
{
    let key = config_key(prefix);
    let mut view = View::start(client, &key).await?;
    let mut last: Option<Vec<u8>> = None;
    loop {
        let value = view.records().get(&key).cloned();
        if let Some(value) = value
            && last.as_ref() != Some(&value)
        {
            last = Some(value.clone());
            match String::from_utf8(value) {
                Ok(text) => apply(text).await,
                Err(_) => tracing::error!("{key} is not UTF-8 text; ignored"),
            }
        }
        view.changed().await;
    }
}
