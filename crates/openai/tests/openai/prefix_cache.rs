//! The prefix cache over HTTP: `cache_salt` (vLLM's) keeps tenants' prefixes apart, a bad
//! salt is a 400 naming it, `reset_prefix_cache` is an admin control, and the hits show in
//! `/metrics` under vLLM's names.

use crate::common;

use common::*;
use serde_json::json;

/// A completion of a long prompt (well over two 16-token blocks) with `salt`.
async fn complete(addr: std::net::SocketAddr, salt: Option<&str>) -> Reply {
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(8);
    let mut body = json!({"model": "smollm2", "prompt": prompt, "max_tokens": 2});
    if let Some(salt) = salt {
        body["cache_salt"] = json!(salt);
    }
    post(addr, "/v1/completions", body).await
}

async fn hits(addr: std::net::SocketAddr) -> f64 {
    metric(&metrics(addr).await, "vllm:prefix_cache_hits_total")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_salts_keep_tenants_apart_and_the_cache_can_be_reset() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    assert_eq!(complete(addr, Some("tenant-a")).await.status, 200);
    assert_eq!(hits(addr).await, 0.0);
    assert_eq!(complete(addr, Some("tenant-b")).await.status, 200);
    assert_eq!(complete(addr, None).await.status, 200);
    assert_eq!(hits(addr).await, 0.0, "other salts share nothing");
    assert_eq!(complete(addr, Some("tenant-a")).await.status, 200);
    let shared = hits(addr).await;
    assert!(
        shared >= 32.0,
        "the same salt shares the prompt's blocks: {shared}"
    );
    assert!(metric(&metrics(addr).await, "modelmux_llm_prefix_cache_bytes") > 0.0);

    let reply = control(addr, "reset_prefix_cache").await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(
        metric(&metrics(addr).await, "modelmux_llm_prefix_cache_bytes"),
        0.0
    );
    assert_eq!(complete(addr, Some("tenant-a")).await.status, 200);
    assert_eq!(hits(addr).await, shared, "nothing cached after the reset");

    let reply = complete(addr, Some("")).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.json()["error"]["param"], "cache_salt");
}
