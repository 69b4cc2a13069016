//! Cluster mode end to end: real etcd members (Debian's `etcd-server`, started on free loopback
//! ports) and real `modelmux serve` processes as nodes and router-only ingresses.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::Running;
use http_body_util::BodyExt;
use modelmux_cluster::LocalEtcd;
use serde_json::Value;
use tokio::time::Instant;

/// One deployment of synthetic models; `infer_ms` per request, 200 ms loads, 2 models per
/// replica.
fn config(infer_ms: u64) -> String {
    format!(
        r"
http_options:
  host: 127.0.0.1
  port: 0
  drain_grace_period_s: 0.5
cluster:
  name: test
  lease_ttl_s: 2
  unready_after_s: 2
applications:
  - name: default
    route_prefix: /
    deployments:
      - name: Model
        num_replicas: 1
        max_ongoing_requests: 8
        max_models_per_replica: 2
        model:
          kind: synthetic
          load_ms: 200
          size_mb: 1
          infer_ms: {infer_ms}
"
    )
}

fn node(etcd: &LocalEtcd, id: &str, role: &str, infer_ms: u64) -> Running {
    let cluster = etcd.cluster_url();
    common::serve_with(
        &config(infer_ms),
        &["--cluster", &cluster, "--node-id", id, "--role", role],
    )
}

/// A client on its own runtime threads for a test's traffic.
struct Client {
    http: wire::Http,
}

mod wire {
    //! A small HTTP/1.1 client over hyper: a new connection per request, so a killed server
    //! shows up as a failed request, never as a stale pooled connection.
    use super::*;

    #[derive(Clone, Default)]
    pub(crate) struct Http;

    impl Http {
        pub(crate) async fn get(
            &self,
            url: &str,
            path: &str,
            model: &str,
        ) -> Result<Reply, String> {
            let addr = url.trim_start_matches("http://").to_string();
            let stream = tokio::net::TcpStream::connect(&addr)
                .await
                .map_err(|e| e.to_string())?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                    .await
                    .map_err(|e| e.to_string())?;
            tokio::spawn(conn);
            let mut request = hyper::Request::builder().uri(path).header("host", &addr);
            if !model.is_empty() {
                request = request.header("serve_multiplexed_model_id", model);
            }
            let request = request
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap();
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status().as_u16();
            let replica = response
                .headers()
                .get("x-modelmux-replica")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok(Reply {
                status,
                replica,
                body: String::from_utf8_lossy(&body).into_owned(),
            })
        }
    }

    pub(crate) struct Reply {
        pub(crate) status: u16,
        pub(crate) replica: String,
        pub(crate) body: String,
    }
}

impl Client {
    fn new() -> Self {
        Self { http: wire::Http }
    }

    async fn get(&self, url: &str, model: &str) -> wire::Reply {
        self.http
            .get(url, "/", model)
            .await
            .unwrap_or_else(|e| panic!("GET {url} for {model}: {e}"))
    }

    async fn json(&self, url: &str, path: &str) -> Value {
        let reply = self.http.get(url, path, "").await.unwrap();
        serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("{path}: {e}: {}", reply.body))
    }

    /// Every replica's loaded models, from a node's `/-/models` (`remote: false` entries: the
    /// node's own replicas).
    async fn local_models(&self, url: &str) -> Vec<(String, Vec<String>)> {
        let models = self.json(url, "/-/models").await;
        let mut out = Vec::new();
        for app in models["applications"].as_array().unwrap() {
            for d in app["deployments"].as_array().unwrap() {
                for r in d["replicas"].as_array().unwrap() {
                    if r["remote"].as_bool() == Some(true) {
                        continue;
                    }
                    let loaded = r["loaded"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|m| m["id"].as_str().unwrap().to_string())
                        .collect();
                    out.push((r["id"].as_str().unwrap().to_string(), loaded));
                }
            }
        }
        out
    }

    /// Model loads a node started (its `/metrics`).
    async fn loads(&self, url: &str) -> u64 {
        let reply = self.http.get(url, "/metrics", "").await.unwrap();
        reply
            .body
            .lines()
            .filter(|l| l.starts_with("modelmux_model_loads_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Waits until `url`'s `/-/models` lists `n` remote replicas that are available.
    async fn until_remote_replicas(&self, url: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let models = self.json(url, "/-/models").await;
            let available = models["applications"][0]["deployments"][0]["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["remote"].as_bool() == Some(true) && r["available"] == true)
                .count();
            if available == n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{url} sees {available} remote replicas, not {n}: {models}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_model_is_loaded_once_cluster_wide_and_then_served_by_its_holder() {
    let etcd = LocalEtcd::start(1).await.unwrap();
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
    assert!(metrics.contains("node=\"n1\""), "{metrics}");
}

/// Requests from `clients` concurrent loops through `url` for models `m0..m{models}` until
/// `stop`: (succeeded, failed with their error types).
async fn traffic(
    client: Arc<Client>,
    url: String,
    clients: usize,
    models: usize,
    stop: Arc<AtomicBool>,
) -> (usize, Vec<String>) {
    let ok = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut loops = Vec::new();
    for c in 0..clients {
        let (client, url, stop, ok, failed) = (
            client.clone(),
            url.clone(),
            stop.clone(),
            ok.clone(),
            failed.clone(),
        );
        loops.push(tokio::spawn(async move {
            let mut i = c;
            while !stop.load(Ordering::SeqCst) {
                let model = format!("m{}", i % models);
                i += 1;
                match client.http.get(&url, "/", &model).await {
                    Ok(r) if r.status == 200 => {
                        ok.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(r) => {
                        let kind = serde_json::from_str::<Value>(&r.body)
                            .ok()
                            .and_then(|v| v["error"]["type"].as_str().map(String::from))
                            .unwrap_or_else(|| format!("status {}", r.status));
                        failed.lock().push(kind);
                    }
                    Err(e) => failed.lock().push(format!("client error: {e}")),
                }
            }
        }));
    }
    for l in loops {
        l.await.unwrap();
    }
    let failed = failed.lock().clone();
    (ok.load(Ordering::SeqCst), failed)
}

/// Two nodes and an ingress under steady traffic; `disrupt` runs mid-traffic. Returns what
/// the traffic got.
async fn under_traffic<F>(etcd: &mut LocalEtcd, disrupt: F) -> (usize, Vec<String>)
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
    disrupt(etcd, &mut nodes);
    tokio::time::sleep(Duration::from_millis(3000)).await;
    stop.store(true, Ordering::SeqCst);
    load.await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigtermed_node_drains_and_loses_no_request() {
    let mut etcd = LocalEtcd::start(1).await.unwrap();
    let (ok, failed) = under_traffic(&mut etcd, |_, nodes| nodes[0].signal_term()).await;
    assert!(ok > 100, "traffic flowed: {ok}");
    assert!(
        failed.is_empty(),
        "{} of {} failed: {failed:?}",
        failed.len(),
        ok + failed.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sigkilled_node_costs_only_its_requests_in_flight() {
    let mut etcd = LocalEtcd::start(1).await.unwrap();
    let (ok, failed) = under_traffic(&mut etcd, |_, nodes| {
        let _ = nodes[0].child.kill();
    })
    .await;
    assert!(ok > 100, "traffic flowed: {ok}");
    // Only requests already sent to the killed node fail (a 502 each): at most one per client
    // loop, since each has one request in flight. None that was not yet sent is lost: a node
    // that cannot be reached is passed over and the request goes to the other.
    assert!(failed.len() <= 6, "{failed:?}");
    assert!(
        failed.iter().all(|f| f == "forward_failed"),
        "only requests in flight fail: {failed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_etcd_leader_loses_no_request() {
    let mut etcd = LocalEtcd::start(3).await.unwrap();
    let (ok, failed) = under_traffic(&mut etcd, |etcd, _| {
        let rt = tokio::runtime::Handle::current();
        let leader = std::thread::scope(|s| s.spawn(|| rt.block_on(etcd.leader())).join().unwrap())
            .expect("a leader");
        etcd.kill(leader);
    })
    .await;
    assert!(ok > 100, "traffic flowed: {ok}");
    assert!(failed.is_empty(), "{failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_cut_off_from_etcd_keeps_serving_and_reports_not_ready() {
    let mut etcd = LocalEtcd::start(1).await.unwrap();
    let n = node(&etcd, "n1", "both", 1);
    let client = Client::new();
    assert_eq!(client.get(&n.url, "a").await.status, 200);
    let health = client.http.get(&n.url, "/-/healthz", "").await.unwrap();
    assert_eq!(health.status, 200, "{}", health.body);
    etcd.kill(0);
    let cut_off = Instant::now();
    // Serving goes on, on the last view.
    let mut not_ready = None;
    while cut_off.elapsed() < Duration::from_secs(6) {
        let reply = client.get(&n.url, "a").await;
        assert_eq!(reply.status, 200, "{}", reply.body);
        let health = client.http.get(&n.url, "/-/healthz", "").await.unwrap();
        if health.status == 503 && not_ready.is_none() {
            assert!(health.body.contains("not_ready"), "{}", health.body);
            not_ready = Some(cut_off.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = not_ready.expect("reported not ready");
    assert!(
        after >= Duration::from_millis(1500) && after < Duration::from_secs(5),
        "not ready after {after:?} (unready_after_s: 2)"
    );
}
