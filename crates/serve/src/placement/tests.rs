//! The replica slot's model set, fed by its caches' events.

use super::*;

fn event(id: &str, kind: ModelEventKind) -> ModelEvent {
    ModelEvent {
        seq: 0,
        id: ModelId::new(id).unwrap(),
        kind,
    }
}

#[tokio::test(start_paused = true)]
async fn events_drive_the_model_set() {
    let slot = ReplicaLedger::new("r".into(), 5, 1, Some(2));
    let m = ModelId::new("m").unwrap();
    let now = Instant::now();
    assert!(!slot.holds(&m, now));
    slot.apply(0, &event("m", ModelEventKind::Loading));
    assert!(slot.holds(&m, now));
    assert!(slot.has_free_slot(now));
    slot.apply(0, &event("n", ModelEventKind::Loading));
    assert!(!slot.has_free_slot(now));
    slot.apply(
        0,
        &event(
            "n",
            ModelEventKind::Failed {
                error: modelmux_cache::Error::ShuttingDown,
            },
        ),
    );
    assert_eq!(slot.model_count(now), 1, "a failed load is retracted");
    slot.apply(
        0,
        &event(
            "m",
            ModelEventKind::Evicting {
                reason: modelmux_cache::EvictReason::Capacity,
            },
        ),
    );
    assert!(!slot.holds(&m, now));
}

#[tokio::test(start_paused = true)]
async fn pending_placements_expire() {
    let slot = ReplicaLedger::new("r".into(), 5, 1, None);
    let m = ModelId::new("m").unwrap();
    slot.mark_pending(&m);
    assert!(slot.holds(&m, Instant::now()));
    tokio::time::advance(PENDING_TTL + Duration::from_millis(1)).await;
    assert!(!slot.holds(&m, Instant::now()));
    assert_eq!(slot.model_count(Instant::now()), 0);
}

fn evicting() -> ModelEventKind {
    ModelEventKind::Evicting {
        reason: modelmux_cache::EvictReason::Capacity,
    }
}

#[tokio::test(start_paused = true)]
async fn two_caches_on_one_replica_keep_their_own_entries() {
    let slot = ReplicaLedger::new("r".into(), 5, 2, None);
    let (x, y) = (ModelId::new("x").unwrap(), ModelId::new("y").unwrap());
    slot.apply_snapshot(0, &[(x.clone(), ModelStatus::Loaded)]);
    slot.apply_snapshot(1, &[(y.clone(), ModelStatus::Loaded)]);
    let now = Instant::now();
    assert!(
        slot.holds(&x, now) && slot.holds(&y, now),
        "the second snapshot kept the first's"
    );
    slot.apply(1, &event("x", evicting()));
    assert!(
        slot.holds(&x, now),
        "cache 1 evicting does not remove cache 0's model"
    );
    slot.apply(0, &event("x", evicting()));
    assert!(!slot.holds(&x, now));
    slot.apply_snapshot(1, &[]);
    assert!(
        !slot.holds(&y, now),
        "a resync replaces that cache's entries"
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_placement_replaces_an_expired_one() {
    let slot = ReplicaLedger::new("r".into(), 5, 1, None);
    let m = ModelId::new("m").unwrap();
    let first = slot.mark_pending(&m).unwrap();
    slot.placement_ended(&m, first);
    tokio::time::advance(PENDING_TTL + Duration::from_secs(1)).await;
    let second = slot.mark_pending(&m).unwrap();
    assert!(slot.holds(&m, Instant::now()));
    assert!(slot.holds_loading(&m, Instant::now()));
    slot.placement_ended(&m, first);
    tokio::time::advance(PENDING_LOADING_GRACE + Duration::from_millis(1)).await;
    assert!(
        slot.holds_loading(&m, Instant::now()),
        "the request that placed it is still in flight (the first one's end does not count)"
    );
    slot.placement_ended(&m, second);
    assert!(
        !slot.holds_loading(&m, Instant::now()),
        "an unconfirmed placement stops holding requests back once its request has ended"
    );
}

#[test]
fn a_drained_replica_takes_no_new_request() {
    let slot = ReplicaLedger::new("r".into(), 1, 0, None);
    assert!(slot.try_begin());
    assert!(!slot.try_begin(), "max_ongoing is 1");
    slot.finish();
    slot.set_available(false);
    assert!(!slot.try_begin());
    assert_eq!(slot.ongoing(), 0, "a refused try leaves nothing taken");
}

fn loaded(size: u64) -> ModelEventKind {
    ModelEventKind::Loaded {
        size_bytes: Some(size),
        load_time: Duration::from_millis(100),
    }
}

fn unloaded() -> ModelEventKind {
    ModelEventKind::Unloaded {
        unload_time: Duration::ZERO,
        error: None,
    }
}

#[tokio::test(start_paused = true)]
async fn room_counts_draining_models_and_bytes() {
    let now = Instant::now();
    // Count cap 3: two held and one evicted but still in use leave no room.
    let slot = ReplicaLedger::new("r".into(), 5, 1, Some(3));
    for id in ["a", "b", "c"] {
        slot.apply(0, &event(id, loaded(10)));
    }
    slot.apply(0, &event("c", evicting()));
    assert_eq!(slot.model_count(now), 2);
    assert!(
        !slot.has_free_slot(now),
        "the draining copy still takes its slot"
    );
    slot.apply(0, &event("c", unloaded()));
    assert!(slot.has_free_slot(now), "unloaded: its slot is free");

    // Byte cap 110: 60 bytes held leave room for a typical (30-byte) model; 60 held plus 30
    // draining do not; two draining copies of one id release half their bytes each.
    let slot = ReplicaLedger::new("r".into(), 5, 1, None).with_byte_capacity(Some(110));
    for id in ["a", "b"] {
        slot.apply(0, &event(id, loaded(30)));
    }
    assert!(slot.has_free_slot(now));
    for _ in 0..2 {
        slot.apply(0, &event("c", loaded(15)));
        slot.apply(0, &event("c", evicting()));
    }
    assert!(!slot.has_free_slot(now), "60 held + 30 draining + 30 > 110");
    slot.apply(0, &event("c", unloaded()));
    assert!(slot.has_free_slot(now), "60 held + 15 draining + 30 <= 110");
    // A resync forgets what drained on that cache.
    slot.apply(0, &event("c", loaded(15)));
    slot.apply(0, &event("c", evicting()));
    slot.apply_snapshot(0, &[(ModelId::new("a").unwrap(), ModelStatus::Loaded)]);
    assert!(slot.has_free_slot(now));
}

#[tokio::test(start_paused = true)]
async fn placement_passes_over_a_replica_whose_room_is_draining() {
    let now = Instant::now();
    let (a, b) = (
        ReplicaLedger::new("a".into(), 5, 1, Some(4)),
        ReplicaLedger::new("b".into(), 5, 1, Some(4)),
    );
    // a holds two models and two evicted ones still in use; b holds three.
    for id in ["a1", "a2", "a3", "a4"] {
        a.apply(0, &event(id, loaded(1)));
    }
    for id in ["a3", "a4"] {
        a.apply(0, &event(id, evicting()));
    }
    for id in ["b1", "b2", "b3"] {
        b.apply(0, &event(id, loaded(1)));
    }
    let new = ModelId::new("new").unwrap();
    assert_eq!(
        crate::router::place(&[Arc::new(a), Arc::new(b)], &new, now),
        Some(1),
        "a has fewer models but no free slot: loading there would evict"
    );
}

#[tokio::test(start_paused = true)]
async fn failures_of_a_flood_of_unknown_ids_are_remembered_within_a_bound() {
    let slot = ReplicaLedger::new("r".into(), 5, 1, Some(2));
    let failed = |id: &str| {
        event(
            id,
            ModelEventKind::Failed {
                error: modelmux_cache::Error::LoadFailed {
                    id: ModelId::new(id).unwrap(),
                    source: std::sync::Arc::from(modelmux_cache::BoxError::from("no such model")),
                },
            },
        )
    };
    slot.apply(0, &failed("real-but-broken"));
    let real = ModelId::new("real-but-broken").unwrap();
    assert!(slot.backing_off(&real, Instant::now()));
    for i in 0..3 * MAX_FAILED {
        slot.apply(0, &failed(&format!("random-{i}")));
        assert!(slot.failed.lock().len() <= MAX_FAILED);
    }
    assert!(slot.backing_off(
        &ModelId::new(format!("random-{}", 3 * MAX_FAILED - 1)).unwrap(),
        Instant::now()
    ));
    // Time passes: every failure is forgotten, however few ids came meanwhile.
    tokio::time::advance(2 * MAX_AVOID + Duration::from_secs(1)).await;
    slot.apply(0, &failed("one-more"));
    assert_eq!(slot.failed.lock().len(), 1);
}
