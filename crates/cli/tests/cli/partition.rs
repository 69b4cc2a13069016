//! Network partitions in cluster mode: each node in its own network namespace, cut off by
//! nftables rules that drop packets (the other side hears nothing, as in a real partition).
//! etcd and the test's clients are in the hub namespace. See `netns/mod.rs` for what this
//! needs; `scripts/test` says when it could not run these.

use crate::cluster_common;
use crate::common;
use crate::netns;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cluster_common::{Client, node_in, traffic};
use common::Running;
use modelmux_cluster::LocalEtcd;
use netns::Net;
use tokio::time::Instant;

/// Host indexes: two nodes that route and run replicas, and a router-only ingress.
const N1: usize = 0;
const N2: usize = 1;
const INGRESS: usize = 2;

/// Runs `test` in the hub of three fresh hosts, on a runtime of its own.
fn with_hosts<F>(tag: &str, test: impl FnOnce(Arc<Net>) -> F + Send)
where
    F: std::future::Future<Output = ()>,
{
    if !netns::enabled() {
        return;
    }
    let net = Arc::new(Net::create(tag, 3));
    net.clone().run_in_hub(move || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(4)
            .enable_all()
            .build()
            .unwrap()
            .block_on(test(net))
    });
}

/// etcd in the hub, and the three hosts' servers.
async fn cluster(net: &Net) -> (LocalEtcd, Vec<Running>) {
    let etcd = LocalEtcd::start_on(1, net.hub_ip().into()).await.unwrap();
    let start = |i: usize, id: &str, role: &str| {
        let host = net.ip(i).to_string();
        node_in(&net.exec(i), &host, &etcd, id, role, 20)
    };
    let servers = vec![
        start(N1, "n1", "both"),
        start(N2, "n2", "both"),
        start(INGRESS, "in", "ingress"),
    ];
    (etcd, servers)
}

/// Whether `url`'s `/-/models` lists a replica of `node` that is available.
async fn sees_available(client: &Client, url: &str, node: &str) -> (bool, bool) {
    let models = client.json(url, "/-/models").await;
    let replicas = models["applications"][0]["deployments"][0]["replicas"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let listed: Vec<_> = replicas.iter().filter(|r| r["node"] == node).collect();
    (
        !listed.is_empty(),
        listed.iter().any(|r| r["available"] == true),
    )
}

/// Polls `check` every 50 ms until it holds; panics with `what` after `within`.
async fn eventually<Fut: std::future::Future<Output = bool>>(
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> Fut,
) -> Duration {
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

#[test]
fn a_node_cut_off_from_its_peers_but_not_etcd_is_passed_over_until_it_answers() {
    with_hosts("peers", |net| async move {
        let (_etcd, servers) = cluster(&net).await;
        let ingress = servers[INGRESS].url.clone();
        let client = Arc::new(Client::new());
        client.until_remote_replicas(&ingress, 2).await;
        let stop = Arc::new(AtomicBool::new(false));
        let load = tokio::spawn(traffic(client.clone(), ingress.clone(), 6, 4, stop.clone()));
        tokio::time::sleep(Duration::from_millis(1500)).await;

        // n1 still reaches etcd, so its records stay and say it is available: the ingress
        // must find out from the connection itself.
        net.cut_from_hosts(N1, &[N2, INGRESS]);
        let cut = Instant::now();
        tokio::time::sleep(Duration::from_secs(6)).await;
        let (listed, available) = sees_available(&client, &ingress, "n1").await;
        assert!(listed, "n1 keeps its lease, so it stays listed");
        assert!(!available, "but it is passed over while it does not answer");

        net.heal(N1);
        // Back once a probe reconnects: the probe's backoff is at most 1 s, so 10 s is the
        // bound (10x the step); it was passed over until the heal (asserted above).
        let back = eventually(Duration::from_secs(10), "n1 back in routing", || {
            let (client, ingress) = (client.clone(), ingress.clone());
            async move { sees_available(&client, &ingress, "n1").await.1 }
        })
        .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::SeqCst);
        let got = load.await.unwrap();

        let slowest = got.slowest_after(cut + Duration::from_secs(3));
        eprintln!(
            "cut from peers: {} ok, {} failed {:?}, slowest after the first 3 s {slowest:?}, \
             back in routing {back:?} after healing",
            got.ok,
            got.failed.len(),
            got.failed
        );
        assert!(got.ok > 200, "traffic flowed: {}", got.ok);
        // Only requests already sent to n1 when it went silent fail: at most one per client
        // loop, when the ping to n1 goes unanswered. None is sent to n1 after that.
        assert!(got.failed.len() <= 6, "{:?}", got.failed);
        assert!(
            got.failed.iter().all(|f| f == "forward_failed"),
            "only requests in flight fail: {:?}",
            got.failed
        );
        // Once n1 is known to be silent, no request waits on it: the probe reconnects in the
        // background, requests never do.
        assert!(
            slowest < Duration::from_millis(1500),
            "a request took {slowest:?} after the partition was noticed"
        );
    });
}

#[test]
fn a_node_cut_off_from_etcd_but_not_its_peers_keeps_serving_and_rejoins() {
    with_hosts("etcd", |net| async move {
        let (etcd, servers) = cluster(&net).await;
        let n1 = servers[N1].url.clone();
        let ingress = servers[INGRESS].url.clone();
        let client = Arc::new(Client::new());
        client.until_remote_replicas(&ingress, 2).await;
        let start = Instant::now();
        let stop = Arc::new(AtomicBool::new(false));
        let through_ingress =
            tokio::spawn(traffic(client.clone(), ingress.clone(), 4, 4, stop.clone()));
        let through_n1 = tokio::spawn(traffic(client.clone(), n1.clone(), 2, 2, stop.clone()));
        tokio::time::sleep(Duration::from_millis(1500)).await;

        let ports: Vec<u16> = etcd
            .endpoints()
            .iter()
            .map(|e| e.rsplit(':').next().unwrap().parse().unwrap())
            .collect();
        net.cut_from_hub_ports(N1, &ports);
        // n1's lease (TTL 2 s) expires: the others stop routing to it; n1 keeps serving on
        // its last view and reports not ready (unready_after_s: 2).
        eventually(
            Duration::from_secs(8),
            "n1 leaves the ingress's view",
            || {
                let (client, ingress) = (client.clone(), ingress.clone());
                async move { !sees_available(&client, &ingress, "n1").await.0 }
            },
        )
        .await;
        eventually(Duration::from_secs(8), "n1 not ready", || {
            let (client, n1) = (client.clone(), n1.clone());
            async move {
                let health = client.http.get(&n1, "/-/healthz", "").await.unwrap();
                health.status == 503 && health.body.contains("not_ready")
            }
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;

        // Back: n1 takes a new lease, writes its records again, and is routed to again.
        net.heal(N1);
        eventually(Duration::from_secs(15), "n1 ready again", || {
            let (client, n1) = (client.clone(), n1.clone());
            async move { client.http.get(&n1, "/-/healthz", "").await.unwrap().status == 200 }
        })
        .await;
        eventually(
            Duration::from_secs(10),
            "n1 back in the ingress's view",
            || {
                let (client, ingress) = (client.clone(), ingress.clone());
                async move { sees_available(&client, &ingress, "n1").await.1 }
            },
        )
        .await;
        let reply = client.get(&ingress, "fresh").await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        stop.store(true, Ordering::SeqCst);

        for (name, got) in [
            ("through the ingress", through_ingress.await.unwrap()),
            ("through n1", through_n1.await.unwrap()),
        ] {
            eprintln!(
                "cut from etcd, {name}: {} ok, {} failed, slowest {:?}",
                got.ok,
                got.failed.len(),
                got.slowest_after(start)
            );
            // Loads dominate: once n1 leaves the others' view, n2 takes its models too.
            assert!(got.ok > 20, "{name}: traffic flowed: {}", got.ok);
            assert!(
                got.failed.is_empty(),
                "{name}: nothing fails, every node stays reachable: {:?}",
                got.failed
            );
        }
    });
}
