//! `modelmux deploy --cluster`: the configuration goes to etcd, and every node applies its
//! applications (keeping its own node settings) — here two nodes scale a deployment up, and
//! down again, each within 1 s of the deploy. A real etcd (Debian's `etcd-server`) and real
//! node processes.

use crate::cluster_common;
use crate::common;

use std::time::Duration;

use cluster_common::{Client, config, node};
use modelmux_cluster::LocalEtcd;
use tokio::time::Instant;

/// `modelmux deploy FILE --cluster ETCD` with `replicas` replicas of the test deployment.
fn deploy(etcd: &LocalEtcd, replicas: usize) {
    let text =
        config("127.0.0.1", 5).replace("num_replicas: 1", &format!("num_replicas: {replicas}"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, text).unwrap();
    let out = std::process::Command::new(common::BIN)
        .args([
            "deploy",
            path.to_str().unwrap(),
            "--cluster",
            &etcd.cluster_url(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Waits until every node runs `replicas` replicas; returns how long since `start` that was.
async fn until_replicas(
    client: &Client,
    urls: &[String],
    replicas: usize,
    start: Instant,
) -> Duration {
    loop {
        let mut all = true;
        for url in urls {
            all &= client.local_models(url).await.len() == replicas;
        }
        if all {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the nodes did not reach {replicas} replicas"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_node_applies_a_cluster_deploy_within_a_second() {
    let etcd = LocalEtcd::start(1).await.unwrap();
    let mut nodes = [node(&etcd, "n1", "both", 5), node(&etcd, "n2", "both", 5)];
    let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let client = Client::new();
    until_replicas(&client, &urls, 1, Instant::now()).await;

    // Timed from before the command runs: its own start-up and the write to etcd count.
    let start = Instant::now();
    deploy(&etcd, 3);
    let took = until_replicas(&client, &urls, 3, start).await;
    eprintln!("both nodes scaled to 3 in {took:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    // A model request still works on each node.
    for url in &urls {
        assert_eq!(client.get(url, "m1").await.status, 200);
    }

    let start = Instant::now();
    deploy(&etcd, 1);
    let took = until_replicas(&client, &urls, 1, start).await;
    eprintln!("both nodes scaled to 1 in {took:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    for n in &mut nodes {
        let (_, logs) = n.terminate();
        assert!(
            logs.contains("applied the cluster's configuration"),
            "{logs}"
        );
    }
}
