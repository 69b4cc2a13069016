//! What `Multiplexer::models()` reports while loads wait: a load waiting for a turn or for
//! room is `Queued`, not `Loading`, so what the report calls loading or loaded (plus what
//! drains) never exceeds the caps, as the memory it names cannot.

mod common;

use std::time::Duration;

use common::{Held, Probe, TestLoader, settle};
use modelmux_cache::{ModelStatus, Multiplexer};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Counts of one report: (loaded, loading, queued).
fn counts(mux: &Multiplexer<common::TestModel>) -> (usize, usize, usize) {
    let models = mux.models();
    let of = |s: ModelStatus| models.iter().filter(|m| m.status == s).count();
    (
        of(ModelStatus::Loaded),
        of(ModelStatus::Loading),
        of(ModelStatus::Queued),
    )
}

#[tokio::test(start_paused = true)]
async fn forty_requests_over_ten_ids_never_report_more_than_the_cap() {
    // The seed's example: 3 models a replica; 40 requests at once over 10 ids, each holding
    // its model while it runs.
    let probe = Probe::new();
    *probe.default_delay.lock() = ms(20);
    let mux = Multiplexer::builder()
        .max_models(3)
        .max_concurrent_loads(8)
        .capacity_timeout(Duration::from_secs(60))
        .build(TestLoader(probe.clone()));
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let mux = mux.clone();
            tokio::spawn(async move {
                let held = Held::new(mux.get(&format!("m{}", i % 10)).await.unwrap());
                tokio::time::sleep(ms(30)).await;
                drop(held);
            })
        })
        .collect();
    let mut saw_queued = false;
    while !tasks.iter().all(|t| t.is_finished()) {
        let (loaded, loading, queued) = counts(&mux);
        let draining = mux.draining().len();
        assert!(
            loaded + loading + draining <= 3,
            "loaded {loaded} + loading {loading} + draining {draining} > 3 (queued {queued})"
        );
        saw_queued |= queued > 0;
        tokio::time::sleep(ms(1)).await;
        settle().await;
    }
    assert!(
        saw_queued,
        "no load ever had to wait: the test tested nothing"
    );
    for t in tasks {
        t.await.unwrap();
    }
    probe.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn a_load_waiting_for_a_turn_is_queued_then_loading() {
    let probe = Probe::new();
    *probe.default_delay.lock() = ms(100);
    let mux = Multiplexer::builder()
        .max_models(4)
        .max_concurrent_loads(1)
        .build(TestLoader(probe.clone()));
    let first = tokio::spawn({
        let mux = mux.clone();
        async move { mux.get("a").await.map(drop) }
    });
    settle().await;
    let second = tokio::spawn({
        let mux = mux.clone();
        async move { mux.get("b").await.map(drop) }
    });
    tokio::time::sleep(ms(10)).await;
    let status = |id: &str| {
        mux.models()
            .into_iter()
            .find(|m| m.id.as_str() == id)
            .map(|m| m.status)
    };
    assert_eq!(status("a"), Some(ModelStatus::Loading));
    assert_eq!(status("b"), Some(ModelStatus::Queued));
    // For routing, both are where their requests should go (the events say Loading).
    let snapshot = mux.subscribe().snapshot;
    assert!(snapshot.contains(&(
        modelmux_cache::ModelId::new("b").unwrap(),
        ModelStatus::Loading
    )));
    first.await.unwrap().unwrap();
    tokio::time::sleep(ms(10)).await;
    assert_eq!(status("b"), Some(ModelStatus::Loading));
    second.await.unwrap().unwrap();
    assert_eq!(status("b"), Some(ModelStatus::Loaded));
}
