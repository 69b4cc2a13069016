//! `modelmux deploy --cluster`: the configuration goes to etcd, and every node applies its
//! applications (keeping its own node settings, which the deployed file's differ from) — here
//! two nodes scale a deployment up, and down again, while the other application's replicas
//! keep their models and nothing loads. A real etcd (Debian's `etcd-server`) and real node
//! processes. How soon the nodes apply a deploy is printed, not asserted: a bound on the wall
//! clock of a shared machine fails by chance (the nodes watch etcd, so it is milliseconds).

use crate::cluster_common;
use crate::common;

use std::time::Duration;

use cluster_common::{Client, config, node};
use modelmux_cluster::LocalEtcd;
use tokio::time::Instant;

/// `modelmux deploy FILE --cluster ETCD` with `replicas` replicas of the test deployment, and
/// node settings (listener, drain, lease) other than the nodes run with: a node that took
/// them would refuse the deploy whole (they need a restart).
fn deploy(etcd: &LocalEtcd, replicas: usize) {
    let text = config("127.0.0.1", 5)
        .replace("num_replicas: 1", &format!("num_replicas: {replicas}"))
        .replace("port: 0", "port: 1")
        .replace("drain_grace_period_s: 0.5", "drain_grace_period_s: 7")
        .replace("lease_ttl_s: 2", "lease_ttl_s: 9");
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
            start.elapsed() < Duration::from_secs(60),
            "the nodes did not reach {replicas} replicas"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_node_applies_a_cluster_deploy_keeping_its_own_node_settings() {
    let etcd = LocalEtcd::start(1).await.unwrap();
    let mut nodes = [node(&etcd, "n1", "both", 5), node(&etcd, "n2", "both", 5)];
    let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let client = Client::new();
    until_replicas(&client, &urls, 1, Instant::now()).await;

    for replicas in [3, 1] {
        // Timed from before the command runs: its own start-up and the write to etcd count.
        let start = Instant::now();
        deploy(&etcd, replicas);
        let took = until_replicas(&client, &urls, replicas, start).await;
        eprintln!("both nodes scaled to {replicas} in {took:?}");
        // Each node still listens where it did, and its replicas carry its own id.
        for (url, id) in urls.iter().zip(["n1", "n2"]) {
            assert_eq!(client.get(url, "m1").await.status, 200);
            let replicas = client.local_models(url).await;
            assert!(
                replicas.iter().all(|(r, _)| r.ends_with(&format!("@{id}"))),
                "{url}: {replicas:?}"
            );
        }
    }
    for n in &mut nodes {
        let (_, logs) = n.terminate();
        assert!(
            logs.matches("applied the cluster's configuration").count() >= 2,
            "{logs}"
        );
        assert!(!logs.contains("the cluster's configuration:"), "{logs}");
    }
}

/// A second application, which the deploys below leave unchanged.
const OTHER: &str = "  - name: other
    route_prefix: /other
    deployments:
      - name: Other
        max_models_per_replica: 2
        model: {kind: synthetic, load_ms: 50, size_mb: 1, infer_ms: 1}
";

/// The models each of a node's own `Other` replicas holds, by replica id.
async fn other_replicas(client: &Client, url: &str) -> Vec<(String, Vec<String>)> {
    (client.local_models(url).await.into_iter())
        .filter(|(id, _)| id.starts_with("Other#"))
        .collect()
}

/// `deploy --cluster` keeps warm caches on every node: a deploy that changes one deployment
/// (the test deployment scaled to 3 and back) leaves the other application's replica on each
/// node as it was, the same replica holding the same models, and loads nothing anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_deploy_keeps_every_nodes_untouched_caches_warm() {
    let etcd = LocalEtcd::start(1).await.unwrap();
    let text = |replicas: usize| {
        config("127.0.0.1", 5).replace("num_replicas: 1", &format!("num_replicas: {replicas}"))
            + OTHER
    };
    let cluster = etcd.cluster_url();
    let mut nodes: Vec<_> = ["n1", "n2"]
        .into_iter()
        .map(|id| {
            common::serve_in(
                &[],
                &cluster_common::for_etcd(&text(1), &etcd),
                &["--cluster", &cluster, "--node-id", id, "--role", "both"],
            )
        })
        .collect();
    let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let client = Client::new();
    until_replicas(&client, &urls, 2, Instant::now()).await;
    // Two models of Other, asked of each node: each loads once in the cluster, on whichever
    // node's replica the router picks, and the other node's requests go there.
    for (url, model) in urls.iter().zip(["w1", "w2"]) {
        let reply = client.http.get(url, "/other", model).await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let mut held = Vec::new();
    for url in &urls {
        held.extend(
            other_replicas(&client, url)
                .await
                .into_iter()
                .flat_map(|(_, m)| m),
        );
    }
    held.sort();
    assert_eq!(held, ["w1", "w2"], "each model held once in the cluster");
    let mut before = Vec::new();
    for url in &urls {
        before.push((other_replicas(&client, url).await, client.loads(url).await));
    }

    for replicas in [3, 1] {
        let path = tempfile::tempdir().unwrap();
        let file = path.path().join("cluster.yaml");
        std::fs::write(&file, text(replicas)).unwrap();
        let out = std::process::Command::new(common::BIN)
            .args(["deploy", file.to_str().unwrap(), "--cluster", &cluster])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        until_replicas(&client, &urls, replicas + 1, Instant::now()).await;
        for (url, (replicas_before, loads_before)) in urls.iter().zip(&before) {
            assert_eq!(
                &other_replicas(&client, url).await,
                replicas_before,
                "{url}: the untouched deployment's replica or its models changed"
            );
            assert_eq!(
                client.loads(url).await,
                *loads_before,
                "{url}: a deploy loaded a model"
            );
        }
    }
    for n in &mut nodes {
        let (_, logs) = n.terminate();
        assert!(
            logs.contains("applied the cluster's configuration"),
            "{logs}"
        );
    }
}
