//! One test per behaviour the Multiplexer promises. Timing-dependent tests run on paused
//! Tokio time, so they are deterministic and take no wall-clock time.

mod common;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Held, Probe, TestLoader, TestModel, UnloadBehaviour, settle};
use modelmux_cache::{
    Error, EvictReason, EvictionPolicy, InvalidModelId, ModelEventKind, ModelId, ModelStatus,
    Multiplexer, MultiplexerBuilder,
};
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn build(probe: &Arc<Probe>, builder: MultiplexerBuilder) -> Multiplexer<TestModel> {
    builder.build(TestLoader(probe.clone()))
}

fn ids(mut v: Vec<ModelId>) -> Vec<String> {
    v.sort();
    v.into_iter().map(|id| id.to_string()).collect()
}

/// Waits until every unload in flight has finished (the multiplexer has nothing draining).
async fn drained(mux: &Multiplexer<TestModel>) {
    for _ in 0..1000 {
        if mux.gauges().draining == 0 {
            return;
        }
        tokio::time::sleep(ms(1)).await;
    }
    panic!("models still draining: {:?}", mux.gauges());
}

#[tokio::test(start_paused = true)]
async fn lru_order_follows_hits() {
    let probe = Probe::new();
    let mux = build(&probe, Multiplexer::builder().max_models(3));
    for id in ["a", "b", "c"] {
        mux.get(id).await.unwrap();
    }
    // A hit on `a` makes `b` the least recently used.
    mux.get("a").await.unwrap();
    mux.get("d").await.unwrap();
    assert_eq!(ids(mux.loaded_ids()), ["a", "c", "d"]);
    // Now `c` is the oldest; hit it, and `a` goes next.
    mux.get("c").await.unwrap();
    mux.get("e").await.unwrap();
    assert_eq!(ids(mux.loaded_ids()), ["c", "d", "e"]);
    let order: Vec<String> = mux.models().into_iter().map(|m| m.id.to_string()).collect();
    assert_eq!(order, ["e", "c", "d"], "most recently used first");
    assert_eq!(probe.total_loads(), 5);
    drained(&mux).await;
    assert_eq!(probe.total_unloads(), 2);
    probe.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn capacity_one_with_three_concurrent_loads_of_different_ids() {
    let probe = Probe::new();
    *probe.default_delay.lock() = ms(50);
    let mux = build(&probe, Multiplexer::builder().max_models(1));
    let tasks: Vec<_> = ["a", "b", "c"]
        .into_iter()
        .map(|id| {
            let mux = mux.clone();
            tokio::spawn(async move {
                let held = Held::new(mux.get(id).await.unwrap());
                tokio::time::sleep(ms(20)).await;
                held.0.id().to_string()
            })
        })
        .collect();
    for (task, id) in tasks.into_iter().zip(["a", "b", "c"]) {
        assert_eq!(task.await.unwrap(), id);
    }
    assert_eq!(
        probe.max_live.load(Ordering::SeqCst),
        1,
        "never two models at once"
    );
    assert_eq!(probe.total_loads(), 3);
    drained(&mux).await;
    assert_eq!(probe.total_unloads(), 2);
    assert_eq!(mux.loaded_ids().len(), 1);
    probe.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn a_hundred_concurrent_gets_of_one_cold_id_load_it_once() {
    let probe = Probe::new();
    *probe.default_delay.lock() = ms(100);
    let mux = build(&probe, Multiplexer::builder());
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let mux = mux.clone();
            tokio::spawn(async move { mux.get("cold").await.unwrap().serial })
        })
        .collect();
    let mut serials = Vec::new();
    for t in tasks {
        serials.push(t.await.unwrap());
    }
    assert_eq!(probe.loads_of("cold"), 1);
    assert!(
        serials.iter().all(|s| *s == serials[0]),
        "all got the same instance"
    );
    let m = mux.metrics();
    assert_eq!((m.loads, m.misses, m.hits), (1, 100, 0));
}

#[tokio::test(start_paused = true)]
async fn slow_loads_of_different_ids_overlap() {
    let probe = Probe::new();
    *probe.default_delay.lock() = ms(100);
    let mux = build(&probe, Multiplexer::builder().max_models(4));
    let start = Instant::now();
    let (a, b) = tokio::join!(mux.get("a"), mux.get("b"));
    a.unwrap();
    b.unwrap();
    assert_eq!(
        start.elapsed(),
        ms(100),
        "two 100 ms loads took one 100 ms, not two"
    );
    assert_eq!(probe.max_loading.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn max_concurrent_loads_bounds_parallel_loads() {
    let probe = Probe::new();
    *probe.default_delay.lock() = ms(100);
    let mux = build(
        &probe,
        Multiplexer::builder().max_models(4).max_concurrent_loads(1),
    );
    let start = Instant::now();
    let (a, b) = tokio::join!(mux.get("a"), mux.get("b"));
    a.unwrap();
    b.unwrap();
    assert_eq!(start.elapsed(), ms(200));
    assert_eq!(probe.max_loading.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_model_in_use_is_not_unloaded_until_its_guard_drops() {
    let probe = Probe::new();
    let mux = build(&probe, Multiplexer::builder().max_models(1));
    let a = Held::new(mux.get("a").await.unwrap());

    // `b` needs a's slot, but `a` is in use: the load waits instead of evicting it.
    let waiting = tokio::spawn({
        let mux = mux.clone();
        async move { mux.get("b").await.map(|g| g.id().to_string()) }
    });
    tokio::time::sleep(ms(500)).await;
    assert!(!waiting.is_finished());
    assert_eq!(probe.total_unloads(), 0);
    assert_eq!(
        probe.loads_of("b"),
        0,
        "b's loader has not started: no room was made"
    );

    drop(a);
    assert_eq!(waiting.await.unwrap().unwrap(), "b");
    assert_eq!(probe.total_unloads(), 1);
    probe.assert_clean();

    // Explicit eviction of a model in use: gone from the index at once, unloaded only later.
    let b = Held::new(mux.get("b").await.unwrap());
    assert!(mux.evict("b"));
    assert!(mux.try_get("b").is_none());
    tokio::time::sleep(ms(100)).await;
    assert_eq!(probe.total_unloads(), 1, "b is still in use");
    assert_eq!(b.0.id().as_str(), "b", "the guard still works");
    drop(b);
    drained(&mux).await;
    assert_eq!(probe.total_unloads(), 2);
    probe.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn unload_errors_and_panics_are_contained_and_reported() {
    let probe = Probe::new();
    probe
        .unload_behaviour
        .lock()
        .insert("err".into(), UnloadBehaviour::Err);
    probe
        .unload_behaviour
        .lock()
        .insert("boom".into(), UnloadBehaviour::Panic);
    let mux = build(&probe, Multiplexer::builder().max_models(2));
    let mut sub = mux.subscribe();
    mux.preload("err").await.unwrap();
    mux.preload("boom").await.unwrap();
    assert!(mux.evict("err"));
    assert!(mux.evict("boom"));
    drained(&mux).await;

    let mut errors = Vec::new();
    while let Ok(event) = sub.events.try_recv() {
        if let ModelEventKind::Unloaded { error, .. } = event.kind {
            errors.push((event.id.to_string(), error.expect("the hook failed")));
        }
    }
    errors.sort();
    assert_eq!(errors[0].0, "boom");
    assert!(
        errors[0].1.contains("panicked") && errors[0].1.contains("exploded"),
        "{errors:?}"
    );
    assert_eq!(
        errors[1],
        ("err".into(), "device refused to free memory".into())
    );

    let m = mux.metrics();
    assert_eq!((m.unloads, m.unload_failures), (2, 2));
    assert_eq!(
        m.gauges.used_slots, 0,
        "capacity released despite the failures"
    );
    // And the multiplexer carries on.
    mux.get("fine").await.unwrap();
    mux.get("err").await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_failed_load_leaves_no_residue_reaches_every_waiter_and_backs_off() {
    let probe = Probe::new();
    *probe.default_delay.lock() = ms(10);
    probe.fail.lock().insert("broken".into());
    let mux = build(
        &probe,
        Multiplexer::builder()
            .max_models(2)
            .failure_backoff(ms(1000), ms(8000)),
    );
    let mut sub = mux.subscribe();

    let waiters: Vec<_> = (0..10)
        .map(|_| {
            let mux = mux.clone();
            tokio::spawn(async move { mux.get("broken").await.map(drop) })
        })
        .collect();
    for w in waiters {
        let err = w.await.unwrap().unwrap_err();
        assert!(matches!(err, Error::LoadFailed { .. }), "{err}");
        assert!(err.to_string().contains("no weights for broken"), "{err}");
    }
    assert_eq!(probe.loads_of("broken"), 1);
    let g = mux.gauges();
    assert_eq!(
        (g.used_slots, g.used_bytes, g.loading, g.loaded),
        (0, 0, 0, 0),
        "no residue"
    );
    assert!(mux.loading_ids().is_empty());
    let kinds: Vec<String> = std::iter::from_fn(|| sub.events.try_recv().ok())
        .map(|e| {
            format!("{:?}", e.kind)
                .split([' ', '{'])
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        kinds,
        ["Loading", "Failed"],
        "the Loading advertisement is retracted"
    );

    // Within the backoff: refused without calling the loader.
    let err = mux.get("broken").await.unwrap_err();
    assert!(matches!(err, Error::BackingOff { .. }), "{err}");
    assert!(err.retry_after().unwrap() <= ms(1000));
    assert_eq!(probe.loads_of("broken"), 1);

    // After it: retried (and fails again, doubling the backoff).
    tokio::time::sleep(ms(1001)).await;
    assert!(matches!(
        mux.get("broken").await,
        Err(Error::LoadFailed { .. })
    ));
    assert_eq!(probe.loads_of("broken"), 2);
    tokio::time::sleep(ms(1500)).await;
    match mux.get("broken").await {
        Err(Error::BackingOff { retry_after, .. }) => {
            assert!(retry_after > ms(400), "{retry_after:?}")
        }
        other => panic!("expected the doubled backoff, got {other:?}"),
    }

    // Fixed: the next attempt after the backoff loads it, and the failure is forgotten.
    probe.fail.lock().clear();
    tokio::time::sleep(ms(2000)).await;
    mux.get("broken").await.unwrap();
    assert_eq!(probe.loads_of("broken"), 3);
    let m = mux.metrics();
    assert_eq!((m.load_failures, m.backoff_rejections), (2, 2));
}

#[tokio::test(start_paused = true)]
async fn a_load_that_takes_too_long_times_out_and_releases_everything() {
    let probe = Probe::new();
    *probe.default_delay.lock() = Duration::from_secs(10);
    let mux = build(
        &probe,
        Multiplexer::builder()
            .max_models(1)
            .load_timeout(Some(Duration::from_secs(1))),
    );
    let start = Instant::now();
    let err = mux.get("slow").await.unwrap_err();
    assert!(
        matches!(err, Error::LoadTimeout { after, .. } if after == Duration::from_secs(1)),
        "{err}"
    );
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(
        probe.live.load(Ordering::SeqCst),
        0,
        "the loader was cancelled"
    );
    assert_eq!(mux.gauges().used_slots, 0);
    // The slot is free for another model.
    *probe.default_delay.lock() = ms(1);
    mux.get("fast").await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_loader_panic_is_contained() {
    let probe = Probe::new();
    probe.panic.lock().insert("p".into());
    let mux = build(&probe, Multiplexer::builder().max_models(1));
    let err = mux.get("p").await.unwrap_err();
    assert!(
        matches!(&err, Error::LoadPanicked { message, .. } if message.contains("exploded")),
        "{err}"
    );
    assert_eq!(mux.gauges().used_slots, 0);
    mux.get("q").await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_byte_cap_evicts_by_size_in_lru_order() {
    let probe = Probe::new();
    probe.hint_sizes.store(true, Ordering::SeqCst);
    for (id, size) in [("a", 60), ("b", 30), ("c", 50), ("d", 90), ("huge", 150)] {
        probe.sizes.lock().insert(id.into(), size);
    }
    let mux = build(
        &probe,
        Multiplexer::builder().unbounded_models().max_bytes(100),
    );
    mux.get("a").await.unwrap();
    mux.get("b").await.unwrap();
    assert_eq!(mux.gauges().used_bytes, 90);
    // 90 + 50 > 100: evicting `a` (LRU, 60 bytes) is enough; `b` stays.
    mux.get("c").await.unwrap();
    assert_eq!(ids(mux.loaded_ids()), ["b", "c"]);
    assert_eq!(mux.gauges().used_bytes, 80);
    // 90 bytes needs both of them gone.
    mux.get("d").await.unwrap();
    assert_eq!(ids(mux.loaded_ids()), ["d"]);
    let err = mux.get("huge").await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::ModelTooLarge {
                size: 150,
                max_bytes: 100,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        probe.loads_of("huge"),
        0,
        "refused on its hint, before loading"
    );
    assert!(probe.max_live_bytes.load(Ordering::SeqCst) <= 100);
    probe.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn without_size_hints_the_byte_cap_is_restored_once_sizes_are_known() {
    let probe = Probe::new();
    for (id, size) in [("a", 40), ("b", 40), ("big", 70), ("huge", 150)] {
        probe.sizes.lock().insert(id.into(), size);
    }
    let mux = build(
        &probe,
        Multiplexer::builder().unbounded_models().max_bytes(100),
    );
    mux.get("a").await.unwrap();
    mux.get("b").await.unwrap();
    // `big` is reserved at the mean size (40): 80 + 40 > 100 evicts `a` first. Loaded, it is 70:
    // 110 > 100, so `b` is evicted too as soon as the real size is known.
    mux.get("big").await.unwrap();
    drained(&mux).await;
    tokio::time::sleep(ms(10)).await;
    assert_eq!(ids(mux.loaded_ids()), ["big"]);
    assert_eq!(mux.gauges().used_bytes, 70);
    // Too large on its own, discovered only after loading: refused and unloaded. Its
    // reservation (the mean, 70) had already made room by evicting `big`.
    let err = mux.get("huge").await.unwrap_err();
    assert!(
        matches!(err, Error::ModelTooLarge { size: 150, .. }),
        "{err}"
    );
    drained(&mux).await;
    assert!(mux.loaded_ids().is_empty());
    assert_eq!(mux.gauges().used_bytes, 0);
    assert_eq!(probe.live.load(Ordering::SeqCst), 0);
    // And it is remembered like any failure of the model itself.
    assert!(matches!(
        mux.get("huge").await,
        Err(Error::BackingOff { .. })
    ));
    probe.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn when_everything_is_in_use_a_load_waits_then_fails_without_overcommitting() {
    let probe = Probe::new();
    let mux = build(
        &probe,
        Multiplexer::builder()
            .max_models(2)
            .capacity_timeout(ms(300)),
    );
    let _a = mux.get("a").await.unwrap();
    let _b = mux.get("b").await.unwrap();
    let start = Instant::now();
    let err = mux.get("c").await.unwrap_err();
    assert_eq!(start.elapsed(), ms(300));
    assert!(
        matches!(err, Error::CapacityExhausted { resident: 2, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("max_models: 2"), "{err}");
    assert_eq!(err.retry_after(), Some(Duration::from_secs(1)));
    assert_eq!(probe.loads_of("c"), 0);
    assert_eq!(probe.max_live.load(Ordering::SeqCst), 2);
    assert_eq!(mux.metrics().capacity_exhausted, 1);
    // Capacity is not the model's fault: no backoff.
    drop(_a);
    mux.get("c").await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn pinned_models_are_not_evicted_until_unpinned() {
    let probe = Probe::new();
    let mux = build(
        &probe,
        Multiplexer::builder()
            .max_models(1)
            .capacity_timeout(ms(100)),
    );
    mux.pin("base").await.unwrap();
    assert_eq!(mux.gauges().pinned, 1);
    assert!(matches!(
        mux.get("other").await,
        Err(Error::CapacityExhausted { .. })
    ));
    assert!(mux.unpin("base"));
    assert!(!mux.unpin("base"));
    mux.get("other").await.unwrap();
    assert_eq!(ids(mux.loaded_ids()), ["other"]);
}

#[tokio::test(start_paused = true)]
async fn preload_list_and_evict() {
    let probe = Probe::new();
    *probe.default_delay.lock() = ms(100);
    let mux = build(&probe, Multiplexer::builder().max_models(3));
    mux.preload("warm").await.unwrap();
    let loading = tokio::spawn({
        let mux = mux.clone();
        async move { mux.preload("cold").await }
    });
    tokio::time::sleep(ms(10)).await;
    assert_eq!(ids(mux.loading_ids()), ["cold"]);
    let models = mux.models();
    assert_eq!(models.len(), 2);
    assert_eq!(
        (models[0].id.as_str(), models[0].status),
        ("warm", ModelStatus::Loaded)
    );
    assert_eq!(
        (models[1].id.as_str(), models[1].status),
        ("cold", ModelStatus::Loading)
    );
    assert_eq!(models[0].size_bytes, Some(1));
    assert!(!mux.evict("cold"), "a load in progress is not evicted");
    loading.await.unwrap().unwrap();
    assert!(mux.evict("warm"));
    assert!(!mux.evict("warm"));
    assert_eq!(ids(mux.loaded_ids()), ["cold"]);
}

#[tokio::test(start_paused = true)]
async fn invalid_ids_are_refused_with_a_reason() {
    let probe = Probe::new();
    let mux = build(&probe, Multiplexer::builder());
    assert!(matches!(
        mux.get("").await,
        Err(Error::InvalidModelId(InvalidModelId::Empty))
    ));
    let long = "x".repeat(300);
    assert!(matches!(
        mux.get(&long).await,
        Err(Error::InvalidModelId(InvalidModelId::TooLong {
            len: 300,
            ..
        }))
    ));
    let err = mux.get("a\u{7}b").await.unwrap_err();
    assert_eq!(err.error_type(), "invalid_model_id");
    assert!(err.to_string().contains("control character"), "{err}");
    assert_eq!(probe.total_loads(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_caller_that_gives_up_does_not_cancel_the_load() {
    let probe = Probe::new();
    *probe.default_delay.lock() = ms(100);
    let mux = build(&probe, Multiplexer::builder());
    assert!(tokio::time::timeout(ms(10), mux.get("m")).await.is_err());
    tokio::time::sleep(ms(200)).await;
    assert!(
        mux.try_get("m").is_some(),
        "the load finished without its caller"
    );
    assert_eq!(probe.loads_of("m"), 1);
}

#[tokio::test(start_paused = true)]
async fn state_changes_are_published_in_order() {
    let probe = Probe::new();
    let mux = build(&probe, Multiplexer::builder().max_models(1));
    mux.preload("a").await.unwrap();
    let mut sub = mux.subscribe();
    assert_eq!(
        sub.snapshot,
        vec![(ModelId::new("a").unwrap(), ModelStatus::Loaded)]
    );
    mux.get("b").await.unwrap();
    drained(&mux).await;
    let events: Vec<_> = std::iter::from_fn(|| sub.events.try_recv().ok()).collect();
    let seen: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            let kind = match &e.kind {
                ModelEventKind::Loading => "loading",
                ModelEventKind::Loaded { .. } => "loaded",
                ModelEventKind::Evicting {
                    reason: EvictReason::Capacity,
                } => "evicting",
                ModelEventKind::Unloaded { error: None, .. } => "unloaded",
                other => panic!("unexpected {other:?}"),
            };
            (e.id.to_string(), kind.to_string())
        })
        .collect();
    let expect = [
        ("b", "loading"),
        ("a", "evicting"),
        ("a", "unloaded"),
        ("b", "loaded"),
    ];
    assert_eq!(seen, expect.map(|(a, b)| (a.to_string(), b.to_string())));
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(
        seqs,
        (sub.seq + 1..=sub.seq + 4).collect::<Vec<_>>(),
        "no gaps"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_unloads_everything_waiting_for_users_with_a_bound() {
    let probe = Probe::new();
    *probe.delay.lock() = [("slow".to_string(), Duration::from_secs(60))].into();
    let mux = build(&probe, Multiplexer::builder().max_models(3));
    mux.preload("idle").await.unwrap();
    let busy = Held::new(mux.get("busy").await.unwrap());
    let loading = tokio::spawn({
        let mux = mux.clone();
        async move { mux.get("slow").await.map(drop) }
    });
    settle().await;

    let report = mux.shutdown(Duration::from_secs(1)).await;
    assert_eq!((report.evicted, report.cancelled_loads), (2, 1));
    assert_eq!(ids(report.still_draining), ["busy"]);
    assert!(matches!(loading.await.unwrap(), Err(Error::ShuttingDown)));
    assert!(matches!(mux.get("idle").await, Err(Error::ShuttingDown)));
    assert_eq!(probe.total_unloads(), 1, "idle is unloaded, busy is not");

    drop(busy);
    drained(&mux).await;
    probe.assert_all_unloaded_once();
    probe.assert_clean();
    assert_eq!(mux.gauges().used_slots, 0);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_multiplexer_unloads_its_models() {
    let probe = Probe::new();
    let mux = build(&probe, Multiplexer::builder());
    mux.preload("a").await.unwrap();
    mux.preload("b").await.unwrap();
    drop(mux);
    settle().await;
    probe.assert_all_unloaded_once();
}

#[tokio::test(start_paused = true)]
async fn counters_are_exact() {
    let probe = Probe::new();
    let mux = build(&probe, Multiplexer::builder().max_models(1));
    mux.get("a").await.unwrap();
    mux.get("a").await.unwrap();
    mux.get("a").await.unwrap();
    mux.get("b").await.unwrap();
    drained(&mux).await;
    let m = mux.metrics();
    assert_eq!((m.get_requests, m.hits, m.misses, m.loads), (4, 2, 2, 2));
    assert_eq!((m.evictions, m.unloads), (1, 1));
    assert_eq!(m.load_duration.count, 2);
    assert_eq!(m.gauges.loaded, 1);
}

#[tokio::test(start_paused = true)]
async fn a_struct_loader_and_a_closure_loader_both_work() {
    struct Plain(String);
    impl modelmux_cache::Model for Plain {}
    let mux = Multiplexer::builder().build(|id: ModelId| async move {
        if id.as_str() == "nope" {
            Err("unknown model")
        } else {
            Ok(Plain(id.to_string()))
        }
    });
    assert_eq!(mux.get("x").await.unwrap().0, "x");
    let err = mux.get("nope").await.unwrap_err();
    assert!(err.to_string().contains("unknown model"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn eviction_prefers_an_idle_model_over_an_older_busy_one() {
    let probe = Probe::new();
    let mux = build(&probe, Multiplexer::builder().max_models(2));
    let old_but_busy = Held::new(mux.get("old").await.unwrap());
    mux.get("newer").await.unwrap();
    // `old` is the least recently used, but in use: `newer` goes instead, without waiting.
    let start = Instant::now();
    mux.get("third").await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(ids(mux.loaded_ids()), ["old", "third"]);
    drop(old_but_busy);
    probe.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn a_model_that_fails_its_probe_evicts_nothing() {
    let probe = Probe::new();
    probe.missing.lock().insert("ghost".into());
    let mux = build(&probe, Multiplexer::builder().max_models(1));
    mux.get("resident").await.unwrap();
    let err = mux.get("ghost").await.unwrap_err();
    assert!(matches!(err, Error::LoadFailed { .. }), "{err}");
    assert!(err.to_string().contains("does not exist"), "{err}");
    assert_eq!(
        ids(mux.loaded_ids()),
        ["resident"],
        "the cache is untouched"
    );
    assert_eq!(probe.loads_of("ghost"), 0);
    assert_eq!(probe.total_unloads(), 0);
    // Remembered like any failure: the next get does not even probe.
    assert!(matches!(
        mux.get("ghost").await,
        Err(Error::BackingOff { .. })
    ));
    assert_eq!(probe.probes.lock()["ghost"], 1);
}

#[tokio::test(start_paused = true)]
async fn a_panicking_size_bytes_fails_the_load_and_leaks_nothing() {
    let probe = Probe::new();
    probe.size_panics.lock().insert("odd".into());
    let mux = build(
        &probe,
        Multiplexer::builder()
            .max_models(1)
            .failure_backoff(ms(100), ms(100)),
    );
    let err = mux.get("odd").await.unwrap_err();
    assert!(
        matches!(&err, Error::LoadPanicked { message, .. } if message.contains("size_bytes")),
        "{err}"
    );
    drained(&mux).await;
    let g = mux.gauges();
    assert_eq!((g.used_slots, g.loading, g.loaded), (0, 0, 0), "{g:?}");
    probe.assert_all_unloaded_once();
    // The id is not wedged: once fixed and past the backoff, it loads.
    probe.size_panics.lock().clear();
    tokio::time::sleep(ms(150)).await;
    mux.get("odd").await.unwrap();
}

#[test]
fn shutdown_right_after_a_load_is_spawned_retracts_it() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let probe = Probe::new();
        let mux = build(&probe, Multiplexer::builder());
        let mut sub = mux.subscribe();
        // Polled once by hand: the get registers the load and spawns its task, and nothing has
        // run that task yet (this is the only thread, and it is busy here).
        let mut get = Box::pin(mux.get("x"));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(get.as_mut().poll(&mut cx).is_pending());
        assert_eq!(ids(mux.loading_ids()), ["x"]);
        let started = Instant::now();
        let report = mux.shutdown(Duration::from_secs(5)).await;
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "shutdown waited out its timeout"
        );
        assert_eq!(report.cancelled_loads, 1);
        assert!(mux.loading_ids().is_empty());
        assert_eq!(mux.gauges().used_slots, 0);
        assert!(matches!(get.await, Err(Error::ShuttingDown)));
        let kinds: Vec<_> = std::iter::from_fn(|| sub.events.try_recv().ok())
            .map(|e| e.kind)
            .collect();
        assert!(
            matches!(
                kinds.as_slice(),
                [ModelEventKind::Loading, ModelEventKind::Failed { .. }]
            ),
            "{kinds:?}"
        );
        assert_eq!(probe.total_loads(), 0);
    });
}

#[tokio::test(start_paused = true)]
async fn a_load_smaller_than_its_reservation_lets_a_waiting_load_in() {
    let probe = Probe::new();
    probe.hint_sizes.store(true, Ordering::SeqCst);
    for (id, size) in [("x", 50), ("a", 10), ("b", 40)] {
        probe.sizes.lock().insert(id.into(), size);
    }
    probe.unknown_size.lock().insert("a".into());
    probe.delay.lock().insert("a".into(), ms(100));
    let mux = build(
        &probe,
        Multiplexer::builder()
            .unbounded_models()
            .max_bytes(100)
            .capacity_timeout(Duration::from_secs(30)),
    );
    let _x = mux.get("x").await.unwrap(); // in use for the whole test
    let start = Instant::now();
    // `a` reserves the mean loaded size (50): 100 of 100. `b` (40) must wait for it. `a`'s
    // caller keeps it in use, so only the admission itself can tell `b` there is room.
    let a = tokio::spawn({
        let mux = mux.clone();
        async move { mux.get("a").await }
    });
    settle().await;
    assert_eq!(
        mux.gauges().used_bytes,
        100,
        "a reserved the mean loaded size"
    );
    let b = mux.get("b").await;
    assert!(b.is_ok(), "{b:?}");
    assert_eq!(
        start.elapsed(),
        ms(100),
        "b got in as soon as a turned out to be 10 bytes"
    );
    let _a = a.await.unwrap().unwrap();
    assert_eq!(mux.gauges().used_bytes, 100);
}

#[tokio::test(start_paused = true)]
async fn a_model_evicted_while_in_use_does_not_block_evicting_an_idle_one() {
    let probe = Probe::new();
    let mux = build(&probe, Multiplexer::builder().max_models(2));
    let busy = Held::new(mux.get("busy").await.unwrap());
    mux.get("idle").await.unwrap();
    assert!(mux.evict("busy"));
    // `busy` drains for as long as its request runs; `idle` can make room now.
    let start = Instant::now();
    mux.get("new").await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(ids(mux.loaded_ids()), ["new"]);
    drop(busy);
    drained(&mux).await;
    probe.assert_clean();
}

fn gdsf(probe: &Arc<Probe>, max_models: usize) -> Multiplexer<TestModel> {
    build(
        probe,
        Multiplexer::builder()
            .max_models(max_models)
            .eviction_policy(EvictionPolicy::Gdsf),
    )
}

#[tokio::test(start_paused = true)]
async fn gdsf_keeps_a_frequently_used_model_over_a_more_recent_one() {
    let probe = Probe::new();
    let mux = gdsf(&probe, 2);
    for _ in 0..5 {
        mux.get("popular").await.unwrap();
    }
    mux.get("once").await.unwrap(); // the most recent, but used once
    mux.get("new").await.unwrap();
    assert_eq!(
        ids(mux.loaded_ids()),
        ["new", "popular"],
        "LRU would have evicted `popular`"
    );
}

#[tokio::test(start_paused = true)]
async fn gdsf_keeps_a_model_that_is_expensive_to_reload() {
    let probe = Probe::new();
    probe
        .delay
        .lock()
        .insert("slow".into(), Duration::from_secs(1));
    probe.delay.lock().insert("fast".into(), ms(10));
    let mux = gdsf(&probe, 2);
    mux.get("slow").await.unwrap();
    mux.get("fast").await.unwrap(); // more recent, same frequency, cheap to reload
    mux.get("new").await.unwrap();
    assert_eq!(ids(mux.loaded_ids()), ["new", "slow"]);
}

#[tokio::test(start_paused = true)]
async fn gdsf_ages_out_popularity_that_stopped() {
    let probe = Probe::new();
    let mux = gdsf(&probe, 2);
    for _ in 0..4 {
        mux.get("was-popular").await.unwrap();
    }
    // A stream of other models: each eviction raises `L`, so newcomers soon outrank it.
    let mut evicted_after = None;
    for k in 0..20 {
        mux.get(&format!("m{k}")).await.unwrap();
        // Looking with `try_get` would count as a use; `loaded_ids` does not.
        if !mux
            .loaded_ids()
            .iter()
            .any(|id| id.as_str() == "was-popular")
        {
            evicted_after = Some(k);
            break;
        }
    }
    let k = evicted_after.expect("old popularity must age out");
    assert!((2..10).contains(&k), "aged out after {k} newcomers");
}

#[tokio::test(start_paused = true)]
async fn a_load_waiting_for_its_turn_holds_no_slot_and_evicts_nothing() {
    let probe = Probe::new();
    probe.delay.lock().insert("slow".into(), ms(100));
    let mux = build(
        &probe,
        Multiplexer::builder().max_models(2).max_concurrent_loads(1),
    );
    mux.get("idle").await.unwrap();
    let slow = tokio::spawn({
        let mux = mux.clone();
        async move { mux.get("slow").await.map(drop) }
    });
    settle().await;
    let queued = tokio::spawn({
        let mux = mux.clone();
        async move { mux.get("queued").await.map(drop) }
    });
    tokio::time::sleep(ms(50)).await;
    // `queued` cannot start before `slow` is done: it must not have taken `idle`'s slot yet.
    assert_eq!(ids(mux.loaded_ids()), ["idle"]);
    assert_eq!(
        mux.gauges().used_slots,
        2,
        "idle + slow; the queued load reserved nothing"
    );
    slow.await.unwrap().unwrap();
    queued.await.unwrap().unwrap();
    assert_eq!(probe.loads_of("queued"), 1);
}
