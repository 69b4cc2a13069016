//! What the cluster tests share: the nodes' configuration, starting a node, and a client that
//! counts what traffic got.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::{self, Running};
use http_body_util::BodyExt;
use modelmux_cluster::LocalEtcd;
use serde_json::Value;
use tokio::time::Instant;

/// One deployment of synthetic models served on `host`; `infer_ms` per request, 200 ms loads,
/// 2 models per replica. Off loopback (the partition tests' namespaces, which only the test
/// reaches) the admin API is open on purpose.
pub fn config(host: &str, infer_ms: u64) -> String {
    let open_admin = host != "127.0.0.1";
    format!(
        r"
http_options:
  host: {host}
  port: 0
  drain_grace_period_s: 0.5
  allow_open_admin: {open_admin}
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

/// Whether this run's cluster tests use an etcd with TLS, client certificates and auth
/// (`MODELMUX_TEST_ETCD_SECURE=1`: the suite runs the cluster tests both ways).
fn secure_run() -> bool {
    std::env::var("MODELMUX_TEST_ETCD_SECURE").is_ok_and(|v| v == "1")
}

/// The cluster tests' etcd: `members` members, plain or (in a secure run) with TLS, client
/// certificates and auth, which the nodes then reach as its `modelmux` user.
pub async fn etcd(members: usize) -> LocalEtcd {
    let etcd = if secure_run() {
        LocalEtcd::start_secure(members).await
    } else {
        LocalEtcd::start(members).await
    };
    etcd.unwrap()
}

/// `config` with what a node needs to reach `etcd`: for a secure one, `cluster.etcd_tls` (the
/// CA, the client certificate and key) and `cluster.etcd_auth` (the user, the password's file).
pub fn for_etcd(config: &str, etcd: &LocalEtcd) -> String {
    let Some(secure) = etcd.secure() else {
        return config.to_string();
    };
    let cluster = format!(
        "cluster:\n  etcd_tls:\n    ca_file: {}\n    cert_file: {}\n    key_file: {}\n  etcd_auth:\n    username: modelmux\n    password_file: {}\n",
        secure.ca_file.display(),
        secure.cert_file.display(),
        secure.key_file.display(),
        secure.password_file.display(),
    );
    assert!(config.contains("\ncluster:\n"), "{config}");
    config.replacen("cluster:\n", &cluster, 1)
}

/// A client of `etcd`, connected as a node connects.
pub async fn etcd_client(etcd: &LocalEtcd) -> modelmux_cluster::EtcdClient {
    let security = match etcd.secure() {
        Some(secure) => modelmux_cluster::EtcdSecurity {
            tls: Some(secure.tls()),
            credentials: Some(secure.credentials()),
        },
        None => modelmux_cluster::EtcdSecurity::default(),
    };
    modelmux_cluster::connect_with(&etcd.endpoints(), &security)
        .await
        .unwrap()
}

/// A node on loopback.
pub fn node(etcd: &LocalEtcd, id: &str, role: &str, infer_ms: u64) -> Running {
    node_in(&[], "127.0.0.1", etcd, id, role, infer_ms)
}

/// A node on loopback whose loads take `load_ms` instead of 200 ms.
pub fn node_loading(
    etcd: &LocalEtcd,
    id: &str,
    role: &str,
    infer_ms: u64,
    load_ms: u64,
) -> Running {
    let config =
        config("127.0.0.1", infer_ms).replace("load_ms: 200", &format!("load_ms: {load_ms}"));
    let cluster = etcd.cluster_url();
    common::serve_in(
        &[],
        &for_etcd(&config, etcd),
        &["--cluster", &cluster, "--node-id", id, "--role", role],
    )
}

/// A node run by `wrapper` (`ip netns exec NS`), serving on `host`.
pub fn node_in(
    wrapper: &[&str],
    host: &str,
    etcd: &LocalEtcd,
    id: &str,
    role: &str,
    infer_ms: u64,
) -> Running {
    let cluster = etcd.cluster_url();
    common::serve_in(
        wrapper,
        &for_etcd(&config(host, infer_ms), etcd),
        &["--cluster", &cluster, "--node-id", id, "--role", role],
    )
}

/// A client for a test's traffic.
pub struct Client {
    pub http: wire::Http,
}

pub mod wire {
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
            self.get_with(url, path, model, &[]).await
        }

        /// A GET with extra `headers`.
        pub(crate) async fn get_with(
            &self,
            url: &str,
            path: &str,
            model: &str,
            headers: &[(&str, &str)],
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
            for (name, value) in headers {
                request = request.header(*name, *value);
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
            let headers = response.headers().clone();
            let body = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok(Reply {
                status,
                replica,
                headers,
                body: String::from_utf8_lossy(&body).into_owned(),
            })
        }
    }

    pub(crate) struct Reply {
        pub(crate) status: u16,
        /// Its `x-modelmux-replica`: the replica that served it.
        pub(crate) replica: String,
        pub(crate) headers: http::HeaderMap,
        pub(crate) body: String,
    }
}

impl Client {
    pub fn new() -> Self {
        Self { http: wire::Http }
    }

    pub async fn get(&self, url: &str, model: &str) -> wire::Reply {
        self.http
            .get(url, "/", model)
            .await
            .unwrap_or_else(|e| panic!("GET {url} for {model}: {e}"))
    }

    pub async fn json(&self, url: &str, path: &str) -> Value {
        // As a local user who can read the token file of a node started without a token.
        let bearer = common::admin_token(url).map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> = bearer
            .iter()
            .map(|b| ("authorization", b.as_str()))
            .collect();
        let reply = self.http.get_with(url, path, "", &headers).await.unwrap();
        serde_json::from_str(&reply.body).unwrap_or_else(|e| panic!("{path}: {e}: {}", reply.body))
    }

    /// Every replica's loaded models, from a node's `/-/models` (`remote: false` entries: the
    /// node's own replicas).
    pub async fn local_models(&self, url: &str) -> Vec<(String, Vec<String>)> {
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
    pub async fn loads(&self, url: &str) -> u64 {
        self.counter(url, "modelmux_model_loads_total").await
    }

    /// Requests a node's own replicas handled (its `/metrics`).
    pub async fn requests(&self, url: &str) -> u64 {
        self.counter(url, "modelmux_requests_total").await
    }

    /// The sum of a counter's samples in a node's `/metrics`.
    async fn counter(&self, url: &str, name: &str) -> u64 {
        let reply = self.http.get(url, "/metrics", "").await.unwrap();
        modelmux_promtext::parse(&reply.body).unwrap().sum(name) as u64
    }

    /// Waits (bounded) until the node at `url` sees, through etcd, a remote replica holding
    /// `model` (what its router places by).
    pub async fn until_remote_holds(&self, url: &str, model: &str) {
        self.until_remote(
            url,
            &format!("a remote replica holding {model}"),
            |remote| {
                remote
                    .iter()
                    .flat_map(|r| r["loaded"].as_array().into_iter().flatten())
                    .any(|m| m["id"] == model)
            },
        )
        .await
    }

    /// Waits until `url`'s `/-/models` lists `n` remote replicas that are available.
    pub async fn until_remote_replicas(&self, url: &str, n: usize) {
        self.until_remote(url, &format!("{n} available remote replicas"), |remote| {
            remote.iter().filter(|r| r["available"] == true).count() == n
        })
        .await
    }

    /// Waits (bounded) until `check` accepts the remote replicas `url`'s `/-/models` lists.
    async fn until_remote(&self, url: &str, what: &str, check: impl Fn(&[&Value]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let models = self.json(url, "/-/models").await;
            let remote: Vec<&Value> = models["applications"][0]["deployments"][0]["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|r| r["remote"].as_bool() == Some(true))
                .collect();
            if check(&remote) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{url} does not see {what}: {models}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// What a stretch of traffic got.
pub struct Traffic {
    /// Requests answered 200.
    pub ok: usize,
    /// The others: their error types (or the client's error).
    pub failed: Vec<String>,
    /// Each request's start and how long it took.
    pub timings: Vec<(Instant, Duration)>,
    /// Each request answered 200: its start and the replica that served it.
    pub served: Vec<(Instant, String)>,
}

impl Traffic {
    /// How many requests started before `before` were served by a replica of `node`.
    pub fn served_by_before(&self, node: &str, before: Instant) -> usize {
        let suffix = format!("@{node}");
        self.served
            .iter()
            .filter(|(start, replica)| *start < before && replica.ends_with(&suffix))
            .count()
    }

    /// The longest a request started after `after` took.
    pub fn slowest_after(&self, after: Instant) -> Duration {
        self.timings
            .iter()
            .filter(|(start, _)| *start >= after)
            .map(|(_, took)| *took)
            .max()
            .unwrap_or_default()
    }
}

/// Requests from `clients` concurrent loops through `url` for models `m0..m{models}` until
/// `stop`.
pub async fn traffic(
    client: Arc<Client>,
    url: String,
    clients: usize,
    models: usize,
    stop: Arc<AtomicBool>,
) -> Traffic {
    let ok = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let timings = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let served = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut loops = Vec::new();
    for c in 0..clients {
        let (client, url, stop, ok, failed, timings, served) = (
            client.clone(),
            url.clone(),
            stop.clone(),
            ok.clone(),
            failed.clone(),
            timings.clone(),
            served.clone(),
        );
        loops.push(tokio::spawn(async move {
            let mut i = c;
            while !stop.load(Ordering::SeqCst) {
                let model = format!("m{}", i % models);
                i += 1;
                let start = Instant::now();
                let reply = client.http.get(&url, "/", &model).await;
                timings.lock().push((start, start.elapsed()));
                match reply {
                    Ok(r) if r.status == 200 => {
                        ok.fetch_add(1, Ordering::SeqCst);
                        served.lock().push((start, r.replica));
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
    let timings = timings.lock().clone();
    let served = served.lock().clone();
    Traffic {
        ok: ok.load(Ordering::SeqCst),
        failed,
        timings,
        served,
    }
}
