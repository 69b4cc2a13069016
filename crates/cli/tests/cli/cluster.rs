//! Cluster mode end to end: real etcd members (Debian's `etcd-server`, started on free loopback
//! ports) and real `modelmux` node processes as nodes and router-only ingresses. The suite runs
//! these tests twice: over a plain etcd, and (`MODELMUX_TEST_ETCD_SECURE=1`) over one with TLS,
//! client certificates and auth, as a cluster's etcd should be run.

use crate::cluster_common;
use crate::common;

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cluster_common::{Client, Traffic, node, traffic};
use common::Running;
use modelmux_cluster::LocalEtcd;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_model_is_loaded_once_cluster_wide_and_then_served_by_its_holder() {
    let etcd = cluster_common::etcd(1).await;
    let nodes = [node(&etcd, "n1", "node", 5), node(&etcd, "n2", "node", 5)];
    let ingresses = [
        node(&etcd, "in1", "ingress", 5),
        node(&etcd, "in2", "ingress", 5),
    ];
    let client = Arc::new(Client::new());
    for i in &ingresses {
        client.until_remote_replicas(&i.url, 2).await;
    }

    // 100 concurrent first requests for one model, half through each ingress: one load.
    let mut burst = Vec::new();
    for k in 0..100 {
        let url = ingresses[k % 2].url.clone();
        let client = client.clone();
        burst.push(tokio::spawn(async move { client.get(&url, "hot").await }));
    }
    let mut served_by = HashMap::new();
    for reply in burst {
        let reply = reply.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
        *served_by.entry(reply.replica).or_insert(0) += 1;
    }
    let mut loads = 0;
    for n in &nodes {
        loads += client.loads(&n.url).await;
    }
    assert_eq!(loads, 1, "one load cluster-wide; served by {served_by:?}");
    assert_eq!(served_by.len(), 1, "all from the holder: {served_by:?}");

    // Later requests through either ingress go to the holder, and cost no load.
    let holder = served_by.keys().next().unwrap().clone();
    for k in 0..20 {
        let reply = client.get(&ingresses[k % 2].url, "hot").await;
        assert_eq!(
            (reply.status, reply.replica.as_str()),
            (200, holder.as_str())
        );
    }

    // Distinct models: each replica holds at most its cap, and the models spread.
    for m in 0..6 {
        let reply = client.get(&ingresses[m % 2].url, &format!("m{m}")).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
    }
    let mut total = 0;
    for n in &nodes {
        for (replica, loaded) in client.local_models(&n.url).await {
            assert!(
                loaded.len() <= 2,
                "{replica} holds {loaded:?}, over its cap of 2"
            );
            total += loaded.len();
        }
    }
    assert_eq!(total, 4, "both replicas full");
    let mut loads = 0;
    for n in &nodes {
        loads += client.loads(&n.url).await;
    }
    assert_eq!(loads, 7, "one load per model");

    // Cluster-wide status: an ingress lists every node's replicas and what they hold.
    let models = client.json(&ingresses[0].url, "/-/models").await;
    let replicas = models["applications"][0]["deployments"][0]["replicas"]
        .as_array()
        .unwrap();
    let nodes_seen: Vec<&str> = replicas.iter().filter_map(|r| r["node"].as_str()).collect();
    assert!(
        nodes_seen.contains(&"n1") && nodes_seen.contains(&"n2"),
        "{models}"
    );
    // Metrics carry the node.
    let metrics = client
        .http
        .get(&nodes[0].url, "/metrics", "")
        .await
        .unwrap()
        .body;
    let page = modelmux_promtext::parse(&metrics).unwrap();
    let series: Vec<_> = page.samples("modelmux_replica_ongoing_requests").collect();
    assert!(!series.is_empty(), "{metrics}");
    assert!(
        series.iter().all(|s| s.label("node") == Some("n1")),
        "{metrics}"
    );

    // `modelmux status` through an ingress: a row per replica, each node's.
    let status = std::process::Command::new(common::BIN)
        .args(["status", "--url", &ingresses[0].url])
        .env("MODELMUX_RUNTIME_DIR", common::runtime_dir())
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&status.stdout);
    for node in ["n1", "n2"] {
        assert!(
            table
                .lines()
                .any(|l| l.split_whitespace().nth(3) == Some(node)),
            "{table}"
        );
    }

    // `modelmux bench` through an ingress reads the loads where they happen: on the nodes.
    let out = std::process::Command::new(common::BIN)
        .args([
            "bench",
            "--url",
            &ingresses[0].url,
            "--json",
            "--duration",
            "3",
        ])
        .args(["--concurrency", "2", "--models", "3", "--model-prefix", "b"])
        .args([
            "--metrics-url",
            &nodes[0].url,
            "--metrics-url",
            &nodes[1].url,
        ])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    // Three new models on full replicas: at least three loads (the ingress itself has none).
    // Three seconds, not less: the models are drawn at random (seeded), and the first few
    // requests may name only two of them.
    let loads = report["server"]["loads"].as_f64().unwrap_or_default();
    assert!(loads >= 3.0, "{report}");
}

/// What a run under traffic got: the traffic, the two nodes as the disruption left them, and
/// when the disruption came.
struct Disrupted {
    traffic: Traffic,
    nodes: Vec<Running>,
    at: Instant,
}

/// Two nodes and an ingress under steady traffic; `disrupt` runs mid-traffic.
async fn under_traffic<F>(etcd: &mut LocalEtcd, disrupt: F) -> Disrupted
where
    F: FnOnce(&mut LocalEtcd, &mut [Running]),
{
    let mut nodes = vec![node(etcd, "n1", "both", 20), node(etcd, "n2", "both", 20)];
    let ingress = node(etcd, "in", "ingress", 20);
    let client = Arc::new(Client::new());
    client.until_remote_replicas(&ingress.url, 2).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(traffic(
        client.clone(),
        ingress.url.clone(),
        6,
        3,
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let at = Instant::now();
    disrupt(etcd, &mut nodes);
    tokio::time::sleep(Duration::from_millis(3000)).await;
    stop.store(true, Ordering::SeqCst);
    Disrupted {
        traffic: load.await.unwrap(),
        nodes,
        at,
    }
}

/// Asserts that node `n1` (`nodes[0]`) is running: it has not exited.
fn assert_running(nodes: &mut [Running]) {
    let exited = nodes[0].child.try_wait().unwrap();
    assert!(exited.is_none(), "n1 exited before the signal: {exited:?}");
}

/// Waits (at most 20 s: 40 times its drain grace) for node `n1` to exit.
fn exit_of(n1: &mut Running) -> ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(exit) = n1.child.try_wait().unwrap() {
            return exit;
        }
        assert!(Instant::now() < deadline, "n1 did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigtermed_node_drains_and_loses_no_request() {
    let mut etcd = cluster_common::etcd(1).await;
    let Disrupted {
        traffic,
        mut nodes,
        at,
    } = under_traffic(&mut etcd, |_, nodes| {
        assert_running(nodes);
        nodes[0].signal_term();
    })
    .await;
    let Traffic { ok, failed, .. } = &traffic;
    assert!(*ok > 100, "traffic flowed: {ok}");
    // n1 carried traffic when it was told to stop, so losing none is not vacuous.
    let on_n1 = traffic.served_by_before("n1", at);
    assert!(on_n1 > 0, "n1 served none of {ok} requests before SIGTERM");
    assert!(
        failed.is_empty(),
        "{} of {} failed: {failed:?}",
        failed.len(),
        ok + failed.len()
    );
    // It stopped, cleanly.
    let exit = exit_of(&mut nodes[0]);
    assert!(exit.success(), "n1 after SIGTERM: {exit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigkilled_node_costs_only_its_requests_in_flight() {
    let mut etcd = cluster_common::etcd(1).await;
    let Disrupted {
        traffic,
        mut nodes,
        at,
    } = under_traffic(&mut etcd, |_, nodes| {
        assert_running(nodes);
        nodes[0].child.kill().unwrap();
    })
    .await;
    let Traffic { ok, failed, .. } = &traffic;
    assert!(*ok > 100, "traffic flowed: {ok}");
    // n1 carried traffic when it was killed: it had requests to lose.
    let on_n1 = traffic.served_by_before("n1", at);
    assert!(on_n1 > 0, "n1 served none of {ok} requests before SIGKILL");
    // Only requests already sent to the killed node fail (a 502 each): at most one per client
    // loop, since each has one request in flight. None that was not yet sent is lost: a node
    // that cannot be reached is passed over and the request goes to the other.
    assert!(failed.len() <= 6, "{failed:?}");
    assert!(
        failed.iter().all(|f| f == "forward_failed"),
        "only requests in flight fail: {failed:?}"
    );
    // It was the kill that ended it.
    let exit = exit_of(&mut nodes[0]);
    assert_eq!(exit.signal(), Some(9), "n1 after SIGKILL: {exit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_etcd_leader_loses_no_request() {
    let mut etcd = cluster_common::etcd(3).await;
    let Disrupted { traffic, .. } = under_traffic(&mut etcd, |etcd, _| {
        let rt = tokio::runtime::Handle::current();
        let leader = std::thread::scope(|s| s.spawn(|| rt.block_on(etcd.leader())).join().unwrap())
            .expect("a leader");
        etcd.kill(leader);
    })
    .await;
    let Traffic { ok, failed, .. } = traffic;
    assert!(ok > 100, "traffic flowed: {ok}");
    assert!(failed.is_empty(), "{failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_cut_off_from_etcd_keeps_serving_and_reports_not_ready() {
    let mut etcd = cluster_common::etcd(1).await;
    let n = node(&etcd, "n1", "both", 1);
    let client = Client::new();
    assert_eq!(client.get(&n.url, "a").await.status, 200);
    let health = client.http.get(&n.url, "/-/healthz", "").await.unwrap();
    assert_eq!(health.status, 200, "{}", health.body);
    etcd.kill(0);
    // Still ready right after: etcd answered within the last `unready_after_s` (2 s; its
    // lease is kept alive every 2/3 s).
    let health = client.http.get(&n.url, "/-/healthz", "").await.unwrap();
    assert_eq!(health.status, 200, "{}", health.body);
    // Serving goes on, on the last view, before and after it reports not ready; it reports
    // not ready within 20 s (10 times `unready_after_s`).
    let cut_off = Instant::now();
    let mut served_since_not_ready = None;
    while served_since_not_ready.is_none_or(|n| n < 5) {
        let reply = client.get(&n.url, "a").await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        if let Some(served) = &mut served_since_not_ready {
            *served += 1;
        } else {
            let health = client.http.get(&n.url, "/-/healthz", "").await.unwrap();
            if health.status == 503 {
                assert!(health.body.contains("not_ready"), "{}", health.body);
                served_since_not_ready = Some(0);
            } else {
                assert_eq!(health.status, 200, "{}", health.body);
                assert!(
                    cut_off.elapsed() < Duration::from_secs(20),
                    "still ready 20 s after etcd went (unready_after_s: 2)"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_of_role_node_and_a_forwarded_request_use_local_replicas_only() {
    let etcd = cluster_common::etcd(1).await;
    // n2 routes over every node's replicas; n1, role `node`, over its own only. n2 is
    // published before n1 joins.
    let n2 = node(&etcd, "n2", "both", 5);
    let n1 = node(&etcd, "n1", "node", 5);
    let ingress = node(&etcd, "in", "ingress", 5);
    let client = Client::new();
    client.until_remote_replicas(&n2.url, 1).await;
    client.until_remote_replicas(&ingress.url, 2).await;

    // Six models through n1, two per replica: a router over both nodes would place some on n2.
    let mut n1_replica = String::new();
    for m in 0..6 {
        let reply = client.get(&n1.url, &format!("m{m}")).await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert!(reply.replica.ends_with("@n1"), "m{m} on {}", reply.replica);
        n1_replica = reply.replica;
    }
    assert_eq!(client.loads(&n2.url).await, 0, "n2 loaded nothing");
    assert_eq!(client.loads(&n1.url).await, 6);
    let models = client.json(&n1.url, "/-/models").await;
    let replicas = models["applications"][0]["deployments"][0]["replicas"]
        .as_array()
        .unwrap();
    assert!(
        replicas.iter().all(|r| r["remote"].as_bool() != Some(true)),
        "n1 lists other nodes' replicas: {models}"
    );

    // A request another node forwarded to n2, naming n1's replica: n2 serves it with its own
    // replica, never forwards it again.
    let forwarded = [("x-modelmux-forwarded", n1_replica.as_str())];
    for m in 0..4 {
        let model = format!("f{m}");
        let reply = client.http.get_with(&n2.url, "/", &model, &forwarded).await;
        let reply = reply.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert!(
            reply.replica.ends_with("@n2"),
            "{model} on {}",
            reply.replica
        );
    }
    assert_eq!(client.loads(&n1.url).await, 6, "n1 loaded nothing more");
    // The same without the header is routed over both nodes: a model n1 holds goes there
    // (once n2 has heard through etcd that n1 holds it).
    client.until_remote_holds(&n2.url, "m5").await;
    let reply = client.get(&n2.url, "m5").await;
    assert_eq!(
        (reply.status, reply.replica.as_str()),
        (200, n1_replica.as_str())
    );

    // A router-only node has no replica of its own: a forwarded request is turned away, for
    // the node that forwarded it to try another.
    let reply = client
        .http
        .get_with(&ingress.url, "/", "m0", &forwarded)
        .await;
    let reply = reply.unwrap();
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert!(
        reply.headers.contains_key("x-modelmux-not-here"),
        "{:?}",
        reply.headers
    );
    assert!(reply.body.contains("not_here"), "{}", reply.body);
    let requests = client.requests(&n1.url).await + client.requests(&n2.url).await;
    assert_eq!(requests, 6 + 4 + 1, "no node got the turned-away request");
}

/// The revision of the cluster's keys in etcd: it grows by one per write.
async fn revision(etcd: &LocalEtcd) -> i64 {
    let client = cluster_common::etcd_client(etcd).await;
    let reply = client.get_prefix("modelmux/test/").await.unwrap();
    reply.header.map_or(0, |h| h.revision)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_unknown_model_ids_writes_nothing_to_etcd_per_id() {
    // Every load fails, 50 ms in (an unknown model, answered by a remote repository).
    let config = cluster_common::config("127.0.0.1", 1)
        .replace("infer_ms: 1", "infer_ms: 1\n          fail_rate: 1.0");
    let etcd = cluster_common::etcd(1).await;
    let config = cluster_common::for_etcd(&config.replace("load_ms: 200", "load_ms: 50"), &etcd);
    let cluster = etcd.cluster_url();
    let n1 = common::serve_with(
        &config,
        &["--cluster", &cluster, "--node-id", "n1", "--role", "both"],
    );
    let client = Arc::new(Client::new());
    // Settled: its record written, its first load report in.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = revision(&etcd).await;
    let started = Instant::now();
    let mut flood = Vec::new();
    for worker in 0..4 {
        let (client, url) = (client.clone(), n1.url.clone());
        flood.push(tokio::spawn(async move {
            for i in 0..25 {
                let reply = client.get(&url, &format!("unknown-{worker}-{i}")).await;
                assert!(reply.status >= 500, "{}: {}", reply.status, reply.body);
            }
        }));
    }
    for worker in flood {
        worker.await.unwrap();
    }
    let writes = revision(&etcd).await - before;
    // The node's record may be written once a second with its load figures; a copy key
    // per id (a put and a delete each) would be 200 writes.
    let bound = started.elapsed().as_secs() as i64 + 3;
    assert!(
        writes <= bound,
        "100 unknown ids cost {writes} etcd writes in {:?} (at most {bound})",
        started.elapsed()
    );
    drop(n1);
}
