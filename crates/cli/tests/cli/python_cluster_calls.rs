//! Handle calls across the nodes of a cluster, end to end: two `modelmux serve` processes
//! joined through an etcd the test starts, real Python workers (MODELMUX_TEST_PYTHON, as in
//! `python.rs`), and `python_apps/cluster_calls.py`, whose ingress calls a multiplexed
//! deployment through `handle.options(multiplexed_model_id=...)` and answers with the replicas
//! that served it.
//!
//! With an admin token every node shares, a call from one node's ingress reaches the replica
//! holding its model on the other node, and nothing is loaded where the call began. Without
//! one, handle calls stay on their node (a call's arguments are a pickle: no node takes one
//! without the token). The call endpoint refuses a forged forwarded call.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::Running;
use common::{
    python_apps_dir as apps_dir, python_package_dir as package_dir, test_python as python,
};

const TOKEN: &str = "a-token-every-node-shares";

/// A node of the cluster: the server, and the file its replicas note their loads in.
struct Node {
    server: Running,
    loads: PathBuf,
    _dir: tempfile::TempDir,
}

impl Node {
    /// `modelmux serve` of `cluster_calls:app` as node `id` of the cluster at `etcd` (named
    /// `name`), with `token` as its admin token if any.
    async fn start(etcd: &str, name: &str, id: &str, token: Option<&str>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let loads = dir.path().join("loads.log");
        let token = token.map_or(String::new(), |t| format!(", admin_token: {t}"));
        let config = format!(
            "http_options: {{port: 0{token}}}\ncluster: {{name: {name}, lease_ttl_s: 2}}\n\
             applications:\n  - name: default\n    route_prefix: /\n    \
             import_path: cluster_calls:app\n    runtime_env: {{working_dir: {}}}\n",
            apps_dir().display()
        );
        let wrapper = [
            "env".to_string(),
            format!("MODELMUX_PYTHON={}", python()),
            format!("PYTHONPATH={}", package_dir().display()),
            format!("MODELMUX_TEST_LOAD_LOG={}", loads.display()),
        ];
        let args = ["--cluster", etcd, "--node-id", id, "--role", "both"].map(String::from);
        let server = tokio::task::spawn_blocking(move || {
            let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            common::serve_in(&wrapper, &config, &args)
        })
        .await
        .unwrap();
        Self {
            server,
            loads,
            _dir: dir,
        }
    }

    /// The loads its replicas made: `(replica, model)`.
    fn loads(&self) -> Vec<(String, String)> {
        std::fs::read_to_string(&self.loads)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(r, m)| (r.to_owned(), m.to_owned()))
            .collect()
    }
}

/// Sends `request` with `body` to `url` on a fresh connection: the status, the headers and the
/// body's bytes (a handle call's answer is a pickle, not text).
use common::send_async as send_bytes;

/// [`send_bytes`], the body as text.
async fn send(
    url: &str,
    request: http::request::Builder,
    body: Vec<u8>,
) -> (u16, http::HeaderMap, String) {
    let (status, headers, body) = send_bytes(url, request, body).await;
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// `GET /?model=<model>` through `node`'s own ingress replica: the forwarded header (naming no
/// replica) keeps it on that node, as if another node had routed it there.
async fn ask(node: &Node, model: &str) -> serde_json::Value {
    ask_at(node, "/", model).await
}

/// [`ask`] at `path`.
async fn ask_at(node: &Node, path: &str, model: &str) -> serde_json::Value {
    // Served by this node's own ingress replica: a request forwarded by a node of the cluster
    // (which proves it with the cluster's token, ignored by a cluster without one).
    let request = http::Request::get(format!("{path}?model={model}"))
        .header("x-modelmux-forwarded", "any-replica-of-this-node")
        .header("x-modelmux-peer-token", TOKEN);
    let (status, _, body) = send(&node.server.url, request, Vec::new()).await;
    assert_eq!(status, 200, "{body}");
    json(&body)
}

/// Loads `model` on `node`'s replica of `Holder` (through its admin API).
async fn load(node: &Node, model: &str, token: Option<&str>) -> String {
    let request = http::Request::post(format!("/-/models/Holder/{model}/load"))
        .header("content-type", "application/json");
    let request = with_token(node, request, token);
    let (status, _, body) = send(&node.server.url, request, Vec::new()).await;
    assert_eq!(status, 200, "{body}");
    json(&body)["replica"].as_str().unwrap().to_owned()
}

/// `request` with the cluster's `token`, or without one with the token `node` made for its
/// local users (which handle calls between nodes never carry).
fn with_token(
    node: &Node,
    request: http::request::Builder,
    token: Option<&str>,
) -> http::request::Builder {
    match token {
        Some(token) => request.header("authorization", format!("Bearer {token}")),
        None => common::as_local_admin(&node.server.url, request),
    }
}

/// `Holder`'s replicas as `node` sees them: `(id, remote, loaded models)`.
async fn holders(node: &Node, token: Option<&str>) -> Vec<(String, bool, Vec<String>)> {
    let request = with_token(node, http::Request::get("/-/models"), token);
    let (status, _, body) = send(&node.server.url, request, Vec::new()).await;
    assert_eq!(status, 200, "{body}");
    let models = json(&body);
    let mut found = Vec::new();
    for app in models["applications"].as_array().unwrap() {
        for deployment in app["deployments"].as_array().unwrap() {
            if deployment["name"] != "Holder" {
                continue;
            }
            for replica in deployment["replicas"].as_array().unwrap() {
                let loaded = replica["loaded"].as_array().unwrap().iter();
                found.push((
                    replica["id"].as_str().unwrap().to_owned(),
                    replica["remote"].as_bool().unwrap_or(false),
                    loaded
                        .map(|m| m["id"].as_str().unwrap().to_owned())
                        .collect(),
                ));
            }
        }
    }
    found
}

/// Waits (at most 20 s) until `node` sees `replica`, another node's, holding `model`.
async fn until_seen(node: &Node, replica: &str, model: &str, token: Option<&str>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let seen = holders(node, token).await;
        let held = seen.iter().any(|(id, remote, loaded)| {
            id == replica && *remote && loaded.iter().any(|m| m == model)
        });
        if held {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{replica} holding {model} never reached this node's view: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// This node's own `Holder` replicas that hold `model`.
async fn own_holders_of(node: &Node, model: &str, token: Option<&str>) -> Vec<String> {
    holders(node, token)
        .await
        .into_iter()
        .filter(|(_, remote, loaded)| !remote && loaded.iter().any(|m| m == model))
        .map(|(id, _, _)| id)
        .collect()
}

/// A handle call of `Holder` as another node forwards it: to the call endpoint, naming
/// `replica`, with `authorization` if any. The body is what a handle sends for `()`.
fn forwarded_call(
    replica: &str,
    model: &str,
    authorization: Option<&str>,
) -> http::request::Builder {
    let mut request = http::Request::post("/-/deployments/Holder/call/__call__?app=default")
        .header("x-modelmux-forwarded", replica)
        .header("serve_multiplexed_model_id", model)
        .header("content-type", "application/x-python-pickle");
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    request
}

/// `cloudpickle.dumps(((), {}))`: a call with no arguments.
const NO_ARGUMENTS: &[u8] = b"\x80\x05\x95\x06\x00\x00\x00\x00\x00\x00\x00)}\x94\x86\x94.";

/// The value a handle call returned, unpickled by the test's Python and printed as JSON.
fn unpickled(body: &[u8]) -> serde_json::Value {
    use std::io::Write;
    let mut child = std::process::Command::new(python())
        .args([
            "-c",
            "import json, pickle, sys; print(json.dumps(pickle.load(sys.stdin.buffer)))",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(body).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    json(&String::from_utf8_lossy(&output.stdout))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_shared_admin_token_a_handle_call_reaches_the_holder_on_another_node() {
    let etcd = modelmux_cluster::LocalEtcd::start(1).await.unwrap();
    let cluster = etcd.cluster_url();
    let a = Node::start(&cluster, "calls", "a", Some(TOKEN)).await;
    let b = Node::start(&cluster, "calls", "b", Some(TOKEN)).await;
    let token = Some(TOKEN);
    // Model m7 on a's replica only; b hears of it.
    let holder = load(&a, "m7", token).await;
    assert!(holder.ends_with("@a"), "{holder}");
    until_seen(&b, &holder, "m7", token).await;

    // Through b's ingress: b's ingress calls Holder, and a's replica answers.
    for _ in 0..3 {
        let answer = ask(&b, "m7").await;
        assert!(
            answer["ingress"].as_str().unwrap().ends_with("@b"),
            "{answer}"
        );
        assert_eq!(answer["holder"], holder.as_str(), "{answer}");
        assert_eq!(answer["model"], "m7", "{answer}");
    }
    // A stream=True call crosses nodes too, its items made by a's replica.
    let items = ask_at(&b, "/stream", "m7").await;
    let want: Vec<String> = (0..3).map(|i| format!("m7:{i}@{holder}")).collect();
    assert_eq!(items, serde_json::json!(want));
    // Loaded once, on a, by the admin API; never on b.
    assert_eq!(a.loads(), [(holder.clone(), "m7".to_owned())]);
    assert!(b.loads().is_empty(), "b loaded {:?}", b.loads());
    assert!(own_holders_of(&b, "m7", token).await.is_empty());

    // A forged forwarded call (no token, the wrong one, the token but not as a bearer token)
    // is refused before it runs.
    for authorization in [None, Some("Bearer not-the-token"), Some(TOKEN)] {
        let request = forwarded_call(&holder, "m7", authorization);
        let (status, _, body) = send(&a.server.url, request, NO_ARGUMENTS.to_vec()).await;
        assert_eq!(status, 401, "{authorization:?}: {body}");
    }
    assert_eq!(a.loads().len(), 1, "nothing ran");

    // A forwarded call is served where it lands, never sent on: naming a's replica to b
    // makes b serve it (and load m7 there), though a holds it.
    let authorization = format!("Bearer {TOKEN}");
    let request = forwarded_call(&holder, "m7", Some(&authorization));
    let (status, headers, body) = send_bytes(&b.server.url, request, NO_ARGUMENTS.to_vec()).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers["x-modelmux-result"], "value");
    let answer = unpickled(&body);
    assert!(
        answer["holder"].as_str().unwrap().ends_with("@b"),
        "{answer}"
    );
    assert_eq!(b.loads().len(), 1, "{:?}", b.loads());
    // Nodes with a token say nothing of handle calls staying home.
    for mut node in [a, b] {
        let (_, logs) = node.server.terminate();
        assert!(!logs.contains("handle calls stay on this node"), "{logs}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_admin_token_handle_calls_stay_on_their_node() {
    let etcd = modelmux_cluster::LocalEtcd::start(1).await.unwrap();
    let cluster = etcd.cluster_url();
    let a = Node::start(&cluster, "local-calls", "a", None).await;
    let b = Node::start(&cluster, "local-calls", "b", None).await;
    let holder = load(&a, "m7", None).await;
    // b sees a's replica holding m7, and still keeps its calls home.
    until_seen(&b, &holder, "m7", None).await;
    for _ in 0..3 {
        let answer = ask(&b, "m7").await;
        assert!(
            answer["ingress"].as_str().unwrap().ends_with("@b"),
            "{answer}"
        );
        let served = answer["holder"].as_str().unwrap();
        assert!(served.ends_with("@b"), "{answer}");
    }
    // Loaded on b for its calls; a's replica only ever had the admin API's load.
    let on_b = own_holders_of(&b, "m7", None).await;
    assert_eq!(on_b.len(), 1, "{on_b:?}");
    assert_eq!(b.loads(), [(on_b[0].clone(), "m7".to_owned())]);
    assert_eq!(a.loads(), [(holder.clone(), "m7".to_owned())]);

    // A node without a token takes no handle call from outside, forwarded or not.
    let request = forwarded_call(&holder, "m7", None);
    let (status, _, body) = send(&a.server.url, request, NO_ARGUMENTS.to_vec()).await;
    assert_eq!(status, 403, "{body}");
    // Each node said so once, at start.
    for mut node in [a, b] {
        let (_, logs) = node.server.terminate();
        let said = logs.matches("handle calls stay on this node").count();
        assert_eq!(said, 1, "{logs}");
    }
}
