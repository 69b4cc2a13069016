//! When a hot model gets a second copy, over real HTTP: only when waiting for its holder would
//! take longer than loading it.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Counters, counted, get_model};
use http::StatusCode;
use modelmux_cache::Multiplexer;

async fn burst(load: Duration, infer: Duration, requests: usize) -> (usize, Vec<String>) {
    let counters = Arc::new(Counters::default());
    let spec = counted(
        "Model",
        counters.clone(),
        Multiplexer::builder().max_models(4),
        load,
        infer,
    )
    .num_replicas(2)
    .max_ongoing_requests(4)
    .max_queued_requests(1000);
    let server = common::serve(spec).await;
    let addr = server.local_addr();
    // One request first, so the load and a service time are measured.
    assert_eq!(get_model(addr, "hot").await.status, StatusCode::OK);
    let all: Vec<_> = (0..requests)
        .map(|_| tokio::spawn(async move { get_model(addr, "hot").await }))
        .collect();
    let mut replicas = Vec::new();
    for r in all {
        let reply = r.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        replicas.push(reply.replica());
    }
    replicas.sort();
    replicas.dedup();
    let loads = counters.loads.load(Ordering::SeqCst);
    server.shutdown().await;
    (loads, replicas)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bursts_of_cheap_requests_wait_for_the_holder_instead_of_loading_copies() {
    // 2 ms requests, 1 s loads: 60 at once on a holder with 4 slots drain in ~30 ms (the
    // estimate stays under the load time unless a request is measured at over 60 ms).
    for round in 0..2 {
        let (loads, replicas) = burst(Duration::from_secs(1), Duration::from_millis(2), 60).await;
        assert_eq!(
            loads, 1,
            "round {round}: a copy was loaded for cheap requests"
        );
        assert_eq!(replicas.len(), 1, "round {round}: {replicas:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_model_with_slow_requests_still_gets_a_copy() {
    // 400 ms requests, 20 ms loads: a second copy serves sooner than the holder could.
    let (loads, replicas) = burst(Duration::from_millis(20), Duration::from_millis(400), 8).await;
    assert_eq!(loads, 2, "no copy for a slow hot model");
    assert_eq!(replicas.len(), 2, "{replicas:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_queued_behind_a_long_one_moves_to_an_idle_replica() {
    // Two replicas of one slot each, cheap loads (10 ms), long requests (2 s): the second of
    // two requests for one model arrives while the first runs. It is queued at first (its
    // holder has only just filled), and placed again once its wait has outgrown the load:
    // on the other replica, not 2 s later behind the first (Ray's
    // test_multiplexed_multiple_replicas has both run at once).
    let (server, counters) = one_slot_replicas().await;
    let addr = server.local_addr();
    let first = tokio::spawn(async move { get_model(addr, "m").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = tokio::spawn(async move { get_model(addr, "m").await });
    // Both are running at once: two loads (one per replica), both started long before the
    // first request could have finished.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
    while counters.loads.load(Ordering::SeqCst) < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second request still waits behind the first: {}",
            common::get(addr, "/-/models", &[]).await.text()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (a, b) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!((a.status, b.status), (StatusCode::OK, StatusCode::OK));
    assert_ne!(a.replica(), b.replica());
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_first_requests_for_one_model_on_one_slot_replicas_run_at_once() {
    // Ray's test_multiplexed_multiple_replicas: num_replicas=2, max_ongoing_requests=1, two
    // requests for one cold model at once. The second must not join the first's replica
    // (whose one slot its first request takes back when the load is done): it waits, then
    // gets a copy on the other replica once the holder has been full for longer than the load.
    for round in 0..3 {
        let (server, counters) = one_slot_replicas().await;
        let addr = server.local_addr();
        let both = [0, 1].map(|_| tokio::spawn(async move { get_model(addr, "1").await }));
        let deadline = tokio::time::Instant::now() + Duration::from_millis(1500);
        while counters.loads.load(Ordering::SeqCst) < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "round {round}: the second request waits behind the first"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let [a, b] = both;
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        assert_eq!((a.status, b.status), (StatusCode::OK, StatusCode::OK));
        assert_ne!(a.replica(), b.replica(), "round {round}");
        server.shutdown().await;
    }
}

/// Two replicas of one request slot each, whose loads take 10 ms and requests 2 s.
async fn one_slot_replicas() -> (modelmux_front::Server, Arc<Counters>) {
    let counters = Arc::new(Counters::default());
    let spec = counted(
        "Model",
        counters.clone(),
        Multiplexer::builder().max_models(2),
        Duration::from_millis(10),
        Duration::from_secs(2),
    )
    .num_replicas(2)
    .max_ongoing_requests(1);
    (common::serve(spec).await, counters)
}
