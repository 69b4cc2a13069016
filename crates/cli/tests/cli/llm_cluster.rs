//! `kind: llm` in a cluster: a conversation stored by one node's Responses API continues
//! through another node, and is a clear 404 once its node is gone.

use std::time::Duration;

use crate::cluster_common::{self, Client};
use crate::common::{self, Running};
use crate::llm::{env, llm_config, run_client};
use serde_json::Value;
use tokio::time::Instant;

/// The LLM application on a node of the cluster `etcd` runs (role `both`: it routes requests
/// to any node's replicas and runs its own).
fn llm_node(etcd: &modelmux_cluster::LocalEtcd, id: &str) -> Running {
    let config = format!(
        "{}cluster:\n  name: test\n  lease_ttl_s: 2\n  unready_after_s: 2\n",
        llm_config(&env("MODELMUX_TEST_ADAPTERS"), "")
    );
    let cluster = etcd.cluster_url();
    common::serve_with(
        &cluster_common::for_etcd(&config, etcd),
        &["--cluster", &cluster, "--node-id", id],
    )
}

/// The available replicas of other nodes `url`'s `/-/models` lists, over all deployments.
async fn remote_available(client: &Client, url: &str) -> usize {
    let models = client.json(url, "/-/models").await;
    let replicas = models["applications"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|a| a["deployments"].as_array().into_iter().flatten())
        .flat_map(|d| d["replicas"].as_array().into_iter().flatten());
    replicas
        .filter(|r| r["remote"] == true && r["available"] == true)
        .count()
}

/// Waits (bounded) until `url` sees `n` available replicas on other nodes.
async fn until_remote_available(client: &Client, url: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let seen = remote_available(client, url).await;
        if seen == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{url} sees {seen} available remote replicas, not {n}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stored_conversation_continues_through_another_node_and_is_a_404_once_its_node_is_gone() {
    let etcd = cluster_common::etcd(1).await;
    let mut nodes: Vec<Running> = ["n1", "n2"].iter().map(|id| llm_node(&etcd, id)).collect();
    let client = Client::new();
    // Each node runs the LLM replica and the API's ingress replica: it sees the other's two.
    for node in &nodes {
        until_remote_available(&client, &node.url, 2).await;
    }
    let args: Vec<String> = ["n1", "n2"]
        .iter()
        .zip(&nodes)
        .map(|(id, node)| format!("{id}={}", node.url))
        .collect();
    let out = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_client("responses_cluster_client.py", args[0], &args[1..])
    });
    let out = out.await.unwrap();
    assert!(
        out.status.success(),
        "the client's checks failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let owner = printed["owner"].as_str().unwrap();
    let stored = printed["stored"].as_str().unwrap().to_owned();

    // The owner goes: its conversation cannot go on, and the survivor says why.
    let at = usize::from(owner == "n2");
    nodes[at].terminate();
    let survivor = &nodes[1 - at];
    until_remote_available(&client, &survivor.url, 0).await;
    let body = serde_json::json!({
        "model": "smollm2:pirate",
        "input": "Repeat my name and my city.",
        "previous_response_id": stored,
        "max_output_tokens": 4,
    });
    let request = http::Request::post("/v1/responses").header("content-type", "application/json");
    let (status, _, answer) =
        common::send_async(&survivor.url, request, body.to_string().into_bytes()).await;
    let answer = String::from_utf8_lossy(&answer);
    assert_eq!(status, 404, "{answer}");
    let error: Value = serde_json::from_str(&answer).unwrap();
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("previous_response_id") && message.contains(&format!("node '{owner}'")),
        "{message}"
    );
    // As is reading it.
    let request = http::Request::get(format!("/v1/responses/{stored}"));
    let (status, _, answer) = common::send_async(&survivor.url, request, Vec::new()).await;
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&answer));
}
