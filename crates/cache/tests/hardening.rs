//! The cache under unlucky timing: a model evicted twice while draining, loads of unknown
//! size under a byte cap, unload hooks that hang, loads that queue for a turn, and loads whose
//! callers all left. Each test failed before the fix it covers.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Held, Probe, TestLoader, TestModel, UnloadBehaviour, settle};
use modelmux_cache::{Error, Multiplexer, MultiplexerBuilder};
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn build(probe: &Arc<Probe>, builder: MultiplexerBuilder) -> Multiplexer<TestModel> {
    builder.build(TestLoader(probe.clone()))
}

#[tokio::test(start_paused = true)]
async fn a_model_draining_twice_is_accounted_per_copy() {
    let probe = Probe::new();
    let mux = build(
        &probe,
        Multiplexer::builder()
            .max_models(2)
            .capacity_timeout(ms(500)),
    );
    // Copy 1 of `a` is evicted while in use: it drains until `held` drops.
    let held = Held::new(mux.get("a").await.unwrap());
    assert!(mux.evict("a"));
    // Copy 2 of `a` is loaded, then evicted idle: it unloads at once.
    drop(mux.get("a").await.unwrap());
    assert!(mux.evict("a"));
    settle().await;
    tokio::time::sleep(ms(10)).await;
    assert_eq!(probe.total_unloads(), 1, "copy 2 unloaded");
    // One slot is taken by copy 1 (in use). `b` takes the other, then goes idle; `c` must
    // evict `b`, not wait for an unload that already happened.
    drop(mux.get("b").await.unwrap());
    let started = Instant::now();
    let c = mux.get("c").await;
    assert!(c.is_ok(), "{:?}", c.err());
    assert!(
        started.elapsed() < ms(100),
        "c waited {:?} for capacity an idle model could give",
        started.elapsed()
    );
    drop(c);
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn loads_of_unknown_size_never_overcommit_the_byte_cap() {
    let probe = Probe::new();
    // Sizes are told only by the loaded model, never in advance.
    for id in ["a", "b", "c", "d"] {
        probe.sizes.lock().insert(id.into(), 6);
    }
    *probe.default_delay.lock() = ms(50);
    let mux = build(
        &probe,
        Multiplexer::builder()
            .max_models(4)
            .max_bytes(10)
            .max_concurrent_loads(4)
            .capacity_timeout(ms(2000)),
    );
    let gets: Vec<_> = ["a", "b", "c", "d"]
        .into_iter()
        .map(|id| {
            let mux = mux.clone();
            tokio::spawn(async move { mux.get(id).await.map(drop) })
        })
        .collect();
    for g in gets {
        g.await.unwrap().unwrap();
    }
    assert_eq!(probe.total_loads(), 4);
    assert!(
        probe.max_live_bytes.load(Ordering::SeqCst) <= 10,
        "{} bytes alive at once under a cap of 10",
        probe.max_live_bytes.load(Ordering::SeqCst)
    );
    assert!(mux.gauges().used_bytes <= 10, "{:?}", mux.gauges());
}

#[tokio::test(start_paused = true)]
async fn an_unload_hook_that_hangs_releases_its_capacity_after_the_timeout() {
    let probe = Probe::new();
    probe
        .unload_behaviour
        .lock()
        .insert("a".into(), UnloadBehaviour::Hang);
    let mux = build(
        &probe,
        Multiplexer::builder()
            .max_models(1)
            .unload_timeout(Some(ms(300)))
            .capacity_timeout(ms(5000)),
    );
    drop(mux.get("a").await.unwrap());
    let started = Instant::now();
    let b = mux.get("b").await;
    assert!(b.is_ok(), "{:?}", b.err());
    let waited = started.elapsed();
    assert!(
        waited >= ms(300) && waited < ms(1000),
        "b waited {waited:?} behind a hung unload with a 300 ms limit"
    );
    let m = mux.metrics();
    assert_eq!(m.unload_failures, 1, "{m:?}");
}

#[tokio::test(start_paused = true)]
async fn the_wait_for_a_load_turn_is_bounded_in_time_and_length() {
    let probe = Probe::new();
    *probe.default_delay.lock() = Duration::from_secs(10);
    let mux = build(
        &probe,
        Multiplexer::builder()
            .max_models(8)
            .max_concurrent_loads(1)
            .max_queued_loads(2)
            .capacity_timeout(ms(400)),
    );
    let hold = |id: &'static str| {
        let mux = mux.clone();
        tokio::spawn(async move { mux.get(id).await.map(drop) })
    };
    let running = hold("slow");
    settle().await;
    let (q1, q2) = (hold("q1"), hold("q2"));
    settle().await;
    // A third waiting load is refused at once.
    let started = Instant::now();
    let Err(refused) = mux.get("q3").await else {
        panic!("q3 loaded");
    };
    assert!(matches!(refused, Error::LoadsBusy { .. }), "{refused}");
    assert!(started.elapsed() < ms(10));
    assert!(refused.retry_after().is_some());
    // The two queued ones give up after capacity_timeout, not after the 10 s load.
    for q in [q1, q2] {
        let Err(e) = q.await.unwrap() else {
            panic!("loaded");
        };
        assert!(matches!(e, Error::LoadsBusy { .. }), "{e}");
    }
    assert!(started.elapsed() < ms(1000));
    assert_eq!(probe.total_loads(), 1, "only the first load ran");
    running.abort();
}

#[tokio::test(start_paused = true)]
async fn a_load_everyone_left_before_it_started_is_dropped() {
    let probe = Probe::new();
    *probe.default_delay.lock() = ms(300);
    let mux = build(
        &probe,
        Multiplexer::builder().max_models(4).max_concurrent_loads(1),
    );
    // Ten callers for ten cold models, each giving up after 20 ms.
    for i in 0..10 {
        let mux = mux.clone();
        let id = format!("cold-{i}");
        let _ = tokio::time::timeout(ms(20), async move { mux.get(&id).await.map(drop) }).await;
    }
    tokio::time::sleep(ms(2000)).await;
    settle().await;
    assert_eq!(
        probe.total_loads(),
        1,
        "only the load that had started ran: {:?}",
        probe.loads.lock()
    );
    let m = mux.metrics();
    assert_eq!(m.loads_abandoned, 9, "{m:?}");
    assert!(mux.loading_ids().is_empty());
    // Nothing remembers them as failed: the next caller loads at once.
    let started = Instant::now();
    drop(mux.get("cold-5").await.unwrap());
    assert!(started.elapsed() <= ms(310), "{:?}", started.elapsed());
    // The one that had started finished, and stays warm.
    assert_eq!(mux.loaded_ids().len(), 2);
}
