//! Cluster mode over an etcd run as it should be: TLS with client certificates
//! (`--cert-file`, `--key-file`, `--trusted-ca-file`, `--client-cert-auth`) and `auth enable`,
//! the nodes configured with `cluster.etcd_tls` and `cluster.etcd_auth` (a password file,
//! never the password itself). Real `modelmux` processes: an ingress forwards requests to a
//! node's replica; `modelmux deploy --cluster` writes the cluster's configuration; a node whose
//! password is wrong does not start, and says why.

use crate::cluster_common::{self, Client};
use crate::common;

use std::process::{Command, Stdio};
use std::time::Duration;

use modelmux_cluster::LocalEtcd;

fn node(etcd: &LocalEtcd, config: &str, id: &str, role: &str) -> common::Running {
    let cluster = etcd.cluster_url();
    common::serve_in(
        &[],
        config,
        &["--cluster", &cluster, "--node-id", id, "--role", role],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_join_and_forward_through_an_etcd_with_tls_and_auth() {
    let etcd = LocalEtcd::start_secure(1).await.unwrap();
    let secure = etcd.secure().unwrap();
    let config = cluster_common::for_etcd(&cluster_common::config("127.0.0.1", 5), &etcd);
    let n1 = node(&etcd, &config, "n1", "node");
    let ingress = node(&etcd, &config, "in", "ingress");
    let client = Client::new();
    client.until_remote_replicas(&ingress.url, 1).await;

    // Every request through the ingress is forwarded to n1's replica and served there.
    for m in 0..4 {
        let reply = client.get(&ingress.url, &format!("m{m}")).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert!(reply.replica.ends_with("@n1"), "m{m} on {}", reply.replica);
    }
    assert_eq!(client.loads(&n1.url).await, 4);

    // Their records are in etcd, on the modelmux user's keys.
    let etcd_client = cluster_common::etcd_client(&etcd).await;
    let nodes = etcd_client
        .get_prefix("modelmux/test/nodes/")
        .await
        .unwrap();
    let keys: Vec<String> = nodes
        .kvs
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
        .collect();
    assert_eq!(keys, ["modelmux/test/nodes/in", "modelmux/test/nodes/n1"]);

    // `modelmux deploy --cluster` reaches etcd as its file's cluster section says.
    let dir = tempfile::tempdir().unwrap();
    let deployed = dir.path().join("deployed.yaml");
    std::fs::write(&deployed, &config).unwrap();
    let deploy = Command::new(common::BIN)
        .args(["deploy", deployed.to_str().unwrap(), "--cluster"])
        .arg(etcd.cluster_url())
        .output()
        .unwrap();
    assert!(
        deploy.status.success(),
        "{}",
        String::from_utf8_lossy(&deploy.stderr)
    );
    let written = etcd_client.get("modelmux/test/config").await.unwrap();
    assert_eq!(written.kvs[0].value, config.as_bytes());

    // A node with a wrong password is refused by etcd: it does not start, and says why.
    let wrong = dir.path().join("wrong-password");
    std::fs::write(&wrong, "not-the-password\n").unwrap();
    let path = dir.path().join("config.yaml");
    let password_file = secure.password_file.display().to_string();
    let wrong_config = config.replace(&password_file, &wrong.display().to_string());
    assert_ne!(wrong_config, config);
    std::fs::write(&path, wrong_config).unwrap();
    let cluster = etcd.cluster_url();
    let mut refused = Command::new(common::BIN)
        .args(["serve", path.to_str().unwrap(), "--cluster", &cluster])
        .args(["--node-id", "n2", "--role", "node"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while refused.try_wait().unwrap().is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a node with a wrong password kept running"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let output = refused.wait_with_output().unwrap();
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("joining the cluster") && said.contains("authentication failed"),
        "{said}"
    );
    assert!(!said.contains("not-the-password"), "{said}");
}
