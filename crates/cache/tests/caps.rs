//! Changing the caps of a running cache (`Multiplexer::set_caps`, what a live
//! reconfiguration does to a deployment whose caps changed): a lower cap evicts idle models in
//! the policy's order and models in use as they become idle, never a pinned one; a higher cap
//! lets waiting loads through at once; under concurrent gets and changing caps, the models
//! alive settle within the last cap and every instance is unloaded exactly once.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Held, Probe, TestLoader, settle};
use modelmux_cache::{EvictionPolicy, Multiplexer};

fn cache(probe: &Arc<Probe>, max: usize) -> Multiplexer<common::TestModel> {
    Multiplexer::builder()
        .max_models(max)
        .capacity_timeout(Duration::from_secs(5))
        .build(TestLoader(probe.clone()))
}

fn sorted(ids: Vec<modelmux_cache::ModelId>) -> Vec<String> {
    let mut ids: Vec<String> = ids.into_iter().map(|i| i.to_string()).collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn a_lower_cap_evicts_the_least_recently_used_idle_models_first() {
    let probe = Probe::new();
    let models = cache(&probe, 4);
    for id in ["a", "b", "c", "d"] {
        drop(models.get(id).await.unwrap());
    }
    drop(models.get("b").await.unwrap()); // b is now the most recent, then d, c, a
    models.set_caps(Some(2), None);
    settle().await;
    assert_eq!(sorted(models.loaded_ids()), ["b", "d"]);
    assert_eq!(models.caps(), (Some(2), None));
    assert_eq!(models.metrics().evictions, 2);
    assert_eq!(probe.total_loads(), 4, "shrinking loads nothing");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(probe.total_unloads(), 2);
    probe.assert_clean();
}

#[tokio::test]
async fn models_in_use_finish_first_and_pinned_models_stay() {
    let probe = Probe::new();
    let models = cache(&probe, 4);
    let held_a = Held::new(models.get("a").await.unwrap());
    let held_b = Held::new(models.get("b").await.unwrap());
    models.pin("p").await.unwrap();
    drop(models.get("c").await.unwrap());
    models.set_caps(Some(2), None);
    settle().await;
    // c (idle) goes at once; a and b are in use, p is pinned.
    assert_eq!(sorted(models.loaded_ids()), ["a", "b", "p"]);
    drop(held_a);
    // a is evicted once idle, which brings the cache within the cap.
    let mut waited = 0;
    while models.loaded_ids().len() > 2 {
        waited += 1;
        assert!(waited < 100, "a was not evicted once idle");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sorted(models.loaded_ids()), ["b", "p"]);
    // Down to one: only pinned p may stay over the cap... and b, in use, until it is done.
    models.set_caps(Some(1), None);
    drop(held_b);
    let mut waited = 0;
    while models.loaded_ids().len() > 1 {
        waited += 1;
        assert!(waited < 100, "b was not evicted once idle");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sorted(models.loaded_ids()), ["p"]);
    probe.assert_clean();
}

#[tokio::test]
async fn a_higher_cap_lets_a_waiting_load_through() {
    let probe = Probe::new();
    let models = cache(&probe, 1);
    let held = Held::new(models.get("a").await.unwrap());
    let waiting = tokio::spawn({
        let models = models.clone();
        async move { models.get("b").await.map(drop) }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished(), "b waits for room while a is in use");
    models.set_caps(Some(2), None);
    tokio::time::timeout(Duration::from_secs(1), waiting)
        .await
        .expect("b loads once the cap is raised")
        .unwrap()
        .unwrap();
    assert_eq!(sorted(models.loaded_ids()), ["a", "b"]);
    drop(held);
    // Bytes too: a byte cap under what is held evicts the idle models.
    probe.sizes.lock().insert("c".into(), 10);
    drop(models.get("c").await.unwrap());
    models.set_caps(Some(3), Some(2));
    settle().await;
    let left = models.loaded_ids();
    assert!(
        left.len() <= 2 && !left.iter().any(|i| i.as_str() == "c"),
        "{left:?}"
    );
    probe.assert_clean();
}

/// Gets of twelve models from eight tasks while the cap moves between 1 and 4 every few
/// milliseconds (both eviction policies): no invariant breaks, the models alive settle
/// within the final cap, and after shutdown every instance was unloaded exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn caps_changing_under_concurrent_gets_keep_the_invariants() {
    for policy in [EvictionPolicy::Lru, EvictionPolicy::Gdsf] {
        let probe = Probe::new();
        *probe.default_delay.lock() = Duration::from_millis(1);
        let models = Multiplexer::builder()
            .max_models(3)
            .eviction_policy(policy)
            .capacity_timeout(Duration::from_secs(10))
            .build(TestLoader(probe.clone()));
        let workers: Vec<_> = (0..8u64)
            .map(|w| {
                let models = models.clone();
                tokio::spawn(async move {
                    let mut x = w * 7919 + 1;
                    for _ in 0..150 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                        let id = format!("m{}", (x >> 33) % 12);
                        let guard = Held::new(models.get(&id).await.expect("get"));
                        tokio::time::sleep(Duration::from_micros((x >> 50) % 500)).await;
                        drop(guard);
                    }
                })
            })
            .collect();
        let changer = {
            let models = models.clone();
            tokio::spawn(async move {
                for i in 0..60usize {
                    models.set_caps(Some(1 + i % 4), None);
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
                models.set_caps(Some(2), None);
            })
        };
        for w in workers {
            w.await.unwrap();
        }
        changer.await.unwrap();
        let mut waited = 0;
        while models.loaded_ids().len() > 2 {
            waited += 1;
            assert!(
                waited < 100,
                "{policy:?}: over the final cap: {:?}",
                models.loaded_ids()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        probe.assert_clean();
        let report = models.shutdown(Duration::from_secs(5)).await;
        assert!(report.still_draining.is_empty());
        probe.assert_all_unloaded_once();
    }
}
