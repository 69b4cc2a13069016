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

/// A chat for the pirate adapter.
async fn pirate(addr: std::net::SocketAddr) -> Reply {
    let request = chat("smollm2:pirate", "Hi", 4, false);
    post(addr, "/v1/chat/completions", request).await
}

/// Models (here: adapters) the replicas hold, from `/metrics` (a scrape: it does not wake).
async fn held(addr: std::net::SocketAddr) -> f64 {
    metric(&metrics(addr).await, "modelmux_models_loaded")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_replica_sleeps_and_requests_wake_it_but_scrapes_and_probes_do_not() {
    let config = config(json!({"experimental_configs": {
        "sleep_after_idle_s": 1.0,
        "drop_adapters_after_idle_s": 2.5,
    }}));
    let server = serve(&config, 1).await;
    let addr = server.local_addr();
    let first = pirate(addr).await;
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
    assert_eq!(held(addr).await, 1.0, "level 1 keeps the adapter");

    // Level 2: the adapter goes as well, the engine still asleep.
    while held(addr).await > 0.0 {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "the adapter stayed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        start.elapsed() >= Duration::from_millis(1000),
        "dropped before its idle time"
    );
    assert!(asleep(addr).await);

    // A burst: every request answered, with the same weights' answer.
    let burst: Vec<_> = (0..4)
        .map(|_| tokio::spawn(async move { pirate(addr).await }))
        .collect();
    for b in burst {
        let again = b.await.unwrap();
        assert_eq!(again.status, 200);
        assert_eq!(again.json()["choices"], first.json()["choices"]);
    }
    assert!(!asleep(addr).await, "awake after the requests");
    assert_eq!(held(addr).await, 1.0, "the adapter loaded again");
    server.shutdown().await;
}
