//! GDSF's patience: a load that would have to evict an idle model worth more than one in use
//! waits a little for the cheaper one to become idle. Without it, a hot model (idle between
//! its requests) is evicted whenever the models just loaded for cold requests are still
//! serving them — on the Python Zipf benchmark the hottest model was reloaded 19 times in
//! 20 s. Paused time: every wait below is exact.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Probe, TestLoader, TestModel};
use modelmux_cache::{EvictionPolicy, ModelId, Multiplexer};
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn ids(mut v: Vec<ModelId>) -> Vec<String> {
    v.sort();
    v.into_iter().map(|id| id.to_string()).collect()
}

/// Two slots under GDSF, 100 ms loads: `hot` used ten times and idle now, `cold` loaded once
/// and still in use (its guard is returned).
async fn hot_idle_cold_busy(
    policy: EvictionPolicy,
) -> (
    Multiplexer<TestModel>,
    modelmux_cache::ModelGuard<TestModel>,
) {
    let probe = Probe::new();
    *probe.default_delay.lock() = ms(100);
    let mux = Multiplexer::builder()
        .max_models(2)
        .eviction_policy(policy)
        .build(TestLoader(Arc::clone(&probe)));
    for _ in 0..10 {
        mux.get("hot").await.unwrap();
    }
    let cold = mux.get("cold").await.unwrap();
    (mux, cold)
}

#[tokio::test(start_paused = true)]
async fn a_load_waits_for_a_cheaper_model_in_use_rather_than_evict_a_hot_idle_one() {
    let (mux, cold) = hot_idle_cold_busy(EvictionPolicy::Gdsf).await;
    let release = tokio::spawn(async move {
        tokio::time::sleep(ms(20)).await;
        drop(cold);
    });
    let started = Instant::now();
    mux.get("new").await.unwrap();
    // 20 ms waiting for `cold` to be idle, then its 100 ms load.
    assert_eq!(started.elapsed(), ms(120));
    release.await.unwrap();
    assert_eq!(
        ids(mux.loaded_ids()),
        ["hot", "new"],
        "the model asked for once goes, not the hot one"
    );
}

#[tokio::test(start_paused = true)]
async fn the_wait_is_bounded_by_what_reloading_the_dearer_model_costs() {
    let (mux, cold) = hot_idle_cold_busy(EvictionPolicy::Gdsf).await;
    let started = Instant::now();
    mux.get("new").await.unwrap();
    // `cold` stays in use: after `hot`'s load time (100 ms) the load evicts `hot` after all.
    assert_eq!(started.elapsed(), ms(200));
    assert_eq!(ids(mux.loaded_ids()), ["cold", "new"]);
    drop(cold);
}

#[tokio::test(start_paused = true)]
async fn lru_evicts_the_idle_model_at_once_as_ray_does() {
    let (mux, cold) = hot_idle_cold_busy(EvictionPolicy::Lru).await;
    let started = Instant::now();
    mux.get("new").await.unwrap();
    assert_eq!(started.elapsed(), ms(100));
    assert_eq!(ids(mux.loaded_ids()), ["cold", "new"]);
    drop(cold);
}
