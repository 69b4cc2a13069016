//! An idle LLM replica sleeps (`experimental_configs.sleep_after_idle_s`): its weights are
//! released once it has had nothing to do for that long, scrapes of `/metrics` and health
//! probes leave it asleep, and the next requests (a burst) wake it and are answered as before.

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use crate::common::*;

/// Whether every replica is asleep (Ray's `is_sleeping`, a control: not a request).
async fn asleep(addr: std::net::SocketAddr) -> bool {
    let answer = control(addr, "is_sleeping").await.json();
    let replicas = answer["replicas"].as_object().unwrap().clone();
    assert!(!replicas.is_empty(), "{answer}");
    replicas.values().all(|r| r["asleep"] == true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_replica_sleeps_and_requests_wake_it_but_scrapes_and_probes_do_not() {
    let config = config(json!({"experimental_configs": {"sleep_after_idle_s": 1.0}}));
    let server = serve(&config, 1).await;
    let addr = server.local_addr();
    let first = post(
        addr,
        "/v1/chat/completions",
        chat("smollm2", "Hi", 4, false),
    )
    .await;
    assert_eq!(first.status, 200);
    assert!(!asleep(addr).await, "busy a moment ago");

    let start = Instant::now();
    while !asleep(addr).await {
        assert!(start.elapsed() < Duration::from_secs(10), "never slept");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        start.elapsed() >= Duration::from_millis(500),
        "slept before its idle time"
    );

    for _ in 0..3 {
        assert!(metrics(addr).await.contains("vllm:"));
        assert_eq!(get(addr, "/-/healthz").await.status, 200);
        assert_eq!(get(addr, "/v1/models").await.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(asleep(addr).await, "a scrape or a probe woke it");

    // A burst: every request answered, with the same weights' answer.
    let burst: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(async move {
                post(
                    addr,
                    "/v1/chat/completions",
                    chat("smollm2", "Hi", 4, false),
                )
                .await
            })
        })
        .collect();
    for b in burst {
        let again = b.await.unwrap();
        assert_eq!(again.status, 200);
        assert_eq!(again.json()["choices"], first.json()["choices"]);
    }
    assert!(!asleep(addr).await, "awake after the requests");
    server.shutdown().await;
}
